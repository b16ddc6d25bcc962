package plugin

import (
	"fmt"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/profile"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// The per-operation path: lock-free handle lookups, a request slot from the
// context's pool, an optional guest plan, and a copy of the descriptor into
// the peer's queue. No allocation, no global lock. Errors are rare and may
// allocate to format their WARN line.

// checkCommon resolves the rma context and validates context and rank.
func checkCommon(call string, h uint64, context int32, rank uint32) (*rmaCtx, abi.Result) {
	r := lookupRma(h)
	if r == nil {
		logx.Warn(abi.SubsysNet, "NET/wasm: %s: unknown or destroyed rma context %#x", call, h)
		return nil, abi.InvalidArgument
	}
	c := r.c
	if c.closed.Load() {
		logx.Warn(abi.SubsysNet, "NET/wasm: %s: collComm of rma context %#x is closed", call, h)
		return nil, abi.InvalidUsage
	}
	if context < 0 || int(context) >= len(r.ctxs) {
		logx.Warn(abi.SubsysNet, "NET/wasm: %s: context %d outside [0, %d)", call, context, len(r.ctxs))
		return nil, abi.InvalidArgument
	}
	if int64(rank) >= int64(c.nranks) {
		logx.Warn(abi.SubsysNet, "NET/wasm: %s: rank %d outside [0, %d)", call, rank, c.nranks)
		return nil, abi.InvalidArgument
	}
	if r.stride > 1 && ((int(rank)-c.rank+c.nranks)%c.nranks)%r.stride != 0 {
		logx.Warn(abi.SubsysNet, "NET/wasm: %s: rank %d is not reachable with rankStride %d from rank %d", call, rank, r.stride, c.rank)
		return nil, abi.InvalidArgument
	}
	return r, abi.Success
}

// localRange resolves a local handle and checks [off, off+size).
func localRange(call, what string, c *coll, mh, off, size uint64) (*mr, abi.Result) {
	m := c.lookupMR(mh)
	if m == nil {
		logx.Warn(abi.SubsysNet, "NET/wasm: %s: %s handle %#x is unknown or released", call, what, mh)
		return nil, abi.InvalidArgument
	}
	if !dataplane.Span(off, size, m.size) {
		logx.Warn(abi.SubsysNet, "NET/wasm: %s: %s range [%d, +%d) outside its registration of %d bytes", call, what, off, size, m.size)
		return nil, abi.InvalidArgument
	}
	return m, abi.Success
}

// remoteRange resolves a symmetric handle and checks [off, off+size) against
// the registration's size on the target rank.
func remoteRange(call, what string, c *coll, mh, off, size uint64, rank uint32) (*mr, abi.Result) {
	m := c.lookupMR(mh)
	if m == nil {
		logx.Warn(abi.SubsysNet, "NET/wasm: %s: %s handle %#x is unknown or released", call, what, mh)
		return nil, abi.InvalidArgument
	}
	regs := m.remote.Load()
	if regs == nil || !dataplane.Span(off, size, regs.sizes[rank]) {
		var rsz uint64
		if regs != nil {
			rsz = regs.sizes[rank]
		}
		logx.Warn(abi.SubsysNet, "NET/wasm: %s: %s range [%d, +%d) outside the registration of %d bytes on rank %d", call, what, off, size, rsz, rank)
		return nil, abi.InvalidArgument
	}
	return m, abi.Success
}

// pair resolves the local and the remote side of a transfer and checks
// both ranges; every data call but the bare signal goes through it.
func pair(call, localWhat, remoteWhat string, c *coll, localMh, localOff, remoteMh, remoteOff, size uint64, rank uint32) (*mr, *mr, abi.Result) {
	local, res := localRange(call, localWhat, c, localMh, localOff, size)
	if res != abi.Success {
		return nil, nil, res
	}
	remote, res := remoteRange(call, remoteWhat, c, remoteMh, remoteOff, size, rank)
	if res != abi.Success {
		return nil, nil, res
	}
	return local, remote, abi.Success
}

// slotWait bounds how long a data call waits for a request slot when all
// of its rma context's are in flight (SPEC.md §5, Backpressure); a
// variable so that tests can shorten it.
var slotWait = 10 * time.Second

var slotWarn logx.Limited

// takeSlot returns a free request slot. The pool holds NCCL's queue depth
// for 4096 (context, peer) pairs, so a caller within NCCL's budget never
// waits. Past it, an error would be fatal for the communicator (NVIDIA/nccl
// #2119), so the call waits, pushing held work out so that completions
// keep coming, for another thread's test() to free a slot; only after
// slotWait does it fail, with a WARN naming the cause. Nothing is accepted
// and then lost: an operation either has a slot or was refused.
func (r *rmaCtx) takeSlot(kind backend.OpKind) (*request, uint32, abi.Result) {
	if q, idx, ok := r.reqs.alloc(); ok {
		return q, idx, abi.Success
	}
	return r.waitSlot(kind)
}

// callName is the ABI call an operation kind came from, for messages.
func callName(kind backend.OpKind) string {
	switch kind {
	case backend.OpPut:
		return "iput"
	case backend.OpPutSignal:
		return "iputSignal"
	case backend.OpGet:
		return "iget"
	case backend.OpFlush:
		return "iflush"
	}
	return "operation"
}

func (r *rmaCtx) waitSlot(kind backend.OpKind) (*request, uint32, abi.Result) {
	deadline := time.Now().Add(slotWait)
	for {
		r.c.flushDeferred()
		r.c.mesh.FlushAll()
		r.c.mesh.Kick()
		if q, idx, ok := r.reqs.alloc(); ok {
			return q, idx, abi.Success
		}
		if time.Now().After(deadline) {
			n := r.reqs.capSlabs() * slabSize
			slotWarn.Warn(abi.SubsysNet, "NET/wasm: %v refused: all %d request slots of rma context %#x were in flight for %v and no test() freed one; NCCL keeps at most %d per context and peer (NCCL_GIN_PROXY_QUEUE_SIZE), so the caller exceeds that or stopped testing",
				callName(kind), n, rmas.handle(r.id), slotWait, ginQueueDepth)
			return nil, 0, abi.InternalError
		}
		time.Sleep(20 * time.Microsecond)
	}
}

// issue takes a request slot, lets the backend plan, and queues op. An
// aggregated op on a context whose backend plans in batches is held back
// and planned with the others (batch.go).
func (r *rmaCtx) issue(context int32, rank uint32, kind backend.OpKind, optFlags, sigOp uint32, op *dataplane.Op) (uint64, abi.Result) {
	q, idx, res := r.takeSlot(kind)
	if res != abi.Success {
		return 0, res
	}
	q.ctx, q.kind, q.peer, q.size = context, uint8(kind), rank, op.Size
	gen := q.gen.Load()
	handle := requestHandle(r.id, gen, idx)
	if r.stallOn {
		q.stamp(kind, context, rank, op.Size)
		traceOp(kind, false, context, rank, op.Size, op.Off, op.SigOff, handle)
	}
	q.prof = 0
	profile.Mark(profile.PtPost)
	if profile.On() {
		q.firstAt.Store(0)
		profile.Call()
		q.prof = profile.Now()
		op.Posted = q.prof
		// Every return below: held by the hint, failed by the plan, posted.
		defer profile.InPost.Since(q.prof)
	}
	op.Tag = handle
	s := &r.ctxs[context]
	if s.comps {
		q.start = nanotime()
	}
	op.Codec = uint32(r.c.plan.Codec)
	aggregate := optFlags&abi.OptFlagAggregateRequests != 0
	if s.batch != nil && aggregate {
		r.deferOp(s, q, context, rank, kind, optFlags, sigOp, op)
		return handle, abi.Success
	}
	if r.c.deferred.Load() != 0 {
		r.c.flushDeferred() // ops held back earlier go first
	}
	lane := int32(-1)
	if s.plans {
		var status abi.Result
		if lane, status = s.planOp(r, context, rank, kind, optFlags, sigOp, op); status != abi.Success {
			r.failPlanned(q, rank, status)
			return handle, abi.Success
		}
	}
	r.post(q, rank, op, aggregate, lane)
	return handle, abi.Success
}

// failPlanned completes a request the backend failed. Sticky first:
// whoever sees the failed request also sees queryLastError report it
// (SPEC.md §3, Errors).
func (r *rmaCtx) failPlanned(q *request, rank uint32, status abi.Result) {
	r.c.setError(errKeyBackend, fmt.Errorf("backend %s failed an operation to rank %d: %v", r.c.be.b.Name(), rank, status))
	q.status.Store(int32(status))
	q.state.Store(reqDone)
}

// post hands a planned op to the mesh.
func (r *rmaCtx) post(q *request, rank uint32, op *dataplane.Op, hold bool, lane int32) {
	if op.Remote == 0 {
		op.Codec = 0 // device memory on either side (or no payload): never compressed
	}
	q.lane = int8(lane) // -1..abi.MaxLanes-1, checked by applyPlan
	q.parts.Store(int32(r.c.mesh.OpParts(int(rank), op)))
	r.c.mesh.Post(int(rank), op, hold, int(lane))
}

// planOp asks the backend for a lane (-1: the runtime's choice) and the
// v1.1 fields, which it writes into op; a fault fails only this operation.
func (s *ctxState) planOp(r *rmaCtx, context int32, rank uint32, kind backend.OpKind, optFlags, sigOp uint32, op *dataplane.Op) (int32, abi.Result) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.b == nil {
		return -1, abi.InvalidUsage
	}
	s.op = backend.Op{Kind: kind, Context: context, Peer: rank, Size: op.Size, OptFlags: optFlags, SignalOp: sigOp}
	s.plan = backend.OpPlan{Lane: -1, Codec: r.c.plan.Codec}
	if err := s.b.PlanOp(&s.op, &s.plan); err != nil {
		r.c.setError(errKeyBackend, err)
		return -1, abi.InternalError
	}
	return r.applyPlan(&s.plan, rank, op)
}

