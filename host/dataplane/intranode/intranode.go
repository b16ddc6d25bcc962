package intranode

import (
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/profile"
)

const (
	// intraInlineMax is inlineMax for a peer on the intra-node path, where
	// sending is a memory copy like any other the caller makes; the caller
	// spinning in test() does it itself instead of waiting for a second
	// thread, which matters when cores are few.
	intraInlineMax = 4 << 20
	// intraMin is the smallest payload worth a process_vm_writev of its own;
	// smaller puts ride the coalesced TCP stream, which is cheaper per op.
	intraMin = 16 << 10
)

// Link is the intra-node transport, for a peer on the same host (same
// host id in its handle): large host payloads move straight between the two
// processes' registered memory with process_vm_writev/readv, one copy and no
// socket. Everything else (small operations, signals, registrations,
// goodbyes, replies, device memory) rides the embedded TCP link. The copy
// runs where the lane's batch is written, in queue order, so the signal
// that follows a put still leaves on the stream after its payload landed.
// Any refusal by the kernel (ptrace rules, other users, non-dumpable peers)
// turns the path off for that peer and the operation goes over TCP.
type Link struct {
	*tcp.Link
	pid    int
	on     atomic.Bool  // the single-copy path is usable for this peer
	selfs  atomic.Int64 // operations to this very rank moved by selfDevice
	mapOn  atomic.Bool  // copies into the peer's mapped device memory work
	mapped atomic.Int64 // operations moved through a mapping (viaMapping)
	evs    linkEvents   // interprocess events of mapped put+signals (ipc_events.go)
	dsig   directState  // signals our device agent adds into the peer's words (direct.go)
	wake   []wakeState  // the wake backstop's, per incoming stream (wake.go)
}

func New(p link.Peer, outs, ins []*net.TCPConn, pid int) *Link {
	x := &Link{Link: tcp.NewLink(p, outs, ins), pid: pid}
	x.wake = make([]wakeState, x.Incoming())
	x.on.Store(true)
	x.mapOn.Store(true)
	x.SetSide(x, func(l link.LaneIO) link.LaneSide { return &intraLane{x: x, l: l, p: p} })
	return x
}

func (x *Link) Release() {
	x.Link.Release()
	x.evs.release()
}

func (x *Link) Props() link.Props {
	pr := x.Link.Props()
	if x.on.Load() {
		pr.Name = Name
	}
	return pr
}

// PeerPid is the peer's process, whose staging ring and stream offers are
// mapped through /proc/<pid>/fd.
func (x *Link) PeerPid() int { return x.pid }

// PeerEvents are the link's interprocess events (ipc_events.go).
func (x *Link) PeerEvents() link.Events { return &x.evs }

// IPCEvents are the link's events, for the mesh's IPC exchange.
func (x *Link) IPCEvents() *linkEvents { return &x.evs }

// WriteState: the mapped device memory path, when it moved something or
// was turned off, then the TCP lanes under it.
func (x *Link) WriteState(w io.Writer) {
	if x.mapped.Load() > 0 || !x.mapOn.Load() {
		fmt.Fprintf(w, "    mapped device memory: %d operations, usable=%v\n", x.mapped.Load(), x.mapOn.Load())
	}
	x.Link.WriteState(w)
	x.writeWakes(w)
}

// AddStats counts the peer as an intra-node peer while the single-copy
// path is enabled for it, and its lanes' acknowledgements (compression is
// counted for plain TCP links only).
func (x *Link) AddStats(st *link.Stats) {
	if x.Props().Name == Name {
		st.IntraNodePeers++
	}
	x.Link.AddAcks(st)
	x.addWakes(st)
}

func (x *Link) InlineMax() uint64 {
	if x.on.Load() {
		return intraInlineMax
	}
	return tcp.InlineMax
}

// takes reports whether op's payload should move beside the stream.
func (x *Link) takes(op *link.Op) bool {
	return op.Size >= intraMin && op.Remote != 0 && op.LocalCtx == 0 && x.on.Load()
}

// Ringable: a large put with device memory at either end (the target's is
// device memory when its address is unknown). Not tied to x.on: mapping
// the peer's ring needs only ptrace read access to it, which Yama's
// ptrace_scope=1 leaves to siblings that process_vm_writev is refused to;
// the ring has its own refusal.
func (x *Link) Ringable(op *link.Op) bool {
	return op.Size >= intraMin && (op.LocalCtx != 0 || op.Remote == 0)
}

// put writes op's payload into the peer; SideNo means "use TCP".
func (x *Link) put(l *intraLane, op *link.Op) link.SideMove {
	if op.Direct {
		if mv := x.direct(l, op); mv != link.SideNo {
			return mv
		}
	}
	if op.Mapped != 0 {
		if mv := x.viaMapping(l, op, true); mv != link.SideNo {
			return mv
		}
	}
	if x.self() {
		if mv := x.selfDevice(l, op, true); mv != link.SideNo {
			return mv
		}
	}
	if !x.takes(op) {
		return link.SideNo
	}
	if x.pid == os.Getpid() {
		copy(unsafe.Slice((*byte)(addrPtr(op.Remote)), op.Size), unsafe.Slice((*byte)(op.Local), op.Size))
		return link.SideMoved
	}
	return moved(x.vm(l, op, true))
}

