package plugin

import (
	"sync"
	"sync/atomic"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
)

// Lane failover reaches the backends (SPEC.md §8.10, FeatureLaneEvents):
// the mesh reports each lane it failed over, and every context whose
// backend wants lane events finds an EventLaneDown record in its next
// completion batch, before the completions of the operations that moved.

// laneLog is a communicator's failed lanes, in the order they failed.
// Each (peer, lane) fails once, so it holds at most nranks*MaxLanes.
type laneLog struct {
	mu  sync.Mutex
	evs []backend.Completion
	n   atomic.Int32 // len(evs), read without the lock on the completion path
}

var _ dataplane.LaneObserver = (*coll)(nil)

// LaneFailed implements dataplane.LaneObserver. The dataplane logged it.
func (c *coll) LaneFailed(peer, lane, moved int, _ error) {
	c.lanes.mu.Lock()
	defer c.lanes.mu.Unlock()
	if len(c.lanes.evs) >= c.nranks*abi.MaxLanes {
		return
	}
	c.lanes.evs = append(c.lanes.evs, backend.Completion{Kind: backend.EventLaneDown, Peer: uint32(peer),
		Size: uint64(moved), Status: int32(abi.RemoteError), Lane: int32(lane)})
	c.lanes.n.Store(int32(len(c.lanes.evs)))
}

// laneEvents adds the lane events this context has not seen to its
// completion batch. Called with s.mu held; one atomic load when there is
// nothing new.
func (s *ctxState) laneEvents(c *coll) {
	if !s.lanes || int(c.lanes.n.Load()) == s.laneSeen {
		return
	}
	c.lanes.mu.Lock()
	s.done = append(s.done, c.lanes.evs[s.laneSeen:]...)
	s.laneSeen = len(c.lanes.evs)
	c.lanes.mu.Unlock()
	if len(s.done) >= completionBatch {
		s.flushCompletions()
	}
}