// applyPlan checks a backend's plan and writes its v1.1 fields into op.
func (r *rmaCtx) applyPlan(plan *backend.OpPlan, rank uint32, op *dataplane.Op) (int32, abi.Result) {
	if plan.Lane >= r.c.plan.Lanes {
		// Fewer lanes than the backend plans for (NCCL_RMA_WASM_LANES, or a
		// plan clamped at connect): fold, told once per communicator.
		if !r.c.laneFolded.Swap(true) {
			logx.Info(abi.SubsysNet, "NET/wasm: backend %s planned lane %d of a communicator with %d; lanes beyond are taken modulo %d", r.c.be.b.Name(), plan.Lane, r.c.plan.Lanes, r.c.plan.Lanes)
		}
		plan.Lane %= r.c.plan.Lanes
	}
	switch {
	case plan.Lane < -1:
		logx.Warn(abi.SubsysNet, "NET/wasm: backend %s planned lane %d; failing the operation", r.c.be.b.Name(), plan.Lane)
		return -1, abi.InternalError
	case plan.Status != 0:
		st := abi.Result(plan.Status)
		if st < abi.UnhandledCudaError || st > abi.RemoteError {
			st = abi.InternalError
		}
		logx.Warn(abi.SubsysNet, "NET/wasm: backend %s failed an operation to rank %d with status %d", r.c.be.b.Name(), rank, plan.Status)
		return -1, st
	}
	// A backend.Context checks these against guestabi's bounds; a
	// native (Go) one is trusted like the rest of the process.
	op.Chunk, op.Codec = plan.ChunkSize, uint32(plan.Codec)
	if plan.DelayNs != 0 {
		op.NotBefore = dataplane.Now() + int64(min(plan.DelayNs, guestabi.MaxDelayNs))
	}
	return plan.Lane, abi.Success
}

