package tcp

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp/waitpolicy"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// Acknowledgements: those this link owes the peer (carried in our batches
// or written alone), the asks for the peer's, the liveness backstop, and
// the FIFO of our puts that the peer's acks complete.

// AskAcks asks the peer to acknowledge every lane's puts at once
// (lane.askAcks): the caller waits for them.
func (t *Link) AskAcks() {
	for _, l := range t.lanes {
		l.askAcks()
	}
}

// carryAck appends the acks this link owes the peer (acker.drained) to
// the batch about to be written, the first things in it, and an ask for
// the peer's acks of this lane's puts when one is due (the first header
// carries it, or one of its own). batch: the batch carries operations too
// (else the acks leave alone, and a hold of theirs was in vain).
func (l *lane) carryAck(iov [][]byte, batch bool) [][]byte {
	ask := l.askAck.Load() && l.askAck.Swap(false)
	k := 0
	if l.t.ride {
		for i, a := range l.t.acks {
			n := a.Owed()
			if n == 0 || !a.Claim(n) {
				continue
			}
			if batch {
				a.Rode()
			} else {
				a.WentAlone()
			}
			// MrID names the peer's lane (our incoming stream i) whose
			// puts n acknowledges.
			h := wire.Header{Typ: wire.MsgAck, MrID: uint32(i), Seq: n}
			if ask && k == 0 {
				h.Status = wire.StatusAckNow
			}
			h.Encode(l.ackHdr[k][:])
			iov = append(iov, l.ackHdr[k][:])
			k++
		}
		if k > 0 {
			l.carried.Add(uint64(k))
		}
	}
	if ask && k == 0 {
		// Only asking: with Seq 0 the peer's counts are unchanged.
		h := wire.Header{Typ: wire.MsgAck, MrID: uint32(l.idx), Status: wire.StatusAckNow}
		h.Encode(l.ackHdr[0][:])
		iov = append(iov, l.ackHdr[0][:])
	}
	return iov
}

// ackStale reports an owed ack that waited ackDelay for a batch in vain.
func (t *Link) ackStale() bool {
	if !t.ride {
		return false
	}
	for _, a := range t.acks {
		if a.Stale() {
			return true
		}
	}
	return false
}

// acksOwed reports whether any ack waits for a batch to carry it.
func (t *Link) acksOwed() bool {
	if !t.ride {
		return false
	}
	for _, a := range t.acks {
		if a.Owed() != 0 {
			return true
		}
	}
	return false
}

// sendAcksAlone writes the owed acks with no batch, on the first open
// lane that did not fail (the acker's timer).
func (t *Link) sendAcksAlone() {
	for _, l := range t.lanes {
		if l.isOpen() {
			if !l.sendAck(false) {
				// Someone holds the stream: its letGo re-arms the timer.
				t.ackDeferred.Add(1)
			}
			return
		}
	}
}

// isOpen reports whether the lane's stream is open and did not fail.
func (l *lane) isOpen() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.out != nil && !l.down
}

// rehomeAcks: a lane failed over, and a count it had taken may have died
// with it (putack.Acker.Rehome).
func (t *Link) rehomeAcks() {
	if !t.ride {
		return
	}
	for _, a := range t.acks {
		a.Rehome()
	}
}

// askAfter is how long a flush waits for the acks of its puts before it
// asks for them: acks that come by themselves (most do, within a few µs)
// cost no ask. A variable so that tests can ask at once.
var askAfter = 10 * time.Microsecond

// askAcks notes that the caller waits for the completions of our puts
// (iflush): if acks are still owed askAfter from now, the next flush (the
// caller's test()) makes the lane's next batch ask the target to
// acknowledge them at once (wire.StatusAckNow), and writes that batch
// when the stream is free. A target that wrote to us since it last
// drained holds its acks for its next batch (acker.drained), and in a GIN
// round that batch comes only after our wait ends, so without asking both
// sides waited out ackDelay. Nothing is asked when every put was
// acknowledged, or on a lane whose target cannot hold acks (one with
// resend acks each on the reply stream as it lands). A busy stream
// carries the ask in its next batch.
func (l *lane) askAcks() {
	if l.pendingPuts() == 0 {
		return
	}
	l.askAt.CompareAndSwap(0, Now()+int64(l.asks.after(l.p.Mesh().FlushAskAtOnce)))
}

