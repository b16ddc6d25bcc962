// Package handoff is a one-place hand-over of a piece of work between the
// thread that began it and whoever finishes it first: the beginner's own
// later calls, which finish it only once it is ready (a look, never a
// wait), or a backstop goroutine that waits for it. The TCP lanes use it
// for a batch whose device copies are still running
// (NCCL_RMA_WASM_GATHER_WRITER): NCCL's proxy thread polls it, the lane's
// writer goroutine is the backstop.
//
// Exactly one finisher takes a value: a claim is a compare-and-swap, and
// a poller that finds the work not ready puts it back. A waiting
// finisher yields while a poller looks.
package handoff

import (
	"runtime"
	"sync/atomic"
)

// The states of a Slot.
const (
	empty   int32 = iota
	waiting       // Put, not taken
	claimed       // a Poll is looking, or a finisher took it
)

// Slot holds at most one value handed over. The zero Slot is empty.
type Slot[T any] struct {
	v      T
	state  atomic.Int32
	handed atomic.Uint64
	polled atomic.Uint64
}

// Put hands v over. The slot must be empty (the caller owns what the
// value needs until a finisher takes it).
func (s *Slot[T]) Put(v T) {
	s.v = v
	s.state.Store(waiting) // after the value: a claim loads the state first
	s.handed.Add(1)
}

// Waiting reports whether a value waits to be taken (a hint: look with
// Poll or Take).
func (s *Slot[T]) Waiting() bool { return s.state.Load() == waiting }

// Poll takes the value if one waits, no one else is looking, and ready
// says it is ready; it never waits.
func (s *Slot[T]) Poll(ready func() bool) (v T, ok bool) {
	if !s.state.CompareAndSwap(waiting, claimed) {
		return v, false
	}
	if !ready() {
		s.state.Store(waiting)
		return v, false
	}
	s.polled.Add(1)
	return s.take(), true
}

// Take takes the value if one is handed over, waiting out a Poll that is
// looking at it; false when the slot is empty.
func (s *Slot[T]) Take() (v T, ok bool) {
	for !s.state.CompareAndSwap(waiting, claimed) {
		if s.state.Load() == empty {
			return v, false
		}
		runtime.Gosched()
	}
	return s.take(), true
}

func (s *Slot[T]) take() T {
	v := s.v
	var zero T
	s.v = zero // drop what it points to
	s.state.Store(empty)
	return v
}

// Handed counts the values handed over so far, and Polled those a Poll
// took.
func (s *Slot[T]) Handed() uint64 { return s.handed.Load() }
func (s *Slot[T]) Polled() uint64 { return s.polled.Load() }
