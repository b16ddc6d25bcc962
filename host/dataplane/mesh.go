// Connect, the mesh's public surface and its teardown.
//
// Ordering: with one lane, every operation from one rank to one peer travels
// on one stream and the target applies them in order, payload before signal;
// with several, puts carry per-peer sequence numbers and the target holds a
// signal until every earlier put landed. Either way every signal is strong
// per (context, peer) and across contexts too.

package dataplane

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/intranode"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/ofi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/handshake"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/profile"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// Options tune Connect.
type Options struct {
	Timeout   time.Duration
	IntraNode bool // use process_vm_writev/readv for peers on this host
	// Lanes is how many streams this rank opens to every peer (1..abi.MaxLanes).
	// With more than one, puts and gets of at least StripeThreshold bytes are
	// cut into ChunkSize pieces spread over the lanes.
	Lanes           int
	StripeThreshold uint64
	ChunkSize       uint64
	// CloseTimeout bounds how long Drain and Close wait for a live peer to
	// take (Drain) and to apply and acknowledge (Close) what was posted.
	CloseTimeout time.Duration
	// LocalCompletion completes a put when the kernel has its bytes instead
	// of when the target acknowledged their arrival: the opt-in faster mode
	// (NCCL_RMA_WASM_LOCAL_COMPLETION), which an out-of-band reader at the
	// target cannot rely on.
	LocalCompletion bool
	// PlacedCompletion completes a put whose payload a device copy placed
	// straight into an intra-node peer's mapped memory once that copy
	// executed and its header was written, without the target's ack
	// (NCCL_RMA_WASM_PLACED_COMPLETION): the bytes are there already.
	PlacedCompletion bool
	// NoFabric declines libfabric for every peer (the connection plan
	// asked for TCP or the intra-node path). Each rank tells its peers in
	// the connection hello, so a pair uses libfabric only if neither
	// declines.
	NoFabric bool
	// OrderWindow bounds how far past the first missing sequence number a
	// peer's numbers may run (0: DefaultOrderWindow). A number beyond it
	// is a protocol violation and drops the peer, so a broken or hostile
	// peer cannot grow the ordering ring without bound.
	OrderWindow uint64
	// SpinWait is how long a stream's reader keeps reading an empty socket
	// after traffic before it parks (0: never spins), and Spinners how many
	// readers of the process may spin at once (host/spin).
	SpinWait time.Duration
	Spinners int
	// SpinShare makes Spinners the host's budget rather than the
	// process's: it is divided among the job's processes on this host
	// (the ranks whose handles name this host, by their pids), so that
	// four ranks on one host spin no more readers in all than one would.
	SpinShare bool
	// PeerTimeout fails a peer with operations outstanding whose streams
	// moved no byte for this long (watchdog.go); 0 waits forever.
	PeerTimeout time.Duration
	// Encrypt seals every TCP stream (NCCL_RMA_WASM_ENCRYPT): X25519 keys
	// agreed under the signed hello, AES-256-GCM records (host/handshake).
	// A dialer that does not seal is refused.
	Encrypt bool
	// StageChunk is the size of the pieces device payloads are staged in
	// through host memory (NCCL_RMA_WASM_STAGE_CHUNK_KB; 0:
	// staging.DefaultChunk).
	StageChunk uint64
	// NoDmaBuf registers device memory with NIC providers by address, not
	// as a DMA-BUF (NCCL_RMA_WASM_FI_DMABUF=0).
	NoDmaBuf bool
	// NoIntraRing keeps intra-node device payloads off the shared staging
	// ring: they ride the TCP lanes (NCCL_RMA_WASM_INTRANODE_RING=0).
	NoIntraRing bool
	// NoIntraStream keeps intra-node request streams on their sockets
	// instead of shared-memory rings (NCCL_RMA_WASM_INTRANODE_STREAM=0).
	NoIntraStream bool
	// GatherWriter: the caller's thread never waits for the device copies
	// of the payloads it gathers; the lane's writer goroutine does, and
	// writes the batch (NCCL_RMA_WASM_GATHER_WRITER).
	GatherWriter bool
	// FlushAskAtOnce lets a flush ask at once for acks the target keeps
	// holding (NCCL_RMA_WASM_FLUSH_ASK_AT_ONCE; tcp's askPacer).
	FlushAskAtOnce bool
	// AckHoldAdapt holds an ack for a batch of ours only while holding
	// pays (NCCL_RMA_WASM_ACK_HOLD_ADAPT; putack.Lanes.Adapt).
	AckHoldAdapt bool
	// DirectSignal lets operations marked by the caller (Route.SigMapped)
	// have the device agent add their signal into the peer's mapped word
	// (NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL; peer.directRoute).
	DirectSignal bool
	// Peers, when non-nil, are the only ranks this rank connects to (its
	// own rank is always one): a peer list, as NCCL's v17 ABI would pass
	// it. Operations to any other rank fail as to a lost peer. Every rank
	// must list the ranks that list it. The scale simulation uses it
	// (scale_test.go), so 1,024 peers need not connect to one another.
	Peers []int
}

