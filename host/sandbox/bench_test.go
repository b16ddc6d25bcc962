package sandbox

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/sandbox/meter"
)

func benchPlan(b *testing.B, c backend.Context) {
	op := &backend.Op{Kind: backend.OpPut, Peer: 1, Size: 8}
	plan := &backend.OpPlan{}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		plan.Lane = -1
		if c.PlansOps() {
			if err := c.PlanOp(op, plan); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkPlanOp: the per-op hook of the C planner, metered (the shipped
// configuration).
func BenchmarkPlanOp(b *testing.B) {
	be := mustOpen(b, testOptions(b, cguest(b, "planner"), ""))
	c, err := be.NewContext(info)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	benchPlan(b, c)
}

// BenchmarkPlanOpEmbedded: the embedded default (PlansOps false: the
// runtime's per-op cost is one interface call).
func BenchmarkPlanOpEmbedded(b *testing.B) {
	be := mustOpen(b, testOptions(b, "", ""))
	c, err := be.NewContext(info)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	benchPlan(b, c)
}

// BenchmarkPlanOpNative: backend.Native for comparison.
func BenchmarkPlanOpNative(b *testing.B) {
	c, _ := backend.Native{}.NewContext(info)
	benchPlan(b, c)
}

// BenchmarkRawCall*: the same planner export called directly, unmetered vs
// metered vs with wazero's WithCloseOnContextDone (the alternative we did
// not take), to show where the cost goes.
func benchRaw(b *testing.B, closeOnDone, metered bool) {
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().WithCloseOnContextDone(closeOnDone))
	defer rt.Close(ctx)
	sr := &sharedRuntime{rt: rt}
	_ = sr
	if _, err := hostModule(rt).Instantiate(ctx); err != nil {
		b.Fatal(err)
	}
	bin, err := os.ReadFile(cguest(b, "planner"))
	if err != nil {
		b.Fatal(err)
	}
	if metered {
		if bin, err = meter.Rewrite(bin); err != nil {
			b.Fatal(err)
		}
	}
	mod, err := rt.InstantiateWithConfig(ctx, bin, wazero.NewModuleConfig().WithStartFunctions())
	if err != nil {
		b.Fatal(err)
	}
	if metered {
		mod.ExportedGlobal(meter.FuelExport).(interface{ Set(uint64) }).Set(1 << 60)
	}
	st := make([]uint64, 6)
	st[0] = 3
	if err := mod.ExportedFunction("rmaw_init").CallWithStack(ctx, st[:1]); err != nil {
		b.Fatal(err)
	}
	f := mod.ExportedFunction("rmaw_plan_op")
	cctx, cancel := context.WithTimeout(ctx, time.Hour)
	defer cancel()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		st[0], st[1], st[2], st[3], st[4], st[5] = 1, 1, 1, 8, 0, 0
		if err := f.CallWithStack(cctx, st); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRawCallUnmetered(b *testing.B)          { benchRaw(b, false, false) }
func BenchmarkRawCallMetered(b *testing.B)            { benchRaw(b, false, true) }
func BenchmarkRawCallCloseOnContextDone(b *testing.B) { benchRaw(b, true, false) }
