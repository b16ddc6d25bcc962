package dataplane

import (
	"net"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/ofi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// What the core does with libfabric (host/dataplane/ofi): the listener's
// endpoint handed to the mesh as its rails, which pairs use it, and the
// registrations the communicator makes on every rail.

// fitFabric drops the listener's endpoint when n ranks do not fit the
// provider's CQ data: ranks and sequence numbers share it, and every rank
// sees the same n and provider, so all of them fall back alike.
func (l *Listener) fitFabric(n int) {
	if f := l.fabric(); f != nil && !f.Fits(n) {
		logx.Warn(abi.SubsysNet|abi.SubsysInit, "NET/wasm: %d ranks do not fit %s's %d bytes of CQ data; using TCP", n, f.Info.Provider, f.Info.CQDataSize)
		l.dropFabric()
	}
}

// takeFabric moves the listener's endpoint to the mesh and opens more
// rails now that the plan's lanes are known; it returns every peer's rail
// names (ofi.Rails.Exchange), nil without an endpoint.
func (m *Mesh) takeFabric(l *Listener, opt Options, infos []wire.HandleInfo, peerNoFab []bool, outs, ins [][]*net.TCPConn, deadline time.Time) ([][][]byte, error) {
	ep := l.takeFabric()
	if ep == nil {
		return nil, nil
	}
	n := len(infos)
	m.fab = ofi.NewRails(ep, m.rank, n, opt.SpinWait, opt.Spinners, l.prov, l.rails, m.lanes, m.noDmaBuf)
	// Which pairs use libfabric: both sides decide alike, from both
	// handles and both hellos.
	fab := make([]bool, n)
	for i := range fab {
		fab[i] = outs[i] != nil && !opt.NoFabric && !peerNoFab[i] && infos[i].FabricHash == infos[m.rank].FabricHash && len(infos[i].FabricName) > 0
	}
	return m.fab.Exchange(fab, outs, ins, deadline)
}

// RegisterMemory registers a communicator registration with the fabric
// endpoint (regMrSym calls it before announcing the registration) and
// returns the key peers write with; 0 without a fabric endpoint.
func (m *Mesh) RegisterMemory(id uint32, base unsafe.Pointer, size uint64, dev bool) (uint64, error) {
	return m.fab.Register(id, base, size, dev)
}

// RegisterDevice registers device memory with the fabric endpoint where
// the provider reaches it (FI_HMEM), on every rail, and returns rail 0's
// key and direct = true; otherwise key 0 and direct = false: operations
// on it are staged over the TCP lanes (ofi.Rails.RegisterDevice).
func (m *Mesh) RegisterDevice(id uint32, base uintptr, size uint64, d DeviceMemory) (key uint64, direct bool) {
	return m.fab.RegisterDevice(id, base, size, d)
}

// DeregisterMemory undoes RegisterMemory once nothing uses the memory.
func (m *Mesh) DeregisterMemory(id uint32) { m.fab.Deregister(id) }
