package dataplane

import (
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
)

// The transport seam. The transports are layers, not alternatives: every
// peer has a tcp.Link, and TCP is its control plane and its fallback.
// A peer (peer.go) is everything that does not depend on how bytes move:
// sequence numbers and striping over lanes, the target-side orderer that
// keeps signals strong, completions and failures reported to the Owner,
// and the teardown (Drain, goodbyes, markDead). It hands each operation to
// the transport Connect chose for that peer (chooseTransport):
//
//   - tcp.Link (host/dataplane/tcp): Lanes streams, the 64-byte header protocol of
//     host/wire, device memory staged through host buffers
//     (host/devmem/staging), compression (host/codec). Registrations,
//     goodbyes, replies and anything the layers above decline ride it.
//   - intranode.Link (host/dataplane/intranode) embeds *tcp.Link and takes over large host
//     payloads to a peer on this host with process_vm_writev/readv, and
//     device payloads through a shared staging ring; the stream
//     still carries everything else, in order, so a signal follows its
//     payload.
//   - ofi.Link (host/dataplane/ofi) embeds *tcp.Link and takes over the payload
//     over libfabric: writes and reads on one or more rails, a signal as
//     write data or a message behind the payload on the same ordered
//     endpoint, a completion goroutine per rail, and the target side on
//     the receive completions. Device memory the provider cannot reach is
//     staged over the embedded TCP lanes (ofi's dev.go).
//
// The core asks a transport only through this interface: no code outside
// a transport's own files names its concrete type.

// transport is link.Transport: what the core asks of the transport to one
// peer.
type transport = link.Transport

// FlushesOnSignal is getRmaProperties' flushesAllPutsOnAnySignal (SPEC.md
// §2): true when no peer's transport lands puts that become visible late
// (Props.LateVisible). Then every put a rank's services have received is
// visible by the time any later signal, from any peer, is applied, since
// each service lands a put whole before it processes what follows, and a
// put still in flight is not yet received.
func (m *Mesh) FlushesOnSignal() bool {
	for _, p := range m.peers {
		if p != nil && p.t != nil && p.t.Props().LateVisible {
			return false
		}
	}
	return true
}
