package plugin

import (
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
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

// wideBackend plans 4 lanes per peer and puts every operation on lane 3.
type wideBackend struct{ backend.Native }

func (wideBackend) Name() string { return "widelanes" }
func (wideBackend) ConnectionPlan(int32, int32) (backend.ConnPlan, error) {
	p := backend.DefaultConnPlan()
	p.Lanes = 4
	return p, nil
}
func (wideBackend) NewContext(backend.ContextInfo) (backend.Context, error) { return wideCtx{}, nil }

type wideCtx struct{}

func (wideCtx) PlansOps() bool { return true }
func (wideCtx) PlanOp(_ *backend.Op, p *backend.OpPlan) error {
	p.Lane = 3
	return nil
}
func (wideCtx) WantsCompletions() bool                 { return false }
func (wideCtx) Completions([]backend.Completion) error { return nil }
func (wideCtx) Close() error                           { return nil }

// TestLanesClamped: NCCL_RMA_WASM_LANES below the backend's plan (2 of 4)
// is honoured with one INFO line at connect and one when an operation
// planned on lane 3 is folded onto the two lanes; the operations succeed
// and their bytes and signals arrive. No WARN.
func TestLanesClamped(t *testing.T) {
	RegisterGuestLoader(func(string) (backend.Backend, error) { return wideBackend{}, nil })
	t.Cleanup(func() { RegisterGuestLoader(nil) })
	var mu sync.Mutex
	var infos, warns []string
	logx.SetSink(func(level abi.LogLevel, _ uint64, _ string, _ int, msg string) {
		mu.Lock()
		defer mu.Unlock()
		switch level {
		case abi.LogWarn:
			warns = append(warns, msg)
		case abi.LogInfo:
			if strings.Contains(msg, "lane") && strings.Contains(msg, "modulo") {
				infos = append(infos, msg)
			}
		}
	})
	defer logx.SetSink(nil)
	const size = 4096
	rs := setupEnv(t, 2, size, map[string]string{config.Backend.Name: "widelanes", config.Dir.Name: t.TempDir(),
		config.IntraNode.Name: "0", config.Lanes.Name: "2"})
	if l := lookupColl(rs[0].coll).plan.Lanes; l != 2 {
		t.Fatalf("communicator has %d lanes, want NCCL_RMA_WASM_LANES's 2", l)
	}
	r := rs[0]
	for j := range r.src {
		r.src[j] = byte(j*7 + 1)
	}
	for k := 0; k < 3; k++ {
		req, res := IputSignal(r.rma, 0, 0, r.srcMh, size, 0, r.dstMh, 1, 0, r.sigMh, 1, abi.SignalOpAdd, true, 0)
		if res != abi.Success || wait(t, r.coll, req) != abi.Success {
			t.Fatalf("put with signal %d planned on lane 3 of 2: %v", k, res)
		}
	}
	for signalWord(rs[1].sig, 0) != 3 {
		runtime.Gosched()
	}
	for j := range rs[1].dst[:size] {
		if want := byte(j*7 + 1); rs[1].dst[j] != want {
			t.Fatalf("byte %d = %d, want %d", j, rs[1].dst[j], want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	// connect on each rank, and the first fold on rank 0's communicator
	if len(infos) != 3 || len(warns) != 0 {
		t.Fatalf("INFO lines %q and WARN lines %q; want 2 at connect and 1 at the first fold, no WARN", infos, warns)
	}
}

// TestClampLanes: the count at connect, for plans and settings in and out
// of range.
func TestClampLanes(t *testing.T) {
	for _, c := range []struct {
		planned int32
		set     int
		want    int32
	}{{4, 0, 4}, {4, 2, 2}, {1, 8, 8}, {0, 0, 1}, {-3, 0, 1}, {99, 0, abi.MaxLanes}, {99, 3, 3}} {
		if got := clampLanes("x", c.planned, c.set); got != c.want {
			t.Errorf("clampLanes(%d, %d) = %d, want %d", c.planned, c.set, got, c.want)
		}
	}
}
