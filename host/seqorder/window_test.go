package seqorder

import "testing"

// TestSeqWindow: the guard's bookkeeping, completions in any order.
func TestSeqWindow(t *testing.T) {
	w := NewWindow(8)
	for s := uint64(1); s <= 8; s++ {
		if !w.Fits(s) {
			t.Fatalf("%d does not fit an empty window", s)
		}
	}
	if w.Fits(9) {
		t.Fatal("9 fits while 1 is in flight, window 8")
	}
	for _, s := range []uint64{3, 2, 8, 5} {
		w.Complete(s)
	}
	if w.Fits(9) {
		t.Fatal("9 fits while 1 is in flight")
	}
	w.Complete(1) // 1, 2, 3 done: low is 4
	if !w.Fits(11) || w.Fits(12) {
		t.Fatalf("after 1..3 completed: low %d", w.low)
	}
	w.Complete(4) // 5 done too: low 6
	w.Complete(0)
	w.Complete(2) // again: ignored
	if w.low != 6 || !w.Fits(13) || w.Fits(14) {
		t.Fatalf("low %d, want 6", w.low)
	}
	for s := uint64(6); s <= 100; s++ {
		if !w.Fits(s) {
			t.Fatalf("%d does not fit with low %d", s, w.low)
		}
		w.Complete(s)
	}
	if w.low != 101 {
		t.Fatalf("low %d after completing everything up to 100", w.low)
	}
}
