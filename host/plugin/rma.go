package plugin

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/profile"
)

// maxContexts bounds nContexts of one createContext call.
const maxContexts = 4096

// completionBatch is how many completions are handed to a backend at once.
const completionBatch = 64

// maxPending bounds the aggregated ops one context holds back for a
// batched plan (the guest's batch capacity may be lower).
const maxPending = 64

// rmaCtx is a block of nContexts contexts created by one createContext.
type rmaCtx struct {
	id      uint64
	c       *coll
	stride  int
	ctxs    []ctxState
	reqs    requestPool
	closed  atomic.Bool
	anyPlan bool
	stallOn bool          // NCCL_RMA_WASM_STALL_REPORT_MS set: requests are stamped (stall.go)
	polls   atomic.Uint64 // rmaProgress and test() calls, counted when stallOn
}

// ctxState is one context of the block: its backend policy state (a guest
// instance) behind a lock, with preallocated scratch so that planning an
// operation allocates nothing.
type ctxState struct {
	mu    sync.Mutex
	b     backend.Context
	plans bool
	comps bool
	op    backend.Op
	plan  backend.OpPlan
	done  []backend.Completion
	// lanes: the backend wants lane events; laneSeen of the
	// communicator's are in its batches already (lanes.go).
	lanes    bool
	laneSeen int
	// Batched planning (batch.go): non-nil when the backend plans
	// aggregated ops in batches; pend holds them, bops/bplans are scratch.
	batch  backend.BatchPlanner
	pend   []pendingOp
	bops   []backend.Op
	bplans []backend.OpPlan
}

var rmas = table[rmaCtx]{kind: kindRma}

// CreateContext creates nContexts contexts; the context argument of data
// calls indexes them. trafficClass is accepted and ignored (TCP has none);
// rankStride 0 is treated as 1, as NCCL's own callers expect.
func CreateContext(h uint64, cfg abi.RmaConfig) (uint64, abi.Result) {
	c := lookupColl(h)
	if c == nil {
		logx.Warn(abi.SubsysInit, "NET/wasm: createContext: unknown collComm %#x", h)
		return 0, abi.InvalidArgument
	}
	if cfg.NContexts < 1 || cfg.NContexts > maxContexts {
		logx.Warn(abi.SubsysInit, "NET/wasm: createContext: nContexts %d outside [1, %d]", cfg.NContexts, maxContexts)
		return 0, abi.InvalidArgument
	}
	stride := int(cfg.RankStride)
	if stride == 0 {
		stride = 1
	}
	if stride < 0 || c.nranks%stride != 0 {
		logx.Warn(abi.SubsysInit, "NET/wasm: createContext: rankStride %d does not divide nranks %d", cfg.RankStride, c.nranks)
		return 0, abi.InvalidArgument
	}
	r := &rmaCtx{c: c, stride: stride, ctxs: make([]ctxState, cfg.NContexts)}
	info := backend.ContextInfo{CommID: c.commID, NRanks: int32(c.nranks), Rank: int32(c.rank), Contexts: cfg.NContexts}
	for i := range r.ctxs {
		b, err := c.be.b.NewContext(info)
		if err != nil {
			logx.Warn(abi.SubsysInit, "NET/wasm: createContext: backend %s: context %d: %v", c.be.b.Name(), i, err)
			r.closeBackends()
			return 0, abi.InternalError
		}
		s := &r.ctxs[i]
		s.b, s.plans, s.comps = b, b.PlansOps(), b.WantsCompletions()
		if s.comps {
			s.done = make([]backend.Completion, 0, completionBatch)
			le, ok := b.(backend.LaneEventer)
			s.lanes = ok && le.WantsLaneEvents()
		}
		if bp, ok := b.(backend.BatchPlanner); ok && s.plans && bp.BatchCap() > 0 {
			n := min(bp.BatchCap(), maxPending)
			s.batch, s.pend, s.bops, s.bplans = bp, make([]pendingOp, 0, n), make([]backend.Op, n), make([]backend.OpPlan, n)
		}
		r.anyPlan = r.anyPlan || s.plans
	}
	r.id = rmas.add(r)
	c.rmaMu.Lock()
	if c.closed.Load() {
		c.rmaMu.Unlock()
		r.destroy()
		logx.Warn(abi.SubsysInit, "NET/wasm: createContext: collComm %#x is closing", h)
		return 0, abi.InvalidUsage
	}
	c.rmas = append(c.rmas, r)
	c.rmaMu.Unlock()
	r.startStallReport()
	return rmas.handle(r.id), abi.Success
}

