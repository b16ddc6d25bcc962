package tcp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/codec"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/ring"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// Lane failover (SPEC.md §4, "Lane failover"). With several TCP lanes to a
// peer, one stream that breaks (a reset, an EOF without goodbye, a failed
// write) does not fail the peer: the initiator marks the lane down and
// sends everything the target may not have applied again on a live lane
// of the same peer, and the target drops what it already applied, by the
// per-peer sequence number every put carries when lanes > 1. Only when the
// last lane goes does the peer die, as before.
//
// Initiator: the lane's resend ring holds every put and registration
// notice written on the stream until the target's cumulative ack covers
// it; the get FIFO holds every get until its reply was read. On failure
// the lane's replies reader (the only one that reads acks and replies)
// waits for the stream's writer to let go, then moves, in this order, the
// unacknowledged puts and notices, the unanswered gets, the ops a failed
// write had taken and never sent, and the queue to the next live lane.
// The puts go flagged (wire.StatusResent, with the lane they left) and keep
// their tags and sequence numbers.
//
// Target: a flagged put first fences the lane it names (closes that
// incoming stream and waits for its service to return), so that no copy
// of the put is still being landed from the dead stream; then, if its
// sequence number already landed, the payload is read and dropped (no
// byte written, no signal applied) and it is acknowledged like any put on
// its new stream. Signals stay strong: the orderer holds them until every
// earlier number landed, whichever lane brought it.
//
// Security: a resend travels only on a stream of the same peer that
// passed the signed hello; nothing is accepted from anyone else. A flagged
// put may only name another lane of the same peer, only skip a number
// that already landed, and the fence wait is bounded by the close
// timeout; anything else is a protocol error and drops the peer, as
// before. A peer could always write its own registrations; failover gives
// it no new reach.

// NoFailover turns lane failover off for this link (both sides).
func (t *Link) NoFailover() {
	t.fixed = true
	for _, l := range t.lanes {
		l.resend, l.sent, l.pops = false, ring.Ring[sentOp]{}, nil
	}
}

// broken handles a failure of the lane's stream seen by its writer or its
// reader. It fails the lane over when another lane of the peer is live
// and the peer is not closing; otherwise the peer is dead, as before.
func (l *lane) broken(err error) {
	p := l.p
	bit := uint32(1) << l.idx
	for {
		d := p.Down().Load()
		if d&bit != 0 {
			return // failed over already
		}
		if !l.resend || p.Opened().Load()&^(d|bit) == 0 || p.Closing() || p.ByeSeen() || p.Dead() {
			p.MarkDead(err)
			return
		}
		if p.Down().CompareAndSwap(d, d|bit) {
			break
		}
	}
	l.mu.Lock()
	l.down = true
	out := l.out
	l.mu.Unlock()
	// Whoever writes or reads the stream fails at once now.
	if out != nil {
		out.Close()
	}
	l.timer.Stop()
	l.due.Stop()
}

// isDown reports whether the lane failed over (a writer waiting on the
// peer, e.g. for room in the staging ring, gives up then).
func (l *lane) isDown() bool { return l.p.Down().Load()&(1<<l.idx) != 0 }

// canFailover reports whether a failure of this lane would fail it over
// (rather than fail the peer).
func (l *lane) canFailover() bool {
	p := l.p
	if !l.resend || p.Closing() || p.ByeSeen() || p.Dead() {
		return false
	}
	bit := uint32(1) << l.idx
	return p.Opened().Load()&^(p.Down().Load()|bit) != 0
}

// replyStreamEnded: the lane's reader could not read. It fails the lane
// over (or the peer) and, when the lane was failed over, moves its work.
func (l *lane) replyStreamEnded(err error) {
	l.broken(err)
	if l.p.Down().Load()&(1<<l.idx) != 0 {
		l.migrate(err)
	}
}

// keep puts ops a failed write took from the queue, and never put on the
// stream, aside for the failover.
func (l *lane) keep(ops []link.Op) {
	l.mu.Lock()
	for i := range ops {
		if ops[i].Msg != link.OpDone {
			l.orphans = append(l.orphans, ops[i])
		}
	}
	l.mu.Unlock()
}

// forward sends op, posted to a lane that failed, to the next live one.
func (l *lane) forward(op *link.Op, hold bool) {
	p := l.p
	if op.Msg == wire.MsgBye {
		p.ByeGone() // the dead stream needs no goodbye
		return
	}
	to := p.Live(l.idx)
	if to == l.idx {
		p.Fail(*op) // every lane failed: the peer is going
		return
	}
	p.Transport().Submit(to, *op, hold)
}

