package dataplane

import (
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/intranode"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp"
)

// Test-only read-outs of the mesh.

// Parts is how many completions the runtime must expect for an operation:
// more than one when it is striped over several lanes.
func (m *Mesh) Parts(kind uint8, size uint64) int { return m.parts(kind, size, 0) }

// PeerParts is Parts for an operation to peer (OpParts): over libfabric a put with
// signal that is not striped completes twice, once for the write and once
// for the signal message behind it.
func (m *Mesh) PeerParts(peer int, kind uint8, size uint64) int {
	return m.OpParts(peer, &Op{Request: Request{Msg: kind, Size: size}})
}

// intraOf is an intra-node lane's side (ring.go, stream.go).
func intraOf(l *tcp.Lane) *intranode.Lane { return l.Side().(*intranode.Lane) }

// addrPtr turns an address in this process into a pointer.
func addrPtr(a uint64) unsafe.Pointer { return intranode.AddrPtr(a) }