// askPacer adapts a lane's askAfter (waitpolicy.Policy): where the target keeps
// holding its acks until asked (a GIN round, where each side's puts are
// followed by its flush and the target's next batch comes only after ours
// ends), waiting askAfter before each ask only delays the flush, so the
// flush then asks at once; acks that came before the ask turn the wait
// back on.
type askPacer struct {
	waitpolicy.Policy
	// For link.Stats: the asks flushes made, and the flushes that did
	// not wait askAfter first.
	asks, early atomic.Uint64
}

// after is how long the next flush waits for its acks before it asks
// (adapt false: always askAfter).
func (a *askPacer) after(adapt bool) time.Duration {
	if !adapt || a.Waiting() {
		return askAfter
	}
	a.early.Add(1)
	return 0
}

// asked notes a flush that had to ask for its acks.
func (a *askPacer) asked() {
	a.asks.Add(1)
	a.Vain()
}

// cameAlone notes a flush's acks that came before it asked.
func (a *askPacer) cameAlone() { a.Paid() }

// The liveness backstop. Every put is acknowledged by the normal paths
// (an ack that rides a batch, one written alone when no batch comes, the
// acker's timer); a bug in them would leave a put that landed
// unacknowledged and its request pending for ever, which hangs a job. So
// the caller's test() and rmaProgress (flush) also look at how long the
// oldest put of each lane has waited for its ack: past backstopBound, the
// lane asks the target to acknowledge at once (wire.StatusAckNow, which
// the target answers on the acknowledged stream itself, apart from every
// lane's hold), at most backstopAsks times, each after twice the wait of
// the one before. An ack that then comes
// is counted (Mesh.Stats().AcksRescued) and reported in a rate-limited
// INFO line: the normal path failed to deliver it in time, which the
// operator (and the soak) should see. NCCL's proxies call test() on every
// pending request, so a waiting caller always runs it.

// backstopBound is how long a put may wait for its ack before the
// backstop asks: four times the longest a held ack waits by design
// (ackDelay for a batch, then ackBound for the timer), plus twice the
// slowest wait seen lately, so that a slow machine or link (a starved CPU
// makes round trips of tens of milliseconds) is not taken for a lost ack.
func (l *lane) backstopBound() int64 {
	return 4*int64(ackDelay.get()+ackBound.get()) + 2*l.ackWait.Load()
}

// ackedPuts records that an ack completed puts of the FIFO (amu held; empty:
// none is left): how long the oldest waited, and an answer to the
// backstop's ask.
func (l *lane) ackedPuts(empty bool) {
	now := Now()
	var waited int64
	if since := l.waitSince.Load(); since != 0 {
		// The round trip seen: a maximum that decays by an eighth per ack.
		old := l.ackWait.Load()
		waited = now - since
		l.ackWait.Store(max(waited, old-old/8))
	}
	if empty {
		l.waitSince.Store(0)
		if l.askAt.Load() != 0 {
			l.asks.cameAlone() // a flush waited, and its acks came unasked
		}
	} else {
		l.waitSince.Store(now) // the next put's wait starts no earlier than this
	}
	l.bsN.Store(0) // an ack: the next wait starts a new round of asks
	if at := l.bsAt.Load(); at != 0 && l.bsAt.CompareAndSwap(at, 0) {
		n := l.bsRescued.Add(1)
		backstopInfo.Info(abi.SubsysNet, "NET/wasm: rank %d: puts to rank %d on lane %d were acknowledged only after the liveness backstop asked (the oldest waited %v, %v of it after the ask; %d times on this lane)",
			l.p.Mesh().Rank, l.p.Rank(), l.idx, time.Duration(waited), time.Duration(now-at), n)
	}
}

// backstopInfo limits the backstop's INFO lines.
var backstopInfo = logx.Limited{Burst: 5, Every: 10 * time.Second}

