package dataplane

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/seqorder"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// peer is everything between us and one rank that does not depend on how
// the bytes move: lane choice, sequence numbers and striping, the orderer
// for the peer's signals, completions, and the teardown. The transport it
// holds moves the operations (transport.go).
type peer struct {
	m     *Mesh
	rank  int
	t     transport
	lanes int

	seqMu sync.Mutex // orders sequence numbers and lane choice when lanes > 1
	seq   uint64
	rr    int
	order seqorder.Orderer[sigRef] // the peer's signals, applied in its sequence order

	quit chan struct{}
	dead atomic.Bool
	// askedAcks counts the peer's asks for our acks at once
	// (wire.StatusAckNow) that we answered (tests).
	askedAcks atomic.Int64
	// why is markDead's cause, stored before dead is raised: an operation
	// that fails in the window before the loss is reported names it.
	why      atomic.Pointer[error]
	peerBye  atomic.Bool // the peer said goodbye on at least one of its lanes
	closing  atomic.Bool
	deadOnce sync.Once

	acks     atomic.Int32  // goodbyes the peer acknowledged, one per lane
	byeLanes atomic.Int32  // lanes a goodbye was sent on (the live ones)
	acked    chan struct{} // closed when every lane's goodbye was acknowledged
	ackOnce  sync.Once

	// down has bit i set once lane i failed and its operations moved to
	// the others (lane failover, tcp_failover.go). Only TCP lanes fail
	// alone; the peer dies when the last one goes.
	down atomic.Uint32
	// opened has bit i set once lane i has a stream (lane 0 at connect,
	// the others when first used: lazy.go). A failed lane's work moves
	// only to an opened lane that is not down: with none, the peer fails,
	// as it did when every lane opened at connect and all of them broke.
	opened atomic.Uint32
	// directOff ends the device agent's own adds of signals to the peer
	// (directRoute).
	directOff atomic.Bool
}

// newPeer makes the peer; Connect gives it its transport before start.
func newPeer(m *Mesh, rank int) *peer {
	p := &peer{m: m, rank: rank, lanes: m.lanes, quit: make(chan struct{}), acked: make(chan struct{})}
	p.order.Window = m.orderWindow
	p.order.OnErr = func(err error) { m.owner.PeerFailed(rank, fmt.Errorf("signal from rank %d: %w", rank, err)) }
	return p
}

// route picks the lane for op and numbers it. With one lane every operation
// rides it and stream order is the ordering. With several, large puts and
// gets are cut into chunks spread over the lanes, and every put carries a
// sequence number so the target can hold a signal until everything before
// it landed. A lane that failed is skipped: its work goes to the next live
// one.
func (p *peer) route(op *Op, hold bool, lane int) {
	if p.m.directSignal {
		lane = p.directRoute(op, lane)
	}
	if p.lanes == 1 {
		if p.t.SubmitCaller(0, *op, hold) {
			p.t.WriteLone(0) // a lone signal leaves at once
		}
		return
	}
	if op.Msg == wire.MsgReg {
		p.t.Submit(p.live(0), *op, hold)
		return
	}
	if lane < 0 || lane >= p.lanes {
		lane = 0
	}
	if lane, lone := p.number(op, hold, lane); lone {
		p.t.WriteLone(lane) // as on one lane, once the number is taken
	}
}

// number numbers op (a get takes none) and queues it, on lane or, striped,
// on them all; lone: the lane it went to would write it at once
// (SubmitCaller), which the caller does without the lock.
func (p *peer) number(op *Op, hold bool, lane int) (int, bool) {
	p.seqMu.Lock()
	defer p.seqMu.Unlock()
	if p.striped(op) {
		p.stripe(op, hold, lane)
		return lane, false
	}
	if op.Msg != wire.MsgGet {
		p.seq++
		op.Seq = p.seq
	}
	lane = p.live(lane)
	return lane, p.t.SubmitCaller(lane, *op, hold)
}

// directRoute keeps a signal that our device agent adds into the peer's
// mapped word itself (op.SigMapped, NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL)
// after everything posted to the peer before it. The agent runs commands
// in order (after the context's stream work queued before them), so such
// operations, and puts copied into the peer's mapped memory in the same
// context (op.Direct), go on lane 0, whose writer hands them over in
// order. Any other put's bytes or signal are landed by the target, after
// a later agent add could already be visible: the first one ends the path
// for the peer, before it is queued.
func (p *peer) directRoute(op *Op, lane int) int {
	if op.Msg != wire.MsgPut && op.Msg != wire.MsgPutSignal {
		return lane
	}
	if op.Direct && !p.directOff.Load() && !p.striped(op) {
		return 0
	}
	op.Direct, op.SigMapped = false, 0
	if !p.directOff.Load() {
		p.directOff.Store(true)
	}
	return lane
}