// get reads op's bytes from the peer; SideNo means "use TCP".
func (x *Link) get(l *intraLane, op *link.Op) link.SideMove {
	if op.Mapped != 0 {
		if mv := x.viaMapping(l, op, false); mv != link.SideNo {
			return mv
		}
	}
	if x.self() {
		if mv := x.selfDevice(l, op, false); mv != link.SideNo {
			return mv
		}
	}
	if !x.takes(op) {
		return link.SideNo
	}
	if x.pid == os.Getpid() {
		copy(unsafe.Slice((*byte)(op.Local), op.Size), unsafe.Slice((*byte)(addrPtr(op.Remote)), op.Size))
		return link.SideMoved
	}
	return moved(x.vm(l, op, false))
}

func moved(ok bool) link.SideMove {
	if ok {
		return link.SideMoved
	}
	return link.SideNo
}

// self reports whether the peer is this very rank: NCCL's RMA proxy
// flushes with an 8-byte put to its own rank after every signal it awaits
// for a CUDA graph without GDRCopy, and a GIN alltoall puts to its own
// rank every round.
func (x *Link) self() bool {
	return x.pid == os.Getpid() && x.Peer().Rank() == x.Peer().Mesh().Rank
}

// selfDevice moves the payload of op, an operation of this rank to itself
// with device memory at either end, with the device's copies instead of a
// round trip through our own socket and both ends' staging: the target
// registration is ours. SideNo (nothing moved): not such an operation, or
// a range or copy the TCP path must refuse and report.
func (x *Link) selfDevice(l *intraLane, op *link.Op, put bool) link.SideMove {
	if op.Size == 0 || (op.LocalCtx == 0 && op.Remote != 0) {
		return link.SideNo // host memory at both ends: the paths above
	}
	base, size, ctx, pin, ok := x.Peer().Mesh().Owner.Resolve(op.MrID)
	if !ok {
		return link.SideNo
	}
	defer pin.Release()
	if !link.Span(op.Off, op.Size, size) || (ctx == 0 && op.LocalCtx == 0) {
		return link.SideNo
	}
	reg := unsafe.Add(base, op.Off) // a device address when ctx != 0, never dereferenced then
	if profile.On() {
		defer profile.SelfCopy.Since(profile.Now())
	}
	if ctx == op.LocalCtx && x.selfQueue(op, put, uintptr(reg)) {
		return link.SideQueued
	}
	l.l.Settle()
	var err error
	if put {
		err = staging.CopyLocal(ctx, reg, op.LocalCtx, op.Local, op.Size, x.Peer().Mesh().StageChunk)
	} else {
		err = staging.CopyLocal(op.LocalCtx, op.Local, ctx, reg, op.Size, x.Peer().Mesh().StageChunk)
	}
	if err != nil {
		// The TCP path stages it again and fails it with its cause.
		selfWarn.Warn(abi.SubsysNet, "NET/wasm: rank %d: operation of %d bytes to itself: %v; sending it through its own socket instead", x.Peer().Rank(), op.Size, err)
		return link.SideNo
	}
	if x.selfs.Add(1) == 1 {
		logx.Info(abi.SubsysNet, "NET/wasm: rank %d: operations to itself with device memory move by device copies, not through its own socket", x.Peer().Rank())
	}
	return link.SideMoved
}

// selfQueue queues the device copy of op, an operation of this rank to
// itself between device memory of one context (reg is the registration's
// address), on the context's stream, without waiting for it: the copy
// completes the request (staging.CopySelfAsync). An operation the target
// also acknowledges (a signal, a numbered put) first gets a part more,
// so that it completes once both happened. false: copy and wait (a
// strongly ordered registration, whose put completes once everything
// before it landed; an owner without parts; no spare slot; a failure to
// queue, which the synchronous copy then reports).
func (x *Link) selfQueue(op *link.Op, put bool, reg uintptr) bool {
	m := x.Peer().Mesh()
	if put && x.strong(op) {
		return false
	}
	acked := link.TellsTarget(op)
	po, parts := m.Owner.(link.PartOwner)
	if acked && !parts {
		return false
	}
	dst, src := reg, uintptr(op.Local)
	if !put {
		dst, src = src, dst
	}
	if acked {
		po.AddPart(op.Tag) // taken back below when nothing was queued
	}
	ok, err := staging.CopySelfAsync(op.LocalCtx, dst, src, op.Size, m.Owner, op.Tag)
	if !ok {
		if acked {
			m.Owner.Complete(op.Tag, abi.Success) // the part added above
		}
		if err != nil {
			selfWarn.Warn(abi.SubsysNet, "NET/wasm: rank %d: operation of %d bytes to itself not queued on the device: %v; copying it synchronously", x.Peer().Rank(), op.Size, err)
		}
		return false
	}
	if x.selfs.Add(1) == 1 {
		logx.Info(abi.SubsysNet, "NET/wasm: rank %d: operations to itself with device memory are queued on the device's stream and complete when they executed", x.Peer().Rank())
	}
	return true
}

