package sandbox

import (
	"path/filepath"
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/guests/buildflags"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
)

// TestGoSDKPlanOpAllocatesNothing builds a Go-SDK backend that plans every
// operation and checks its own malloc count every 1024 calls: the SDK's
// per-op path (the wasmexport entry, the Op and Plan views of the area) must
// not allocate, or the guest's GC would run inside NCCL's progress calls.
func TestGoSDKPlanOpAllocatesNothing(t *testing.T) {
	root := repoRoot(t)
	out := filepath.Join(t.TempDir(), "goplanner.wasm")
	if err := buildflags.CompileGo(root, "./host/sandbox/testdata/goplanner", out); err != nil {
		t.Fatalf("building the Go guest: %v", err)
	}
	b := mustOpen(t, testOptions(t, out, ""))
	cp, err := b.ConnectionPlan(4, 0)
	if err != nil || cp.Lanes != 2 {
		t.Fatalf("connection plan from the Go guest: %+v %v", cp, err)
	}
	c, err := b.NewContext(info)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !c.PlansOps() {
		t.Fatal("the Go planner did not enable plan_op")
	}
	op := backend.Op{Kind: backend.OpPut, Size: 8}
	var plan backend.OpPlan
	for i := 0; i < 20*1024; i++ {
		op.Peer = uint32(i % 4)
		plan = backend.OpPlan{Lane: -1}
		if err := c.PlanOp(&op, &plan); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if plan.Status != 0 {
			t.Fatalf("call %d: the guest saw an allocation on its per-op path (status %d)", i, plan.Status)
		}
		if plan.Lane != int32(op.Peer%2) {
			t.Fatalf("call %d: lane %d, want %d", i, plan.Lane, op.Peer%2)
		}
	}
}
