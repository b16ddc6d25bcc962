package dataplane

import (
	"net"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/ofi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/handshake"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/handshake/admission"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// Hooks into a mesh and its listener for the integration tests, which live
// in external test packages (package dataplane_test, tcp_test,
// intranode_test, ofi_test) and build whole meshes with host/dataplane/meshtest:
// they look at a peer, a listener's admission and the bounds a test
// shortens, the way the transports' testhooks.go expose their lanes. Test
// support only: nothing in the data path, nor host/plugin, calls them.

// Parts is how many completions the runtime must expect for an operation:
// more than one when it is striped over several lanes.
func (m *Mesh) Parts(kind uint8, size uint64) int { return m.parts(kind, size, 0) }

// PeerParts is Parts for an operation to peer (OpParts): over libfabric a put with
// signal that is not striped completes twice, once for the write and once
// for the signal message behind it.
func (m *Mesh) PeerParts(peer int, kind uint8, size uint64) int {
	return m.OpParts(peer, &Op{Request: Request{Msg: kind, Size: size}})
}

// Peer is rank i's peer as its transport sees it (link.Peer), or nil
// where the mesh has no peer i (Options.Peers).
func (m *Mesh) Peer(i int) link.Peer {
	if p := m.peers[i]; p != nil {
		return p
	}
	return nil
}

// Peers are the mesh's peers by rank (nil where the mesh has no peer).
func (m *Mesh) Peers() []link.Peer {
	ps := make([]link.Peer, len(m.peers))
	for i, p := range m.peers {
		if p != nil {
			ps[i] = p
		}
	}
	return ps
}

// BarePeer is a peer of no mesh, of rank rank: for a transport's tests of
// what a link decides by itself (ofi.BareLink).
func BarePeer(rank int) link.Peer { return &peer{rank: rank} }

// SetTransport replaces peer i's transport (a test's wrapper around it);
// only while nothing is posted.
func (m *Mesh) SetTransport(i int, t link.Transport) { m.peers[i].t = t }

// PeerSeq is the last sequence number posted to peer i.
func (m *Mesh) PeerSeq(i int) uint64 { return m.peers[i].seq }

// Lanes is how many lanes the mesh opens to a peer (Options.Lanes).
func (m *Mesh) Lanes() int { return m.lanes }

// Fab is the mesh's libfabric rails, nil without them.
func (m *Mesh) Fab() *ofi.Rails { return m.fab }

// KickAll wakes every writer (kickAll).
func (m *Mesh) KickAll() { m.kickAll() }

// Incoming is an admitted dialer's stream and what it claimed.
type Incoming = incoming

// Gate is the listener's admission of strangers.
func (l *Listener) Gate() *admission.Gate { return &l.gate }

// SetPeers gives the listener every rank's handle, as connect does.
func (l *Listener) SetPeers(infos []wire.HandleInfo, encrypt bool) { l.setPeers(infos, encrypt) }

// ID is the listener's identity (its rank's key pair).
func (l *Listener) ID() *handshake.Identity { return &l.id }

// Info is the listener's handle (not to be changed).
func (l *Listener) Info() *wire.HandleInfo { return &l.info }

// Conns are the admitted streams connect has not taken yet.
func (l *Listener) Conns() chan Incoming { return l.conns }

// Fab is the listener's libfabric endpoint until a mesh takes it, or nil.
func (l *Listener) Fab() *ofi.EP { return l.fab }

// Dial dials peer and proves the claim cl with id (a rank's dial).
func Dial(peer wire.HandleInfo, id *handshake.Identity, cl handshake.Claim, deadline time.Time) (*net.TCPConn, error) {
	return dial(peer, id, cl, deadline)
}

// AcceptWarn rate-limits the lines about accept failures.
func AcceptWarn() *logx.Limited { return &acceptWarn }

// HelloTimeout bounds a dialer's hello from accept.
func HelloTimeout() *time.Duration { return &helloTimeout }

// KeyWaitTimeout bounds a proven-looking dialer's wait for connect.
func KeyWaitTimeout() *time.Duration { return &keyWaitTimeout }

// MaxStrangers caps a listener's unauthenticated connections.
func MaxStrangers() *int32 { return &maxStrangers }

// MaxStrangersPerAddr caps those of one source.
func MaxStrangersPerAddr() *int32 { return &maxStrangersPerAddr }
