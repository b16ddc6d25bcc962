package dataplane

import (
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric/endpoint"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// Rails: a communicator with more than one lane opens one libfabric
// endpoint per NIC, up to as many as it has lanes (rail 0 is the
// listener's, on the listen device's NIC; rails 1.. on the NICs the
// listener was given, ListenOptions.Rails). Lane l of a fabric link posts on
// rail l mod rails, so the peer's striping of large operations over the
// lanes (peer.stripe, above the plan's StripeThreshold) spreads them over
// the NICs, and the backend's plan (its lanes, plan_op's lane) chooses
// rails the way it chooses TCP lanes. A pair uses min(our rails, its
// rails), rail r paired with the peer's rail r.
//
// Rail 0's endpoint name rides the listen handle; the others travel at
// connect, on lane 0 of every pair that chose libfabric, as a rails frame
// (endpoint.RailFrame). Each side writes its frame on the stream it dialled, then reads the
// peer's from the stream the peer dialled, before either side's service
// starts reading that stream; the frames are small enough for any socket
// buffer, so the writes never wait for the reads.

// openRails opens the endpoints of rails 1..want-1 on the listener's
// rail domains. A rail that cannot open, or whose provider splits the CQ
// data or keys differently from rail 0, ends the list with an INFO line:
// the communicator then uses the rails it has.
func (m *Mesh) openRails(l *Listener, want int) {
	m.rails = []*fabEP{m.fab}
	for _, d := range l.rails {
		if len(m.rails) >= want {
			break
		}
		e, err := openFabric(l.prov, d)
		if err == nil && (!e.layout(m.nranks) || e.cq.SeqBits != m.fab.cq.SeqBits || e.Info.MRMode != m.fab.Info.MRMode) {
			e.close()
			err = fmt.Errorf("its CQ data or mr_mode differs from rail 0's")
		}
		if err != nil {
			logx.Info(abi.SubsysNet|abi.SubsysInit, "NET/wasm: fabric rail %d on domain %s: %v; using %d rail(s)", len(m.rails), d, err, len(m.rails))
			break
		}
		e.rail, e.m, e.rank, e.links = len(m.rails), m, m.rank, make([]*fabricLink, m.nranks)
		e.SetSpin(m.fab.Spin())
		m.rails = append(m.rails, e)
	}
}

// railFrame is our rails frame.
func (m *Mesh) railFrame() []byte {
	names := make([][]byte, 0, len(m.rails)-1)
	for _, e := range m.rails[1:] {
		names = append(names, e.Name)
	}
	return endpoint.RailFrame(names)
}

// exchangeRails sends our rails frame to every peer fab[i] marks and
// reads theirs (names[i]: the peer's rails 1..).
func (m *Mesh) exchangeRails(fab []bool, outs, ins [][]*net.TCPConn, deadline time.Time) ([][][]byte, error) {
	frame := m.railFrame()
	for i, ok := range fab {
		if !ok {
			continue
		}
		c := outs[i][0]
		c.SetWriteDeadline(deadline)
		_, err := c.Write(frame)
		c.SetWriteDeadline(time.Time{})
		if err != nil {
			return nil, fmt.Errorf("rails frame to rank %d: %w", i, err)
		}
	}
	names := make([][][]byte, len(fab))
	for i, ok := range fab {
		if !ok {
			continue
		}
		c := ins[i][0]
		c.SetReadDeadline(deadline)
		nm, err := endpoint.ReadRailFrame(c, wire.FabNameMax)
		c.SetReadDeadline(time.Time{})
		if err != nil {
			return nil, fmt.Errorf("rails frame from rank %d: %w", i, err)
		}
		names[i] = nm
	}
	return names, nil
}

// fabricRails builds a link's rails to peer rank: rail 0 at addr0, then
// each rail both sides have, the peer's name inserted in our rail's AV.
func (m *Mesh) fabricRails(rank int, addr0 uint64, names [][]byte) ([]fabRail, error) {
	rails := []fabRail{{e: m.fab, addr: addr0}}
	for r := 1; r < len(m.rails) && r <= len(names); r++ {
		a, err := m.rails[r].FI.Insert(names[r-1])
		if err != nil {
			return nil, fmt.Errorf("fabric rail %d address of rank %d: %w", r, rank, err)
		}
		rails = append(rails, fabRail{e: m.rails[r], addr: a})
	}
	return rails, nil
}

// railNames names the domains (NICs) of the communicator's fabric
// endpoints, rail 0 first; nil without libfabric.
func (m *Mesh) railNames() []string {
	var d []string
	for _, e := range m.rails {
		d = append(d, e.Info.Domain)
	}
	return d
}

// railBytes is what our puts and gets moved through each rail so far.
func (m *Mesh) railBytes() []uint64 {
	var b []uint64
	for _, e := range m.rails {
		b = append(b, e.bytes.Load())
	}
	return b
}

// logRails reports the bytes each rail moved (at close).
func (m *Mesh) logRails() {
	if len(m.rails) < 2 {
		return
	}
	var s strings.Builder
	for r, e := range m.rails {
		fmt.Fprintf(&s, " rail %d (%s) %d", r, e.Info.Domain, e.bytes.Load())
	}
	logx.Info(abi.SubsysNet, "NET/wasm: rank %d: bytes put and got by fabric rail:%s", m.rank, s.String())
}

// closeRails closes every rail's endpoint.
func (m *Mesh) closeRails() {
	for _, e := range m.rails {
		e.close()
	}
	if len(m.rails) == 0 && m.fab != nil {
		m.fab.close()
	}
}
