package profile

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestBuckets: every value falls in a bucket whose bounds hold it, and
// buckets are within 25% of their value.
func TestBuckets(t *testing.T) {
	for _, v := range []uint64{0, 1, 3, 4, 5, 7, 8, 9, 15, 16, 1000, 12345, 1 << 40, 1<<63 - 1} {
		i := bucket(v)
		if i < 0 || i >= nBuckets {
			t.Fatalf("bucket(%d) = %d out of range", v, i)
		}
		if lo := lower(i); lo > v || (i+1 < nBuckets && lower(i+1) <= v) {
			t.Fatalf("%d in bucket %d [%d, %d)", v, i, lower(i), lower(i+1))
		}
		if v >= 4 && float64(v-lower(i)) > 0.25*float64(v) {
			t.Fatalf("%d: bucket lower bound %d more than 25%% below", v, lower(i))
		}
	}
}

// TestQuantilesAndWrite: quantiles of a known spread, and the report
// names each stage that recorded something and no other.
func TestQuantilesAndWrite(t *testing.T) {
	Reset()
	defer Reset()
	for i := 1; i <= 100; i++ {
		PutDone.Add(int64(time.Duration(i) * time.Microsecond))
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 50 * time.Microsecond}, {0.9, 90 * time.Microsecond}, {0.99, 99 * time.Microsecond}} {
		got := PutDone.Quantile(c.q)
		if got > c.want || float64(c.want-got) > 0.25*float64(c.want) {
			t.Errorf("quantile %.2f = %v, want within 25%% below %v", c.q, got, c.want)
		}
	}
	Call()
	Call()
	var b bytes.Buffer
	Write(&b, "rank 3")
	out := b.String()
	for _, want := range []string{"profile of rank 3", PutDone.Name, "n=100", CallGap.Name} {
		if !strings.Contains(out, want) {
			t.Fatalf("report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, GetDone.Name) {
		t.Fatalf("report names a stage that recorded nothing:\n%s", out)
	}
}

// TestTrace: points are recorded in order with a clock that does not run
// backwards, nothing is recorded while off, and past TraceCap the rest are
// dropped rather than written out of bounds.
func TestTrace(t *testing.T) {
	defer SetTrace(false)
	defer ResetTrace()
	Mark(PtPost) // off: nothing
	SetTrace(true)
	ResetTrace()
	for _, p := range []Point{PtPost, PtPlan, PtQueue, PtCopy, PtWire, PtRead, PtMark, PtSigCall, PtSignal} {
		Mark(p)
	}
	var b strings.Builder
	if err := WriteTrace(&b, "rank 1"); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 10 || !strings.Contains(lines[0], "rank 1: 9 points") {
		t.Fatalf("trace:\n%s", b.String())
	}
	var last int64
	for i, want := range []string{"post", "plan", "queue", "copy", "wire", "read", "mark", "sigcall", "signal"} {
		var name string
		var ts int64
		if _, err := fmt.Sscan(lines[i+1], &name, &ts); err != nil || name != want || ts < last {
			t.Fatalf("line %d %q: want %s at or after %d (%v)", i+1, lines[i+1], want, last, err)
		}
		last = ts
	}
	for range TraceCap + 10 {
		Mark(PtWire)
	}
	b.Reset()
	WriteTrace(&b, "full")
	if n := strings.Count(b.String(), "\n"); n != TraceCap+1 {
		t.Fatalf("a full trace wrote %d lines, want %d", n, TraceCap+1)
	}
}
