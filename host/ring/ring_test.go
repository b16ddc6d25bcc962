package ring

import (
	"slices"
	"testing"
)

// check compares the ring with the slice model, element by element.
func check(t *testing.T, r *Ring[int], model []int) {
	t.Helper()
	if r.Len() != len(model) {
		t.Fatalf("Len %d, model has %d", r.Len(), len(model))
	}
	if r.Cap() < r.Len() {
		t.Fatalf("Cap %d below Len %d", r.Cap(), r.Len())
	}
	for i, v := range model {
		if got := *r.At(i); got != v {
			t.Fatalf("At(%d) = %d, model has %d", i, got, v)
		}
	}
}

// run applies the operations ops names to a ring and a slice model.
func run(t *testing.T, start int, ops []byte) {
	r := New[int](start)
	var model []int
	next := 0
	for _, o := range ops {
		switch o % 7 {
		case 0, 1, 2: // pushes outnumber pops, so the ring grows
			next++
			r.Push(next)
			model = append(model, next)
		case 3:
			v, ok := r.Pop()
			if ok != (len(model) > 0) {
				t.Fatalf("Pop ok %v with %d held", ok, len(model))
			}
			if ok {
				if v != model[0] {
					t.Fatalf("Pop %d, model has %d", v, model[0])
				}
				model = model[1:]
			}
		case 4:
			next++
			r.PushFront(next)
			model = slices.Insert(model, 0, next)
		case 5:
			r.Drop()
			if len(model) > 0 {
				model = model[1:]
			}
		case 6:
			if len(model) > 0 {
				i := int(o) % len(model)
				*r.At(i) = -model[i]
				model[i] = -model[i]
			}
		}
		check(t, &r, model)
	}
	r.Grow(r.Cap() + 3)
	check(t, &r, model)
	r.Clear()
	check(t, &r, nil)
	for i := range r.buf {
		if r.buf[i] != 0 {
			t.Fatalf("slot %d not zeroed: %d", i, r.buf[i])
		}
	}
}

// TestRingModel: sequences of operations, wrapping and growing, agree
// with a slice.
func TestRingModel(t *testing.T) {
	for _, start := range []int{0, 1, 2, 3, 16} {
		ops := make([]byte, 500)
		for i := range ops {
			ops[i] = byte(i*31 + i*i*7 + start)
		}
		run(t, start, ops)
	}
}

// FuzzRing: any sequence of operations agrees with the slice model.
func FuzzRing(f *testing.F) {
	f.Add(uint8(1), []byte{0, 0, 3, 0, 4, 5, 6, 0, 0, 0, 3, 3})
	f.Add(uint8(0), []byte{4, 4, 4, 3, 3, 3, 3})
	f.Fuzz(func(t *testing.T, start uint8, ops []byte) {
		run(t, int(start%8), ops)
	})
}

// TestPopZeroes: a popped slot keeps no pointer alive.
func TestPopZeroes(t *testing.T) {
	r := New[*int](2)
	x := 1
	r.Push(&x)
	if v, ok := r.Pop(); !ok || v != &x {
		t.Fatal("Pop lost the element")
	}
	if r.buf[0] != nil {
		t.Fatal("Pop left the pointer in its slot")
	}
	if _, ok := r.Pop(); ok {
		t.Fatal("Pop on an empty ring")
	}
}

var pointee int

// TestNoAllocs: pushes and pops within the room allocate nothing, with
// a struct element as the lanes use.
func TestNoAllocs(t *testing.T) {
	type op struct {
		a, b, c uint64
		p       *int
	}
	r := New[op](4)
	a := testing.AllocsPerRun(1000, func() {
		r.Push(op{a: 1, c: 4, p: &pointee})
		r.Push(op{a: 2})
		r.At(1).b = 3
		r.PushFront(op{})
		r.Pop()
		r.Drop()
		r.Pop()
	})
	if a != 0 {
		t.Fatalf("%.0f allocations per round", a)
	}
}

func BenchmarkPushPop(b *testing.B) {
	r := New[[10]uint64](1024)
	var v [10]uint64
	for i := 0; i < b.N; i++ {
		r.Push(v)
		r.Pop()
	}
}

// TestLogKeepsTheLast: a Log of 4 holds the last 4 entries written, by
// number, across wrap-around; an empty one holds none.
func TestLogKeepsTheLast(t *testing.T) {
	l := NewLog[int](4)
	if first, next := l.Window(); first != 0 || next != 0 {
		t.Fatalf("empty log window [%d, %d)", first, next)
	}
	for v := 0; v < 10; v++ {
		*l.Claim() = v
	}
	first, next := l.Window()
	if first != 6 || next != 10 {
		t.Fatalf("window [%d, %d), want [6, 10)", first, next)
	}
	for i := first; i < next; i++ {
		if got := *l.At(i); got != int(i) {
			t.Fatalf("entry %d holds %d", i, got)
		}
	}
}
