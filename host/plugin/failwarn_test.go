package plugin

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// TestFailedRequestsWarnOncePerCause: requests to a peer that went away
// fail in test() with a WARN that names the cause (the peer's recorded
// error), once per cause however many fail: 50 failed gets cost at most
// two lines (one may precede the cause, when the transport completes a
// request before it reports the peer).
func TestFailedRequestsWarnOncePerCause(t *testing.T) {
	rs := setup(t, 2, 1<<16)
	a, b := rs[0], rs[1]
	failWarn.Reset()
	var mu sync.Mutex
	var lines []string
	logx.SetSink(func(level abi.LogLevel, _ uint64, _ string, _ int, msg string) {
		if level == abi.LogWarn && strings.Contains(msg, "failed with") {
			mu.Lock()
			lines = append(lines, msg)
			mu.Unlock()
		}
	})
	defer logx.SetSink(nil)
	CloseColl(b.coll)
	b.coll = 0
	failed := 0
	deadline := time.Now().Add(20 * time.Second)
	for failed < 50 {
		req, res := Iget(a.rma, 0, 0, a.getMh, 64, 0, a.srcMh, 1, 0)
		if res != abi.Success {
			t.Fatalf("iget: %v", res)
		}
		if res := wait(t, a.coll, req); res != abi.Success {
			failed++
			continue
		}
		if time.Now().After(deadline) {
			t.Fatal("gets from a closed peer keep succeeding")
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	named := false
	for i, l := range lines {
		if !strings.Contains(l, "iget to rank 1 (64 bytes) failed with ncclRemoteError") {
			t.Errorf("WARN %q does not name the call, peer and status", l)
		}
		named = named || !strings.Contains(l, "no cause recorded")
		for _, m := range lines[:i] {
			if m == l {
				t.Errorf("WARN %q logged twice", l)
			}
		}
	}
	if len(lines) == 0 || len(lines) > 2 || !named {
		t.Fatalf("%d failed gets gave WARN lines %q; want one naming the cause (and at most one before it was known)", failed, lines)
	}
	t.Logf("%d failed gets, WARN lines: %q", failed, lines)
}
