package profile

import (
	"bufio"
	"fmt"
	"io"
	"sync/atomic"
	"time"
)

// Point is a moment of one small operation's way from the initiator's
// call to the target's signal. A trace records each point met, with the
// host's realtime clock, which every process of the host shares, so that
// the points of two ranks line up with each other and, through a
// calibration the application makes (test/gpu/gin_pingpong.cu), with a
// kernel's %globaltimer: where a GPU-initiated hop's time goes, end to end.
type Point uint8

// The points. A marked put+signal meets them in the order post, plan,
// queue, copy, wire, read, mark, sigcall, signal.
const (
	PtPost   Point = iota + 1 // initiator: a data call (iput, iputSignal, iget) entered
	PtCopy                    // initiator: its device copy handed to the device agent with a mark
	PtWire                    // initiator: its header written to the lane
	PtRead                    // target: a marked header looked at (NCCL's thread or the service)
	PtMark                    // target: the sender's mark seen
	PtSignal                  // target: the signal applied or queued on the device
	// Finer points within the plugin's own parts, numbered after the
	// first six so that a trace's names keep their meaning.
	PtPlan    // initiator: the data plane's post entered (the call's own work done)
	PtQueue   // initiator: a marked device copy's queue entered (routing done)
	PtSigCall // target: the signal's device write entered (its order, and its mark, met)
)

var pointNames = [...]string{PtPost: "post", PtCopy: "copy", PtWire: "wire", PtRead: "read", PtMark: "mark", PtSignal: "signal",
	PtPlan: "plan", PtQueue: "queue", PtSigCall: "sigcall"}

// String is the point's name in a trace file.
func (p Point) String() string {
	if int(p) < len(pointNames) && pointNames[p] != "" {
		return pointNames[p]
	}
	return fmt.Sprintf("point%d", p)
}

// TraceCap is how many points a process records; later ones are dropped.
const TraceCap = 1 << 17

var (
	traceOn atomic.Bool
	traceN  atomic.Uint64
	traceT  []atomic.Int64
	traceP  []atomic.Uint32
)

// SetTrace turns the trace on (allocating its TraceCap entries once) or
// off (host/plugin, at init; never on the data path).
func SetTrace(b bool) {
	if b && traceT == nil {
		traceT = make([]atomic.Int64, TraceCap)
		traceP = make([]atomic.Uint32, TraceCap)
	}
	traceOn.Store(b)
}

// Tracing reports whether points are recorded.
func Tracing() bool { return traceOn.Load() }

// Mark records point p now, where the trace is on: one atomic load when
// off, an atomic add and a clock read when on, no allocation.
func Mark(p Point) {
	if !traceOn.Load() {
		return
	}
	i := traceN.Add(1) - 1
	if i >= TraceCap {
		return
	}
	traceT[i].Store(time.Now().UnixNano())
	traceP[i].Store(uint32(p))
}

// WriteTrace writes the points recorded so far, one per line: the point's
// name and its realtime in nanoseconds, after a header line naming who.
func WriteTrace(w io.Writer, who string) error {
	bw := bufio.NewWriter(w)
	n := min(traceN.Load(), TraceCap)
	fmt.Fprintf(bw, "# NET/wasm trace of %s: %d points (realtime ns)\n", who, n)
	for i := range n {
		if p := Point(traceP[i].Load()); p != 0 {
			fmt.Fprintf(bw, "%s %d\n", p, traceT[i].Load())
		}
	}
	return bw.Flush()
}

// ResetTrace forgets every point (tests).
func ResetTrace() { traceN.Store(0) }