// backstop asks for the acks of puts that waited past backstopBound
// (flush, the caller's thread): one atomic load when none waits.
func (l *lane) backstop() {
	since := l.waitSince.Load()
	if since == 0 || skipBackstop.Load() {
		return
	}
	now, bound := Now(), l.backstopBound()
	if now-since < bound {
		return
	}
	n := l.bsN.Load()
	if n >= backstopAsks {
		return // the peer answers nothing: the peer watchdog's case, not ours
	}
	if at := l.bsAt.Load(); at != 0 && now-at < bound<<n {
		return // asked already: ask again only when that ask went unanswered twice as long
	}
	l.bsN.Store(n + 1)
	l.bsAt.Store(now)
	l.bsAsks.Add(1)
	l.askAck.Store(true)
}

// backstopAsks is how many times the backstop asks for the same wait
// (each after twice the time of the one before) before it gives up. A
// peer that answers none of them is not holding an ack: it is stopped or
// unreachable, which the peer watchdog (NCCL_RMA_WASM_PEER_TIMEOUT_MS)
// fails. Asking for ever would defeat it: each ask is bytes the stopped
// peer's kernel still acknowledges, which the watchdog counts as progress.
const backstopAsks = 3

// skipBackstop switches the backstop off (tests that must see the normal
// path alone deliver every ack).
var skipBackstop atomic.Bool

// askDue turns a flush's wait that outlasted askAfter into an ask.
func (l *lane) askDue() {
	at := l.askAt.Load()
	if at == 0 || Now() < at || !l.askAt.CompareAndSwap(at, 0) {
		return
	}
	if l.pendingPuts() > 0 {
		l.asks.asked()
		l.askAck.Store(true)
	}
}

// sendAsk writes a batch of nothing but what carryAck adds, when an ask
// is pending, nothing is queued (a batch would carry it) and the stream
// is free.
func (l *lane) sendAsk() {
	if !l.askAck.Load() {
		return
	}
	l.mu.Lock()
	if l.writing || l.down || l.out == nil || l.p.Dead() || l.q.Len() > 0 {
		l.mu.Unlock()
		return
	}
	l.writing = true
	l.mu.Unlock()
	l.writeAlone()
}

// writeAlone writes a batch of nothing but what carryAck adds and lets
// the stream go; the caller took it (l.writing).
func (l *lane) writeAlone() {
	ok, _ := l.writeBatch(l.batch[:0], false)
	if more := l.letGo(); ok && more {
		l.kick()
	}
}

// sendAck writes an ack that no batch carried in time, alone (test() or
// rmaProgress through flush, idle set: only when nothing is queued, which
// would carry it; or the acker's timer). When someone holds the stream,
// that one re-arms the timer as it lets go (letGo), so the ack is never
// stranded. It reports whether it took the stream.
func (l *lane) sendAck(idle bool) bool {
	l.mu.Lock()
	if l.writing || l.down || l.out == nil || l.p.Dead() || !l.t.acksOwed() || (idle && l.q.Len() > 0) {
		l.mu.Unlock()
		return false
	}
	l.writing = true
	l.mu.Unlock()
	l.writeAlone()
	return true
}

// awaitingReply: the lane has sent something the peer answers (a put to
// acknowledge, a get to serve), so its replies reader spins for it.
func (l *lane) awaitingReply() bool { return l.pendingPuts() > 0 || l.pendingGets() > 0 }

// awaitPuts appends the tags of puts about to be written to the FIFO that
// the target's acks complete. If the peer is already dead (FailAll may have
// emptied the FIFO), they fail here instead, so none is left behind, and
// it returns errPutsFailed: their requests completed, so their sources
// may be reused already, and the caller must not write what it gathered.
// (markDead raises the dead flag before it closes the streams: a write
// in between would still leave, with bytes read after the completion.)
func (l *lane) awaitPuts(tags []uint64, ops []link.Op) error {
	if len(tags) == 0 && len(ops) == 0 {
		return nil
	}
	l.amu.Lock()
	if l.p.Dead() {
		l.amu.Unlock()
		for _, tag := range tags {
			l.p.Fail(link.Op{Request: link.Request{Msg: wire.MsgPut, Tag: tag}})
		}
		return errPutsFailed
	}
	if l.resend {
		l.logSent(ops)
	}
	if l.puts.Len() == 0 && len(tags) > 0 {
		l.waitSince.Store(Now())
	}
	for _, tag := range tags {
		l.puts.Push(tag)
	}
	l.nputs.Store(int64(l.puts.Len()))
	l.amu.Unlock()
	return nil
}

