package seqorder

import "sync"

// Window keeps an initiator (a fabric link) from posting a sequence
// number size or more past the oldest of its numbers whose operation has
// not completed.
// The target reads only the low bits of a write's number from the CQ data
// (16 of them with 4-byte CQ data) and unwraps them relative to its first
// missing number, which is never below our oldest incomplete one
// (completion means delivery); and its orderer drops a peer whose numbers
// run past its window. Without the guard one slow operation (a large
// write) followed by many small ones completing could wrap the field and
// land a put under the wrong number. An operation that does not fit waits
// in the link's queue, in order, like one that found no room.
type Window struct {
	mu   sync.Mutex
	low  uint64   // every number below low completed
	done []uint64 // bitmap ring of completed numbers at or above low
	size uint64   // power of two
}

// NewWindow makes a window of size numbers, a power of two.
func NewWindow(size uint64) *Window {
	return &Window{low: 1, done: make([]uint64, (size+63)/64), size: size}
}

// Fits reports whether number seq may be posted now.
func (w *Window) Fits(seq uint64) bool {
	w.mu.Lock()
	ok := seq < w.low || seq-w.low < w.size
	w.mu.Unlock()
	return ok
}

// Size is the window's size in numbers.
func (w *Window) Size() uint64 { return w.size }

// Complete records that the operation numbered seq completed.
func (w *Window) Complete(seq uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if seq < w.low || seq-w.low >= w.size {
		return // not ours to track (0, or already passed)
	}
	i := seq % w.size
	w.done[i/64] |= 1 << (i % 64)
	for {
		j := w.low % w.size
		if w.done[j/64]&(1<<(j%64)) == 0 {
			return
		}
		w.done[j/64] &^= 1 << (j % 64)
		w.low++
	}
}
