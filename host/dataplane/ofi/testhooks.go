package ofi

import (
	"sync/atomic"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric/endpoint"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/procid"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/seqorder"
)

// Hooks into the libfabric transport for its integration tests (package
// ofi_test, which build whole meshes with host/dataplane/meshtest): they
// look at or drive the endpoints, slots and windows underneath. Kept apart
// from the data path so that the tests reach only these; test-only,
// nothing in the data path calls them.

// EP is rail i's endpoint.
func (r *Rails) EP(i int) *EP { return r.eps[i] }

// CQ is how the endpoint's CQ data splits between rank and sequence
// number, and whether signals ride it.
func (e *EP) CQ() endpoint.CQLayout { return e.cq }

// Links are the endpoint's links by rank (nil where the peer is not on
// this fabric).
func (e *EP) Links() []*Link { return e.links }

// Addr is the peer's address on the rail, in our endpoint's AV.
func (r fabRail) Addr() uint64 { return r.addr }

// EP is our endpoint of the rail.
func (r fabRail) EP() *EP { return r.e }

// Rails are the link's rails, rail 0 first.
func (f *Link) Rails() []fabRail { return f.rails }

// EP is the link's rail-0 endpoint.
func (f *Link) EP() *EP { return f.e }

// Win is the link's window of sequence numbers.
func (f *Link) Win() *seqorder.Window { return f.win }

// Inflight counts operations and control messages posted, not completed.
func (f *Link) Inflight() *atomic.Int64 { return &f.inflight }

// CtlLive counts the control messages among Inflight.
func (f *Link) CtlLive() *atomic.Int64 { return &f.ctlLive }

// Backlog counts the operations waiting for room.
func (f *Link) Backlog() *atomic.Int32 { return &f.backlog }

// CQSigs counts the puts with signal sent as one write.
func (f *Link) CQSigs() *atomic.Uint64 { return &f.cqSigs }

// AcksIn counts the acknowledgements that came in a MsgAck.
func (f *Link) AcksIn() *atomic.Uint64 { return &f.acksIn }

// Staging counts the staged puts not yet acknowledged.
func (f *Link) Staging() *atomic.Int32 { return &f.staging }

// Slot takes a slot of e for tag (ctl: a control message).
func (f *Link) Slot(e *EP, tag uint64, ctl bool) (uint32, bool) { return f.slot(e, tag, ctl) }

// Unslot frees slot idx of e.
func (f *Link) Unslot(e *EP, idx uint32) { f.unslot(e, idx) }

// PeerRegistered records the peer's registration id on rail.
func (f *Link) PeerRegistered(rail uint8, id uint32, base, key uint64, dev, direct bool) {
	f.peerRegistered(rail, id, base, key, dev, direct)
}

// Target is the remote address and rail's key of off in the peer's
// registration id; false while unknown.
func (f *Link) Target(id uint32, off uint64, rail int) (uint64, uint64, bool) {
	return f.target(id, off, rail)
}

// RemoteDev reports whether the peer's registration id is device memory,
// and whether its provider registered it.
func (f *Link) RemoteDev(id uint32) (dev, direct bool) { return f.remoteDev(id) }

// Staged reports whether op moves over the TCP lanes.
func (f *Link) Staged(op *link.Op) bool { return f.staged(op) }

// LearnSignal remembers that the peer accepted signal word off of id.
func (f *Link) LearnSignal(id uint32, off uint64) { f.learnSignal(id, off) }

// BareLink is a link whose only rail is endpoint ep, with no provider
// behind it and no peer registration heard yet, over TCP link tl (nil:
// none): for the tests of what a link decides by itself.
func BareLink(ep *endpoint.Endpoint, tl *tcp.Link) *Link {
	e := &EP{Endpoint: ep}
	f := &Link{Link: tl, e: e, rails: []fabRail{{e: e}}}
	empty := []fabRemote{}
	f.remote.Store(&empty)
	return f
}

// WatchPid arms the exit check of an shm peer's process pid.
func (f *Link) WatchPid(pid int) { f.watchPid(pid) }

// Pid is the watch on the shm peer's process.
func (f *Link) Pid() *procid.Watch { return &f.pid }

// PeerGone is the error a post to an exited peer fails with, or nil.
func (f *Link) PeerGone() error { return f.peerGone() }

// SignalSent reports whether a posted slot of e holds f's operation tag
// with its send completed (sigSent), under e's poll lock.
func (e *EP) SignalSent(f *Link, tag uint64) bool {
	for i := range e.slots {
		s := &e.slots[i]
		if s.state.Load()&3 == slotPosted && s.link == f && s.tag == tag && s.got&sigSent != 0 {
			return true
		}
	}
	return false
}
