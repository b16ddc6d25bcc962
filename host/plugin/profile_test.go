package plugin

import (
	"bytes"
	"strings"
	"testing"

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
