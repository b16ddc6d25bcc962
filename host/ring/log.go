package ring

import "sync/atomic"

// Log keeps the last len(Slots) entries written, without a lock: a writer
// claims a slot and fills it (with atomics of its own); a reader visits
// the held ones by number. A reader racing a writer may see an entry half
// filled, so a Log is for diagnostics (the stall report's traces).
type Log[E any] struct {
	next  atomic.Uint64
	Slots []E
}

// NewLog returns a Log of n entries.
func NewLog[E any](n int) *Log[E] { return &Log[E]{Slots: make([]E, n)} }

// Claim returns the slot of the next entry.
func (l *Log[E]) Claim() *E { return &l.Slots[(l.next.Add(1)-1)%uint64(len(l.Slots))] }

// Window returns the number of the oldest entry held and of the next one
// to be written.
func (l *Log[E]) Window() (first, next uint64) {
	next = l.next.Load()
	if n := uint64(len(l.Slots)); next > n {
		first = next - n
	}
	return first, next
}

// At returns entry number i (between Window's bounds).
func (l *Log[E]) At(i uint64) *E { return &l.Slots[i%uint64(len(l.Slots))] }
