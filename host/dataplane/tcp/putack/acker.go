// Package putack sends the cumulative acknowledgements of the puts that
// one incoming TCP stream landed: alone on that stream, or riding the next
// batch of one of our lanes to the peer (SPEC.md §4, "Acknowledgements
// ride the reverse lanes"). It is a unit of its own because when an ack
// may wait, and what makes sure it leaves at all, is a small state machine
// (a drain, a deadline, a timer, a nack that bars riding) with invariants
// of its own: every ack counts only puts that landed, so completion still
// means arrival, and no owed ack is stranded. The transport
// (host/dataplane/tcp) tells it what landed, writes what it owes into its
// batches, and stays free of its bookkeeping.
package putack

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp/waitpolicy"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// Acker sends the cumulative put acknowledgements of one incoming stream.
// It sits between the socket and the stream's buffered reader (the
// transport's reader calls Drained before each read from the socket), so
// an ack leaves just before each read: at most one per read (one per up
// to a read buffer of small puts), never held while the service waits for
// input, and never starved by a stream that keeps the buffer full.
//
// Piggybacking: an ack need not cost a write and a wake-up of its own.
// When one of our lanes to the peer carried something since the last time
// the input drained (traffic flows both ways, as in a ping-pong), the ack
// is left for them instead: the next batch any of them writes carries it
// (wire.MsgAck, naming this stream, through Owed and Claim) in the same
// writev, and the peer's reader, which reads that batch anyway, completes
// the puts. When no batch comes, the next test() or rmaProgress of this
// process sends it alone once it waited Lanes.Delay (Stale, on the
// caller's thread: no wake-up here), and a timer armed at most once per
// Lanes.Bound covers a process that stops calling.
//
// Holding adapts (Lanes.Adapt): a hold pays when a batch carries the ack
// and is in vain when the ack leaves alone after all. Where holds keep
// being in vain (a GIN round: each side's next batch comes only after its
// flush, which waits for the ack the other side holds, so both sides sat
// out Lanes.Delay), the stream acknowledges at once instead of holding,
// and holds again now and then to notice traffic that comes back
// (waitpolicy.Policy).
//
// The zero Acker acknowledges on the stream alone; Ride lets its acks
// ride the lanes.
type Acker struct {
	landed uint64 // puts of this stream that landed (the reader counts)
	buf    [wire.HeaderSize]byte

	// Shared with our lanes to the peer, which carry the acks (piggybacking).
	pub   atomic.Uint64 // landed, as published at the last drain
	sent  atomic.Uint64 // the highest count acknowledged, either way
	piggy atomic.Int32  // piggyOff, piggyOn (acks may ride our lanes) or piggyBarred
	lanes *Lanes        // the lanes that carry them; nil: none
	// hold keeps every acknowledgement back (tests: a lane that dies with
	// puts landed and not yet acknowledged, whatever the timing).
	hold  atomic.Bool
	alone atomic.Uint64 // acks written on the stream itself (Mesh.Stats)
	// holds decides whether to hold (Lanes.Adapt); holding is set while
	// a hold's outcome is pending; atOnce counts the acks written at
	// once because holding had not paid (Mesh.Stats).
	holds   waitpolicy.Policy
	holding atomic.Bool
	atOnce  atomic.Uint64
	outs    uint64       // the lanes' batches at the last drain (reader only)
	held    uint64       // the count last left for the lanes (reader only)
	due     atomic.Int64 // link.Now() after which Stale reports an owed ack
	tmu     sync.Mutex   // guards armed and the timer's state
	armed   bool
	timer   *time.Timer // the bound when nobody calls: never stopped, so
	// that arming it costs no wake-up per ack (a stopped timer still
	// wakes a parked poller at its old deadline)
}