// errPutsFailed: awaitPuts found the peer dead and failed the puts it was
// given, which must not be written any more.
var errPutsFailed = fmt.Errorf("%w: its puts failed before they were written", link.ErrPeerGone)

// ackPuts completes the puts a cumulative ack covers: the first n puts of
// the stream. It reports false when n is more than the stream carried.
func (l *lane) ackPuts(n uint64) bool {
	var done [64]uint64 // completed outside the lock, a few at a time
	for {
		l.amu.Lock()
		if l.moved {
			// Its puts went to another lane, whose acks complete them;
			// this count was on its way before the failover.
			l.amu.Unlock()
			return true
		}
		if n < l.pAcked {
			// Stale: a piggybacked ack and one on the reply stream
			// travel apart, and a higher count came first.
			l.amu.Unlock()
			return true
		}
		if n-l.pAcked > uint64(l.puts.Len()) {
			l.amu.Unlock()
			return false
		}
		k := min(int(n-l.pAcked), len(done))
		for i := 0; i < k; i++ {
			done[i], _ = l.puts.Pop()
		}
		l.nputs.Store(int64(l.puts.Len()))
		l.pAcked += uint64(k)
		if l.resend {
			l.popSent(k)
		}
		if k > 0 {
			l.ackedPuts(l.puts.Len() == 0)
		}
		l.amu.Unlock()
		if l.t.onAcked != nil {
			l.t.onAcked() // before the requests complete
		}
		for _, tag := range done[:k] {
			if tag != 0 {
				l.p.Mesh().Owner.Complete(tag, abi.Success)
			}
		}
		if k < len(done) {
			return true
		}
	}
}

// failPut fails the oldest put of request tag awaiting its ack (a nack
// names it; nacks come in stream order, so the oldest is the one) and
// leaves 0 in its place. In local-completion mode the put completed when
// written: only the sticky error reports the rejection then.
func (l *lane) failPut(tag uint64, st abi.Result) {
	if tag == 0 {
		return
	}
	found := false
	l.amu.Lock()
	for i := 0; i < l.puts.Len(); i++ {
		if p := l.puts.At(i); *p == tag {
			*p, found = 0, true
			break
		}
	}
	if found && l.resend {
		// A resend must not complete the failed request again.
		for i := 0; i < l.sent.Len(); i++ {
			if e := l.sent.At(i); e.counts && e.op.Tag == tag {
				e.op.Tag = 0
				break
			}
		}
	}
	l.amu.Unlock()
	if found {
		l.p.Mesh().Owner.Complete(tag, st)
	}
}

// Rejected is the status a peer's rejection carries, as a failure: a
// status that is not one (0, or beyond the codes) reads as a remote error.
func Rejected(status uint16) abi.Result {
	if st := abi.Result(status); st != abi.Success && st <= abi.RemoteError {
		return st
	}
	return abi.RemoteError
}

// failPuts fails every put awaiting its ack; the peer is dead.
func (l *lane) failPuts() {
	l.amu.Lock()
	var tags []uint64
	for tag, ok := l.puts.Pop(); ok; tag, ok = l.puts.Pop() {
		tags = append(tags, tag)
	}
	l.nputs.Store(0)
	l.sent.Clear() // failed here: never sent again
	l.waitSince.Store(0)
	l.amu.Unlock()
	for _, tag := range tags {
		if tag != 0 {
			l.p.Mesh().Owner.Complete(tag, abi.RemoteError)
		}
	}
}

// pendingPuts is how many puts of the stream await their ack.
func (l *lane) pendingPuts() int { return int(l.nputs.Load()) }

// acked is how many puts of this stream the target acknowledged.
func (l *lane) acked() uint64 {
	l.amu.Lock()
	defer l.amu.Unlock()
	return l.pAcked
}

// Acked is how many puts of lane i the target acknowledged.
func (t *Link) Acked(i int) uint64 { return t.lanes[i].acked() }
