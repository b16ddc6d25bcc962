package ofi

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric/endpoint"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// Arrival acknowledgements of puts with signal in CQ data. Such a write is
// posted without delivery completion: on tcp;ofi_rxm delivery completion
// makes the target's provider send an acknowledgement of its own before it
// reports the write, a second message on the critical path of every
// ping-pong step, which raw fi_writedata does not pay. Instead the target
// counts our numbers that landed, in order (its orderer passed them), and
// tells us how many more did since it last said: in the CQ data of its
// next put with signal in CQ data to us (SigAckBits), or, when none
// carried it within ackPolls polls or before its goodbye, in a MsgAck
// message. The counts commute,
// so rails and reordering do not matter; we complete a write once the
// acknowledged count reaches its number, so a request still completes
// only once its bytes and signal arrived (SPEC.md §3).

// fabAckWait is a write of ours awaiting the peer's acknowledgement: its
// number and its slot.
type fabAckWait struct {
	seq uint64
	idx uint32
}

// fabAckQ holds one rail's writes awaiting acknowledgement, in number
// order. Pushed by posters, popped by that rail's poller.
type fabAckQ struct {
	mu sync.Mutex
	q  []fabAckWait
	n  atomic.Int32
}

func (a *fabAckQ) push(seq uint64, idx uint32) {
	a.mu.Lock()
	a.q = append(a.q, fabAckWait{seq, idx})
	// Concurrent submitters may post out of number order: keep it sorted
	// (a step or two back at most), so that popping stops at the first
	// number not yet acknowledged.
	for i := len(a.q) - 1; i > 0 && a.q[i-1].seq > seq; i-- {
		a.q[i-1], a.q[i] = a.q[i], a.q[i-1]
	}
	a.n.Store(int32(len(a.q)))
	a.mu.Unlock()
}

// drop takes out the entry of seq (its post failed).
func (a *fabAckQ) drop(seq uint64) {
	a.mu.Lock()
	for i := len(a.q) - 1; i >= 0; i-- {
		if a.q[i].seq == seq {
			a.q = append(a.q[:i], a.q[i+1:]...)
			break
		}
	}
	a.n.Store(int32(len(a.q)))
	a.mu.Unlock()
}

func (a *fabAckQ) clear() {
	a.mu.Lock()
	a.q = a.q[:0]
	a.n.Store(0)
	a.mu.Unlock()
}

// takeAck takes what an outgoing put with signal in CQ data may
// acknowledge of the peer's numbers (at most SigAckMax); giveAck puts it
// back when the post failed. It asks the orderer only while the peer
// awaits an acknowledgement: a caller that saw the peer's signal applied
// then finds its number passed (the orderer applies under its lock).
func (f *Link) takeAck() uint64 {
	for {
		sent := f.ackSent.Load()
		if f.ackWant.Load() <= sent {
			return 0
		}
		passed := f.Peer().Order().Next() - 1
		if passed <= sent {
			return 0
		}
		d := min(passed-sent, endpoint.SigAckMax)
		if f.ackSent.CompareAndSwap(sent, sent+d) {
			return d
		}
	}
}

func (f *Link) giveAck(d uint64) {
	if d != 0 {
		f.ackSent.Add(-d)
	}
}

// postAcked posts a put with signal in CQ data (pd.cqsig) on rail rl from
// slot idx: without delivery completion, the slot kept until the peer
// acknowledges the number (acked).
func (f *Link) postAcked(pd *fabPend, rl *fabRail, idx uint32, raddr, key uint64) error {
	e, op := rl.e, &pd.op
	s := &e.slots[idx]
	s.sig, s.got, s.vst, s.learn = true, 0, abi.Success, false
	q := &f.ackWait[pd.rail]
	q.push(pd.seq, idx) // before the post: the acknowledgement may beat our return
	ack := f.takeAck()
	data := e.cq.SigData(e.rank, pd.seq, op.SigMrID, op.SigOff, ack)
	err := e.FI.WriteMsg(op.Local, op.Size, e.Regs.Desc(op.LocalMr), data, rl.addr, raddr, key, e.SlotArea(idx), false)
	if err != nil {
		f.giveAck(ack)
		q.drop(pd.seq)
	}
	return err
}

// acked records that the peer acknowledged n more of our numbers (from
// endpoint e's completion, under its poll lock) and completes what that
// covers on e's rail; other rails' pollers complete theirs (popAcked).
// More than we ever sent is a protocol violation.
func (e *EP) acked(l *Link, n uint64) {
	if n == 0 {
		return
	}
	if a := l.acked.Add(n); a > l.seq.Load() || a < n {
		err := fmt.Errorf("protocol violation by rank %d: it acknowledged %d of our sequence numbers, we sent %d", l.Peer().Rank(), a, l.seq.Load())
		logx.Warn(abi.SubsysNet, "NET/wasm: %v; dropping its connections", err)
		go l.Peer().MarkDead(err)
		return
	}
	e.popAcked(l)
	for i := range l.rails {
		if i != e.rail && l.ackWait[i].n.Load() > 0 {
			l.rails[i].e.Nudge()
		}
	}
}

