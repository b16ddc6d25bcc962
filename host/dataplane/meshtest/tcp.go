package meshtest

import (
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp"
)

// TCPOf is the TCP side of a peer's transport (the intra-node link runs
// on it too); a transport without one ends the test.
func TCPOf(t testing.TB, m *dataplane.Mesh, peer int) *tcp.Link {
	t.Helper()
	if tl := tcp.Of(m.Peer(peer).Transport()); tl != nil {
		return tl
	}
	t.Fatalf("peer %d's transport is %T, not TCP", peer, m.Peer(peer).Transport())
	return nil
}

// ResetIn resets rank m's incoming stream of lane from peer, once it
// opened, as a link that breaks does: the peer's lane fails over.
func ResetIn(t testing.TB, m *dataplane.Mesh, peer, lane int) {
	t.Helper()
	tl := TCPOf(t, m, peer)
	WaitUntil(t, "the lane to open", func() bool {
		done, err := tl.ResetIn(lane)
		if err != nil {
			t.Fatal(err)
		}
		return done
	})
}

// SetDelays sets each delay to d until t ends, restored after the meshes
// t made closed (cleanups run last first, so call it before connecting),
// as their timers read them.
func SetDelays(t testing.TB, d time.Duration, ds ...*tcp.Delay) {
	for _, v := range ds {
		saved := v.Get()
		v.Set(d)
		t.Cleanup(func() { v.Set(saved) })
	}
}

// OpenLanes opens every lane from m to peer, as connect did before lanes
// opened on first use: only an opened lane takes over a failed one's work.
func OpenLanes(t testing.TB, m *dataplane.Mesh, peer int) {
	t.Helper()
	p := m.Peer(peer)
	for _, l := range TCPOf(t, m, peer).Lanes() {
		l.Mu().Lock()
		if l.Out() == nil && !l.Opening() {
			l.StartOpen()
		}
		l.Mu().Unlock()
	}
	all := uint32(1)<<p.Lanes() - 1
	WaitUntil(t, "every lane to open", func() bool { return p.Opened().Load() == all })
}

// HoldWriter takes lane l's writing role, as a writer holding its stream
// does: nothing queued on l is written until ReleaseWriter.
func HoldWriter(t testing.TB, l *tcp.Lane) {
	t.Helper()
	WaitUntil(t, "the lane's writing role", func() bool {
		l.Mu().Lock()
		defer l.Mu().Unlock()
		if *l.Writing() {
			return false
		}
		*l.Writing() = true
		return true
	})
}

// ReleaseWriter gives l's writing role back and kicks its link k, as a
// holder that lets go with work queued.
func ReleaseWriter(l *tcp.Lane, k *tcp.Link) {
	l.Mu().Lock()
	*l.Writing() = false
	l.Mu().Unlock()
	k.Kick()
}
