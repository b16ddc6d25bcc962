package dataplane

import (
	"net"
	"sync/atomic"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/seqorder"
)

// The peer as its transport sees it (link.Peer): the transports name no
// field of peer or Mesh, so that they can live in packages of their own.

var _ link.Peer = (*peer)(nil)

// Rank is the peer's rank.
func (p *peer) Rank() int { return p.rank }

// Mesh is the mesh's configuration, as Connect gave it.
func (p *peer) Mesh() *link.Config { return &p.m.cfg }

// Transport is the peer's transport.
func (p *peer) Transport() link.Transport { return p.t }

// Lanes is how many lanes the mesh opens to the peer.
func (p *peer) Lanes() int { return p.lanes }

// Live is live: the first lane from lane on that has not failed.
func (p *peer) Live(lane int) int { return p.live(lane) }

// Dead reports the dead flag.
func (p *peer) Dead() bool { return p.dead.Load() }

// RaiseDead raises the dead flag alone (a transport's Stop).
func (p *peer) RaiseDead() { p.dead.Store(true) }

// MarkDead is markDead.
func (p *peer) MarkDead(err error) { p.markDead(err) }

// Quit is closed once the peer is torn down.
func (p *peer) Quit() <-chan struct{} { return p.quit }

// Closing reports that our Close began.
func (p *peer) Closing() bool { return p.closing.Load() }

// Fail is fail.
func (p *peer) Fail(op Op) { p.fail(&op) }

// FailCause is failCause.
func (p *peer) FailCause(op Op, err error) { p.failCause(&op, err) }

// ByeSeen reports that the peer said goodbye on one of its lanes.
func (p *peer) ByeSeen() bool { return p.peerBye.Load() }

// SeeBye records the peer's goodbye.
func (p *peer) SeeBye() { p.peerBye.Store(true) }

// AckBye is ackBye.
func (p *peer) AckBye() { p.ackBye() }

// ByeGone is byeGone.
func (p *peer) ByeGone() { p.byeGone() }

// Down is the bit set of failed lanes.
func (p *peer) Down() *atomic.Uint32 { return &p.down }

// Opened is the bit set of lanes with a stream.
func (p *peer) Opened() *atomic.Uint32 { return &p.opened }

// DirectOff is link.Peer's.
func (p *peer) DirectOff() *atomic.Bool { return &p.directOff }

// AskedAcks counts the peer's asks for acks we answered.
func (p *peer) AskedAcks() *atomic.Int64 { return &p.askedAcks }

// Order is the orderer of the peer's signals.
func (p *peer) Order() *seqorder.Orderer[link.Signal] { return &p.order }

// Landed is landed.
func (p *peer) Landed(seq uint64, sig link.Signal, add uint64) error { return p.landed(seq, sig, add) }

// DialLane is the mesh's dialLane for the peer.
func (p *peer) DialLane(lane int) (*net.TCPConn, error) { return p.m.dialLane(p, lane) }

// SignalTarget is signalTarget.
func (p *peer) SignalTarget(mrID uint32, off uint64, op uint8, value uint64) (link.Signal, uint64, abi.Result) {
	return p.signalTarget(mrID, off, op, value)
}
