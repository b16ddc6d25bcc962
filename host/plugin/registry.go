package plugin

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
)

// registry is one communicator's symmetric registrations. Ids are assigned
// in call order, so a buffer has the same id on every rank; the target
// side resolves ids for every incoming operation, so lookups are lock-free
// reads of a copy-on-write slice, while registering, releasing and the
// exchange of peers' sizes take the mutex.
type registry struct {
	nranks int
	closed *atomic.Bool // the communicator's: waiters give up when it closes

	mu     sync.Mutex
	cond   *sync.Cond // peers' announcements arrived, or the wait ended
	byID   atomic.Pointer[[]*mr]
	byAddr map[regKey]*mr
	nextID uint32
	remote map[uint32]*remoteSizes // announcements not yet claimed by awaitPeers
}

// remoteSizes collects what peers announced for one registration id.
type remoteSizes struct {
	have  int
	peers remoteRegs
	known []bool
}

// remoteRegs is a registration as every rank sees it: its size there (for
// bounds checks) and its address there (for the intra-node single copy).
type remoteRegs struct {
	sizes []uint64
	bases []uint64
	dev   []bool // device memory there: no single-copy path into it
	// share is each rank's descriptor server token for this registration
	// (0: none), nil when no rank offered one; mapped is the address of
	// each rank's registration mapped into this process (0: not mapped),
	// nil when none is (share.go).
	share  []uint64
	mapped []uintptr
	// adds says which ranks' parts take our device agent's adds to their
	// signal words (direct.go), nil when none does.
	adds []bool
	// inbox is each rank's 1 + the entry of its peer inbox's table that
	// holds its part (0: none), nil when no rank's does.
	inbox []uint8
}

func newRegistry(nranks int, closed *atomic.Bool) *registry {
	g := &registry{nranks: nranks, closed: closed, byAddr: map[regKey]*mr{}, remote: map[uint32]*remoteSizes{}}
	g.cond = sync.NewCond(&g.mu)
	empty := []*mr{}
	g.byID.Store(&empty)
	return g
}

// lookup returns registration id, or nil; lock-free.
func (g *registry) lookup(id uint32) *mr {
	mrs := *g.byID.Load()
	if int(id) >= len(mrs) {
		return nil
	}
	return mrs[id]
}

// regKey is what makes two registrations one: the address and the
// flags. A range registered again with other flags (NEVER_RESET or not,
// FORCE_SO or not) is a registration of its own: sharing the first one's
// never-reset signal shadow with a registration whose words may be reset
// would silently break its signals after a reset.
type regKey struct {
	addr  uintptr
	flags uint64
}

// reuse takes another reference on the registration of data with the
// same flags when it covers size bytes.
func (g *registry) reuse(data uintptr, size, flags uint64) *mr {
	g.mu.Lock()
	defer g.mu.Unlock()
	if m := g.byAddr[regKey{data, flags}]; m != nil && size <= m.size {
		m.refs++
		return m
	}
	return nil
}

// add gives m the next id and publishes it.
func (g *registry) add(m *mr, data uintptr) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.nextID++
	m.id = g.nextID
	old := *g.byID.Load()
	n := make([]*mr, max(len(old), int(m.id)+1))
	copy(n, old)
	n[m.id] = m
	g.byID.Store(&n)
	g.byAddr[regKey{data, m.flags}] = m
}

// release drops one reference and reports whether it was the last.
func (g *registry) release(m *mr) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	m.refs--
	return m.refs == 0
}

// drop forgets m: the target side no longer resolves its id.
func (g *registry) drop(m *mr) {
	m.dropped.Store(true)
	g.mu.Lock()
	defer g.mu.Unlock()
	old := *g.byID.Load()
	n := make([]*mr, len(old))
	copy(n, old)
	n[m.id] = nil
	g.byID.Store(&n)
	if k := (regKey{uintptr(m.base), m.flags}); g.byAddr[k] == m {
		delete(g.byAddr, k)
	}
}

