package plugin

import "testing"

// TestRequestLaneReset: a reused slot starts with no planned lane, so a
// flush (never planned) does not report the lane of the slot's last op in
// its completion record.
func TestRequestLaneReset(t *testing.T) {
	var p requestPool
	q, idx, ok := p.alloc()
	if !ok {
		t.Fatal("alloc failed")
	}
	if q.lane != -1 {
		t.Fatalf("a fresh slot has lane %d", q.lane)
	}
	q.lane = 5
	p.release(q, idx)
	q2, idx2, _ := p.alloc()
	if idx2 != idx {
		t.Fatalf("slot %d reused as %d; the test needs the same slot", idx, idx2)
	}
	if q2.lane != -1 {
		t.Fatalf("a reused slot keeps lane %d", q2.lane)
	}
}
