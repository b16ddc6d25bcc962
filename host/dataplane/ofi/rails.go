package ofi

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

// Rails are a communicator's libfabric endpoints, rail 0 (the listener's)
// first. The mesh holds them for what it does beside its peers'
// transports: registrations on every rail's domain, the caller's polls,
// the statistics and the close; everything else about libfabric stays in
// this package. A nil *Rails is a communicator without libfabric.
type Rails struct {
	eps      []*EP
	rank     int
	noDmaBuf bool // Options.NoDmaBuf: no DMA-BUF registrations (takesDmaBuf)
}

// NewRails takes the listener's endpoint ep for a communicator of n ranks
// in which we are rank, and opens further rails on domains (the
// listener's ListenOptions.Rails, on provider prov), up to want in all. A
// rail that cannot open, or whose provider splits the CQ data or keys
// differently from rail 0, ends the list with an INFO line: the
// communicator then uses the rails it has.
func NewRails(ep *EP, rank, n int, spin time.Duration, spinners int, prov string, domains []string, want int, noDmaBuf bool) *Rails {
	ep.rank, ep.links = rank, make([]*Link, n)
	ep.SetSpin(spin, int32(spinners))
	r := &Rails{eps: []*EP{ep}, rank: rank, noDmaBuf: noDmaBuf}
	for _, d := range domains {
		if len(r.eps) >= want {
			break
		}
		e, err := Open(prov, d)
		if err == nil && (!e.Fits(n) || e.cq.SeqBits != ep.cq.SeqBits || e.Info.MRMode != ep.Info.MRMode) {
			e.Discard()
			err = fmt.Errorf("its CQ data or mr_mode differs from rail 0's")
		}
		if err != nil {
			logx.Info(abi.SubsysNet|abi.SubsysInit, "NET/wasm: fabric rail %d on domain %s: %v; using %d rail(s)", len(r.eps), d, err, len(r.eps))
			break
		}
		e.rail, e.rank, e.links = len(r.eps), rank, make([]*Link, n)
		e.SetSpin(ep.Spin())
		r.eps = append(r.eps, e)
	}
	return r
}

// railFrame is our rails frame.
func (r *Rails) railFrame() []byte {
	names := make([][]byte, 0, len(r.eps)-1)
	for _, e := range r.eps[1:] {
		names = append(names, e.Name)
	}
	return endpoint.RailFrame(names)
}

// Exchange sends our rails frame to every peer fab[i] marks and reads
// theirs (names[i]: the peer's rails 1..), on lane 0 of each pair.
func (r *Rails) Exchange(fab []bool, outs, ins [][]*net.TCPConn, deadline time.Time) ([][][]byte, error) {
	frame := r.railFrame()
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

// linkRails builds a link's rails to peer rank: rail 0 at addr0, then
// each rail both sides have, the peer's name inserted in our rail's AV.
func (r *Rails) linkRails(rank int, addr0 uint64, names [][]byte) ([]fabRail, error) {
	rails := []fabRail{{e: r.eps[0], addr: addr0}}
	for i := 1; i < len(r.eps) && i <= len(names); i++ {
		a, err := r.eps[i].FI.Insert(names[i-1])
		if err != nil {
			return nil, fmt.Errorf("fabric rail %d address of rank %d: %w", i, rank, err)
		}
		rails = append(rails, fabRail{e: r.eps[i], addr: a})
	}
	return rails, nil
}

// Names names the domains (NICs) of the communicator's fabric endpoints,
// rail 0 first; nil without libfabric.
func (r *Rails) Names() []string {
	if r == nil {
		return nil
	}
	var d []string
	for _, e := range r.eps {
		d = append(d, e.Info.Domain)
	}
	return d
}

// Bytes is what our puts and gets moved through each rail so far.
func (r *Rails) Bytes() []uint64 {
	if r == nil {
		return nil
	}
	var b []uint64
	for _, e := range r.eps {
		b = append(b, e.bytes.Load())
	}
	return b
}

// Provider is rail 0's provider; "" without libfabric.
func (r *Rails) Provider() string {
	if r == nil {
		return ""
	}
	return r.eps[0].Info.Provider
}

// Poll polls every rail once on the caller's thread (Mesh.Progress).
func (r *Rails) Poll() {
	if r == nil {
		return
	}
	for _, e := range r.eps {
		e.CallerPoll()
	}
}

// Log reports the bytes each rail moved (at close).
func (r *Rails) Log() {
	if r == nil || len(r.eps) < 2 {
		return
	}
	var s strings.Builder
	for i, e := range r.eps {
		fmt.Fprintf(&s, " rail %d (%s) %d", i, e.Info.Domain, e.bytes.Load())
	}
	logx.Info(abi.SubsysNet, "NET/wasm: rank %d: bytes put and got by fabric rail:%s", r.rank, s.String())
}

// Close closes every rail's endpoint.
func (r *Rails) Close() {
	if r == nil {
		return
	}
	for _, e := range r.eps {
		e.Discard()
	}
}