// DefaultCloseTimeout is Options.CloseTimeout when it is zero: the default
// of NCCL_RMA_WASM_CLOSE_TIMEOUT_MS, declared in host/config.
const DefaultCloseTimeout = config.DefaultCloseTimeout

// DefaultOrderWindow is Options.OrderWindow when it is zero.
const DefaultOrderWindow = config.DefaultOrderWindow

// Mesh is one communicator's set of connections: Lanes streams to every
// rank, itself included.
type Mesh struct {
	rank, nranks  int
	owner         Owner
	peers         []*peer
	lanes         int
	stripe        uint64
	chunk         uint64
	closed        atomic.Bool
	held          atomic.Bool // some peer queue holds aggregated ops
	closeTimeout  time.Duration
	localComp     bool
	orderWindow   uint64
	spinWait      time.Duration
	spinners      int
	wg            sync.WaitGroup
	quit          chan struct{} // closed by Close: stops the watchdog
	stageChunk    uint64        // Options.StageChunk
	noIntraRing   bool          // Options.NoIntraRing
	noIntraStream bool          // Options.NoIntraStream
	noDmaBuf      bool          // Options.NoDmaBuf
	directSignal  bool          // Options.DirectSignal
	fab           *ofi.Rails    // the libfabric endpoints, nil without them
	// What a lane opened after connect dials with (lazy.go).
	infos          []wire.HandleInfo
	id             *handshake.Identity
	noFab, encrypt bool
	dialTimeout    time.Duration
	// cfg is what the transports read of the mesh (link.Peer.Mesh).
	cfg link.Config
}

// ErrPeerGone is link.ErrPeerGone: the status of operations to a peer that
// closed or failed.
var ErrPeerGone = link.ErrPeerGone

