package profile_test

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/profile"
)

// The data path adds a duration to a stage (Since(t0) adds the time since
// a Now, where the profile is on); Write reports each stage that recorded
// something, with its percentiles (each a bucket's lower bound: 3 µs
// reads 2.6 µs).
func Example() {
	profile.SetOn(true)
	defer profile.SetOn(false)
	defer profile.Reset()
	for range 10 {
		profile.TargetHost.Add(int64(3 * time.Microsecond))
	}
	profile.Write(os.Stdout, "rank 0")
	// Output:
	// === NET/wasm profile of rank 0 (NCCL_RMA_WASM_PROFILE; since init; percentiles within 25%)
	//   target: put received and landed (host memory)                  n=10       p50     2.6 µs  p90     2.6 µs  p99     2.6 µs
}

// With the trace on, each point the data path meets is recorded with the
// host's realtime clock; WriteTrace lists them (a communicator's close
// writes them to NCCL_RMA_WASM_PROFILE_TRACE's file).
func ExampleMark() {
	profile.SetTrace(true)
	defer profile.SetTrace(false)
	defer profile.ResetTrace()
	profile.Mark(profile.PtPost)
	profile.Mark(profile.PtWire)
	var b strings.Builder
	profile.WriteTrace(&b, "rank 0")
	for _, l := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		fmt.Println(strings.Fields(l)[0])
	}
	// Output:
	// #
	// post
	// wire
}