// peerRegistered records a peer's size, address and memory kind for id.
func (g *registry) peerRegistered(peer int, r dataplane.PeerReg, adds bool) {
	id := r.MrID
	g.mu.Lock()
	defer g.mu.Unlock()
	rs := g.remote[id]
	if rs == nil {
		n := g.nranks
		rs = &remoteSizes{peers: remoteRegs{sizes: make([]uint64, n), bases: make([]uint64, n), dev: make([]bool, n)}, known: make([]bool, n)}
		g.remote[id] = rs
	}
	if !rs.known[peer] {
		rs.known[peer] = true
		rs.have++
	}
	rs.peers.sizes[peer] = r.Size
	rs.peers.bases[peer] = r.Base
	rs.peers.dev[peer] = r.Dev
	if r.Share != 0 {
		if rs.peers.share == nil {
			rs.peers.share = make([]uint64, g.nranks)
		}
		rs.peers.share[peer] = r.Share
	}
	if r.Inbox != 0 {
		if rs.peers.inbox == nil {
			rs.peers.inbox = make([]uint8, g.nranks)
		}
		rs.peers.inbox[peer] = r.Inbox
	}
	if adds {
		if rs.peers.adds == nil {
			rs.peers.adds = make([]bool, g.nranks)
		}
		rs.peers.adds[peer] = true
	}
	g.cond.Broadcast()
}

// awaitPeers waits until every rank announced registration id, the
// communicator closes, or timeout passes.
func (g *registry) awaitPeers(id uint32, timeout time.Duration) (*remoteRegs, error) {
	deadline := time.Now().Add(timeout)
	t := time.AfterFunc(timeout, g.wake)
	defer t.Stop()
	g.mu.Lock()
	defer g.mu.Unlock()
	for {
		rs := g.remote[id]
		if rs != nil && rs.have == g.nranks {
			delete(g.remote, id)
			return &rs.peers, nil
		}
		if g.closed.Load() {
			return nil, fmt.Errorf("communicator closed")
		}
		if time.Now().After(deadline) {
			missing := []int{}
			for p := 0; p < g.nranks; p++ {
				if rs == nil || !rs.known[p] {
					missing = append(missing, p)
				}
			}
			return nil, fmt.Errorf("ranks %v did not register the matching buffer within %v (registration is collective)", missing, timeout)
		}
		g.cond.Wait()
	}
}

// wake makes waiters look again (the deadline passed, or the communicator
// closed).
func (g *registry) wake() {
	g.mu.Lock()
	g.cond.Broadcast()
	g.mu.Unlock()
}

// errKeyBackend is the stickyError key of failures a backend decided (a
// plan status, a lane outside the plan, a guest fault); peers use their rank.
const errKeyBackend = -1

// errKeyInternal is the stickyError key of panics recovered at the C boundary.
const errKeyInternal = -2

// stickyError is queryLastError's flag: set by the first asynchronous
// failure and never cleared. Each failing peer is logged once, and its
// first error is kept as the cause its failed requests name (test()).
type stickyError struct {
	flag  atomic.Bool
	mu    sync.Mutex
	peers map[int]error
	// warned holds the (peer, status, cause) of failed requests already
	// logged by test(): one WARN per cause.
	warned map[failKey]bool
}

type failKey struct {
	peer   uint32
	status abi.Result
	cause  string
}

// set raises the flag, keeps err as peer's cause if it is the first, and
// reports whether it is.
func (s *stickyError) set(peer int, err error) (first bool) {
	s.mu.Lock()
	if s.peers == nil {
		s.peers = map[int]error{}
	}
	_, seen := s.peers[peer]
	if !seen {
		s.peers[peer] = err
	}
	s.mu.Unlock()
	s.flag.Store(true)
	return !seen
}

// cause is the first error recorded for peer (nil: none yet).
func (s *stickyError) cause(peer int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peers[peer]
}

// firstFailure reports whether a failed request to peer with status and
// cause is the first such, and records it.
func (s *stickyError) firstFailure(peer uint32, status abi.Result, cause string) bool {
	k := failKey{peer, status, cause}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.warned[k] {
		return false
	}
	if s.warned == nil {
		s.warned = map[failKey]bool{}
	}
	s.warned[k] = true
	return true
}

// isSet is lock-free.
func (s *stickyError) isSet() bool { return s.flag.Load() }