// viaMapping moves op's payload with one device copy between our memory
// and the peer's device memory mapped into this process (op.Mapped:
// SPEC.md §4, "Device windows mapped"). A put+signal from device memory
// is queued with our event after it, which the target waits for
// (queueMapped). Another put from device memory is queued on its
// context's stream with the batch's other device copies (SideGathered):
// the lane waits for them all before it writes the batch, so the header
// that follows (a signal, a numbered put) reaches the target only once
// the bytes are in its memory, as the target's own landing would.
// Anything else (a get, a host source, a strongly-ordered target
// registration, a payload larger than a bounce slot, which would hold the
// context's stream, no slot for the event) is copied and waited for here,
// after the copies the batch queued before it. A failed copy turns the
// path off for this peer and the TCP path takes the operation (the same
// bytes again, so a partial copy does no harm).
func (x *Link) viaMapping(l *intraLane, op *link.Op, put bool) link.SideMove {
	if op.Size == 0 || !x.mapOn.Load() {
		return link.SideNo
	}
	if put && op.LocalCtx != 0 && !x.strong(op) {
		if x.queueMapped(op) {
			x.mappedOnce()
			return link.SideQueued // the target orders its signal by our event
		}
		queued, err := l.l.Gathered().AddCopy(op.LocalCtx, uintptr(op.Mapped), uintptr(op.Local), op.Size)
		if err != nil {
			return x.mapFailed(op, err)
		}
		if queued {
			x.mappedOnce()
			return link.SideGathered
		}
	}
	l.l.Settle()
	ctx := op.LocalCtx
	if ctx == 0 {
		ctx = op.MapCtx
	}
	var err error
	if put {
		err = staging.CopyLocal(ctx, addrPtr(op.Mapped), op.LocalCtx, op.Local, op.Size, x.Peer().Mesh().StageChunk)
	} else {
		err = staging.CopyLocal(op.LocalCtx, op.Local, ctx, addrPtr(op.Mapped), op.Size, x.Peer().Mesh().StageChunk)
	}
	if err != nil {
		return x.mapFailed(op, err)
	}
	x.mappedOnce()
	return link.SideMoved
}

// mapFailed turns the mapping off for this peer after a failed copy (one
// WARN): op and every later operation take the staged path.
func (x *Link) mapFailed(op *link.Op, err error) link.SideMove {
	if x.mapOn.Swap(false) {
		logx.Warn(abi.SubsysNet, "NET/wasm: rank %d: device copy of %d bytes through the mapping of its memory failed: %v; its operations go through the staged path from now on", x.Peer().Rank(), op.Size, err)
	}
	return link.SideNo
}

// strong reports whether op's target registration is strongly ordered
// (NCCL_NET_MR_FLAG_FORCE_SO): its puts are copied and waited for.
func (x *Link) strong(op *link.Op) bool {
	so, ok := x.Peer().Mesh().Owner.(link.StrongOwner)
	return ok && so.StronglyOrdered(op.MrID)
}

// mappedOnce counts an operation moved through a mapping; the first says so.
func (x *Link) mappedOnce() {
	if x.mapped.Add(1) == 1 {
		logx.Info(abi.SubsysNet, "NET/wasm: rank %d (pid %d): device operations copy straight into its mapped device memory (IPC)", x.Peer().Rank(), x.pid)
	}
}

// selfWarn limits the WARN lines about failed local device copies.
var selfWarn logx.Limited

// vm copies with the kernel, using the lane's iovec scratch (the caller
// owns the lane's stream).
func (x *Link) vm(l *intraLane, op *link.Op, write bool) bool {
	done := uint64(0)
	for done < op.Size {
		l.liov[0].Base = (*byte)(unsafe.Add(op.Local, done))
		l.liov[0].SetLen(int(op.Size - done))
		l.riov[0] = unix.RemoteIovec{Base: uintptr(op.Remote + done), Len: int(op.Size - done)}
		var n int
		var err error
		if write {
			n, err = unix.ProcessVMWritev(x.pid, l.liov[:], l.riov[:], 0)
		} else {
			n, err = unix.ProcessVMReadv(x.pid, l.liov[:], l.riov[:], 0)
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			if done > 0 {
				// Part of the payload landed: resending it all over TCP is
				// still correct, the bytes are the same.
				err = fmt.Errorf("short transfer after %d bytes: %v", done, err)
			}
			x.on.Store(false)
			logx.Info(abi.SubsysNet, "NET/wasm: intra-node path to rank %d (pid %d) refused by the kernel (%v); using TCP for this peer", x.Peer().Rank(), x.pid, err)
			return false
		}
		done += uint64(n)
	}
	return true
}

// addrPtr turns an address in this process into a pointer without tripping
// vet's uintptr check; the memory is C memory registered by the caller.
func addrPtr(a uint64) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&a)) }
