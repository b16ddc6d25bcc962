package dataplane_test

import (
	"errors"
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp"
)

// TestGetRecordedAfterDeath: a writer that records a get after the peer
// died and markDead emptied the FIFO (the soak found it: a get whose
// intra-node read failed against a killed peer fell back to the stream and
// was never answered nor failed) must fail it at once.
func TestGetRecordedAfterDeath(t *testing.T) {
	ms, os := meshtest.Mesh2(t, false)
	p := ms[0].Peer(1)
	p.MarkDead(errors.New("test: the peer died"))
	l := p.Transport().(*tcp.Link).Lanes()[0]
	l.PushGet(77, 8)
	if n := l.PendingGets(); n != 0 {
		t.Fatalf("%d gets wait for a dead peer's reply", n)
	}
	if st, ok := os[0].Status(77); !ok || st != abi.RemoteError {
		t.Fatalf("the get completed: %v with %v, want ncclRemoteError", ok, st)
	}
}
