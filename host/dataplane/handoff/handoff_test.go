package handoff

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// TestOneFinisher: values handed over one after another, each raced for
// by a poller (ready on every other look) and a waiting taker, are each
// taken exactly once, with the value that was put.
func TestOneFinisher(t *testing.T) {
	const n = 300
	var s Slot[int]
	var got [n]atomic.Int32
	var looks atomic.Uint64
	var wg sync.WaitGroup
	done := make(chan struct{})
	taken := make(chan struct{}, 1)
	finish := func(v int) {
		got[v].Add(1)
		taken <- struct{}{}
	}
	// take runs until done: the poller (ready on every other look) and
	// the backstop each race for every value.
	race := func(take func() (int, bool)) {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			if v, ok := take(); ok {
				finish(v)
			}
			runtime.Gosched()
		}
	}
	wg.Add(2)
	go race(func() (int, bool) { return s.Poll(func() bool { return looks.Add(1)%2 == 0 }) })
	go race(s.Take)
	for i := range n {
		s.Put(i)
		<-taken // the slot is empty again before the next Put
	}
	close(done)
	wg.Wait()
	for i := range n {
		if c := got[i].Load(); c != 1 {
			t.Fatalf("value %d taken %d times", i, c)
		}
	}
	if s.Handed() != n || s.Polled() > n {
		t.Fatalf("handed %d, polled %d, want %d handed", s.Handed(), s.Polled(), n)
	}
}

// TestPollNotReady: a value that is not ready stays for the next look or
// a taker; an empty slot gives nothing.
func TestPollNotReady(t *testing.T) {
	var s Slot[string]
	if _, ok := s.Poll(func() bool { return true }); ok {
		t.Fatal("Poll took from an empty slot")
	}
	if _, ok := s.Take(); ok {
		t.Fatal("Take took from an empty slot")
	}
	s.Put("batch")
	if _, ok := s.Poll(func() bool { return false }); ok || !s.Waiting() {
		t.Fatal("a value not ready was taken, or not put back")
	}
	if v, ok := s.Take(); !ok || v != "batch" || s.Waiting() {
		t.Fatalf("Take: %q %v, waiting %v", v, ok, s.Waiting())
	}
	if s.Polled() != 0 || s.Handed() != 1 {
		t.Fatalf("polled %d handed %d", s.Polled(), s.Handed())
	}
}