// live is lane, or the next lane after it that has not failed (lane itself
// when every lane failed: the peer is dying and the op fails there).
func (p *peer) live(lane int) int {
	down := p.down.Load()
	if down == 0 {
		return lane
	}
	// An opened lane first: the work of a failed one must not wait on a
	// dial (a lane opened now could not take over its resends).
	for _, ok := range [2]uint32{p.opened.Load() &^ down, ^down} {
		for i := 0; i < p.lanes; i++ {
			if l := (lane + i) % p.lanes; ok&(1<<l) != 0 {
				return l
			}
		}
	}
	return lane
}

// stripe cuts op into chunks over all lanes (round robin). A signal travels
// after the chunks as its own operation. Called with seqMu held.
func (p *peer) stripe(op *Op, hold bool, sigLane int) {
	chunk := p.m.pieceSize(op.Size, op.Chunk)
	for off := uint64(0); off < op.Size; off += chunk {
		c := *op
		c.Chunk = 0
		if c.Msg == wire.MsgPutSignal {
			c.Msg, c.SigOp, c.SigMrID, c.SigOff, c.SigValue = wire.MsgPut, 0, 0, 0, 0
		}
		c.Size = min(chunk, op.Size-off)
		c.Local = addOffset(op.Local, off)
		c.Off = op.Off + off
		if c.Remote != 0 {
			c.Remote += off
		}
		if c.Mapped != 0 {
			c.Mapped += off
		}
		if c.Msg != wire.MsgGet {
			p.seq++
			c.Seq = p.seq
		}
		lane := p.live(p.rr % p.lanes)
		p.rr++
		p.t.Submit(lane, c, true)
	}
	if op.Msg == wire.MsgPutSignal {
		s := *op
		s.Size, s.Local, s.Remote, s.Mapped, s.Off, s.MrID = 0, nil, 0, 0, 0, 0
		p.seq++
		s.Seq = p.seq
		p.t.Submit(p.live(sigLane), s, true)
	}
	if !hold {
		p.t.Kick()
	}
}

// striped reports whether an operation is cut over the lanes: with a
// per-op chunk (the guest's plan.chunk_size) when it is larger than the
// chunk, else when it reaches the connection's stripe threshold.
func (m *Mesh) striped(kind uint8, size, chunk uint64) bool {
	if m.lanes == 1 || (kind != wire.MsgPut && kind != wire.MsgPutSignal && kind != wire.MsgGet) {
		return false
	}
	if chunk != 0 {
		return size > max(chunk, guestabi.MinPlanChunk)
	}
	return size >= m.stripe
}

// pieceSize is the size of a striped operation's pieces. With a per-op
// chunk: that chunk, at least 4 KiB and at most MaxPiecesPerOp pieces.
// Else one piece per lane (rounded up to 4 KiB), but no smaller than the
// connection's chunk size: few large pieces keep the per-piece cost (a
// header, a sequence number, a completion) small.
func (m *Mesh) pieceSize(size, chunk uint64) uint64 {
	if chunk != 0 {
		return max(chunk, guestabi.MinPlanChunk, (size+guestabi.MaxPiecesPerOp-1)/guestabi.MaxPiecesPerOp)
	}
	per := (size + uint64(m.lanes) - 1) / uint64(m.lanes)
	per = (per + 4095) &^ 4095
	return max(per, m.chunk)
}

// striped is Mesh.striped for op to this peer. Over libfabric with one
// rail every lane posts on the same endpoint, so cutting an op only adds
// operations: it is not striped unless the backend's plan asked for a
// chunk size, or it is staged over the TCP lanes (device memory).
func (p *peer) striped(op *Op) bool {
	if p.t.WholeOp(*op) {
		return false
	}
	return p.m.striped(op.Msg, op.Size, op.Chunk)
}

// parts is how many completions an operation of this kind and size gets:
// one per chunk, plus one for the signal of a striped put with signal.
func (m *Mesh) parts(kind uint8, size, chunk uint64) int {
	if !m.striped(kind, size, chunk) {
		return 1
	}
	c := m.pieceSize(size, chunk)
	n := int((size + c - 1) / c)
	if kind == wire.MsgPutSignal {
		n++
	}
	return n
}

