package plugin

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/intranode/share"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/handshake"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/profile"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/spin"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

type listenComm struct {
	l      *dataplane.Listener
	dev    int32
	be     *loaded
	commID uint64 // NCCL's communicator id, from the context listen was called on
	// held: a communicator with more than one lane connected on l and
	// needs it until it closes, to accept the lanes peers open when they
	// first use them (host/dataplane/lazy.go); closeColl closes l then.
	held atomic.Bool
}

// coll is a collective communicator: the mesh, its registrations and its
// rma contexts.
type coll struct {
	id     uint64
	commID uint64 // NCCL's communicator id; guests see it in rmaw_ctx_open
	rank   int
	nranks int
	dev    int32
	be     *loaded
	plan   backend.ConnPlan
	mesh   *dataplane.Mesh
	ln     *dataplane.Listener // the listener the mesh keeps (listenComm.held), or nil
	closed atomic.Bool
	// laneFolded: a backend's lane beyond plan.Lanes was folded (logged once).
	laneFolded atomic.Bool

	regs *registry

	rmaMu sync.Mutex
	rmas  []*rmaCtx
	// deferred is 1 while a context holds aggregated ops back for batched
	// planning (batch.go).
	deferred atomic.Int32

	err stickyError

	lanes laneLog // lanes the mesh failed over (lanes.go)

	shares *share.Exchange // device windows shared with peers of this host (share.go)
}

var (
	listens = table[listenComm]{kind: kindListen}
	colls   = table[coll]{kind: kindColl}
)

// Listen opens the listener a later connect accepts peers on, and writes the
// handle NCCL all-gathers.
func Listen(ctx uint64, dev int32, handle *[abi.HandleSize]byte) (uint64, abi.Result) {
	pc := lookupCtx(ctx)
	if pc == nil {
		logx.Warn(abi.SubsysNet, "NET/wasm: listen: unknown context %#x", ctx)
		return 0, abi.InvalidArgument
	}
	if dev < 0 || int(dev) >= len(pc.backend.devices) {
		logx.Warn(abi.SubsysNet, "NET/wasm: listen: device %d out of range [0, %d)", dev, len(pc.backend.devices))
		return 0, abi.InvalidArgument
	}
	prov, _ := selectTransport() // an explicit request not honoured failed init
	l, h, err := dataplane.Listen(dataplane.ListenOptions{Addr: config.Addr.Get(), Provider: prov,
		Domain: pc.backend.deviceDomain(dev), Rails: pc.backend.railDomains(dev)})
	if err != nil {
		logx.Warn(abi.SubsysNet, "NET/wasm: listen: %v", err)
		return 0, abi.SystemError
	}
	*handle = *h
	id := listens.add(&listenComm{l: l, dev: dev, be: pc.backend, commID: pc.commID})
	if d := l.FabricDomain(); d != "" {
		logx.Info(abi.SubsysNet, "NET/wasm: listening on %s (dev %d), fabric endpoint on domain %s (device memory: %s)", l.Addr(), dev, d, l.FabricDeviceMemory())
	} else {
		logx.Info(abi.SubsysNet, "NET/wasm: listening on %s (dev %d)", l.Addr(), dev)
	}
	return listens.handle(id), abi.Success
}

// CloseListen stops accepting. Connect has already taken its connections.
func CloseListen(listen uint64) abi.Result {
	lc := listens.take(listen)
	if lc == nil {
		logx.Warn(abi.SubsysNet, "NET/wasm: closeListen: unknown listen comm %#x", listen)
		return abi.InvalidArgument
	}
	if lc.held.Load() {
		return abi.Success // closeColl closes it
	}
	if err := lc.l.Close(); err != nil {
		logx.Info(abi.SubsysNet, "NET/wasm: closeListen: %v", err)
	}
	return abi.Success
}

// clampLanes is the communicator's lane count: NCCL_RMA_WASM_LANES when
// set (the operator overrides the backend), else the backend's plan,
// within 1..MaxLanes. A difference from the plan is one INFO line rather
// than an error: operations the backend plans on lanes beyond the count
// fold onto the lanes there are (applyPlan).
func clampLanes(be string, planned int32, set int) int32 {
	lanes := planned
	if set > 0 {
		lanes = int32(set)
	}
	lanes = min(max(lanes, 1), abi.MaxLanes)
	if lanes != planned {
		why := fmt.Sprintf("allowed 1..%d", abi.MaxLanes)
		if set > 0 {
			why = fmt.Sprintf("NCCL_RMA_WASM_LANES=%d", set)
		}
		logx.Info(abi.SubsysNet, "NET/wasm: connect: backend %s planned %d lane(s); using %d (%s); a lane it plans beyond them is taken modulo %d", be, planned, lanes, why, lanes)
	}
	return lanes
}