// Connect builds the full mesh: it dials lane 0 of every rank's listener
// (including its own) and accepts lane 0 from every rank on l. It returns
// when all 2*nranks streams are up or when timeout passes. Further lanes
// open when first used (lazy.go): with more than one lane, l must stay
// open until the mesh is closed, to accept the peers' lanes.
func Connect(l *Listener, handles []*wire.Handle, rank int, owner Owner, opt Options) (*Mesh, error) {
	timeout := opt.Timeout
	n := len(handles)
	if rank < 0 || rank >= n {
		return nil, fmt.Errorf("rank %d outside [0, %d)", rank, n)
	}
	want, err := peerSet(opt.Peers, rank, n)
	if err != nil {
		return nil, err
	}
	infos := make([]wire.HandleInfo, n)
	for i, h := range handles {
		if !want[i] {
			continue // never dialled; its zero key admits no one
		}
		hi, err := wire.DecodeHandle(h)
		if err != nil {
			return nil, fmt.Errorf("handle of rank %d: %w", i, err)
		}
		infos[i] = hi
	}
	deadline := time.Now().Add(timeout)
	lanes := opt.Lanes
	if lanes < 1 || lanes > abi.MaxLanes {
		return nil, fmt.Errorf("%d lanes requested, allowed 1..%d", lanes, abi.MaxLanes)
	}
	if opt.SpinShare {
		budget, procs := opt.Spinners, 0
		opt.Spinners, procs = shareSpinners(budget, infos, rank)
		if procs > 1 && budget > 0 {
			logx.Info(abi.SubsysNet|abi.SubsysInit, "NET/wasm: rank %d: %d processes of this job on this host share its %d spinning readers: %d each",
				rank, procs, budget, opt.Spinners)
		}
	}
	m := &Mesh{rank: rank, nranks: n, owner: owner, peers: make([]*peer, n), lanes: lanes,
		stripe: max(opt.StripeThreshold, 1), chunk: max(opt.ChunkSize, 4096), closeTimeout: opt.CloseTimeout, localComp: opt.LocalCompletion,
		orderWindow: opt.OrderWindow, spinWait: opt.SpinWait, spinners: opt.Spinners, quit: make(chan struct{}),
		stageChunk: opt.StageChunk, noIntraRing: opt.NoIntraRing, noIntraStream: opt.NoIntraStream, noDmaBuf: opt.NoDmaBuf, directSignal: opt.DirectSignal,
		infos: infos, id: &l.id, noFab: opt.NoFabric, encrypt: opt.Encrypt, dialTimeout: timeout}
	if m.orderWindow == 0 {
		m.orderWindow = DefaultOrderWindow
	}
	if m.closeTimeout <= 0 {
		m.closeTimeout = DefaultCloseTimeout
	}
	m.cfg = link.Config{Rank: rank, Owner: owner, WG: &m.wg, StageChunk: m.stageChunk, LocalCompletion: m.localComp, PlacedCompletion: opt.PlacedCompletion,
		OrderWindow: m.orderWindow, SpinWait: m.spinWait, Spinners: m.spinners, CloseTimeout: m.closeTimeout,
		NoIntraRing: m.noIntraRing, NoIntraStream: m.noIntraStream, GatherWriter: opt.GatherWriter,
		FlushAskAtOnce: opt.FlushAskAtOnce, AckHoldAdapt: opt.AckHoldAdapt}
	l.fitFabric(n)
	outs, ins, peerNoFab, err := connectStreams(l, infos, want, rank, lanes, opt.NoFabric, opt.Encrypt, deadline, timeout)
	if err != nil {
		return nil, err
	}
	closeAll := func() {
		for j := range outs {
			for _, c := range append(outs[j], ins[j]...) {
				if c != nil { // lanes past 0 open on first use (lazy.go)
					c.Close()
				}
			}
		}
		m.fab.Close()
	}
	rails, err := m.takeFabric(l, opt, infos, peerNoFab, outs, ins, deadline)
	if err != nil {
		closeAll()
		return nil, err
	}
	for i := 0; i < n; i++ {
		if !want[i] {
			m.peers[i] = absentPeer(m, i)
			continue
		}
		p := newPeer(m, i)
		var names [][]byte
		if rails != nil {
			names = rails[i]
		}
		t, err := m.chooseTransport(p, opt, infos[i], infos[rank], outs[i], ins[i], opt.NoFabric || peerNoFab[i], names)
		if err != nil {
			closeAll()
			return nil, err
		}
		p.t = t
		m.peers[i] = p
	}
	if err := m.fab.Start(m.stripe); err != nil {
		m.fab = nil // Start closed the rails
		closeAll()
		return nil, err
	}
	for _, p := range m.peers {
		p.t.Start()
	}
	if lanes > 1 {
		m.wg.Add(1)
		go m.lateLanes(l)
	}
	if opt.PeerTimeout > 0 {
		m.wg.Add(1)
		go m.watch(opt.PeerTimeout)
	}
	var rings []streamWaker
	for _, p := range m.peers {
		if w, ok := p.t.(streamWaker); ok && !opt.NoIntraStream {
			rings = append(rings, w)
		}
	}
	if rings != nil {
		m.wg.Add(1)
		go m.watchStreams(rings)
	}
	return m, nil
}