// migrate moves the work of the failed lane to the next live lane. It runs
// once, on the lane's reader goroutine, after broken closed the stream.
func (l *lane) migrate(cause error) {
	p := l.p
	// The stream's writer (its goroutine or a caller flushing inline) fails
	// at once on the closed socket; wait until it let go, so that what it
	// took is in the rings or among the orphans.
	for {
		l.mu.Lock()
		if !l.writing {
			break
		}
		l.mu.Unlock()
		time.Sleep(20 * time.Microsecond)
	}
	orphans := l.orphans
	l.orphans = nil
	queued := make([]link.Op, 0, l.q.Len())
	for op, ok := l.q.Pop(); ok; op, ok = l.q.Pop() {
		queued = append(queued, op)
	}
	l.mu.Unlock()
	// Counts of acks it carried may have died with it; the writer let go,
	// so none it took is still in flight.
	l.t.rehomeAcks()

	// Failure path: allocating here is fine.
	var work []link.Op
	l.amu.Lock()
	for e, ok := l.sent.Pop(); ok; e, ok = l.sent.Pop() {
		if e.counts {
			e.op.Resent, e.op.From = true, uint8(l.idx)
		}
		work = append(work, e.op)
	}
	// Their tags travel with them; the stream's count ends here.
	l.puts.Clear()
	l.nputs.Store(0)
	l.waitSince.Store(0)
	l.moved = true
	l.amu.Unlock()
	l.gmu.Lock()
	for e, ok := l.gets.Pop(); ok; e, ok = l.gets.Pop() {
		work = append(work, e.op)
	}
	l.gmu.Unlock()
	work = append(work, orphans...)
	work = append(work, queued...)

	to := p.Live(l.idx)
	moved := 0
	if to != l.idx {
		for i := range work {
			if m := work[i].Msg; m != wire.MsgBye && m != link.OpDone {
				moved++
			}
		}
	}
	// Tell first, then resubmit: an observer hears of the failover before
	// any moved operation can complete on its new lane.
	logx.Warn(abi.SubsysNet, "NET/wasm: rank %d: lane %d to rank %d failed (%v); %d operations moved to lane %d, none lost",
		p.Mesh().Rank, l.idx, p.Rank(), cause, moved, to)
	if o, ok := p.Mesh().Owner.(link.LaneObserver); ok {
		o.LaneFailed(p.Rank(), l.idx, moved, cause)
	}
	for i := range work {
		op := &work[i]
		switch {
		case op.Msg == wire.MsgBye:
			p.ByeGone()
		case op.Msg == link.OpDone:
		case to == l.idx:
			p.Fail(*op) // no live lane left: the peer died meanwhile
		default:
			p.Transport().Submit(to, *op, true)
		}
	}
	p.Transport().Kick()
}

// logSent appends what a batch wrote to the resend ring; amu held.
func (l *lane) logSent(ops []link.Op) {
	for i := range ops {
		l.sent.Push(sentOp{op: ops[i], counts: ops[i].Msg != wire.MsgReg})
	}
}

// popSent forgets the first k puts of the ring (an ack covered them) and
// the registration notices written before the last of them; amu held.
func (l *lane) popSent(k int) {
	for l.sent.Len() > 0 && k > 0 {
		if l.sent.At(0).counts {
			k--
		}
		l.sent.Drop()
	}
}

// unpopGet puts back the get whose reply the reader was in the middle of
// when the stream broke: it goes again, whole, on another lane.
func (l *lane) unpopGet(e getEntry) {
	l.gmu.Lock()
	l.gets.PushFront(e)
	l.gmu.Unlock()
}

// inLaneEnded: the service of incoming lane i could not read, without a
// goodbye. It reports true when the lane ends alone (the peer fails it
// over and sends again what it did not see acknowledged), false when the
// peer must be failed: it has one lane, it is closing, or this was the
// last live lane.
func (t *Link) inLaneEnded(i int, err error) bool {
	p := t.p
	n := len(t.ins)
	if n == 1 || t.fixed || p.Closing() || p.Dead() {
		return false
	}
	bit := uint32(1) << i
	all := uint32(1)<<n - 1
	for {
		d := t.inDown.Load()
		if d|bit == all {
			return false
		}
		if t.inDown.CompareAndSwap(d, d|bit) {
			break
		}
	}
	t.closeIn(i)
	logx.Info(abi.SubsysNet, "NET/wasm: rank %d: incoming lane %d from rank %d ended (%v); the rank sends again what it did not see acknowledged",
		p.Mesh().Rank, i, p.Rank(), err)
	return true
}

// streamEnded tells an error of the stream itself (it was closed, reset,
// or ended) from a protocol error, which fails the peer whatever its lanes.
func streamEnded(err error) bool {
	var op *net.OpError
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) || errors.As(err, &op)
}

// fence makes sure the service of incoming lane from returned before a
// resent operation that left that lane is handled on lane i: it closes
// that stream and waits for its service, at most the close timeout.
func (t *Link) fence(i, from int) error {
	p := t.p
	if from >= len(t.ins) || from == i || t.fixed {
		return fmt.Errorf("protocol error: rank %d resent an operation of lane %d on lane %d (it has %d)", p.Rank(), from, i, len(t.ins))
	}
	select {
	case <-t.inDone[from]:
		return nil
	default:
	}
	t.inMu.Lock()
	if t.ins[from] == nil {
		// The lane never opened here (lazy.go): nothing of it is landing,
		// and it may not open any more.
		t.fenced |= 1 << from
		t.inMu.Unlock()
		return nil
	}
	t.inMu.Unlock()
	t.fences[from].Do(func() { t.closeIn(from) })
	timer := time.NewTimer(p.Mesh().CloseTimeout)
	defer timer.Stop()
	select {
	case <-t.inDone[from]:
		return nil
	case <-p.Quit():
		return fmt.Errorf("%w: rank %d", link.ErrPeerGone, p.Rank())
	case <-timer.C:
		return fmt.Errorf("protocol error: rank %d resent operations of lane %d, whose stream did not end within %v", p.Rank(), from, p.Mesh().CloseTimeout)
	}
}

// dropPut reads and drops the payload of a resent put whose sequence
// number already landed: no byte of it is written, its signal is not
// applied again.
func (t *Link) dropPut(br *bufio.Reader, h *wire.Header, dec *codec.Decoder) error {
	if h.Size == 0 {
		return nil
	}
	if cid := uint8(h.Status); cid != guestabi.CodecNone {
		_, err := t.readCompressed(br, cid, h.Size, nil, dec)
		return err
	}
	if h.Size > math.MaxInt64 {
		return fmt.Errorf("protocol error: rank %d resent a put of %d bytes", t.p.Rank(), h.Size)
	}
	if _, err := br.Discard(int(h.Size)); err != nil {
		return fmt.Errorf("receive resent put from rank %d: %w", t.p.Rank(), err)
	}
	return nil
}
