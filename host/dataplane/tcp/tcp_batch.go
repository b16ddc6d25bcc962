package tcp

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/codec"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/profile"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// The batch writer: one writev of headers and payloads per batch.

// writeBatch sends headers and payloads with one writev, straight from the
// registered memory. A put completes when the target acknowledges that it
// landed (wire.MsgPutAck, read by replies), not when the kernel has the bytes:
// completion means arrival, as an RDMA write completion does. With a side
// path (intra-node) payloads it takes are copied into the peer first, and a
// put that needs nothing more from the target completes here; only what the
// target must act on is sent.
//
// mayHand (a caller's flush, Config.GatherWriter): a batch whose gathered
// device copies are still running is handed over with the stream instead
// (handed true; finishHanded, by a later flush or the writer).
func (l *lane) writeBatch(ops []link.Op, mayHand bool) (ok, handed bool) {
	b := batchOut{iov: l.carryAck(l.iov[:0], len(ops) > 0), pend: l.ptags[:0], pops: l.pops[:0], later: l.later[:0]}
	if len(ops) > 0 {
		l.batches.Add(1) // an ack alone is no sign of traffic (acker.drained)
	}
	l.enc.Reset()
	var err error
	n := 0 // ops handled so far; a device copy failure stops the batch
	for ; n < len(ops) && err == nil; n++ {
		var reached bool
		if reached, err = l.writeOp(&b, n, &ops[n]); !reached {
			break // this op never left
		}
	}
	if err == nil && mayHand && l.gather.Pending() {
		l.hand.Put(handedBatch{ops: ops, n: n, b: b})
		if !l.armed.Swap(true) {
			l.timer.Reset(sendDelay.get()) // the writer's turn if no flush finishes it
		}
		return true, true
	}
	return l.finishBatch(ops, n, &b, err), false
}

// handedBatch is a batch handed over (writeBatch): its ops, how many it
// handled, what it gathered.
type handedBatch struct {
	ops []link.Op
	n   int
	b   batchOut
}

// finishBatch writes what the batch gathered (err nil) and completes or
// fails its ops.
func (l *lane) finishBatch(ops []link.Op, n int, b *batchOut, err error) bool {
	defer l.enc.Release() // the arena goes back to the pool once the batch is written
	defer l.gather.Done() // slots of copies gathered for a batch that failed
	if err == nil {
		// Into the FIFO before the bytes leave: the ack may come back
		// before writev returns. Puts failed there are not written.
		err = l.sendGathered(b)
	}
	clear(b.iov)
	clear(b.pops) // a batch that failed before await
	return l.batchWritten(ops, n, b.later, err)
}

// finishHanded finishes the handed batch, if any, and lets the stream go
// (ran: it did; ok: the batch was written). block (the writer) waits for
// its copies; a flush takes it only once they executed.
func (l *lane) finishHanded(block bool) (ran, ok bool) {
	var h handedBatch
	if block {
		h, ran = l.hand.Take()
	} else {
		h, ran = l.hand.Poll(l.ready)
	}
	if !ran {
		return false, true
	}
	ok = l.finishBatch(h.ops, h.n, &h.b, nil)
	l.letGo()
	return true, ok
}

// batchOut is what writeBatch gathers for its writev: the iovec, the tags
// of the puts in it (for the FIFO the target's acks complete), the puts
// the resend ring logs, and the ops (their indices) that complete once
// the batch was written.
type batchOut struct {
	iov   [][]byte
	pend  []uint64
	pops  []link.Op
	later []int
}

// await moves the puts gathered so far into the FIFO, before what is
// gathered is written: the ack may race the write. An error (the peer
// died, the puts failed) means what is gathered must not be written.
func (l *lane) await(b *batchOut) error {
	err := l.awaitPuts(b.pend, b.pops)
	clear(b.pops) // the FIFO and resend log copied them: drop their pointers
	b.pend, b.pops = b.pend[:0], b.pops[:0]
	return err
}

// sendGathered awaits b's puts, then writes what is gathered; puts failed
// there (the peer died) are not written.
func (l *lane) sendGathered(b *batchOut) error {
	if err := l.await(b); err != nil {
		return err
	}
	return l.WriteIov(b.iov)
}

