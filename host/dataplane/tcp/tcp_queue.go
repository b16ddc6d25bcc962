package tcp

import (
	"sync/atomic"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// The lane's queue and timers: what is queued, when it leaves (the send
// timer, the caller's flush, the writer goroutine), and who holds the
// stream while it is written.

// sendTimer is the send timer's turn: it wakes the writer only for work
// queued sendDelay (holdDelay) ago that nobody sent, sleeps again for
// younger work, and goes quiet on an empty queue (an enqueue re-arms it).
// So a busy lane updates its timer once per sendDelay, not per op, and a
// caller that tests in time never sees the writer.
func (l *lane) sendTimer() {
	l.mu.Lock()
	handed := l.hand.Waiting()
	more := l.q.Len() > 0 || handed
	d := holdDelay.get()
	if l.qUrgent {
		d = sendDelay.get()
	}
	if wait := l.qSince + int64(d) - Now(); more && wait > 0 && !handed {
		l.timer.Reset(time.Duration(wait))
		l.mu.Unlock()
		return
	}
	l.armed.Store(false)
	l.long.Store(false)
	l.mu.Unlock()
	if more {
		l.kick()
	}
}

// loneGap is how long a lane must have had nothing posted for a signal to
// leave at once (SubmitCaller): dense bursts batch, sparse exchanges do not wait.
const loneGap = 10 * time.Microsecond

// enqueue appends op to the queue, growing it rather than failing. It
// reports whether op is a lone signal (SubmitCaller): a small put with signal or
// bare signal, not held or paced, queued on an empty, idle, open lane
// loneGap after the op before.
func (l *lane) enqueue(op *link.Op, hold bool) (lone bool) {
	l.mu.Lock()
	if l.p.Dead() {
		l.mu.Unlock()
		l.p.Fail(*op)
		return false
	}
	if l.down {
		l.mu.Unlock()
		l.forward(op, hold)
		return false
	}
	if l.q.Len() == 0 {
		now := Now()
		lone = !hold && !l.writing && l.out != nil && op.Msg == wire.MsgPutSignal && op.NotBefore == 0 &&
			op.Size <= smallResponse && now-l.qSince > int64(loneGap)
		l.qSince, l.qUrgent = now, false
	}
	if !hold {
		l.qUrgent = true
	}
	l.q.Push(*op) // grows the queue rather than failing
	l.work.Store(true)
	if l.out == nil && !l.opening {
		l.startOpen() // the first op on this lane: dial it (lazy.go)
	}
	l.mu.Unlock()
	switch {
	case op.Msg == wire.MsgReg || op.Msg == wire.MsgBye || op.NotBefore != 0:
		// Control messages go at once, nobody tests them; a paced op is
		// the writer's, on its timer.
		l.kick()
	case op.Size > l.t.inlineMax() && !hold:
		// Big payloads are sent by the writer goroutine, never the caller.
		l.kick()
	case hold:
		// Held by the aggregation hint (more ops follow): the caller's
		// next test() or rmaProgress sends it with everything queued by
		// then, in one writev, or hands a big one to the writer then
		// (flush); the timer, at holdDelay, covers callers that never
		// test, so nothing held is stranded.
		if !l.armed.Swap(true) {
			l.long.Store(true)
			l.timer.Reset(holdDelay.get())
		}
	case !l.armed.Swap(true) || l.long.Load():
		// Small: the same, with the timer at sendDelay (which also
		// covers a lone signal that SubmitCaller could not write after all).
		l.long.Store(false)
		l.timer.Reset(sendDelay.get())
	}
	return lone
}

// flush writes what is queued on the caller's thread when the stream is
// idle and the work is small. test() calls it: a hand-off to the writer
// goroutine costs a scheduler wake-up, which from a foreign C thread can take
// a hundred microseconds on a busy machine, while a caller that posts a burst
// and then tests gets the whole burst in one writev. The send timer, armed
// at post time, remains the guarantee that nothing waits for a test.
func (l *lane) flush() {
	limit := l.t.inlineMax()
	if l.hand.Waiting() {
		l.finishHanded(false) // a handed batch whose copies executed
	}
	l.backstop()
	if l.t.ackStale() && l.sendAck(true) {
		return // nothing queued to carry an owed ack: it left alone, on this thread
	}
	l.askDue()
	l.sendAsk() // an ask for the peer's acks that no batch carried yet
	l.mu.Lock()
	if l.writing || l.q.Len() == 0 || l.down || l.out == nil || l.q.At(0).NotBefore != 0 || l.p.Dead() {
		// A paced op at the head is the writer's, on its timer; an
		// unopened lane's ops wait for it to open (lazy.go).
		l.mu.Unlock()
		return
	}
	if l.q.At(0).Size > limit {
		// A big op the aggregation hint held (enqueue kicks the others):
		// the writer sends it, never the caller's thread.
		l.mu.Unlock()
		l.kick()
		return
	}
	l.writing = true
	n := l.takeLocked(limit)
	l.mu.Unlock()
	ok, handed := l.writeBatch(l.batch[:n], l.p.Mesh().GatherWriter)
	if handed {
		return // a later flush, or the writer, writes it and lets go
	}
	// The send timer keeps running when everything left: it goes quiet
	// by itself (sendTimer), and stopping it here would make the next
	// post re-arm it, a timer update per op.
	if more := l.letGo(); ok && more {
		l.kick()
	}
}

// queued reports whether ops may wait in the queue (flush), without the
// lock: a hint, set when an op is queued and cleared when a batch takes
// the last one. Stale either way it only changes the order of flush's two
// steps, each of which looks again under the lock.
func (l *lane) queued() bool { return l.work.Load() }

// letGo ends a hold of the stream (l.writing = true, taken under mu by
// flush, sendAsk, sendAck or the writer): every holder lets go through
// here and nowhere else. It re-arms the acks still owed (ackLeft): an
// acker's timer that fired while the stream was held found it busy and
// left its ack to the holder (Link.sendAcksAlone), so a holder that
// let go without re-arming would strand it, and the put it acknowledges
// would never complete. It reports whether ops are left queued.
func (l *lane) letGo() (more bool) {
	if h := letGoHook.Load(); h != nil {
		(*h)(l) // tests: widen the window between the write and letting go
	}
	l.mu.Lock()
	l.writing = false
	more = l.q.Len() > 0
	l.mu.Unlock()
	if !skipRearm.Load() {
		l.ackLeft()
	}
	return more
}

// letGoHook and skipRearm are test knobs (unset in production: an atomic
// load each): letGoHook runs as a holder is about to let go, after its
// write (a test sleeps there to open the window in which an acker's timer
// finds the stream busy); skipRearm leaves owed acks unarmed as the
// stream is let go (the bug letGo exists to prevent), for the negative
// control.
var (
	letGoHook atomic.Pointer[func(*lane)]
	skipRearm atomic.Bool
)

// ackLeft re-arms the ack timers of acks still owed as the stream is let
// go (letGo): a timer may have fired while the stream was held.
func (l *lane) ackLeft() {
	if !l.t.ride {
		return
	}
	for _, a := range l.t.acks {
		if a.Owed() != 0 {
			a.Arm()
		}
	}
}

func (l *lane) kick() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// takeLocked moves queued ops into the batch, at most len(l.batch) of them
// and, past the first, no more than maxPayload bytes of payload. It stops at
// a paced op that is not due yet (everything behind it waits, to keep the
// order). The caller holds l.mu and owns the stream.
func (l *lane) takeLocked(maxPayload uint64) int {
	n, bytes := 0, uint64(0)
	var now int64
	for n < len(l.batch) && l.q.Len() > 0 {
		op := l.q.At(0)
		if n > 0 && bytes+op.Size > maxPayload {
			break
		}
		if op.NotBefore != 0 {
			if now == 0 {
				now = Now()
			}
			if op.NotBefore > now {
				break
			}
		}
		bytes += op.Size
		l.batch[n] = *op
		l.q.Drop()
		n++
	}
	if l.q.Len() == 0 {
		l.work.Store(false)
	}
	return n
}

// drainFailed fails every queued op; the peer is dead.
func (l *lane) drainFailed() {
	l.mu.Lock()
	orphans := l.orphans
	l.orphans = nil
	l.mu.Unlock()
	for i := range orphans {
		l.p.Fail(orphans[i])
	}
	for {
		l.mu.Lock()
		op, ok := l.q.Pop()
		l.mu.Unlock()
		if !ok {
			return
		}
		l.p.Fail(op)
	}
}

func (l *lane) writer() {
	defer l.p.Mesh().WG.Done()
	for {
		select {
		case <-l.wake:
		case <-l.p.Quit():
			// A batch handed over and not yet written: written now, or
			// failed with the closing stream, never left hanging.
			l.finishHanded(true)
			return
		}
		for {
			if ran, ok := l.finishHanded(true); ran {
				if !ok {
					return
				}
				continue
			}
			l.mu.Lock()
			if l.writing || l.q.Len() == 0 || l.down {
				// An inline writer owns the stream; it kicks us when it
				// leaves work behind.
				l.mu.Unlock()
				break
			}
			l.writing = true
			n := l.takeLocked(^uint64(0))
			if n == 0 {
				// A paced op heads the queue: come back when it is due.
				wait := l.q.At(0).NotBefore - Now()
				l.mu.Unlock()
				l.letGo()
				l.due.Reset(time.Duration(max(wait, 1)))
				break
			}
			l.mu.Unlock()
			ok, _ := l.writeBatch(l.batch[:n], false)
			l.letGo()
			if !ok {
				return
			}
		}
	}
}