// shareSpinners divides a host's budget of spinning readers among the
// job's processes on this host: those of the ranks in infos whose handles
// name this host's id, told apart by pid (one process may hold several
// ranks' communicators). Each process's share is the budget divided by
// their number, rounded down (procs: how many): where the cores cannot give every process a
// spinner, none spins, as on a machine of fewer than four cores. A spinner
// holds a core; several processes each spinning their own budget beside
// NCCL's polling proxies took more cores than the host has, and a reader
// that waits for a core for milliseconds costs more than its spin saves.
func shareSpinners(budget int, infos []wire.HandleInfo, rank int) (share, procs int) {
	self := infos[rank]
	pids := make(map[uint32]bool) // once per connect
	pids[self.Pid] = true
	for _, hi := range infos {
		if hi.HostID == self.HostID && hi.Pid != 0 {
			pids[hi.Pid] = true
		}
	}
	return budget / len(pids), len(pids)
}

// chooseTransport picks how bytes move to one peer: libfabric when both
// listeners opened an endpoint on the same provider, else the intra-node
// path for a peer on this host (same host id, a pid to copy into), else
// TCP. Both sides see both handles and both hellos, so they choose alike.
// railNames are the peer's rails 1.. (ofi.Rails.Exchange).
func (m *Mesh) chooseTransport(p *peer, opt Options, peer, self wire.HandleInfo, outs, ins []*net.TCPConn, noFab bool, railNames [][]byte) (transport, error) {
	if m.fab != nil && !noFab && peer.FabricHash == self.FabricHash && len(peer.FabricName) > 0 {
		return m.fab.Transport(p, peer, self, outs, ins, railNames)
	}
	if opt.IntraNode && peer.HostID == self.HostID && peer.Pid != 0 {
		return intranode.New(p, outs, ins, int(peer.Pid)), nil
	}
	return tcp.NewLink(p, outs, ins), nil
}

// Stats is link.Stats: what a mesh reports of itself.
type Stats = link.Stats

// Stats reads the mesh's counters (at connect and close: it allocates).
func (m *Mesh) Stats() Stats {
	st := Stats{FabricRails: m.fab.Names(), RailBytes: m.fab.Bytes(), FabricProvider: m.fab.Provider()}
	for _, p := range m.peers {
		p.t.AddStats(&st)
	}
	return st
}

// Post queues op for peer. It never blocks on the network and never fails for
// lack of space; an op to a lost peer completes with an error.
func (m *Mesh) Post(peerRank int, op *Op, hold bool, lane int) {
	profile.Mark(profile.PtPlan)
	m.peers[peerRank].route(op, hold, lane)
	// Raise the flag after the op is queued, so a Kick that clears it
	// always finds the op.
	if hold && !m.held.Load() {
		m.held.Store(true)
	}
}

// Flush sends what is queued for peer from the calling thread if the stream
// is idle (see lane.flush). test() calls it for the peer of a pending request.
func (m *Mesh) Flush(peerRank int) { m.peers[peerRank].t.Flush() }

// FlushAll is Flush for every peer; rmaProgress and iflush call it.
// Progress is FlushAll plus one poll of every libfabric endpoint on the
// caller's thread (rmaProgress): the peers' writes land and their signals
// apply where the caller waits, with no hand-off to the progress
// goroutine, which leaves the CQs to callers while they keep calling
// (endpoint.CallerGrace).
func (m *Mesh) Progress() {
	m.fab.Poll()
	for _, p := range m.peers {
		p.t.Turn()
	}
}

func (m *Mesh) FlushAll() {
	for _, p := range m.peers {
		p.t.Flush()
	}
}

// Mesh.AskAcks, peer.sayGoodbye and lateLanes find these TCP link methods
// by assertion only: a renamed method would silently turn them off.
var (
	_ interface{ AskAcks() }            = (*tcp.Link)(nil)
	_ interface{ LaneUnused(int) bool } = (*tcp.Link)(nil)
	_ interface {
		AddIn(lane, lanes int, c *net.TCPConn) error
	} = (*tcp.Link)(nil)
)