// writeOp adds ops[i] of the batch to b by what it is: a payload a side
// path moves, a header, then a put's payload or a get's awaited reply.
// reached is false when op never left (the batch stops before it); err
// stops the batch after it.
func (l *lane) writeOp(b *batchOut, i int, op *link.Op) (reached bool, err error) {
	// A resent op goes on the stream as it is: a payload the side path
	// moved is in the target already (its header alone is resent), and
	// the side path again would copy, add or write an inbox entry a
	// second time, which the target's check of resent numbers cannot
	// undo (the sender's agent applies a direct signal itself).
	if l.ix != nil && !op.Resent && l.sideOp(b, i, op) {
		return true, nil
	}
	ringed := false
	// A resent put goes on the stream: the target may drop its
	// payload unread (tcp_failover.go), which a ring cannot do.
	if (op.Msg == wire.MsgPut || op.Msg == wire.MsgPutSignal) && !op.Resent && l.ix != nil && !l.ix.RingOff() && l.t.side.Ringable(op) {
		// What is gathered goes first: the first ring offer waits
		// for the target's answer.
		if err = l.sendGathered(b); err != nil {
			return false, err
		}
		b.iov = b.iov[:0]
		if ringed, err = l.ix.RingReady(); err != nil {
			return false, err
		}
	}
	// Compression is TCP's alone: a side path (intra-node) copies.
	comp := l.t.side == nil && compressible(op)
	b.iov = append(b.iov, l.header(i, op, ringed, comp))
	if l.resend && (op.Msg == wire.MsgPut || op.Msg == wire.MsgPutSignal || op.Msg == wire.MsgReg) {
		b.pops = append(b.pops, *op)
		if op.Placed {
			// Completed once written (batchWritten): its resend (the
			// header alone) completes nothing, neither when written nor
			// when acknowledged.
			b.pops[len(b.pops)-1].Tag, b.pops[len(b.pops)-1].Placed = 0, false
		}
	}
	switch op.Msg {
	case wire.MsgPut, wire.MsgPutSignal:
		err = l.putPayload(b, op, ringed, comp)
	case wire.MsgGet:
		e := getEntry{tag: op.Tag, dst: op.Local, size: op.Size, ctx: op.LocalCtx}
		if l.resend {
			e.op = *op
		}
		l.pushGet(e)
	}
	return true, err
}

// sideOp offers ops[i] of the batch to the side path (intra-node): put
// and get payloads it moves into or out of the peer. true: nothing is left
// to tell the target (op is done, now or once the batch waited for its
// gathered copy); otherwise the stream carries op, the signal (or the
// number that landed) alone when the side path moved its payload.
func (l *lane) sideOp(b *batchOut, i int, op *link.Op) bool {
	var mv link.SideMove
	switch op.Msg {
	case wire.MsgPut, wire.MsgPutSignal:
		mv = l.ix.Put(op)
	case wire.MsgGet:
		mv = l.ix.Get(op)
	}
	switch {
	case mv == link.SideNo:
	case link.TellsTarget(op):
		// The payload is there (or its copy queued, which completes the
		// request once more): send the signal, or the number that
		// landed, alone.
		// Bounded: past placedMax puts awaiting acks on the lane, the
		// request waits for its ack, so a target that never acknowledges
		// holds the caller's requests, not our memory.
		// A signal alone is placed once its command (an inbox entry's
		// write) completes its request once more (SideQueued).
		op.Placed = (op.Size > 0 || mv == link.SideQueued) && l.p.Mesh().PlacedCompletion && l.nputs.Load() < placedMax.Load()
		if op.Placed && !l.t.placedSaid.Load() && !l.t.placedSaid.Swap(true) {
			logx.Info(abi.SubsysNet, "NET/wasm: rank %d: puts placed in its mapped memory complete once their copy executed and their header was written, without its acknowledgement (NCCL_RMA_WASM_PLACED_COMPLETION)", l.p.Rank())
		}
		op.Size = 0
	default:
		op.Msg = link.OpDone // nothing to tell the target
		switch mv {
		case link.SideMoved:
			l.p.Mesh().Owner.Complete(op.Tag, abi.Success)
		case link.SideGathered:
			b.later = append(b.later, i)
		}
		return true
	}
	return false
}

