// Package ring holds Ring, the growable FIFO the TCP lanes queue their
// work in (host/dataplane: the ops queue, outstanding gets, unacknowledged
// puts, the resend ring). It is generic over the element, so an element is
// stored by value (no interface boxing), and it allocates only when it
// grows: when a push finds it full, it doubles. Log (log.go) is the other
// shape: a fixed ring of the last entries written, for diagnostics.
package ring

// Ring is a FIFO of T on a circular buffer. The zero value is an empty
// ring with no room (its first push allocates); New gives it room. A Ring
// is not safe for concurrent use: its owner locks around it.
type Ring[T any] struct {
	buf  []T
	head int // index of the oldest element
	n    int // elements held
}

// New returns a ring with room for size elements.
func New[T any](size int) Ring[T] { return Ring[T]{buf: make([]T, size)} }

// Len is the number of elements held.
func (r *Ring[T]) Len() int { return r.n }

// Cap is the number held before the next push grows the ring.
func (r *Ring[T]) Cap() int { return len(r.buf) }

// At is the i-th oldest element, 0 <= i < Len, in place: a caller may
// change it.
func (r *Ring[T]) At(i int) *T {
	if uint(i) >= uint(r.n) {
		panic("ring: index out of range")
	}
	return &r.buf[(r.head+i)%len(r.buf)]
}

// Push appends v as the newest element, growing the ring when it is full.
func (r *Ring[T]) Push(v T) {
	if r.n == len(r.buf) {
		r.grow(2 * len(r.buf))
	}
	r.buf[(r.head+r.n)%len(r.buf)] = v
	r.n++
}

// PushFront puts v back as the oldest element (one just popped).
func (r *Ring[T]) PushFront(v T) {
	if r.n == len(r.buf) {
		r.grow(2 * len(r.buf))
	}
	r.head = (r.head - 1 + len(r.buf)) % len(r.buf)
	r.buf[r.head] = v
	r.n++
}

// Pop removes and returns the oldest element, false when empty. Its slot
// is zeroed, so the ring keeps no pointer it held alive.
func (r *Ring[T]) Pop() (T, bool) {
	var zero T
	if r.n == 0 {
		return zero, false
	}
	v := r.buf[r.head]
	r.Drop()
	return v, true
}

// Drop removes the oldest element, zeroing its slot; nothing when empty.
func (r *Ring[T]) Drop() {
	if r.n == 0 {
		return
	}
	var zero T
	r.buf[r.head] = zero
	r.head = (r.head + 1) % len(r.buf)
	r.n--
}

// Clear removes every element, zeroing their slots; the room stays.
func (r *Ring[T]) Clear() {
	for r.n > 0 {
		r.Drop()
	}
	r.head = 0
}

// Grow makes room for at least size elements (no change when there is).
func (r *Ring[T]) Grow(size int) {
	if size > len(r.buf) {
		r.grow(size)
	}
}

// grow moves the elements, oldest first, into a new buffer of size
// elements (at least one).
func (r *Ring[T]) grow(size int) {
	nb := make([]T, max(size, 1))
	for i := 0; i < r.n; i++ {
		nb[i] = r.buf[(r.head+i)%len(r.buf)]
	}
	r.buf, r.head = nb, 0
}
