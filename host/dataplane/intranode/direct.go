package intranode

import (
	"sync/atomic"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/inbox"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// Signals our device agent adds into the peer's mapped word itself
// (NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL, SPEC.md §4 "Device windows
// mapped"). A put+signal whose payload the agent copies into the peer's
// mapped window gets, right behind that copy on the same agent, an
// atomic add into the peer's signal word; a signal alone is the add. The
// agent runs its commands in order, so the signal follows its payload and
// every earlier such operation; the batch waits for both before the
// header leaves, marked applied (wire.SigApplied), so that the target
// numbers and acknowledges it as before and every later operation it
// lands follows the add. The mesh routes these operations to lane 0 and
// ends the path for the peer at its first other put (peer.directRoute);
// an operation this lane cannot carry so ends it too.

// directState is a link's: the context whose agent added its signals
// (all must be the same agent, whose order is the order), and how many.
type directState struct {
	ctx     atomic.Uintptr
	adds    atomic.Int64
	entries atomic.Int64 // signals through the peer's inbox (inbox)
	placed  atomic.Int64 // of them, signals alone completed once their entry executed
}

// direct carries op (op.Direct): the payload's copy into the mapped window
// and the signal's add (op.SigMapped), on the agent of op's context,
// gathered in the lane's batch; a put without signal through the mapping
// in that context (viaMapping). SideNo: not so (the lane's other ways
// carry op and the target lands it and applies its signal), and the path
// is over for the peer.
func (x *Link) direct(l *intraLane, op *link.Op) link.SideMove {
	ctx := op.LocalCtx
	if op.Size == 0 {
		ctx = op.MapCtx
	}
	var ib *inbox.Peer
	if op.InboxIdx != 0 {
		if ib = x.evs.PeerInbox(); ib != nil && op.Size == 0 {
			ctx = ib.Ctx() // a signal alone: the agent that writes our entries
		}
	}
	d := &x.dsig
	off := x.Peer().DirectOff()
	if off.Load() || !x.mapOn.Load() || ctx == 0 || (op.Size > 0 && op.Mapped == 0) ||
		(!d.ctx.CompareAndSwap(0, ctx) && d.ctx.Load() != ctx) {
		off.Store(true)
		return link.SideNo
	}
	if op.InboxIdx != 0 {
		return x.inboxEntry(l, op, ib, ctx)
	}
	if op.SigMapped == 0 {
		mv := x.viaMapping(l, op, true)
		if mv == link.SideNo {
			off.Store(true)
		}
		return mv
	}
	g := l.l.Gathered()
	if op.Size > 0 {
		queued, err := g.AddCopy(ctx, uintptr(op.Mapped), uintptr(op.Local), op.Size)
		if err != nil || !queued {
			off.Store(true)
			if err != nil {
				return x.mapFailed(op, err)
			}
			return link.SideNo
		}
	}
	v := op.SigValue
	if op.SigOp == abi.SignalOpInc {
		v = 1
	}
	ok, err := g.AddAdd(ctx, uintptr(op.SigMapped), v)
	if !ok || err != nil {
		off.Store(true)
		if err != nil {
			selfWarn.Warn(abi.SubsysNet, "NET/wasm: rank %d: %v; its signals are applied by its host from now on", x.Peer().Rank(), err)
		}
		if op.Size > 0 {
			x.mappedOnce()
			return link.SideGathered // the copy is queued; the target applies the signal
		}
		return link.SideNo
	}
	op.SigOp |= wire.SigApplied
	if op.Size > 0 {
		x.mappedOnce()
	}
	if d.adds.Add(1) == 1 {
		logx.Info(abi.SubsysNet, "NET/wasm: rank %d (pid %d): our device agent adds signals straight into its mapped signal words (NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL)", x.Peer().Rank(), x.pid)
	}
	return link.SideGathered
}

// inboxEntry carries op (op.InboxIdx): the payload's copy into the mapped
// window, then our agent's entry in the peer's inbox, whose agent adds the
// signal (host/devmem/inbox). The header, marked applied, names the entry
// and leaves at once: a signal alone's entry needs nothing more, and a
// put+signal's request waits for the command, as a marked copy's; only
// where the command could not get a slot of its own does the lane's
// batch wait for it before the header leaves. With placed completions a
// signal alone's request also waits for its command, and completes
// without the peer's acknowledgement (SideQueued). SideNo: not so (no row of
// the peer's mapped here, the agent of the payload's context is not the
// one that writes our entries, no room in the row in time), and the path
// is over for the peer.
func (x *Link) inboxEntry(l *intraLane, op *link.Op, ib *inbox.Peer, ctx uintptr) link.SideMove {
	off := x.Peer().DirectOff()
	if ib == nil || ctx != ib.Ctx() {
		off.Store(true)
		return link.SideNo
	}
	v := op.SigValue
	if op.SigOp == abi.SignalOpInc {
		v = 1
	}
	idx := int(op.InboxIdx - 1)
	owner := x.Peer().Mesh().Owner
	var pos uint64
	var ok bool
	var err error
	mv := link.SideQueued
	if op.Size == 0 {
		// A signal alone completes once its entry is in the peer's row,
		// as a placed put once its bytes are (placed completions);
		// otherwise on the peer's acknowledgement.
		mv = link.SideMoved
		if po, isPO := owner.(link.PartOwner); isPO && x.Peer().Mesh().PlacedCompletion {
			po.AddPart(op.Tag) // the command's part; given back below when nothing was queued
			if pos, ok, err = ib.QueueSignalPlaced(idx, op.SigOff, v, owner, op.Tag); ok {
				mv = link.SideQueued
				if x.dsig.placed.Add(1) == 1 {
					logx.Info(abi.SubsysNet, "NET/wasm: rank %d (pid %d): signals alone through its peer inbox complete once their entry is in its row, without its acknowledgement (NCCL_RMA_WASM_PLACED_COMPLETION)", x.Peer().Rank(), x.pid)
				}
			} else {
				owner.Complete(op.Tag, abi.Success)
			}
		}
		if !ok && err == nil {
			pos, ok, err = ib.QueueSignal(idx, op.SigOff, v)
		}
	} else {
		if po, isPO := owner.(link.PartOwner); isPO && !x.strong(op) {
			po.AddPart(op.Tag) // the command's part; given back below when nothing was queued
			if pos, ok, err = ib.QueueMapped(uintptr(op.Mapped), uintptr(op.Local), op.Size, idx, op.SigOff, v, owner, op.Tag); !ok {
				owner.Complete(op.Tag, abi.Success)
			}
		}
		if !ok && err == nil {
			mv = link.SideGathered
			pos, ok, err = ib.Queue(l.l.Gathered(), uintptr(op.Mapped), uintptr(op.Local), op.Size, idx, op.SigOff, v)
		}
	}
	if !ok || err != nil {
		off.Store(true)
		switch {
		case err != nil && op.Size > 0:
			return x.mapFailed(op, err)
		case err != nil:
			selfWarn.Warn(abi.SubsysNet, "NET/wasm: rank %d: %v; its signals are applied by its host from now on", x.Peer().Rank(), err)
		}
		return link.SideNo
	}
	op.SigOp |= wire.SigApplied
	row := ib.Row()
	if pos&inbox.HostPos != 0 {
		row, pos = row+inbox.Rows, pos&^inbox.HostPos // our row of the peer's host rows
	}
	op.Inbox, op.InboxPos = uint8(row+1), pos
	if op.Size > 0 {
		x.mappedOnce()
	}
	x.inboxOnce()
	return mv
}

// inboxOnce counts a signal through the peer's inbox; the first says so.
func (x *Link) inboxOnce() {
	if x.dsig.entries.Add(1) == 1 {
		logx.Info(abi.SubsysNet, "NET/wasm: rank %d (pid %d): our device agent hands signals to its agent through its peer inbox (NCCL_RMA_WASM_INTRANODE_INBOX)", x.Peer().Rank(), x.pid)
	}
}