// Lanes is what the acks that ride see of a link's lanes to the peer; the
// link's ackers share one.
type Lanes struct {
	// Batches are the lanes' counts of the batches they wrote: a change
	// since the stream last drained means traffic flows both ways.
	Batches []*atomic.Uint64
	// Delay is how long an ack left for the lanes waits for a batch
	// before a caller sends it alone (Stale), and Bound how long at most
	// when nobody calls (the timer), in nanoseconds. They only matter when
	// a prediction that a lane will write soon was wrong. Pointers to the
	// transport's tunables: tests change them while timers read them.
	Delay, Bound *atomic.Int64
	// Alone writes the owed acks with no batch, on an open lane (the
	// timer: no batch carried them in time).
	Alone func()
	// Adapt holds an ack for a batch only while holding pays (the
	// Acker's doc); false holds whenever a lane wrote since the last
	// drain.
	Adapt bool
}

// written counts the batches the lanes wrote.
func (l *Lanes) written() uint64 {
	var n uint64
	for _, b := range l.Batches {
		n += b.Load()
	}
	return n
}

// Ride lets the stream's acks ride lanes (the transport's start, before
// the stream is served). A link beside a fabric endpoint does not call
// it: its staged puts' window is reaped by whichever reader acks them.
func (a *Acker) Ride(lanes *Lanes) {
	a.lanes = lanes
	a.timer = time.AfterFunc(time.Hour, a.expire)
	a.timer.Stop()
	a.piggy.Store(piggyOn)
}

// Stop stops the timer (the link's teardown).
func (a *Acker) Stop() {
	if a.timer != nil {
		a.timer.Stop()
	}
}

// Land counts a put of the stream that was served, landed or rejected
// (the reader only).
func (a *Acker) Land() { a.landed++ }

// Unacked is how many puts landed that no ack covers yet (the reader
// only).
func (a *Acker) Unacked() uint64 { return a.landed - a.sent.Load() }

// Drained runs when the stream's reader has consumed everything it read:
// the acks of what landed leave now, on in, or ride the lanes' next
// batch. Only the holder of the stream's reading role calls it.
func (a *Acker) Drained(in *net.TCPConn) error {
	if a.landed == a.sent.Load() {
		return nil
	}
	if a.lanes != nil && a.Rides() {
		if a.held == a.landed && link.Now() < a.due.Load() {
			// Already left for the lanes, and a caller polling the stream
			// drains it again and again before a lane writes: the ack
			// waits its Delay, as it would for the service.
			return nil
		}
		if n := a.lanes.written(); n != a.outs {
			// A lane wrote since the last drain: expect one again. The
			// deadline goes before the count: a caller that sees the count
			// owed (Owed) must see how long it may wait for a batch
			// (Stale), or it sends the ack alone at once.
			a.outs = n
			wait := a.lanes.Delay.Load()
			if a.lanes.Adapt && !a.holds.Waiting() {
				// Holds have not paid lately: the initiator would wait.
				// The ack is owed stale at once: the next test() or
				// rmaProgress of this process sends it alone on a lane
				// (the peer reads our lanes on its polling thread, where
				// an ack on this stream would wait for its replies
				// reader to wake), and the timer when nobody calls. Not
				// written here: a reader that blocked writing to a lane
				// whose peer blocks the same way would deadlock both.
				wait = 0
				a.atOnce.Add(1)
			} else {
				a.holding.Store(true)
			}
			a.held = a.landed
			a.due.Store(link.Now() + wait)
			a.pub.Store(a.landed)
			a.Arm()
			return nil
		}
	}
	return a.Flush(in) // publishes the count too
}

// Flush acknowledges every put counted so far, if any is new, on the
// incoming stream in itself. Only the holder of the stream's reading role
// writes that stream.
func (a *Acker) Flush(in *net.TCPConn) error {
	a.pub.Store(a.landed)
	if a.hold.Load() || !a.Claim(a.landed) {
		return nil
	}
	h := wire.Header{Typ: wire.MsgPutAck, Seq: a.landed}
	h.Encode(a.buf[:])
	a.WentAlone()
	if _, err := in.Write(a.buf[:]); err != nil {
		return fmt.Errorf("acknowledge puts: %w", err)
	}
	a.alone.Add(1)
	return nil
}