func (r *rmaCtx) closeBackends() {
	for i := range r.ctxs {
		s := &r.ctxs[i]
		s.mu.Lock()
		s.flushPending(r) // held ops were accepted: planned and queued before the backend goes
		if s.b != nil {
			if s.comps {
				s.laneEvents(r.c) // a lane that failed after the last batch
			}
			s.flushCompletions()
			if err := s.b.Close(); err != nil {
				logx.Info(abi.SubsysNet, "NET/wasm: closing backend context: %v", err)
			}
			s.b = nil
		}
		s.mu.Unlock()
	}
}

// destroy retires the context block; requests still in flight are dropped.
func (r *rmaCtx) destroy() {
	if r.closed.Swap(true) {
		return
	}
	rmas.remove(r.id)
	r.closeBackends()
}

func lookupRma(h uint64) *rmaCtx { return rmas.lookup(h) }

// DestroyContext retires a context block. Operations it posted are sent
// first (bounded by the close timeout): NCCL's GIN proxy destroys the
// context right after a kernel's last signals, never testing them, and
// frees their buffers next.
func DestroyContext(h uint64) abi.Result {
	r := lookupRma(h)
	if r == nil {
		logx.Warn(abi.SubsysInit, "NET/wasm: destroyContext: unknown rma context %#x", h)
		return abi.InvalidArgument
	}
	c := r.c
	c.flushDeferred()
	if !c.closed.Load() {
		c.drain("destroyContext")
	}
	c.rmaMu.Lock()
	for i, x := range c.rmas {
		if x == r {
			c.rmas = append(c.rmas[:i], c.rmas[i+1:]...)
			break
		}
	}
	c.rmaMu.Unlock()
	r.destroy()
	return abi.Success
}

// QueryLastError reports a sticky asynchronous error (a lost peer, an
// operation a peer rejected, a backend fault).
func QueryLastError(h uint64) (bool, abi.Result) {
	r := lookupRma(h)
	if r == nil {
		logx.Warn(abi.SubsysNet, "NET/wasm: queryLastError: unknown rma context %#x", h)
		return false, abi.InvalidArgument
	}
	return r.c.err.isSet(), abi.Success
}

// Progress pushes out operations held back by the aggregation hint, reaps
// the libfabric completion queues on the caller's thread, and hands
// pending telemetry to the backend. The data path runs on its own; this is
// never required for correctness, only faster when called in a loop.
func Progress(h uint64) abi.Result {
	r := lookupRma(h)
	if r == nil {
		logx.Warn(abi.SubsysNet, "NET/wasm: rmaProgress: unknown rma context %#x", h)
		return abi.InvalidArgument
	}
	var t0 int64
	if profile.On() {
		t0 = profile.ProgressCall()
	}
	if r.stallOn {
		r.polls.Add(1)
	}
	staging.Reap()
	r.c.flushDeferred()
	r.c.mesh.Progress()
	r.c.mesh.Kick()
	for i := range r.ctxs {
		s := &r.ctxs[i]
		if s.comps {
			s.mu.Lock()
			s.laneEvents(r.c)
			s.flushCompletions()
			s.mu.Unlock()
		}
	}
	if t0 != 0 {
		profile.InProgress.Since(t0)
	}
	return abi.Success
}

// Test reports whether a request is done and frees it when it is.
func Test(coll, req uint64) (bool, abi.Result) {
	if profile.On() {
		t0 := profile.Now()
		done, res := test(coll, req)
		profile.InTest.Since(t0)
		return done, res
	}
	return test(coll, req)
}

