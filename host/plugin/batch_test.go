package plugin

import (
	"sync"
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
)

// batchBackend is a Go backend that plans aggregated ops in batches of 8
// and records what it was asked.
type batchBackend struct {
	backend.Native
	mu      sync.Mutex
	batches []int // sizes of the PlanOps calls, in order
	singles int   // PlanOp calls
	order   []uint64
	quiet   bool // record nothing (allocation checks)
}

func (b *batchBackend) Name() string { return "fakebatch" }
func (b *batchBackend) NewContext(backend.ContextInfo) (backend.Context, error) {
	return &batchCtx{b: b}, nil
}

type batchCtx struct{ b *batchBackend }

func (c *batchCtx) PlansOps() bool                         { return true }
func (c *batchCtx) WantsCompletions() bool                 { return false }
func (c *batchCtx) Completions([]backend.Completion) error { return nil }
func (c *batchCtx) Close() error                           { return nil }
func (c *batchCtx) BatchCap() int                          { return 8 }
func (c *batchCtx) PlanOp(op *backend.Op, p *backend.OpPlan) error {
	c.b.mu.Lock()
	c.b.singles++
	c.b.order = append(c.b.order, op.Size)
	c.b.mu.Unlock()
	return nil
}
func (c *batchCtx) PlanOps(ops []backend.Op, plans []backend.OpPlan) error {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	if c.b.quiet {
		return nil
	}
	c.b.batches = append(c.b.batches, len(ops))
	for i := range ops {
		c.b.order = append(c.b.order, ops[i].Size)
		if ops[i].Size == 77 {
			plans[i].Status = int32(abi.InvalidArgument) // policy fails this one
		}
	}
	return nil
}

// TestBatchedPlanning: aggregated puts are planned in batches (full ones,
// then the rest when an op of another context comes), in issue order; a
// signal from another context posted after them is applied after every
// one of them landed; an op the batch plan fails completes with its status;
// test() sends what is held.
func TestBatchedPlanning(t *testing.T) {
	be := &batchBackend{}
	RegisterGuestLoader(func(name string) (backend.Backend, error) { return be, nil })
	t.Cleanup(func() { RegisterGuestLoader(nil) })
	rs := setupEnv(t, 2, 8192, map[string]string{config.Backend.Name: "fakebatch", config.Dir.Name: t.TempDir(), config.IntraNode.Name: "0"})
	r0, r1 := rs[0], rs[1]
	for i := range r0.src {
		r0.src[i] = byte(i*7 + 1)
	}
	const n = 20
	var reqs []uint64
	for k := uint64(0); k < n; k++ {
		size := uint64(256)
		if k == 5 {
			size = 77
		}
		h, res := Iput(r0.rma, 0, k*256, r0.srcMh, size, k*256, r0.dstMh, 1, abi.OptFlagAggregateRequests)
		if res != abi.Success {
			t.Fatal(res)
		}
		reqs = append(reqs, h)
	}
	be.mu.Lock()
	if len(be.batches) != 2 || be.batches[0] != 8 || be.batches[1] != 8 || be.singles != 0 {
		t.Fatalf("after %d aggregated puts: batches %v, %d single plans; want two full batches of 8", n, be.batches, be.singles)
	}
	be.mu.Unlock()
	// Another context's signal: the 4 held ops are planned and queued first.
	sh, res := IputSignal(r0.rma, 1, 0, 0, 0, 0, 0, 1, 0, r0.sigMh, 1, abi.SignalOpInc, true, 0)
	if res != abi.Success {
		t.Fatal(res)
	}
	be.mu.Lock()
	if len(be.batches) != 3 || be.batches[2] != 4 || be.singles != 1 || be.order[n] != 0 {
		t.Fatalf("batches %v, %d single plans, order %v: the held ops were not planned before the signal", be.batches, be.singles, be.order)
	}
	be.mu.Unlock()
	if st := wait(t, r0.coll, sh); st != abi.Success {
		t.Fatal(st)
	}
	deadline := time.Now().Add(20 * time.Second)
	for signalWord(r1.sig, 0) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("signal never arrived")
		}
		time.Sleep(100 * time.Microsecond)
	}
	for k := 0; k < n; k++ {
		want := byte(0)
		for i := k * 256; i < k*256+256; i++ {
			want = r0.src[i]
			if k == 5 {
				want = 0 // failed by the plan: never sent
			}
			if r1.dst[i] != want {
				t.Fatalf("put %d byte %d: %d, want %d (signal applied before the put landed?)", k, i, r1.dst[i], want)
			}
		}
	}
	for k, h := range reqs {
		want := abi.Success
		if k == 5 {
			want = abi.InvalidArgument
		}
		if st := wait(t, r0.coll, h); st != want {
			t.Fatalf("put %d completed with %v, want %v", k, st, want)
		}
	}
	// A held op is sent by test() alone.
	h, res := Iput(r0.rma, 0, 0, r0.srcMh, 64, 7000, r0.dstMh, 1, abi.OptFlagAggregateRequests)
	if res != abi.Success {
		t.Fatal(res)
	}
	if st := wait(t, r0.coll, h); st != abi.Success {
		t.Fatalf("held put: %v", st)
	}
	// A signal behind it orders the byte check after the landing for the
	// race detector too (a completion travels over a socket, which it
	// cannot see).
	sh, res = IputSignal(r0.rma, 0, 0, 0, 0, 0, 0, 1, 0, r0.sigMh, 1, abi.SignalOpInc, true, 0)
	if res != abi.Success || wait(t, r0.coll, sh) != abi.Success {
		t.Fatalf("signal after the held put: %v", res)
	}
	for signalWord(r1.sig, 0) != 2 {
		if time.Now().After(deadline) {
			t.Fatal("second signal never arrived")
		}
		time.Sleep(100 * time.Microsecond)
	}
	if r1.dst[7000] != r0.src[0] {
		t.Fatalf("held put: byte %d, want %d", r1.dst[7000], r0.src[0])
	}
	// Holding, batch-planning and queueing allocate nothing.
	be.mu.Lock()
	be.quiet = true
	be.mu.Unlock()
	hs := make([]uint64, 20)
	if a := testing.AllocsPerRun(20, func() {
		for k := range hs {
			// Not at 7000, which the test read above: the race detector
			// sees no order between that read and a later landing (the
			// socket in between is invisible to it).
			hs[k], _ = Iput(r0.rma, 0, 0, r0.srcMh, 64, 7200, r0.dstMh, 1, abi.OptFlagAggregateRequests)
		}
		for _, h := range hs {
			for {
				if done, _ := Test(r0.coll, h); done {
					break
				}
			}
		}
	}); a != 0 {
		t.Fatalf("%v allocations per round of 20 held puts", a)
	}
}
