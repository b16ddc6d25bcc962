package plugin

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/profile"
)

// TestProfile: with NCCL_RMA_WASM_PROFILE=1 every put and get is timed at
// each stage it meets (the caller's cadence, the queue, the target, issue
// to completion, completion to test()), and the report names them with
// their counts; off, nothing is recorded.
func TestProfile(t *testing.T) {
	profile.Reset()
	defer profile.Reset()
	rs := setupEnv(t, 2, 4096, map[string]string{config.Profile.Name: "1"})
	defer profile.SetOn(false)
	if !profile.On() {
		t.Fatal("NCCL_RMA_WASM_PROFILE=1 did not turn the profile on")
	}
	r0 := rs[0]
	const puts = 20
	for k := range puts {
		req, res := IputSignal(r0.rma, 0, 0, r0.srcMh, 64, 64*uint64(k), r0.dstMh, 1, 8, r0.sigMh, 1, abi.SignalOpAdd, true, 0)
		if res != abi.Success || wait(t, r0.coll, req) != abi.Success {
			t.Fatalf("put %d: %v", k, res)
		}
	}
	for range 3 {
		if res := Progress(r0.rma); res != abi.Success {
			t.Fatalf("rmaProgress: %v", res)
		}
	}
	req, res := Iget(r0.rma, 0, 0, r0.srcMh, 128, 0, r0.getMh, 1, 0)
	if res != abi.Success || wait(t, r0.coll, req) != abi.Success {
		t.Fatalf("get: %v", res)
	}
	for _, c := range []struct {
		s    *profile.Series
		want uint64
	}{{profile.PutDone, puts}, {profile.GetDone, 1}, {profile.Noticed, puts + 1}, {profile.CallGap, puts},
		{profile.Queued, puts + 1}, {profile.TargetHost, puts},
		{profile.InPost, puts + 1}, {profile.InTest, puts + 1}, {profile.ProgGap, 2}, {profile.InProgress, 3}} {
		if n := c.s.Count(); n < c.want {
			t.Errorf("%s: %d recorded, want at least %d", c.s.Name, n, c.want)
		}
	}
	var b bytes.Buffer
	profile.Write(&b, "rank 0")
	if !strings.Contains(b.String(), profile.PutDone.Name) || !strings.Contains(b.String(), "p99") {
		t.Fatalf("report:\n%s", b.String())
	}
	t.Log("\n" + b.String())

	// Off: nothing more is recorded.
	profile.SetOn(false)
	n := profile.PutDone.Count()
	req, res = IputSignal(r0.rma, 0, 0, r0.srcMh, 64, 0, r0.dstMh, 1, 8, r0.sigMh, 1, abi.SignalOpAdd, true, 0)
	if res != abi.Success || wait(t, r0.coll, req) != abi.Success {
		t.Fatalf("put: %v", res)
	}
	if profile.PutDone.Count() != n {
		t.Fatal("a put was profiled with the profile off")
	}
}

// TestProfileTrace: with NCCL_RMA_WASM_PROFILE_TRACE set, each data call
// and each header written is a trace point, and closing the communicator
// writes them to <prefix>.<pid> (every point so far, rewritten at each
// close); unset, no file.
func TestProfileTrace(t *testing.T) {
	profile.ResetTrace()
	defer profile.ResetTrace()
	defer profile.SetTrace(false)
	prefix := filepath.Join(t.TempDir(), "trace")
	path := fmt.Sprintf("%s.%d", prefix, os.Getpid())
	const puts = 20
	t.Run("on", func(t *testing.T) {
		rs := setupEnv(t, 2, 4096, map[string]string{config.ProfileTrace.Name: prefix})
		if !profile.Tracing() {
			t.Fatal("NCCL_RMA_WASM_PROFILE_TRACE did not turn the trace on")
		}
		r0 := rs[0]
		for k := range puts {
			req, res := IputSignal(r0.rma, 0, 0, r0.srcMh, 64, 64*uint64(k), r0.dstMh, 1, 8, r0.sigMh, 1, abi.SignalOpAdd, true, 0)
			if res != abi.Success || wait(t, r0.coll, req) != abi.Success {
				t.Fatalf("put %d: %v", k, res)
			}
		}
		if _, err := os.Stat(path); err == nil {
			t.Fatal("a trace file before any communicator closed")
		}
	})
	profile.SetTrace(false) // after the close wrote it
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("no trace written at close: %v", err)
	}
	counts := map[string]int{}
	var last int64
	for i, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if i == 0 {
			if !strings.HasPrefix(l, "# NET/wasm trace of rank ") {
				t.Fatalf("header %q", l)
			}
			continue
		}
		var name string
		var ts int64
		if _, err := fmt.Sscan(l, &name, &ts); err != nil || ts < last-int64(time.Second) {
			t.Fatalf("line %d %q: %v", i, l, err)
		}
		counts[name]++
	}
	if counts["post"] < puts || counts["wire"] < puts {
		t.Fatalf("points %v: want at least %d posts and %d headers written", counts, puts, puts)
	}

	os.Remove(path)
	t.Run("off", func(t *testing.T) {
		rs := setupEnv(t, 2, 4096, nil)
		r0 := rs[0]
		req, res := IputSignal(r0.rma, 0, 0, r0.srcMh, 64, 0, r0.dstMh, 1, 8, r0.sigMh, 1, abi.SignalOpAdd, true, 0)
		if res != abi.Success || wait(t, r0.coll, req) != abi.Success {
			t.Fatalf("put: %v", res)
		}
	})
	if _, err := os.Stat(path); err == nil {
		t.Fatal("a trace written with NCCL_RMA_WASM_PROFILE_TRACE unset")
	}
}