// Rode notes that a batch of our lanes carried the acks (Claim): a
// pending hold paid.
func (a *Acker) Rode() {
	if a.holding.Load() && a.holding.Swap(false) {
		a.holds.Paid()
	}
}

// WentAlone notes that the acks left with no batch, on a lane or on the
// stream (Claim): a pending hold was in vain.
func (a *Acker) WentAlone() {
	if a.holding.Load() && a.holding.Swap(false) {
		a.holds.Vain()
	}
}

// AtOnce counts the acks written at once because holding had not paid
// (Mesh.Stats).
func (a *Acker) AtOnce() uint64 { return a.atOnce.Load() }

// Claim records n as acknowledged; false when a count as high was
// already sent. The peer ignores a count below one it has seen (the two
// ways to send one travel on different streams).
func (a *Acker) Claim(n uint64) bool {
	for {
		s := a.sent.Load()
		if n <= s {
			return false
		}
		if a.sent.CompareAndSwap(s, n) {
			return true
		}
	}
}

// Owed is the published count a lane's batch should carry, 0 when none.
func (a *Acker) Owed() uint64 {
	n := a.pub.Load()
	if n <= a.sent.Load() || !a.Rides() || a.hold.Load() {
		return 0
	}
	return n
}

// Arm starts the bound unless it runs; it is not stopped when a lane
// carries the ack, so a busy stream arms it once per Lanes.Bound at most.
// Only an acker that rides arms it.
func (a *Acker) Arm() {
	a.tmu.Lock()
	if !a.armed {
		a.armed = true
		a.timer.Reset(time.Duration(a.lanes.Bound.Load()))
	}
	a.tmu.Unlock()
}

// Stale reports an owed ack that waited Lanes.Delay for a batch in vain.
func (a *Acker) Stale() bool { return a.Owed() != 0 && link.Now() >= a.due.Load() }

// expire: no batch carried the ack in time; a lane sends it alone. (A
// stream whose acks do not ride sends them as it drains.)
func (a *Acker) expire() {
	a.tmu.Lock()
	a.armed = false
	a.tmu.Unlock()
	if a.Rides() {
		a.lanes.Alone()
	}
}

// Rehome: a lane failed over, and a count it had taken may have died with
// it. The next carry repeats the whole count (the peer keeps the highest
// it saw), on a live lane; the timer covers a link that stays quiet.
func (a *Acker) Rehome() {
	if a.Rides() {
		a.sent.Store(0)
		a.Arm()
	}
}

// Nacked: a put of this stream is rejected. Its nack travels on the
// incoming stream, which the peer reads apart from the lanes, so an ack
// covering the put must follow it on that same stream: no more
// piggybacking on this stream (rejections are failures, not a fast path).
func (a *Acker) Nacked() { a.piggy.Store(piggyBarred) }

// Piggybacking states (Acker.piggy): off (the link's acks never ride:
// beside a fabric endpoint), on, or barred for good by a nack.
const (
	piggyOff int32 = iota
	piggyOn
	piggyBarred
)

// Rides reports whether acks may ride the lanes.
func (a *Acker) Rides() bool { return a.piggy.Load() == piggyOn }

// Alone counts the acks written on the stream itself (Mesh.Stats).
func (a *Acker) Alone() uint64 { return a.alone.Load() }

// State is what the stall report shows of the acker: the count published
// at the last drain, the highest sent, and whether the timer is armed.
func (a *Acker) State() (pub, sent uint64, armed bool) {
	a.tmu.Lock()
	armed = a.armed
	a.tmu.Unlock()
	return a.pub.Load(), a.sent.Load(), armed
}
