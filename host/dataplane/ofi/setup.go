package ofi

import (
	"fmt"
	"net"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// Set-up: what Connect does for libfabric beyond the TCP streams every
// peer has, once the rails are open and their names exchanged (rails.go):
// the pairs that both can use libfabric get a Link, and the rails'
// completion goroutines start.

// Transport is the libfabric transport to peer p: the peer's address on
// every rail (its handle peer names rail 0, railNames the rest), and a
// Link over them. self is our own handle; a peer on our host gets its
// process watched (pid.go).
func (r *Rails) Transport(p link.Peer, peer, self wire.HandleInfo, outs, ins []*net.TCPConn, railNames [][]byte) (link.Transport, error) {
	addr, err := r.eps[0].FI.Insert(peer.FabricName)
	if err != nil {
		return nil, fmt.Errorf("fabric address of rank %d: %w", p.Rank(), err)
	}
	rails, err := r.linkRails(p.Rank(), addr, railNames)
	if err != nil {
		return nil, err
	}
	f := newLink(p, outs, ins, rails)
	if peer.HostID == self.HostID {
		f.watchPid(int(peer.Pid))
	}
	for _, rl := range rails {
		rl.e.links[p.Rank()] = f
	}
	return f, nil
}

// Start starts every rail's completion goroutine once every peer has its
// transport; on an error it closes every rail. stripe is the size from
// which operations stripe over the lanes, and so over the rails.
func (r *Rails) Start(stripe uint64) error {
	if r == nil {
		return nil
	}
	for _, e := range r.eps {
		if err := e.Start(); err != nil {
			r.Close()
			return fmt.Errorf("fabric rail %d: %w", e.rail, err)
		}
	}
	if len(r.eps) > 1 {
		logx.Info(abi.SubsysNet|abi.SubsysInit, "NET/wasm: rank %d: %d fabric rails %v; operations of at least %d bytes stripe over them",
			r.rank, len(r.eps), r.Names(), stripe)
	}
	return nil
}