// Connect builds the full mesh among the nranks ranks. The ctx argument is
// ignored: NCCL's RMA proxy passes another plugin's context there.
func Connect(handles []*[abi.HandleSize]byte, rank int32, listen uint64) (uint64, abi.Result) {
	lc := listens.lookup(listen)
	if lc == nil {
		logx.Warn(abi.SubsysNet, "NET/wasm: connect: unknown listen comm %#x", listen)
		return 0, abi.InvalidArgument
	}
	n := len(handles)
	if n == 0 || rank < 0 || int(rank) >= n {
		logx.Warn(abi.SubsysNet, "NET/wasm: connect: rank %d outside [0, %d)", rank, n)
		return 0, abi.InvalidArgument
	}
	plan, err := lc.be.b.ConnectionPlan(int32(n), rank)
	if err != nil {
		logx.Warn(abi.SubsysNet, "NET/wasm: connect: backend %s: connection plan: %v", lc.be.b.Name(), err)
		return 0, abi.InternalError
	}
	plan.Lanes = clampLanes(lc.be.b.Name(), plan.Lanes, int(config.Lanes.Get()))
	c := &coll{commID: lc.commID, rank: int(rank), nranks: n, dev: lc.dev, be: lc.be, plan: plan}
	c.regs = newRegistry(n, &c.closed)
	c.shares = newShares(c)
	hs := make([]*wire.Handle, n)
	for i, h := range handles {
		hs[i] = (*wire.Handle)(h)
	}
	start := time.Now()
	opt := dataplane.Options{Timeout: config.ConnectTimeout.Get(), IntraNode: config.IntraNode.Get() && plan.Transport != backend.TransportTCP,
		Lanes: int(plan.Lanes), StripeThreshold: plan.StripeThreshold, ChunkSize: plan.ChunkSize, CloseTimeout: config.CloseTimeout.Get(),
		LocalCompletion: config.LocalCompletion.Get(), PlacedCompletion: config.PlacedCompletion.Get(),
		// The plan chooses among what the operator enabled (SPEC.md §8.10).
		// Encryption declines libfabric too: its RMA writes would bypass the seal.
		NoFabric:    plan.Transport == backend.TransportTCP || plan.Transport == backend.TransportIntraNode || config.Encrypt.Get(),
		OrderWindow: uint64(config.OrderWindow.Get()), PeerTimeout: config.PeerTimeout.Get(),
		Encrypt:    config.Encrypt.Get(),
		StageChunk: uint64(config.StageChunkKiB.Get()) << 10, NoIntraRing: !config.IntraRing.Get(),
		// A shared ring carries requests in the clear: not under encryption.
		NoIntraStream: !config.IntraStream.Get() || config.Encrypt.Get(), NoDmaBuf: !config.FIDmaBuf.Get(),
		GatherWriter: gatherWriter(), DirectSignal: directSignal.Load() || inboxOn.Load(), FlushAskAtOnce: config.FlushAskAtOnce.Get(),
		AckHoldAdapt: config.AckHoldAdapt.Get()}
	opt.SpinWait, opt.Spinners, opt.SpinShare = spinOptions()
	checkNoFile(n, opt.Lanes, opt.Encrypt)
	mesh, err := dataplane.Connect(lc.l, hs, int(rank), c, opt)
	if err != nil {
		logx.Warn(abi.SubsysNet, "NET/wasm: connect: rank %d of %d: %v", rank, n, err)
		return 0, connectResult(err)
	}
	c.mesh = mesh
	c.shares.Attach(mesh.IPC())
	if opt.Lanes > 1 {
		c.ln = lc.l
		lc.held.Store(true)
	}
	c.id = colls.add(c)
	// The lane count closes the line so a host (rma_driver --summary) can
	// report the connection plan the backend chose.
	st := mesh.Stats()
	if st.FabricPeers > 0 {
		logx.Info(abi.SubsysNet|abi.SubsysInit, "NET/wasm: rank %d reaches %d ranks over libfabric provider %s", rank, st.FabricPeers, st.FabricProvider)
	}
	if plan.Codec != 0 {
		logx.Info(abi.SubsysNet|abi.SubsysInit, "NET/wasm: rank %d: backend %s compresses puts over TCP with codec %d level %d by default",
			rank, lc.be.b.Name(), plan.Codec.ID(), plan.Codec.Level())
	}
	logx.Info(abi.SubsysNet|abi.SubsysInit, "NET/wasm: rank %d connected to %d ranks in %v; %d on this host use the intra-node path; %d TCP lane(s) per peer",
		rank, n, time.Since(start).Round(time.Microsecond), st.IntraNodePeers, plan.Lanes)
	return colls.handle(c.id), abi.Success
}

