package plugin

import (
	"errors"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
)

// Batched planning (Guest ABI v1.1 FeaturePlanBatch). An op posted with the
// aggregation hint says more will follow; on a context whose backend plans
// in batches it is held before planning, and the held ops are planned with
// one guest call when the batch is full, when an op without the hint comes
// (from any context), when one of them is tested, or on iflush and
// rmaProgress. Ordering is kept: at most one context of a communicator holds
// ops back at a time (coll.deferred), and every other op of the
// communicator first plans and queues what is held, so nothing issued later
// overtakes it.

// pendingOp is an op held for batched planning.
type pendingOp struct {
	op       dataplane.Op
	q        *request
	rank     uint32
	kind     backend.OpKind
	context  int32
	optFlags uint32
	sigOp    uint32
}

var errContextClosed = errors.New("the rma context was destroyed")

// deferOp holds op on s, making s the communicator's one holder; when
// another context holds ops, those were issued first and go out first.
func (r *rmaCtx) deferOp(s *ctxState, q *request, context int32, rank uint32, kind backend.OpKind, optFlags, sigOp uint32, op *dataplane.Op) {
	c := r.c
	for {
		s.mu.Lock()
		if len(s.pend) > 0 || c.deferred.CompareAndSwap(0, 1) {
			break
		}
		s.mu.Unlock()
		c.flushDeferred()
	}
	q.parts.Store(0) // held: test() of it plans and sends the batch (post sets the real count)
	s.pend = append(s.pend, pendingOp{op: *op, q: q, rank: rank, kind: kind, context: context, optFlags: optFlags, sigOp: sigOp})
	if len(s.pend) == cap(s.pend) {
		s.flushPending(r)
	}
	s.mu.Unlock()
}

// flushPending plans the held ops with one backend call and queues them,
// in order, still held for the sender (aggregated). Called with s.mu held.
// It allocates nothing.
func (s *ctxState) flushPending(r *rmaCtx) {
	n := len(s.pend)
	if n == 0 {
		return
	}
	for i := range s.pend {
		p := &s.pend[i]
		s.bops[i] = backend.Op{Kind: p.kind, Context: p.context, Peer: p.rank, Size: p.op.Size, OptFlags: p.optFlags, SignalOp: p.sigOp}
		s.bplans[i] = backend.OpPlan{Lane: -1, Codec: r.c.plan.Codec}
	}
	err := errContextClosed
	if s.b != nil {
		err = s.batch.PlanOps(s.bops[:n], s.bplans[:n])
	}
	if err != nil {
		r.c.setError(errKeyBackend, err)
	}
	for i := range s.pend {
		p := &s.pend[i]
		if err != nil {
			r.failPlanned(p.q, p.rank, abi.InternalError)
			continue
		}
		lane, st := r.applyPlan(&s.bplans[i], p.rank, &p.op)
		if st != abi.Success {
			r.failPlanned(p.q, p.rank, st)
			continue
		}
		r.post(p.q, p.rank, &p.op, true, lane)
	}
	clear(s.pend)
	s.pend = s.pend[:0]
	r.c.deferred.Store(0)
}

// flushDeferred plans and queues the ops a context of the communicator
// holds back. It costs one atomic load when none is held.
func (c *coll) flushDeferred() {
	if c.deferred.Load() == 0 {
		return
	}
	c.rmaMu.Lock()
	defer c.rmaMu.Unlock()
	for _, r := range c.rmas {
		for i := range r.ctxs {
			if s := &r.ctxs[i]; s.batch != nil {
				s.mu.Lock()
				s.flushPending(r)
				s.mu.Unlock()
			}
		}
	}
}
