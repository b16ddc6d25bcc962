package dataplane

import (
	"fmt"
	"net"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// Fabric set-up: what Connect does for libfabric beyond the TCP streams
// every peer has. The listener's endpoint moves to the mesh, further rails
// open and their addresses are exchanged over the streams
// (fabric_rails.go), the pairs that both can use libfabric get a
// fabricLink, and the rails' completion goroutines start.

// fitFabric drops the listener's endpoint when n ranks do not fit the
// provider's CQ data: ranks and sequence numbers share it, and every rank
// sees the same n and provider, so all of them fall back alike.
func (l *Listener) fitFabric(n int) {
	if f := l.fabric(); f != nil && !f.layout(n) {
		logx.Warn(abi.SubsysNet|abi.SubsysInit, "NET/wasm: %d ranks do not fit %s's %d bytes of CQ data; using TCP", n, f.Info.Provider, f.Info.CQDataSize)
		l.dropFabric()
	}
}

// takeFabric moves the listener's endpoint to the mesh and opens more
// rails now that the plan's lanes are known; it returns every peer's rail
// names (exchangeRails), nil without an endpoint.
func (m *Mesh) takeFabric(l *Listener, opt Options, infos []wire.HandleInfo, peerNoFab []bool, outs, ins [][]*net.TCPConn, deadline time.Time) ([][][]byte, error) {
	m.fab = l.takeFabric()
	if m.fab == nil {
		return nil, nil
	}
	n := len(infos)
	m.fab.m, m.fab.rank, m.fab.links = m, m.rank, make([]*fabricLink, n)
	m.fab.SetSpin(opt.SpinWait, int32(opt.Spinners))
	m.openRails(l, m.lanes)
	// Which pairs use libfabric: both sides decide alike, from both
	// handles and both hellos.
	fab := make([]bool, n)
	for i := range fab {
		fab[i] = outs[i] != nil && !opt.NoFabric && !peerNoFab[i] && infos[i].FabricHash == infos[m.rank].FabricHash && len(infos[i].FabricName) > 0
	}
	return m.exchangeRails(fab, outs, ins, deadline)
}

// fabricTransport is chooseTransport's libfabric branch: the peer's
// address on every rail, and a fabricLink over them.
func (m *Mesh) fabricTransport(p *peer, peer, self wire.HandleInfo, outs, ins []*net.TCPConn, railNames [][]byte) (transport, error) {
	addr, err := m.fab.FI.Insert(peer.FabricName)
	if err != nil {
		return nil, fmt.Errorf("fabric address of rank %d: %w", p.Rank(), err)
	}
	rails, err := m.fabricRails(p.Rank(), addr, railNames)
	if err != nil {
		return nil, err
	}
	f := newFabricLink(p, outs, ins, rails)
	if peer.HostID == self.HostID {
		f.watchPid(int(peer.Pid))
	}
	for _, r := range rails {
		r.e.links[p.Rank()] = f
	}
	return f, nil
}

// startRails starts every rail's completion goroutine once every peer has
// its transport.
func (m *Mesh) startRails() error {
	for _, e := range m.rails {
		if err := e.Start(); err != nil {
			m.closeRails()
			m.fab, m.rails = nil, nil
			return fmt.Errorf("fabric rail %d: %w", e.rail, err)
		}
	}
	if len(m.rails) > 1 {
		logx.Info(abi.SubsysNet|abi.SubsysInit, "NET/wasm: rank %d: %d fabric rails %v; operations of at least %d bytes stripe over them",
			m.rank, len(m.rails), m.railNames(), m.stripe)
	}
	return nil
}
