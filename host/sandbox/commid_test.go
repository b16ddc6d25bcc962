package sandbox

import (
	"fmt"
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/plugin"
)

// TestGuestSeesCommID: the communicator id NCCL passes to init reaches
// rmaw_ctx_open (SPEC.md §8.2). The guest fails every operation unless the
// id it was handed equals the one its config names; the wrong id in the
// config shows that the check can fail.
func TestGuestSeesCommID(t *testing.T) {
	for _, c := range []struct {
		comm int
		want abi.Result
	}{{0x42, abi.Success}, {0x43, abi.RemoteError}} {
		t.Run(fmt.Sprintf("config comm=%#x", c.comm), func(t *testing.T) {
			useGuest(t, cguest(t, "testdata/commid.c"), fmt.Sprintf("comm=%d", c.comm))
			rs := hostComm(t, 2, 1) // init(0x42) on every rank
			r := rs[0]
			req, res := plugin.Iput(r.rma, 0, 0, r.bufMh, 64, 64, r.bufMh, 1, 0)
			if res != abi.Success {
				t.Fatalf("iput: %v", res)
			}
			if got := hostWait(t, r.coll, req); got != c.want {
				t.Fatalf("operation finished with %v, want %v (the guest compares comm_id with %#x)", got, c.want, c.comm)
			}
			// A request failed by the backend's plan sets the sticky flag
			// before it completes (SPEC.md §3, Errors).
			if bad, _ := plugin.QueryLastError(r.rma); bad != (c.want != abi.Success) {
				t.Fatalf("queryLastError = %v after an operation that finished with %v", bad, c.want)
			}
		})
	}
}
