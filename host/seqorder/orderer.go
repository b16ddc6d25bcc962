// Package seqorder keeps a peer's operations in sequence order across the
// paths that carry them (several TCP lanes, libfabric rails, staged puts).
// Both ends of a sequence number are here: the target's Orderer, which
// applies a signal only once every operation numbered before it has
// landed (signals stay strong however the puts were spread), and the
// initiator's Window, which keeps its numbers from running so far ahead of
// its oldest incomplete one that the target could misread them. Sequence
// numbers start at 1; puts and signals each take one.
package seqorder

import (
	"fmt"
	"sync"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
)

// Signal is a signal word waiting in an Orderer: Apply adds to it once
// everything before it landed, then Release lets go of what it holds (a
// registration's pin). The zero value is no signal (Valid false).
type Signal interface {
	Valid() bool
	Apply(add uint64) error
	Release()
}

// Orderer applies a peer's signals in sequence order when its operations
// arrive over several paths. Its zero value is ready; numbers may land at
// most Window past the first missing one.
type Orderer[S Signal] struct {
	OnErr  func(error) // reports a signal that could not be applied
	Window uint64      // 0: config.DefaultOrderWindow
	mu     sync.Mutex
	next   uint64 // every sequence number below next has been applied
	ring   []slot[S]
}

type slot[S Signal] struct {
	state uint8 // 0 not yet, 1 landed, 2 signal waiting
	sig   S
	add   uint64
}

// Done records that seq landed; sig, when valid, is the signal word that
// seq adds add to once everything before it has landed. It refuses, and
// changes nothing, a number that already landed or lies Window or more
// past the first missing one: neither happens on a healthy stream, and the
// window bounds the ring (and its memory) whatever a peer sends.
func (o *Orderer[S]) Done(seq uint64, sig S, add uint64) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.next == 0 {
		o.next = 1
	}
	if seq < o.next {
		return fmt.Errorf("sequence number %d arrived again (every number below %d has landed)", seq, o.next)
	}
	window := o.Window
	if window == 0 {
		window = config.DefaultOrderWindow
	}
	if seq-o.next >= window {
		return fmt.Errorf("sequence number %d is %d past the first missing one (%d), beyond the window of %d", seq, seq-o.next, o.next, window)
	}
	for seq-o.next >= uint64(len(o.ring)) {
		o.grow()
	}
	s := &o.ring[seq%uint64(len(o.ring))]
	if s.state != 0 {
		return fmt.Errorf("sequence number %d arrived again", seq)
	}
	s.state, s.sig, s.add = 1, sig, add
	if sig.Valid() {
		s.state = 2
	}
	for {
		s := &o.ring[o.next%uint64(len(o.ring))]
		if s.state == 0 {
			return nil
		}
		if s.state == 2 {
			if err := s.sig.Apply(s.add); err != nil && o.OnErr != nil {
				o.OnErr(err)
			}
			s.sig.Release()
		}
		*s = slot[S]{}
		o.next++
	}
}

// Seen reports whether seq already landed (a resent put that did must not
// be applied again).
func (o *Orderer[S]) Seen(seq uint64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	next := max(o.next, 1)
	if seq < next {
		return true
	}
	if seq-next >= uint64(len(o.ring)) {
		return false
	}
	return o.ring[seq%uint64(len(o.ring))].state != 0
}

// grow doubles the window of sequence numbers that may land out of order.
func (o *Orderer[S]) grow() {
	n := max(2*len(o.ring), 1024)
	nr := make([]slot[S], n)
	for i, s := range o.ring {
		if s.state != 0 {
			// slot i held the sequence number congruent to i within the
			// current window [next, next+len)
			seq := o.next + (uint64(i)-o.next%uint64(len(o.ring))+uint64(len(o.ring)))%uint64(len(o.ring))
			nr[seq%uint64(n)] = s
		}
	}
	o.ring = nr
}

// Passed reports whether every sequence number up to seq was applied
// (a goodbye is acknowledged then).
func (o *Orderer[S]) Passed(seq uint64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.next > seq
}

// Next is the first sequence number that has not landed.
func (o *Orderer[S]) Next() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return max(o.next, 1)
}

// Slots is the size of the ring of numbers landed out of order (it
// grows on demand, never past the window's bound).
func (o *Orderer[S]) Slots() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.ring)
}

// Unwrap turns the low bits of a sequence number (the CQ data of a
// provider with 4 bytes of it) back into the number: every number that can
// still arrive is at least next, and fewer than 1<<bits are outstanding.
func (o *Orderer[S]) Unwrap(w uint64, bits uint) uint64 {
	if bits >= 64 {
		return w
	}
	o.mu.Lock()
	next := max(o.next, 1)
	o.mu.Unlock()
	return next + (w-next)&(1<<bits-1)
}
