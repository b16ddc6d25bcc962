package nap

import (
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"
)

// TestNaps: naps of many goroutines at once each end, after their time
// (never before), and a stopped nap does not fire; with the keeper and
// with Go timers.
func TestNaps(t *testing.T) {
	for _, p := range []bool{true, false} {
		saved := precise
		precise = p
		t.Run(fmt.Sprint("precise=", p), testNaps)
		precise = saved
	}
}

func testNaps(t *testing.T) {
	// More naps at once than the keeper takes: the rest are Go timers,
	// and every one fires.
	many := make([]*Napper, 2*maxArmed)
	for i := range many {
		many[i] = New()
		many[i].Start(time.Duration(200+i) * time.Microsecond)
	}
	for _, n := range many {
		<-n.C()
		n.Stop()
	}

	var wg sync.WaitGroup
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			n := New()
			for k := 0; k < 50; k++ {
				d := time.Duration(50+(g*7+k*13)%400) * time.Microsecond
				start := time.Now()
				n.Sleep(d)
				if el := time.Since(start); el < d {
					t.Errorf("a nap of %v ended after %v", d, el)
					return
				}
			}
		}(g)
	}
	wg.Wait()

	n := New()
	// A nap stopped before it was due never fires; an hour is never due
	// here, however long this machine pauses between the two calls.
	n.Start(time.Hour)
	n.Stop()
	select {
	case <-n.C():
		t.Fatal("a stopped nap fired")
	case <-time.After(20 * time.Millisecond):
	}
	keeper.mu.Lock()
	left := len(keeper.armed)
	keeper.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d naps still armed", left)
	}
	// Restarting replaces the nap: it fires once.
	n.Start(time.Hour)
	n.Start(100 * time.Microsecond)
	<-n.C()
	select {
	case <-n.C():
		t.Fatal("a restarted nap fired twice")
	case <-time.After(5 * time.Millisecond):
	}
}

// BenchmarkNap reports how late a 200 µs nap ends here (ns/op is the
// whole nap; late-p50-us the overshoot's median), beside Go's timer in
// BenchmarkTimer: on an idle process the timer rounds up to a millisecond.
func BenchmarkNap(b *testing.B) {
	saved := precise
	precise = true
	defer func() { precise = saved }()
	n := New()
	late(b, func() { n.Sleep(200 * time.Microsecond) })
}

func BenchmarkTimer(b *testing.B) {
	tm := time.NewTimer(time.Hour)
	late(b, func() {
		tm.Reset(200 * time.Microsecond)
		<-tm.C
	})
}

func late(b *testing.B, f func()) {
	var d []time.Duration
	for i := 0; i < b.N; i++ {
		s := time.Now()
		f()
		d = append(d, time.Since(s)-200*time.Microsecond)
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	b.ReportMetric(float64(d[len(d)/2])/1e3, "late-p50-us")
}
