package dataplane

import (
	"context"
	"fmt"
	"net"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/handshake"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/handshake/admission"
)

// Lazy lanes. Connect opens lane 0 to every peer; a lane beyond it opens
// when the first operation is queued on it: the lane dials the peer's
// listener with the signed hello (the claim names the lane), and the
// peer's mesh takes the stream from its listener (lateLanes), which must
// stay open while the mesh lives. Until then the lane's operations wait in
// its queue, in order; the target's orderer holds signals for sequence
// numbers still on the way, as for a slow lane. A dial that fails is a
// lane failure (tcp_failover.go): the queue moves to a live lane, or the
// peer fails when none is left. Only an opened lane is live for a
// failover (peer.opened): a failed lane's work never waits on a dial. A peer never used beyond lane 0 costs one
// stream each way.

// dialLane opens lane of the connection to p: the dial and the hello of
// connect, bounded by the connect timeout and cut short when the peer
// dies (Close marks it dead once its goodbyes were answered or timed out).
func (m *Mesh) dialLane(p *peer, lane int) (*net.TCPConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), m.dialTimeout)
	defer cancel()
	go func() {
		select { // not on m.quit: Close waits for what was queued on the lane
		case <-p.Quit():
			cancel()
		case <-ctx.Done():
		}
	}()
	cl := handshake.Claim{Rank: m.rank, NRanks: m.nranks, Lane: lane, Lanes: m.lanes, NoFabric: m.noFab, Encrypt: m.encrypt}
	return dialCtx(ctx, &m.infos[p.Rank()], m.id, cl)
}

// lateLanes hands the streams peers open after connect to their links,
// until the mesh or the listener closes.
func (m *Mesh) lateLanes(l *Listener) {
	defer m.wg.Done()
	for {
		select {
		case <-m.quit:
			return
		case <-l.done:
			return
		case in := <-l.conns:
			var err error
			if in.NRanks != m.nranks || in.Rank < 0 || in.Rank >= m.nranks {
				err = fmt.Errorf("it claims rank %d of %d; this communicator has %d ranks", in.Rank, in.NRanks, m.nranks)
			} else if a, ok := m.peers[in.Rank].t.(interface {
				AddIn(lane, lanes int, c *net.TCPConn) error
			}); !ok {
				err = fmt.Errorf("rank %d is not connected", in.Rank)
			} else {
				err = a.AddIn(in.Lane, in.Lanes, in.conn)
			}
			if err != nil {
				admission.Warn.Warn(abi.SubsysNet, "NET/wasm: rank %d: refused a lane opened after connect: %v", m.rank, err)
				in.conn.Close()
			}
		}
	}
}