// header encodes ops[i]'s header into its slot of the lane's header
// buffer and returns it: ringed, its payload goes through the staging
// ring; comp, it is compressed.
func (l *lane) header(i int, op *link.Op, ringed, comp bool) []byte {
	h := wire.Header{Typ: op.Msg, SigOp: op.SigOp, MrID: op.MrID, Tag: op.Tag, Off: op.Off,
		Size: op.Size, SigMrID: op.SigMrID, Context: op.Context, SigOff: op.SigOff, SigValue: op.SigValue, Seq: op.Seq}
	if op.Msg == wire.MsgReg && op.Dev {
		h.Status = 1
	}
	if op.Event != 0 {
		h.Status = wire.StatusEvent | uint16(op.Event-1)
	}
	if op.Mark != 0 {
		h.Status, h.Off = wire.StatusMark|uint16(op.Mark-1), op.MarkV
	}
	if op.InboxPos != 0 {
		h.Status, h.Off = wire.StatusInbox|uint16(op.Inbox-1), op.InboxPos
	}
	if ringed {
		h.Status = link.StatusRing
	}
	if comp {
		h.Status = uint16(op.Codec & guestabi.CodecIDMask) // requests: the payload's codec
	}
	if op.Resent {
		h.Status |= wire.StatusResent | uint16(op.From)<<8
	}
	hb := l.hdrs[i*wire.HeaderSize : (i+1)*wire.HeaderSize]
	h.Encode(hb)
	return hb
}

// placedMax bounds the puts a lane lets complete before their ack while
// earlier ones still await theirs (the FIFO and resend log entries a
// silent target makes us keep): several times what NCCL keeps in flight
// per peer (256 per context).
var placedMax atomic.Int64

func init() { placedMax.Store(4096) }

// writtenCompletes reports whether put op's request completes once its
// header (and payload) was written rather than on the target's ack: in
// local-completion mode, or when the side path placed its payload in the
// target's memory (Route.Placed). Its FIFO entry then completes nothing.
func writtenCompletes(c *link.Config, op *link.Op) bool { return c.LocalCompletion || op.Placed }

// putPayload counts put op in the FIFO the target's acks complete and adds
// its payload to b, by where it comes from: the staging ring, a small
// device payload gathered, a device source staged chunk by chunk, a
// compressed payload, or host memory written straight from the
// registration.
func (l *lane) putPayload(b *batchOut, op *link.Op, ringed, comp bool) (err error) {
	if writtenCompletes(l.p.Mesh(), op) {
		// Completed below, once written. The FIFO still counts
		// the put against the target's acks; tag 0 completes
		// nothing when the ack comes.
		b.pend = append(b.pend, 0)
	} else {
		b.pend = append(b.pend, op.Tag)
	}
	if ringed {
		// The header goes now; the payload through the ring.
		if err = l.sendGathered(b); err == nil {
			err = l.ix.RingSend(op)
		}
		b.iov = b.iov[:0]
	} else if g, gerr := l.gatherDev(op, len(b.iov)); g != nil {
		// A small device payload, its copy queued: the
		// bytes join iov, written after WriteIov waited.
		b.iov = append(b.iov, g)
	} else if gerr != nil {
		// As a failed synchronous copy: the put is in the
		// FIFO, failed (or resent) with the lane.
		if err = l.await(b); err == nil {
			err = gerr
		}
	} else if op.Size > 0 && op.LocalCtx != 0 {
		// Device source: what is queued goes first, then the
		// payload is staged through host memory chunk by chunk.
		if err = l.sendGathered(b); err == nil {
			err = staging.WriteFromDevice(l.streamWriter(), op.LocalCtx, uintptr(op.Local), op.Size, l.p.Mesh().StageChunk)
		}
		b.iov = b.iov[:0]
	} else if comp {
		b.iov, b.pend, b.pops, err = l.compress(b.iov, b.pend, b.pops, op)
	} else if op.Size > 0 {
		b.iov = append(b.iov, unsafe.Slice((*byte)(op.Local), op.Size))
	}
	return err
}