// fail completes op with an error without sending it.
func (p *peer) fail(op *Op) {
	// The sticky error is set before the request completes, so whoever sees
	// the failed request also sees queryLastError report it.
	if !p.closing.Load() && op.Msg != wire.MsgBye {
		err := fmt.Errorf("%w: operation to rank %d failed", ErrPeerGone, p.rank)
		if why := p.why.Load(); why != nil {
			err = fmt.Errorf("%w: %v", err, *why)
		}
		p.m.owner.PeerFailed(p.rank, err)
	}
	if op.Msg != wire.MsgReg && op.Tag != 0 {
		p.m.owner.Complete(op.Tag, abi.RemoteError)
	}
}

// failCause is fail for an operation whose failure is about to mark the
// peer dead with err: the failure it reports names err.
func (p *peer) failCause(op *Op, err error) {
	p.why.CompareAndSwap(nil, &err)
	p.fail(op)
}

// markDead tears the connections down once, fails everything in flight,
// and reports the loss unless it was an orderly goodbye or our own close.
func (p *peer) markDead(err error) {
	p.deadOnce.Do(func() {
		p.why.CompareAndSwap(nil, &err)
		p.t.Stop()
		close(p.quit)
		lost := p.t.Awaiting()
		if !p.closing.Load() && (!p.peerBye.Load() || lost > 0) {
			p.m.owner.PeerFailed(p.rank, fmt.Errorf("%w: %v", ErrPeerGone, err))
		}
		// After the report: whoever sees a failed request also sees
		// queryLastError report it.
		p.t.FailAll()
	})
}

// sayGoodbye queues a goodbye behind everything already queued on every
// lane. The target acknowledges each one after it applied all the lane
// carried before it (payloads, then signals), so an operation accepted
// before closeColl is delivered, not dropped with the streams.
func (p *peer) sayGoodbye() {
	p.closing.Store(true)
	// A lane never opened (lazy.go) carried nothing: no goodbye, which
	// would only open it.
	down := p.down.Load()
	unused, _ := p.t.(interface{ LaneUnused(int) bool })
	skip := func(lane int) bool { return down&(1<<lane) != 0 || (unused != nil && unused.LaneUnused(lane)) }
	n := int32(0)
	for lane := 0; lane < p.lanes; lane++ {
		if !skip(lane) {
			n++
		}
	}
	p.byeLanes.Store(max(n, 1))
	for lane := 0; lane < p.lanes; lane++ {
		if !skip(lane) || n == 0 {
			p.t.Submit(lane, Op{Request: Request{Msg: wire.MsgBye}}, false)
		}
	}
}

// awaitGoodbye waits until the peer acknowledged every lane's goodbye, the
// peer is gone, or the deadline passes, then drops the streams. It reports
// how many lanes were not acknowledged in time.
func (p *peer) awaitGoodbye(deadline time.Time) int {
	missing := 0
	if !p.dead.Load() {
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-p.acked:
		case <-p.quit:
		case <-t.C:
			missing = int(p.byeLanes.Load() - p.acks.Load())
		}
		t.Stop()
	}
	p.markDead(nil)
	return missing
}

// ackBye counts one acknowledged goodbye; a peer that acknowledges more
// than it was sent changes nothing.
func (p *peer) ackBye() {
	if p.acks.Add(1) == p.byeLanes.Load() {
		p.ackOnce.Do(func() { close(p.acked) })
	}
}

// byeGone forgets a goodbye that will never be acknowledged: it was queued
// on a lane that failed (the lane's stream is gone, and a second goodbye on
// another lane would be a protocol error there).
func (p *peer) byeGone() {
	if n := p.byeLanes.Add(-1); n > 0 && p.acks.Load() >= n {
		p.ackOnce.Do(func() { close(p.acked) })
	}
}

// idle reports whether every operation posted so far completed (puts arrived).
func (p *peer) idle() bool { return p.dead.Load() || p.t.Idle() }

// Gone is the staging ring's liveness check of a peer's services.
func (p *peer) Gone() bool { return p.dead.Load() }

// addOffset advances a pointer into registered memory.
func addOffset(ptr unsafe.Pointer, off uint64) unsafe.Pointer {
	if ptr == nil {
		return nil
	}
	return unsafe.Add(ptr, off)
}