// Iput copies size bytes from the local registration to rank's.
func Iput(h uint64, context int32, srcOff, srcMh, size, dstOff, dstMh uint64, rank, optFlags uint32) (uint64, abi.Result) {
	return oneSided("iput", "source", "destination", backend.OpPut, wire.MsgPut, h, context, srcOff, srcMh, dstOff, dstMh, size, rank, optFlags)
}

// oneSided checks and issues a put or a get: each names a local range
// and a remote one of size bytes (for a put the source and destination,
// for a get the destination and source).
func oneSided(name, localName, remoteName string, kind backend.OpKind, msg uint8, h uint64, context int32,
	localOff, localMh, remoteOff, remoteMh, size uint64, rank, optFlags uint32) (uint64, abi.Result) {
	r, res := checkCommon(name, h, context, rank)
	if res != abi.Success {
		return 0, res
	}
	local, remote, res := pair(name, localName, remoteName, r.c, localMh, localOff, remoteMh, remoteOff, size, rank)
	if res != abi.Success {
		return 0, res
	}
	op := dataplane.Op{Request: dataplane.Request{Msg: msg, MrID: remote.id, Context: uint32(context), Local: unsafe.Add(local.base, localOff), LocalMr: local.id, LocalCtx: local.devCtx, Size: size, Off: remoteOff}}
	remote.target(&op, local, rank, remoteOff)
	// A device put copied into the peer's mapped memory keeps the order of
	// the signals our agent adds there (direct.go).
	op.Direct = (directSignal.Load() || inboxOn.Load()) && msg == wire.MsgPut && op.Mapped != 0 && op.LocalCtx != 0
	return r.issue(context, rank, kind, optFlags, 0, &op)
}