// batchWritten completes or fails the batch's ops once it was written
// (err nil) or failed after its first n ops were handled; later are the
// ops whose gathered copies the write waited for.
func (l *lane) batchWritten(ops []link.Op, n int, later []int, err error) bool {
	p := l.p
	if err != nil {
		// Copies the batch queued may still run: they finish before
		// their requests fail (and the caller may free or unmap).
		l.gather.Done()
	}
	for _, i := range later {
		// Their copies were waited for by a WriteIov that succeeded, or
		// the batch failed.
		if err == nil {
			p.Mesh().Owner.Complete(ops[i].Tag, abi.Success)
		} else {
			p.Fail(ops[i])
		}
	}
	if err != nil && l.canFailover() {
		// The lane failed alone: what the loop did not reach goes to the
		// other lanes with the rest of its work (tcp_failover.go). A
		// placed put it reached is resent from the log, with no request
		// to complete: it completes here, as it would have once written.
		for i := range ops[:n] {
			if ops[i].Placed {
				p.Mesh().Owner.Complete(ops[i].Tag, abi.Success)
			}
		}
		l.keep(ops[n:])
		l.broken(fmt.Errorf("send to rank %d on lane %d: %w", p.Rank(), l.idx, err))
		return false
	}
	if err != nil {
		for i := range ops {
			// The puts and gets the loop reached are in the FIFOs, which
			// markDead fails (but tag 0 there in local mode); the rest
			// never left.
			put := ops[i].Msg == wire.MsgPut || ops[i].Msg == wire.MsgPutSignal
			if (i >= n && (put || ops[i].Msg == wire.MsgGet)) || (put && writtenCompletes(p.Mesh(), &ops[i])) {
				p.Fail(ops[i])
			}
		}
		p.MarkDead(fmt.Errorf("send to rank %d: %w", p.Rank(), err))
		return false
	}
	for i := range ops {
		if (ops[i].Msg == wire.MsgPut || ops[i].Msg == wire.MsgPutSignal) && writtenCompletes(p.Mesh(), &ops[i]) {
			p.Mesh().Owner.Complete(ops[i].Tag, abi.Success)
		}
	}
	if profile.On() {
		for i := range ops {
			profile.Queued.Since(ops[i].Posted)
		}
	}
	if profile.Tracing() {
		for range ops {
			profile.Mark(profile.PtWire)
		}
	}
	return true
}

// compress appends op's payload to iov as compressed blocks in the lane's
// arena (a block the codec cannot shrink is sent as it is, from the source).
// When the arena or iov is full, what is gathered is written first; pend's
// tags go to the FIFO before that, as the acks may race the write.
func (l *lane) compress(iov [][]byte, pend []uint64, pops []link.Op, op *link.Op) ([][]byte, []uint64, []link.Op, error) {
	e := &l.enc
	src := unsafe.Slice((*byte)(op.Local), op.Size)
	for len(src) > 0 {
		n := min(len(src), codec.BlockSize)
		if !e.Room(n) || len(iov)+2 > cap(iov) {
			err := l.awaitPuts(pend, pops)
			pend, pops = pend[:0], pops[:0]
			if err == nil {
				err = l.WriteIov(iov)
			}
			clear(iov)
			iov = iov[:0]
			e.Reset()
			if err != nil {
				return iov, pend, pops, err
			}
		}
		framed, stored := e.Block(op.Codec, src[:n])
		iov = append(iov, framed)
		if stored {
			iov = append(iov, src[:n])
		}
		src = src[n:]
	}
	return iov, pend, pops, nil
}

// compressible reports whether op's payload is compressed on the wire.
func compressible(op *link.Op) bool {
	return op.Codec&guestabi.CodecIDMask != guestabi.CodecNone && op.Size >= codec.MinSize && op.LocalCtx == 0 &&
		(op.Msg == wire.MsgPut || op.Msg == wire.MsgPutSignal)
}

// gatherReady reports whether the handed batch's copies executed (a copy
// that failed counts: the write reports it).
func (l *lane) gatherReady() bool {
	ready, err := l.gather.Ready()
	return ready || err != nil
}
