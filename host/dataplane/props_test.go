package dataplane

import (
	"testing"
	"time"
)

// lateLink is a transport whose puts become visible late (an FI_HMEM
// fabric link, an asynchronous landing copy).
type lateLink struct{ transport }

func (l lateLink) Props() Props {
	pr := l.transport.Props()
	pr.LateVisible = true
	return pr
}

// TestFlushesOnSignal: getRmaProperties' flushesAllPutsOnAnySignal is true
// over TCP and the intra-node path, and false as soon as one peer's
// transport lands puts that become visible late.
func TestFlushesOnSignal(t *testing.T) {
	for _, intra := range []bool{false, true} {
		ms := connect2(t, newOwners(2, 64), Options{Timeout: 10 * time.Second, IntraNode: intra, Lanes: 1})
		if !ms[0].FlushesOnSignal() || !ms[1].FlushesOnSignal() {
			t.Fatalf("intra=%v: FlushesOnSignal false on a mesh with no late-visible transport", intra)
		}
		p := ms[0].peers[1]
		real := p.t
		p.t = lateLink{real}
		late := ms[0].FlushesOnSignal()
		p.t = real
		if late {
			t.Fatalf("intra=%v: FlushesOnSignal true with a late-visible peer", intra)
		}
	}
}
