package dataplane_test

import (
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
)

// lateLink is a transport whose puts become visible late (an FI_HMEM
// fabric link, an asynchronous landing copy).
type lateLink struct{ link.Transport }

func (l lateLink) Props() dataplane.Props {
	pr := l.Transport.Props()
	pr.LateVisible = true
	return pr
}

// TestFlushesOnSignal: getRmaProperties' flushesAllPutsOnAnySignal is true
// over TCP and the intra-node path, and false as soon as one peer's
// transport lands puts that become visible late.
func TestFlushesOnSignal(t *testing.T) {
	for _, intra := range []bool{false, true} {
		ms := meshtest.Connect2(t, meshtest.NewOwners(2, 64), dataplane.Options{Timeout: 10 * time.Second, IntraNode: intra, Lanes: 1})
		if !ms[0].FlushesOnSignal() || !ms[1].FlushesOnSignal() {
			t.Fatalf("intra=%v: FlushesOnSignal false on a mesh with no late-visible transport", intra)
		}
		real := ms[0].Peer(1).Transport()
		ms[0].SetTransport(1, lateLink{real})
		late := ms[0].FlushesOnSignal()
		ms[0].SetTransport(1, real)
		if late {
			t.Fatalf("intra=%v: FlushesOnSignal true with a late-visible peer", intra)
		}
	}
}