// AskAcks asks rank peerRank to acknowledge our puts to it at once if
// they are not acknowledged soon: the caller waits for their completions
// (iflush). Transports whose targets never hold their acks ignore it.
func (m *Mesh) AskAcks(peerRank int) {
	if a, ok := m.peers[peerRank].t.(interface{ AskAcks() }); ok {
		a.AskAcks()
	}
}

// Kick wakes the writers of queues holding aggregated ops. It costs one
// atomic load when nothing is held.
func (m *Mesh) Kick() {
	if !m.held.Load() || !m.held.Swap(false) {
		return
	}
	for _, p := range m.peers {
		p.t.Kick()
	}
}

// OpParts is how many completions the runtime must expect for op as it
// will be posted to peer (its Chunk counts): more than one when it is
// striped over several lanes, and over libfabric a put with signal that is
// not striped completes twice, once for the write and once for the signal
// message behind it.
func (m *Mesh) OpParts(peer int, op *Op) int {
	if peer < 0 || peer >= len(m.peers) || m.peers[peer] == nil {
		return m.parts(op.Msg, op.Size, op.Chunk)
	}
	p, n := m.peers[peer], 1
	if p.striped(op) {
		n = m.parts(op.Msg, op.Size, op.Chunk)
	}
	if n == 1 && p.t.SignalApart(*op) {
		n++
	}
	return n
}

// Drain sends everything posted so far and waits until every operation
// completed (puts acknowledged by the peer or copied into it, gets
// answered), a peer is gone, or the close timeout passes. The
// runtime calls it before destroyContext and deregMrSym return, because
// after those the caller may free the memory queued operations read from
// or write to. It reports the peers still busy at the deadline.
func (m *Mesh) Drain() []int {
	m.FlushAll()
	m.kickAll()
	deadline := time.Now().Add(m.closeTimeout)
	pause := 10 * time.Microsecond
	for {
		var busy []int
		for _, p := range m.peers {
			if !p.idle() {
				busy = append(busy, p.rank)
			}
		}
		if len(busy) == 0 || time.Now().After(deadline) {
			return busy
		}
		// Teardown only: the writers and the peer do the work, we sleep.
		time.Sleep(pause)
		pause = min(2*pause, time.Millisecond)
	}
}

// kickAll wakes every writer, so that small operations waiting for a test()
// or an aggregation hint leave now.
func (m *Mesh) kickAll() {
	m.held.Store(false)
	for _, p := range m.peers {
		p.t.Kick()
	}
}

// ErrUnconfirmed reports peers that did not acknowledge a goodbye in time:
// operations posted to them before the close may not have been applied.
type ErrUnconfirmed struct {
	Ranks   []int
	Timeout time.Duration
}

func (e *ErrUnconfirmed) Error() string {
	return fmt.Sprintf("ranks %v did not confirm within %v that they applied the operations posted before the close; those may be lost", e.Ranks, e.Timeout)
}

// Close delivers what was posted and then closes every stream. A goodbye
// follows the queued operations on every lane, and Close waits until each
// peer acknowledged each goodbye (its service applied everything before it,
// with no call from the peer process), the peer is gone, or the close
// timeout passes; a dead peer ends the wait at once.
func (m *Mesh) Close() error {
	if m.closed.Swap(true) {
		return nil
	}
	close(m.quit)
	for _, p := range m.peers {
		p.sayGoodbye()
	}
	deadline := time.Now().Add(m.closeTimeout)
	var late []int
	for _, p := range m.peers {
		if p.awaitGoodbye(deadline) > 0 {
			late = append(late, p.rank)
		}
	}
	m.wg.Wait()
	for _, p := range m.peers {
		p.t.Release()
	}
	m.fab.Log()
	m.fab.Close()
	if late != nil {
		return &ErrUnconfirmed{Ranks: late, Timeout: m.closeTimeout}
	}
	return nil
}
