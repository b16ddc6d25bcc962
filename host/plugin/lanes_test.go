package plugin

import (
	"errors"
	"sync"
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
)

// laneBackend's contexts want completions; the first one rank 0 creates
// also wants lane events. Each records the batches it was handed.
type laneBackend struct {
	backend.Native
	mu    sync.Mutex
	ctxs  []*laneCtx
	rank0 int
}

func (b *laneBackend) Name() string { return "fakelanes" }
func (b *laneBackend) NewContext(info backend.ContextInfo) (backend.Context, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := &laneCtx{b: b, events: info.Rank == 0 && b.rank0 == 0}
	if info.Rank == 0 {
		b.rank0++
	}
	b.ctxs = append(b.ctxs, c)
	return c, nil
}

type laneCtx struct {
	b      *laneBackend
	events bool
	got    []backend.Completion
}

func (c *laneCtx) PlansOps() bool                            { return false }
func (c *laneCtx) PlanOp(*backend.Op, *backend.OpPlan) error { return nil }
func (c *laneCtx) WantsCompletions() bool                    { return true }
func (c *laneCtx) WantsLaneEvents() bool                     { return c.events }
func (c *laneCtx) Close() error                              { return nil }
func (c *laneCtx) Completions(batch []backend.Completion) error {
	c.b.mu.Lock()
	c.got = append(c.got, batch...)
	c.b.mu.Unlock()
	return nil
}

// TestLaneEventsReachBackends: a lane the mesh failed over reaches the
// contexts that want lane events, once, in their next completion batch and
// before the completions that follow it; other contexts never see one.
func TestLaneEventsReachBackends(t *testing.T) {
	be := &laneBackend{}
	RegisterGuestLoader(func(string) (backend.Backend, error) { return be, nil })
	t.Cleanup(func() { RegisterGuestLoader(nil) })
	rs := setupEnv(t, 2, 4096, map[string]string{config.Backend.Name: "fakelanes", config.Dir.Name: t.TempDir(), config.IntraNode.Name: "0"})
	r0 := rs[0]
	c := lookupColl(r0.coll)
	c.LaneFailed(1, 2, 5, errors.New("reset"))
	for ctx := int32(0); ctx < 2; ctx++ {
		h, res := Iput(r0.rma, ctx, 0, r0.srcMh, 64, 0, r0.dstMh, 1, 0)
		if res != abi.Success || wait(t, r0.coll, h) != abi.Success {
			t.Fatalf("put on context %d: %v", ctx, res)
		}
	}
	if res := Progress(r0.rma); res != abi.Success {
		t.Fatal(res)
	}
	be.mu.Lock()
	var mine []*laneCtx
	for _, x := range be.ctxs {
		if len(x.got) > 0 {
			mine = append(mine, x)
		}
	}
	if len(mine) != 2 || mine[0].events == mine[1].events {
		t.Fatalf("%d contexts got completions, want rank 0's two (one with lane events)", len(mine))
	}
	for _, x := range mine {
		events := 0
		for _, r := range x.got {
			if r.Kind == backend.EventLaneDown {
				events++
			}
		}
		switch {
		case !x.events && events != 0:
			t.Errorf("a context without lane events got %d", events)
		case x.events && (events != 1 || x.got[0] != backend.Completion{Kind: backend.EventLaneDown, Peer: 1, Lane: 2, Size: 5, Status: int32(abi.RemoteError)}):
			t.Errorf("a context with lane events got %+v, want the event first, once", x.got)
		}
	}
	be.mu.Unlock()
	// A lane that fails after the last batch is handed over when the
	// context closes.
	c.LaneFailed(1, 3, 0, errors.New("reset"))
	if res := DestroyContext(r0.rma); res != abi.Success {
		t.Fatal(res)
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	for _, x := range mine {
		if last := x.got[len(x.got)-1]; x.events && (last.Kind != backend.EventLaneDown || last.Lane != 3) {
			t.Errorf("at close the context with lane events got %+v last, want lane 3's event", last)
		}
	}
}
