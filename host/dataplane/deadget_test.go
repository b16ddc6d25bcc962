package dataplane

import (
	"errors"
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp"
)

// TestGetRecordedAfterDeath: a writer that records a get after the peer
// died and markDead emptied the FIFO (the soak found it: a get whose
// intra-node read failed against a killed peer fell back to the stream and
// was never answered nor failed) must fail it at once.
func TestGetRecordedAfterDeath(t *testing.T) {
	ms, os := mesh2(t, false)
	p := ms[0].peers[1]
	p.markDead(errors.New("test: the peer died"))
	l := p.t.(*tcp.Link).Lanes()[0]
	l.PushGet(77, 8)
	if n := l.PendingGets(); n != 0 {
		t.Fatalf("%d gets wait for a dead peer's reply", n)
	}
	if st, ok := os[0].status(77); !ok || st != abi.RemoteError {
		t.Fatalf("the get completed: %v with %v, want ncclRemoteError", ok, st)
	}
}
