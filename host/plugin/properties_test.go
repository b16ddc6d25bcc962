package plugin

import (
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
)

// TestRmaProperties: v16's getRmaProperties reports
// flushesAllPutsOnAnySignal = true over TCP and the intra-node path (their
// targets land every put whole before anything behind it, SPEC.md §2;
// properties_visible_test.go checks what that promises), for every rank;
// an unknown collComm is ncclInvalidArgument.
func TestRmaProperties(t *testing.T) {
	for _, intra := range []string{"0", "1"} {
		t.Run("intranode="+intra, func(t *testing.T) {
			testIntraNode = intra
			defer func() { testIntraNode = "1" }()
			rs := setup(t, 2, 64)
			for i, r := range rs {
				v, res := GetRmaProperties(r.coll)
				if res != abi.Success || !v {
					t.Fatalf("rank %d: getRmaProperties = %v, %v; want true, success", i, v, res)
				}
			}
		})
	}
	if _, res := GetRmaProperties(0xdead); res != abi.InvalidArgument {
		t.Fatalf("unknown collComm: %v, want InvalidArgument", res)
	}
}