// popAcked completes l's writes on e's rail whose numbers the peer
// acknowledged (under e's poll lock).
func (e *EP) popAcked(l *Link) {
	q := &l.ackWait[e.rail]
	if q.n.Load() == 0 {
		return
	}
	a := l.acked.Load()
	q.mu.Lock()
	k := 0
	for k < len(q.q) && q.q[k].seq <= a {
		k++
	}
	done := e.ackDone[:0]
	done = append(done, q.q[:k]...)
	q.q = append(q.q[:0], q.q[k:]...)
	q.n.Store(int32(len(q.q)))
	q.mu.Unlock()
	for _, w := range done {
		// As a verdict of success: the slot finishes once its send
		// completed too; a slot failed or reused since is left alone.
		e.verdict(l, w.seq|uint64(w.idx)<<48, abi.Success)
	}
	e.ackDone = done[:0]
}

// wantAck notes (under e's poll lock) that the peer's put with signal in
// CQ data numbered seq arrived: the peer awaits our acknowledgement once
// it passed the orderer, which our next such put carries or, failing
// that, a MsgAck at a later poll. Noted before the orderer applies the
// signal, so that a caller who sees it and answers carries it.
func (e *EP) wantAck(l *Link, seq uint64) {
	for {
		w := l.ackWant.Load()
		if w >= seq || l.ackWant.CompareAndSwap(w, seq) {
			break
		}
	}
	if !l.acking.Swap(true) {
		e.acking = append(e.acking, fabAcking{l, e.polls})
		e.nacking.Store(int32(len(e.acking)))
	}
}

// fabAcking is a link on an endpoint's acking list and the endpoint's
// poll count when it was listed.
type fabAcking struct {
	l  *Link
	at uint64
}

// ackPolls: a MsgAck goes out no earlier than this many polls after the
// write it acknowledges landed. A caller that waits for a signal polls
// twice per turn (test() and rmaProgress), and its answer, a put with
// signal, should carry the acknowledgement instead.
const ackPolls = 2

// TestNoAckMsg, when set by a test, sends no MsgAck from a poll:
// acknowledgements travel in CQ data, or before a goodbye (flushAck).
var TestNoAckMsg atomic.Bool

// sendAcks acknowledges what no put carried (under the poll lock): a link
// stays on the list while the peer awaits an acknowledgement, including
// while its number waits in the orderer for an earlier one.
func (e *EP) sendAcks() {
	k := 0
	msgs := !TestNoAckMsg.Load()
	for _, a := range e.acking {
		// A peer we are leaving gets its acknowledgement at once: our
		// goodbye may end the pair before another poll.
		if a.l.Peer().Dead() || a.l.ackOwed(e.rail, msgs && (e.polls-a.at >= ackPolls || a.l.Peer().Closing())) {
			continue
		}
		e.acking[k] = a
		k++
	}
	clear(e.acking[k:])
	e.acking = e.acking[:k]
	e.nacking.Store(int32(k))
}

// ackOwed sends a MsgAck on rail if the peer awaits one and send allows
// it; true when nothing more is owed (l leaves the acking list).
func (l *Link) ackOwed(rail int, send bool) bool {
	sent := l.ackSent.Load()
	if sent >= l.ackWant.Load() {
		l.acking.Store(false)
		// A want noted since by another rail's poller found the flag set
		// and did not list l: keep it here then.
		return l.ackSent.Load() >= l.ackWant.Load() || l.acking.Swap(true)
	}
	if !send {
		return false
	}
	passed := l.Peer().Order().Next() - 1
	if passed <= sent || !l.ackSent.CompareAndSwap(sent, passed) {
		return false // an earlier number is still missing, or a put took some
	}
	if !l.sendAck(rail, passed-sent) {
		l.giveAck(passed - sent)
	}
	return false // looked at again next poll
}

// sendAck sends a MsgAck of n numbers on rail; false means no room yet.
func (l *Link) sendAck(rail int, n uint64) bool {
	return l.sendSmall(rail, endpoint.Msg{Type: endpoint.MsgAck, Word: n & endpoint.SeqMask}, "acknowledgement")
}

// flushAck sends, from any thread, whatever acknowledgement the peer
// awaits; false when it could not (no room, or a number still missing).
// A goodbye and its acknowledgement go after it on the same rail, so the
// peer completes its writes before it learns the pair is closing.
func (l *Link) flushAck(rail int) bool {
	for {
		sent := l.ackSent.Load()
		if sent >= l.ackWant.Load() {
			return true
		}
		passed := l.Peer().Order().Next() - 1
		if passed <= sent {
			return false
		}
		if !l.ackSent.CompareAndSwap(sent, passed) {
			continue
		}
		if !l.sendAck(rail, passed-sent) {
			l.giveAck(passed - sent)
			return false
		}
	}
}
