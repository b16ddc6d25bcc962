// The race detector does not see the order a socket gives between one
// peer's put landing and another peer's signal, which is what the
// visibility check here relies on (as arrival_test.go in host/dataplane).

//go:build !race

package plugin

import (
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
)

// TestRmaPropertiesSignalVisibility checks what flushesAllPutsOnAnySignal
// = true promises over TCP and the intra-node path: a signal from one peer
// proves every put received from any peer visible. Rank 1 puts to rank 0
// without a signal, rank 2 then signals rank 0, and once rank 0 sees the
// signal and rank 1's put completed (arrival), every byte is there.
func TestRmaPropertiesSignalVisibility(t *testing.T) {
	for _, intra := range []string{"0", "1"} {
		t.Run("intranode="+intra, func(t *testing.T) {
			testIntraNode = intra
			defer func() { testIntraNode = "1" }()
			const size = 4096
			rs := setup(t, 3, size)
			for i, r := range rs {
				v, res := GetRmaProperties(r.coll)
				if res != abi.Success || !v {
					t.Fatalf("rank %d: getRmaProperties = %v, %v; want true, success", i, v, res)
				}
			}
			for i := range rs[1].src {
				rs[1].src[i] = byte(i*5 + 3)
			}
			// Rank 1's put lands in rank 0's dst at offset size (its slot).
			h1, res := Iput(rs[1].rma, 0, 0, rs[1].srcMh, size, size, rs[1].dstMh, 0, 0)
			if res != abi.Success {
				t.Fatalf("iput: %v", res)
			}
			if st := wait(t, rs[1].coll, h1); st != abi.Success {
				t.Fatalf("rank 1's put: %v", st)
			}
			h2, res := IputSignal(rs[2].rma, 0, 0, 0, 0, 0, 0, 0, 0, rs[2].sigMh, 1, abi.SignalOpAdd, true, 0)
			if res != abi.Success {
				t.Fatalf("iputSignal: %v", res)
			}
			if st := wait(t, rs[2].coll, h2); st != abi.Success {
				t.Fatalf("rank 2's signal: %v", st)
			}
			if w := signalWord(rs[0].sig, 0); w != 1 {
				t.Fatalf("signal word %d, want 1", w)
			}
			for i, b := range rs[0].dst[size : 2*size] {
				if b != rs[1].src[i] {
					t.Fatalf("byte %d of rank 1's put: %d, want %d", i, b, rs[1].src[i])
				}
			}
		})
	}
}
