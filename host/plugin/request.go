package plugin

import (
	"sync"
	"sync/atomic"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/profile"
)

// Request slots live in fixed slabs so that a handle (rma context id, slot
// index, generation) finds its slot with two loads and no lock, and so that
// the completing goroutine and the testing thread meet on one atomic word.
const (
	slabBits = 8
	slabSize = 1 << slabBits
	maxSlabs = 4096 // 1M requests in flight per rma context
	// ginQueueDepth is what NCCL's GIN proxy keeps in flight per (context,
	// peer) at most: NCCL_GIN_PROXY_QUEUE_SIZE, default 32 x maxRecvs.
	// maxSlabs*slabSize holds it for 4096 (context, peer) pairs.
	ginQueueDepth = 32 * maxRecvs
	indexBits     = 20
	genBits       = 12
	genMask       = 1<<genBits - 1
)

const (
	reqFree    = 0
	reqPending = 1
	reqDone    = 2
	reqClaimed = 3 // one test() call reports it done and releases it
)

type request struct {
	state  atomic.Uint32
	gen    atomic.Uint32
	status atomic.Int32
	parts  atomic.Int32 // completions still expected (chunks of a striped op)
	ctx    int32
	kind   uint8 // backend.OpKind (not a dataplane message type), narrowed to keep requests small
	lane   int8  // the lane the plan asked for (-1: the runtime's), for completion records
	peer   uint32
	size   uint64
	start  int64
	prof   int64 // profile.Now() at issue, 0: not profiled
	doneAt int64 // profile.Now() at completion (profiled requests)
	// firstAt: profile.Now() when the first of several parts completed.
	firstAt atomic.Int64
	st      stallStamp // only with the stall report on (stall.go)
}

type slab [slabSize]request

type requestPool struct {
	mu     sync.Mutex // guards free and nslabs; never held across I/O
	free   []uint32
	nslabs int
	limit  int // slabs allowed; 0 is maxSlabs (tests lower it)
	slabs  [maxSlabs]atomic.Pointer[slab]
}

// alloc returns a pending slot and its index; ok is false only when a
// million requests (the limit) are already in flight.
func (p *requestPool) alloc() (*request, uint32, bool) {
	p.mu.Lock()
	if len(p.free) == 0 && !p.grow() {
		p.mu.Unlock()
		return nil, 0, false
	}
	idx := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	p.mu.Unlock()
	r := p.slot(idx)
	r.gen.Store((r.gen.Load() + 1) & genMask)
	r.status.Store(0)
	r.lane = -1 // no plan (a flush, an unplanned op) until issue says otherwise
	r.parts.Store(1)
	r.state.Store(reqPending)
	return r, idx, true
}

// grow adds a slab; called with p.mu held. The only allocation on the
// request path, and it stops once the pool fits the load.
func (p *requestPool) grow() bool {
	if p.nslabs == p.capSlabs() {
		return false
	}
	p.slabs[p.nslabs].Store(new(slab))
	base := uint32(p.nslabs * slabSize)
	for i := slabSize - 1; i >= 0; i-- {
		p.free = append(p.free, base+uint32(i))
	}
	p.nslabs++
	return true
}

func (p *requestPool) capSlabs() int {
	if p.limit > 0 {
		return min(p.limit, maxSlabs)
	}
	return maxSlabs
}

func (p *requestPool) slot(idx uint32) *request {
	s := p.slabs[idx>>slabBits].Load()
	if s == nil {
		return nil
	}
	return &s[idx&(slabSize-1)]
}

func (p *requestPool) release(r *request, idx uint32) {
	r.state.Store(reqFree)
	p.mu.Lock()
	p.free = append(p.free, idx)
	p.mu.Unlock()
}

func requestHandle(rmaID uint64, gen, idx uint32) uint64 {
	return makeHandle(kindReq, rmaID<<32|uint64(gen&genMask)<<indexBits|uint64(idx))
}

// lookupRequest decodes a request handle. It returns nil for anything that
// is not a live request of a live rma context.
func lookupRequest(h uint64) (*rmaCtx, *request, uint32) {
	k, p := splitHandle(h)
	if k != kindReq {
		return nil, nil, 0
	}
	r := rmas.get(p >> 32)
	if r == nil {
		return nil, nil, 0
	}
	idx := uint32(p) & (1<<indexBits - 1)
	gen := uint32(p>>indexBits) & genMask
	if idx>>slabBits >= maxSlabs {
		return nil, nil, 0
	}
	q := r.reqs.slot(idx)
	if q == nil || q.gen.Load() != gen || q.state.Load() == reqFree {
		return nil, nil, 0
	}
	return r, q, idx
}

// completeRequest is called by the data path; a request that is gone (its
// context destroyed) is ignored.
func completeRequest(h uint64, status abi.Result) {
	_, q, _ := lookupRequest(h)
	if q == nil {
		return
	}
	if status != abi.Success {
		q.status.CompareAndSwap(0, int32(status)) // the first failure wins
	}
	if q.prof != 0 && q.parts.Load() > 1 {
		q.firstAt.CompareAndSwap(0, profile.Now())
	}
	if q.parts.Add(-1) <= 0 {
		if q.prof != 0 {
			// Before the state change: test() may reuse the slot after it.
			q.doneAt = profile.Now()
		}
		q.state.CompareAndSwap(reqPending, reqDone)
	}
}

// profRequest records a profiled request's issue-to-completion and
// completion-to-test() times (NCCL_RMA_WASM_PROFILE).
func profRequest(q *request) {
	switch backend.OpKind(q.kind) {
	case backend.OpGet:
		profile.GetDone.Add(q.doneAt - q.prof)
	case backend.OpFlush:
	default:
		profile.PutDone.Add(q.doneAt - q.prof)
	}
	profile.Noticed.Since(q.doneAt)
	if t := q.firstAt.Load(); t != 0 {
		profile.FirstPart.Add(t - q.prof)
	}
}
