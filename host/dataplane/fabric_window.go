package dataplane

import "sync"

// fabSeqWindow is the most sequence numbers a fabric link lets run ahead
// of its oldest one that may still be in flight.
const fabSeqWindow = 1 << 16

// seqWindow keeps a fabric link from posting a sequence number size or
// more past the oldest of its numbers whose operation has not completed.
// The target reads only the low bits of a write's number from the CQ data
// (16 of them with 4-byte CQ data) and unwraps them relative to its first
// missing number, which is never below our oldest incomplete one
// (completion means delivery); and its orderer drops a peer whose numbers
// run past its window. Without the guard one slow operation (a large
// write) followed by many small ones completing could wrap the field and
// land a put under the wrong number. An operation that does not fit waits
// in the link's queue, in order, like one that found no room.
type seqWindow struct {
	mu   sync.Mutex
	low  uint64   // every number below low completed
	done []uint64 // bitmap ring of completed numbers at or above low
	size uint64   // power of two
}

func newSeqWindow(size uint64) *seqWindow {
	return &seqWindow{low: 1, done: make([]uint64, (size+63)/64), size: size}
}

// fits reports whether number seq may be posted now.
func (w *seqWindow) fits(seq uint64) bool {
	w.mu.Lock()
	ok := seq < w.low || seq-w.low < w.size
	w.mu.Unlock()
	return ok
}

// complete records that the operation numbered seq completed.
func (w *seqWindow) complete(seq uint64) {
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
