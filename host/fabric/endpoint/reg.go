package endpoint

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric"
)

// Regs is an endpoint's memory registrations by id (the owner's ids):
// changed under a lock, read without one on the data path (Key, Desc,
// DevDirect).
type Regs struct {
	fi     *fabric.Endpoint
	mrMode uint64
	mu     sync.Mutex
	closed bool // under mu: the endpoint is gone
	tab    atomic.Pointer[[]fabric.MR]
}

// NewRegs is the table of endpoint fi's registrations, whose
// memory-registration mode is mrMode, holding mrs (by id) already. A
// table with no endpoint (fi nil) only answers questions: a test's.
func NewRegs(fi *fabric.Endpoint, mrMode uint64, mrs []fabric.MR) *Regs {
	r := &Regs{fi: fi, mrMode: mrMode}
	tab := append([]fabric.MR{}, mrs...)
	r.tab.Store(&tab)
	return r
}

// Register registers req's memory as id and returns its remote key.
func (r *Regs) Register(id uint32, req fabric.MRRequest) (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return 0, fmt.Errorf("fabric endpoint closed")
	}
	req.Len, req.WantKey = max(req.Len, 1), uint64(id)
	mr, err := r.fi.RegisterMR(req)
	if err != nil {
		return 0, err
	}
	old := *r.tab.Load()
	tab := make([]fabric.MR, max(len(old), int(id)+1))
	copy(tab, old)
	tab[id] = mr
	r.tab.Store(&tab)
	return mr.Key, nil
}

// Deregister undoes Register (nothing when id is not registered).
func (r *Regs) Deregister(id uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := *r.tab.Load()
	if r.closed || int(id) >= len(old) || old[id] == (fabric.MR{}) {
		return
	}
	r.fi.Deregister(old[id])
	tab := append([]fabric.MR(nil), old...)
	tab[id] = fabric.MR{}
	r.tab.Store(&tab)
}

// Key is registration id's remote key (0 if none).
func (r *Regs) Key(id uint32) uint64 {
	if t := *r.tab.Load(); int(id) < len(t) {
		return t[id].Key
	}
	return 0
}

// Desc is the local descriptor of registration id (nil where the
// provider does not need one). Under FI_MR_HMEM device buffers need
// theirs whatever FI_MR_LOCAL says.
func (r *Regs) Desc(id uint32) unsafe.Pointer {
	if t := *r.tab.Load(); int(id) < len(t) && (r.mrMode&fabric.MRLocal != 0 || (r.mrMode&fabric.MRHMEM != 0 && t[id].Dev)) {
		return t[id].Desc
	}
	return nil
}

// DevDirect reports whether registration id is device memory registered
// with the provider (FI_HMEM): RDMA reaches it, no staging.
func (r *Regs) DevDirect(id uint32) bool {
	t := *r.tab.Load()
	return int(id) < len(t) && t[id].Dev
}

// close deregisters everything left; later calls change nothing.
func (r *Regs) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.closed = true
	for _, mr := range *r.tab.Load() {
		r.fi.Deregister(mr)
	}
}