func lookupColl(h uint64) *coll { return colls.lookup(h) }

// GetRmaProperties answers the v16 query: flushesAllPutsOnAnySignal. NCCL
// asks whether the arrival of any signal from any peer makes every put
// received before it visible, so that its device barrier can skip a flush
// per peer. Over TCP and the intra-node path it does: a target's service
// lands each put whole (memcpy, process_vm_writev or a synchronous device
// copy) before it reads anything behind it, so a put received is a put
// visible, whichever peer's signal comes next. Not so when a NIC writes
// device memory directly (FI_HMEM: nothing flushes its writes before the
// signal) or a landing copy may still run when the service moves on: the
// mesh says which (dataplane.Mesh.FlushesOnSignal, Props.LateVisible).
func GetRmaProperties(h uint64) (bool, abi.Result) {
	c := lookupColl(h)
	if c == nil {
		logx.Warn(abi.SubsysNet, "NET/wasm: getRmaProperties: unknown collComm %#x", h)
		return false, abi.InvalidArgument
	}
	return c.mesh.FlushesOnSignal(), abi.Success
}

// CloseColl delivers what was posted and tears the communicator down: a
// goodbye follows the queued operations on every stream, and the streams
// close once every peer's service acknowledged it (it applied everything
// before it), or a peer is gone, or the close timeout passed.
func CloseColl(h uint64) abi.Result {
	c := colls.take(h)
	if c == nil {
		logx.Warn(abi.SubsysNet, "NET/wasm: closeColl: unknown collComm %#x", h)
		return abi.InvalidArgument
	}
	c.flushDeferred() // held ops were accepted: they go out before the goodbye
	c.closed.Store(true)
	c.rmaMu.Lock()
	rmas := c.rmas
	c.rmas = nil
	c.rmaMu.Unlock()
	for _, r := range rmas {
		r.destroy()
	}
	c.shares.Stop()
	if err := c.mesh.Close(); err != nil {
		logx.Warn(abi.SubsysNet, "NET/wasm: closeColl: rank %d: %v (%s)", c.rank, err, config.CloseTimeout.Name)
	}
	c.closeShares()
	if profile.On() {
		profile.Write(os.Stderr, fmt.Sprintf("rank %d (pid %d)", c.rank, os.Getpid()))
	}
	if profile.Tracing() {
		writeTrace(c.rank)
	}
	if c.ln != nil {
		c.ln.Close()
	}
	st := c.mesh.Stats()
	if st.CompressedRaw > 0 {
		raw, wire := st.CompressedRaw, st.CompressedWire
		logx.Info(abi.SubsysNet, "NET/wasm: rank %d compressed %d payload bytes into %d on the wire (%.2fx)", c.rank, raw, wire, float64(raw)/float64(wire))
	}
	if st.AcksCarried+st.AcksAlone > 0 {
		logx.Info(abi.SubsysNet, "NET/wasm: rank %d acknowledged its peers' puts %d times in its own batches and %d times alone; %d times it sent them at once instead of holding them for a batch (holding had not paid)", c.rank, st.AcksCarried, st.AcksAlone, st.AcksAtOnce)
	}
	if n := st.MarksAtOnce + st.MarksWaited + st.MarksLeft + st.MarksToDevice; n > 0 {
		logx.Info(abi.SubsysNet, "NET/wasm: rank %d met %d put+signals ordered by its peers' agent marks on NCCL's thread: %d with the mark there, %d after waiting for it, %d left to the lanes' services, %d before it, for the device agent to wait for", c.rank, n, st.MarksAtOnce, st.MarksWaited, st.MarksLeft, st.MarksToDevice)
	}
	if st.FlushAsks > 0 {
		logx.Info(abi.SubsysNet, "NET/wasm: rank %d's flushes asked their targets for held acks %d times, %d of them without waiting first", c.rank, st.FlushAsks, st.FlushAsksAtOnce)
	}
	if st.Handed > 0 {
		logx.Info(abi.SubsysNet, "NET/wasm: rank %d handed over %d batches instead of waiting for their gathered device copies (NCCL_RMA_WASM_GATHER_WRITER): %d written by the caller's next call, the rest by its lanes' writers", c.rank, st.Handed, st.HandedByCaller)
	}
	c.regs.wake()
	return abi.Success
}

