package plugin

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
)

// TestStallReportPollingStopped: with NCCL_RMA_WASM_STALL_REPORT_MS set, a
// caller that polled rmaProgress and then stopped for the period is
// reported once (the case of a proxy thread blocked in a CUDA call), and
// nothing is reported while it keeps polling.
func TestStallReportPollingStopped(t *testing.T) {
	logs := warnings(t)
	rs := setupEnv(t, 2, 1<<12, map[string]string{config.StallReport.Name: "150"})
	a := rs[0]
	// A loaded machine may itself stop this loop for the period; that is
	// a real stop, rightly reported, so only a report while no gap between
	// two polls came near the period fails the test.
	var gap time.Duration
	last := time.Now()
	for end := last.Add(400 * time.Millisecond); time.Now().Before(end); {
		if res := Progress(a.rma); res != abi.Success {
			t.Fatalf("rmaProgress: %v", res)
		}
		gap = max(gap, time.Since(last))
		last = time.Now()
		time.Sleep(time.Millisecond)
	}
	reports := logs()
	gap = max(gap, time.Since(last)) // the loop's end counts as a stop too
	for _, l := range reports {
		if strings.Contains(l, "stall report") {
			if gap < 100*time.Millisecond {
				t.Fatalf("reported while the caller polled (longest gap %v): %q", gap, l)
			}
			t.Skipf("this machine stopped the polling loop for %v, longer than the report allows", gap)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		n := 0
		for _, l := range logs() {
			if strings.Contains(l, "polling thread is blocked") && strings.Contains(l, "rank 0,") {
				n++
			}
		}
		if n == 1 {
			break
		}
		if n > 1 || time.Now().After(deadline) {
			t.Fatalf("%d reports of the stopped caller (want 1): %q", n, logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestStallReportOldRequest: the report names the oldest pending request
// (call, peer, size) and counts the pending ones per peer and kind.
func TestStallReportOldRequest(t *testing.T) {
	logs := warnings(t)
	rs := setup(t, 2, 1<<12)
	r := lookupRma(rs[0].rma)
	now := nanotime()
	period := 100 * time.Millisecond
	var held []*request
	for i, kind := range []backend.OpKind{backend.OpPutSignal, backend.OpPut, backend.OpPut} {
		q, _, ok := r.reqs.alloc()
		if !ok {
			t.Fatal("no request slot")
		}
		q.stamp(kind, 0, 1, uint64(64<<i))
		held = append(held, q)
	}
	if r.reportStalls(now, period) {
		t.Fatal("reported requests younger than the period")
	}
	held[1].st.since.Store(now - int64(3*period))
	held[2].st.since.Store(now - int64(2*period))
	if !r.reportStalls(now, period) {
		t.Fatal("no report of a request older than the period")
	}
	got := strings.Join(logs(), "\n")
	for _, want := range []string{"3 request(s) pending", "the oldest, 300ms old: iput to rank 1, context 0, 128 bytes", "rank 1 iput x2;", "rank 1 iputSignal x1;"} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	for _, q := range held {
		q.state.Store(reqFree) // not released to the pool: the context is torn down with the test
	}
}

// TestStallReportWatcher: the reporter goroutine itself finds a request
// pending longer than the period and WARNs it.
func TestStallReportWatcher(t *testing.T) {
	logs := warnings(t)
	rs := setupEnv(t, 2, 1<<12, map[string]string{config.StallReport.Name: "100"})
	r := lookupRma(rs[0].rma)
	q, _, ok := r.reqs.alloc()
	if !ok {
		t.Fatal("no request slot")
	}
	q.stamp(backend.OpGet, 0, 1, 4096)
	defer q.state.Store(reqFree)
	deadline := time.Now().Add(time.Minute)
	for {
		got := strings.Join(logs(), "\n")
		if strings.Contains(got, "iget to rank 1, context 0, 4096 bytes") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no stall report of a request pending for 5 s:\n%s", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestOpTrace: issued and completed operations are written out with the
// call, peer, size, offsets and request, oldest first.
func TestOpTrace(t *testing.T) {
	traceOp(backend.OpPutSignal, false, 1, 3, 4096, 8192, 16, 0xabc)
	traceOp(backend.OpPutSignal, true, 1, 3, 4096, uint64(abi.RemoteError), 0, 0xabc)
	var b strings.Builder
	writeOpTrace(&b)
	out := b.String()
	i := strings.Index(out, "iputSignal ctx 1 rank 3 4096 B off 8192 sig 16 request 0xabc")
	j := strings.Index(out, fmt.Sprintf("done iputSignal rank 3 status %d request 0xabc", abi.RemoteError))
	if i < 0 || j < i {
		t.Fatalf("operation trace lacks the issue and then the completion:\n%s", out)
	}
}