// IputSignal is a put followed, at the target, by a 64-bit signal update that
// becomes visible only after the payload. size 0 is a signal alone, and then
// the source and destination handles may be NULL.
func IputSignal(h uint64, context int32, srcOff, srcMh, size, dstOff, dstMh uint64, rank uint32,
	signalOff, signalMh, signalValue uint64, signalOp uint32, strong bool, optFlags uint32) (uint64, abi.Result) {
	r, res := checkCommon("iputSignal", h, context, rank)
	if res != abi.Success {
		return 0, res
	}
	c := r.c
	if signalOp != abi.SignalOpInc && signalOp != abi.SignalOpAdd {
		logx.Warn(abi.SubsysNet, "NET/wasm: iputSignal: unknown signal op %d (INC=1, ADD=2)", signalOp)
		return 0, abi.InvalidArgument
	}
	sig, res := remoteRange("iputSignal", "signal", c, signalMh, signalOff, 8, rank)
	if res != abi.Success {
		return 0, res
	}
	if signalOff%8 != 0 {
		logx.Warn(abi.SubsysNet, "NET/wasm: iputSignal: signal offset %d is not 8-byte aligned", signalOff)
		return 0, abi.InvalidArgument
	}
	op := dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, SigOp: uint8(signalOp), SigMrID: sig.id, Context: uint32(context), SigOff: signalOff, SigValue: signalValue}}
	if size > 0 {
		src, dst, res := pair("iputSignal", "source", "destination", c, srcMh, srcOff, dstMh, dstOff, size, rank)
		if res != abi.Success {
			return 0, res
		}
		op.MrID, op.Local, op.Size, op.Off = dst.id, unsafe.Add(src.base, srcOff), size, dstOff
		op.LocalCtx, op.LocalMr = src.devCtx, src.id
		dst.target(&op, src, rank, dstOff)
	}
	if inboxOn.Load() {
		sig.markInbox(&op, rank, signalOff)
	}
	if directSignal.Load() && !op.Direct {
		sig.markDirect(&op, rank, signalOff)
	}
	return r.issue(context, rank, backend.OpPutSignal, optFlags, signalOp, &op)
}

// Iget reads size bytes of rank's registration into the local one.
func Iget(h uint64, context int32, remoteOff, remoteMh, size, localOff, localMh uint64, rank, optFlags uint32) (uint64, abi.Result) {
	return oneSided("iget", "local", "remote", backend.OpGet, wire.MsgGet, h, context, localOff, localMh, remoteOff, remoteMh, size, rank, optFlags)
}

// Iflush completes at once: gets complete only after their bytes are in host
// memory, so every completed get is already visible. A real request is
// returned anyway because some callers assert it is non-NULL.
func Iflush(h uint64, context int32, mh uint64, rank uint32) (uint64, abi.Result) {
	r, res := checkCommon("iflush", h, context, rank)
	if res != abi.Success {
		return 0, res
	}
	if mh != 0 && r.c.lookupMR(mh) == nil {
		logx.Warn(abi.SubsysNet, "NET/wasm: iflush: handle %#x is unknown or released", mh)
		return 0, abi.InvalidArgument
	}
	r.c.flushDeferred()
	// The caller waits for our puts to rank to complete next (GIN's
	// flush): the target must not hold its acks for a batch of its own.
	r.c.mesh.AskAcks(int(rank))
	r.c.mesh.FlushAll()
	r.c.mesh.Kick()
	q, idx, res := r.takeSlot(backend.OpFlush)
	if res != abi.Success {
		return 0, res
	}
	q.ctx, q.kind, q.peer, q.size = context, uint8(backend.OpFlush), rank, 0
	handle := requestHandle(r.id, q.gen.Load(), idx)
	if r.stallOn {
		traceOp(backend.OpFlush, false, context, rank, 0, 0, 0, handle)
	}
	q.start = nanotime()
	q.state.Store(reqDone)
	return handle, abi.Success
}