// setError records a sticky asynchronous error for queryLastError.
func (c *coll) setError(peer int, err error) {
	if c.err.set(peer, err) && !c.closed.Load() {
		logx.Warn(abi.SubsysNet, "NET/wasm: rank %d: %v", c.rank, err)
	}
}

// dataplane.Owner

// Resolve is called by the target service for every incoming operation.
func (c *coll) Resolve(id uint32) (unsafe.Pointer, uint64, uintptr, dataplane.Pin, bool) {
	m := c.regs.lookup(id)
	if m == nil {
		return nil, 0, 0, dataplane.Pin{}, false
	}
	// Pin, then look again: drop marks the registration before it waits
	// for the pins to go, so one of the two sees the other.
	pin := dataplane.NewPin(&m.pins)
	if m.dropped.Load() {
		pin.Release()
		return nil, 0, 0, dataplane.Pin{}, false
	}
	return m.base, m.size, m.devCtx, pin, true
}

// PeerRegistered records a peer's size, address, memory kind and share
// offer for a registration.
func (c *coll) PeerRegistered(peer int, r dataplane.PeerReg) {
	adds := r.Share&share.DirectAdds != 0
	r.Share &^= share.DirectAdds
	c.shares.PeerOffered(peer, r.Share)
	c.regs.peerRegistered(peer, r, adds)
}

// drain sends what was posted and waits until it completed (arrived), before
// the caller may free memory that queued operations still read or write.
func (c *coll) drain(call string) {
	if busy := c.mesh.Drain(); len(busy) > 0 {
		logx.Warn(abi.SubsysNet, "NET/wasm: %s: rank %d: operations to ranks %v still in flight after %s; returning anyway",
			call, c.rank, busy, config.CloseTimeout.Name)
	}
}

// Complete finishes a request; tags are request handles.
func (c *coll) Complete(tag uint64, status abi.Result) { completeRequest(tag, status) }

// AddPart makes a request wait for one completion more
// (dataplane.PartOwner: a rank's own device copy, queued).
func (c *coll) AddPart(tag uint64) {
	if _, q, _ := lookupRequest(tag); q != nil {
		q.parts.Add(1)
	}
}

// PeerFailed makes the error visible through queryLastError.
func (c *coll) PeerFailed(peer int, err error) { c.setError(peer, err) }

// gatherWriter resolves NCCL_RMA_WASM_GATHER_WRITER: auto hands gathered
// batches over where the device agent runs, the configuration it was
// measured to win in (docs/design/device-memory.md).
func gatherWriter() bool {
	switch config.GatherWriter.Get() {
	case "1":
		return true
	case "auto":
		return staging.AgentWanted()
	}
	return false
}

// spinOptions reads NCCL_RMA_WASM_SPIN_US: unset, readers spin 50 µs, one
// per four cores of the host at once, shared among the job's processes
// on it; set, they spin that long on any machine, each process's own
// budget.
func spinOptions() (wait time.Duration, slots int, share bool) {
	us := config.SpinUs.Get()
	if us < 0 {
		return 50 * time.Microsecond, spin.DefaultSlots(), true
	}
	return time.Duration(us) * time.Microsecond, max(spin.DefaultSlots(), 1), false
}

// connectResult is connect's code for a failed mesh: ncclInvalidUsage for
// ranks that loaded different builds (a peer speaking another wire
// protocol: the job's set-up is wrong, not the system), ncclSystemError
// for everything else (sockets, timeouts, dead peers).
func connectResult(err error) abi.Result {
	var ve *handshake.VersionError
	if errors.As(err, &ve) {
		return abi.InvalidUsage
	}
	return abi.SystemError
}
