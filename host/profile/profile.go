// Package profile keeps latency histograms of the data path's stages
// while NCCL_RMA_WASM_PROFILE is set, and writes their percentiles when a
// communicator closes: where a small operation's time goes, seen from the
// plugin (the caller's cadence, the queue, the device copies, the wire and
// the target), on hardware where nothing else can look (a GPU under NCCL's
// GIN proxy). Off, each stage pays one atomic load.
package profile

import (
	"fmt"
	"io"
	"math/bits"
	"sync/atomic"
	"time"
)

var on atomic.Bool

// SetOn turns the histograms on or off (host/plugin, at init).
func SetOn(b bool) { on.Store(b) }

// On reports whether stages are timed.
func On() bool { return on.Load() }

var epoch = time.Now()

// Now is the profile's clock: monotonic nanoseconds, never 0.
func Now() int64 { return int64(time.Since(epoch)) + 1 }

// sub buckets per power of two: quantiles within 25%.
const (
	sub      = 4
	nBuckets = 4 + 62*sub
)

// bucket is the histogram bucket of ns nanoseconds.
func bucket(ns uint64) int {
	if ns < 4 {
		return int(ns)
	}
	e := bits.Len64(ns) - 1 // >= 2
	return 4 + (e-2)*sub + int(ns>>(e-2)) - 4
}

// lower is the smallest value of bucket i.
func lower(i int) uint64 {
	if i < 4 {
		return uint64(i)
	}
	e, m := (i-4)/sub+2, (i-4)%sub
	return uint64(4+m) << (e - 2)
}

// Series is one stage's histogram.
type Series struct {
	Name string
	n    atomic.Uint64
	b    [nBuckets]atomic.Uint64
}

// Add records one duration of ns nanoseconds.
func (s *Series) Add(ns int64) {
	if ns < 0 {
		ns = 0
	}
	s.n.Add(1)
	s.b[bucket(uint64(ns))].Add(1)
}

// Since records the time since t0 (a Now); t0 0 records nothing.
func (s *Series) Since(t0 int64) {
	if t0 != 0 {
		s.Add(Now() - t0)
	}
}

// Count is how many durations were recorded.
func (s *Series) Count() uint64 { return s.n.Load() }

// Quantile is the lower bound of the bucket holding quantile q (0..1).
func (s *Series) Quantile(q float64) time.Duration {
	n := s.n.Load()
	if n == 0 {
		return 0
	}
	want := uint64(q*float64(n-1)) + 1
	seen := uint64(0)
	for i := range s.b {
		if seen += s.b[i].Load(); seen >= want {
			return time.Duration(lower(i))
		}
	}
	return time.Duration(lower(nBuckets - 1))
}

func (s *Series) reset() {
	s.n.Store(0)
	for i := range s.b {
		s.b[i].Store(0)
	}
}

// The stages, in the order an operation meets them.
var (
	CallGap    = &Series{Name: "caller: gap between data calls (iput, iputSignal, iget)"}
	InPost     = &Series{Name: "caller: time inside a data call (iput, iputSignal, iget)"}
	ProgGap    = &Series{Name: "caller: gap between rmaProgress calls (the proxy's loop)"}
	InProgress = &Series{Name: "caller: time inside rmaProgress"}
	InTest     = &Series{Name: "caller: time inside test()"}
	Queued     = &Series{Name: "initiator: posted to written to the wire"}
	GatherWait = &Series{Name: "initiator: wait for a batch's gathered device copies"}
	StageOut   = &Series{Name: "wire: device payload staged out synchronously (put, get served)"}
	SelfCopy   = &Series{Name: "initiator: device copy of an operation to its own rank"}
	TargetHost = &Series{Name: "target: put received and landed (host memory)"}
	TargetDev  = &Series{Name: "target: put received and landed or queued (device memory)"}
	DevSignal  = &Series{Name: "target: device signal applied or queued"}
	MarkWait   = &Series{Name: "target: wait for the sender agent's mark (not there at the first look)"}
	InboxWait  = &Series{Name: "target: wait for our agent to take an inbox entry (not at the first look)"}
	CopyReaped = &Series{Name: "initiator: queued device copy, queued to seen executed"}
	FirstPart  = &Series{Name: "request: issued to its first part done (of several)"}
	PutDone    = &Series{Name: "request: put issued to completed"}
	GetDone    = &Series{Name: "request: get issued to completed"}
	Noticed    = &Series{Name: "request: completed to reported by test()"}
	all        = []*Series{CallGap, InPost, ProgGap, InProgress, InTest, Queued, GatherWait, StageOut, SelfCopy, TargetHost, TargetDev, DevSignal, MarkWait, InboxWait, CopyReaped, FirstPart, PutDone, GetDone, Noticed}
)

var lastCall atomic.Int64

// Call records the gap since the previous data call of this process.
func Call() {
	now := Now()
	if prev := lastCall.Swap(now); prev != 0 {
		CallGap.Add(now - prev)
	}
}

var lastProgress atomic.Int64

// ProgressCall records the gap since the previous rmaProgress call of this
// process (NCCL's proxies call it once per loop) and returns the time now.
func ProgressCall() int64 {
	now := Now()
	if prev := lastProgress.Swap(now); prev != 0 {
		ProgGap.Add(now - prev)
	}
	return now
}

// Write writes every stage that recorded something: count and the 50th,
// 90th and 99th percentiles (each the lower bound of its bucket, within
// 25%). who names the writer (a rank).
func Write(w io.Writer, who string) {
	fmt.Fprintf(w, "=== NET/wasm profile of %s (NCCL_RMA_WASM_PROFILE; since init; percentiles within 25%%)\n", who)
	for _, s := range all {
		if n := s.Count(); n > 0 {
			fmt.Fprintf(w, "  %-62s n=%-8d p50 %10s  p90 %10s  p99 %10s\n", s.Name, n,
				us(s.Quantile(0.5)), us(s.Quantile(0.9)), us(s.Quantile(0.99)))
		}
	}
}

func us(d time.Duration) string { return fmt.Sprintf("%.1f µs", float64(d)/1e3) }

// Reset empties every stage (tests).
func Reset() {
	for _, s := range all {
		s.reset()
	}
	lastCall.Store(0)
	lastProgress.Store(0)
}