func test(coll, req uint64) (bool, abi.Result) {
	r, q, idx := lookupRequest(req)
	if q == nil {
		logx.Warn(abi.SubsysNet, "NET/wasm: test: unknown or already completed request %#x", req)
		return false, abi.InvalidArgument
	}
	if k, id := splitHandle(coll); k != kindColl || id != r.c.id {
		logx.Warn(abi.SubsysNet, "NET/wasm: test: request %#x does not belong to collComm %#x", req, coll)
		return false, abi.InvalidArgument
	}
	if r.stallOn {
		r.polls.Add(1)
	}
	if q.state.Load() != reqDone {
		staging.Reap() // a rank's own device copies, queued
		if q.parts.Load() == 0 {
			r.c.flushDeferred() // q is held for a batched plan
		}
		if q.kind != uint8(backend.OpFlush) {
			r.c.mesh.Flush(int(q.peer))
		}
		return false, abi.Success
	}
	// Threads that test one request concurrently race here: exactly one
	// claims it, reports it done and releases the slot once.
	if !q.state.CompareAndSwap(reqDone, reqClaimed) {
		logx.Warn(abi.SubsysNet, "NET/wasm: test: request %#x was completed by a concurrent test()", req)
		return false, abi.InvalidArgument
	}
	status := abi.Result(q.status.Load())
	if r.stallOn {
		traceOp(backend.OpKind(q.kind), true, q.ctx, q.peer, q.size, uint64(status), 0, req)
	}
	if q.prof != 0 {
		profRequest(q)
	}
	s := &r.ctxs[q.ctx]
	if s.comps {
		s.mu.Lock()
		s.laneEvents(r.c)
		s.record(q, status)
		s.mu.Unlock()
	}
	r.reqs.release(q, idx)
	if status != abi.Success {
		r.c.warnFailed(backend.OpKind(q.kind), q.peer, q.size, status)
	}
	return true, status
}

// failWarn limits the WARN lines of failed requests across communicators;
// each cause is logged once anyway (warnFailed).
var failWarn logx.Limited

// warnFailed logs a request that completed with an error, naming its cause
// (the peer's first recorded error, else the backend's): once per peer,
// status and cause, rate-limited, so that a lost peer with thousands of
// operations in flight costs one line, and NCCL's "Error on GFD test" is
// never the only trace. The failure path alone allocates.
func (c *coll) warnFailed(kind backend.OpKind, peer uint32, size uint64, status abi.Result) {
	cause := c.err.cause(int(peer))
	if cause == nil {
		cause = c.err.cause(errKeyBackend)
	}
	why := "no cause recorded yet (the transport reported the failure first)"
	if cause != nil {
		why = cause.Error()
	}
	if c.err.firstFailure(peer, status, why) {
		failWarn.Warn(abi.SubsysNet, "NET/wasm: rank %d: %s to rank %d (%d bytes) failed with %v: %s; further requests failing for this cause are not logged",
			c.rank, callName(kind), peer, size, status, why)
	}
}

func (s *ctxState) record(q *request, status abi.Result) {
	if s.b == nil {
		return
	}
	s.done = append(s.done, backend.Completion{Kind: backend.OpKind(q.kind), Peer: q.peer, Size: q.size,
		Status: int32(status), Lane: int32(q.lane), Latency: uint64(nanotime() - q.start)})
	if len(s.done) == cap(s.done) {
		s.flushCompletions()
	}
}

// flushCompletions hands the batch to the backend; called with s.mu held.
func (s *ctxState) flushCompletions() {
	if len(s.done) == 0 || s.b == nil {
		return
	}
	if err := s.b.Completions(s.done); err != nil {
		logx.Warn(abi.SubsysNet, "NET/wasm: backend completion hook failed: %v", err)
	}
	s.done = s.done[:0]
}

var epoch = time.Now()

// nanotime is a monotonic clock that does not allocate.
func nanotime() int64 { return int64(time.Since(epoch)) }

// NoteFault raises the sticky error of the communicator that handle h (an
// rma context or a collective communicator) belongs to, after capi
// recovered a panic in call: a request that failed that way must be
// visible through queryLastError like any other failure.
func NoteFault(h uint64, call string) {
	var c *coll
	switch k, _ := splitHandle(h); k {
	case kindRma:
		if r := lookupRma(h); r != nil {
			c = r.c
		}
	case kindColl:
		c = lookupColl(h)
	}
	if c != nil {
		c.setError(errKeyInternal, fmt.Errorf("internal error in %s (recovered panic)", call))
	}
}
