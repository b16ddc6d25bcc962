package sandbox

import (
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
)

func TestSmokePlanner(t *testing.T) {
	b := mustOpen(t, testOptions(t, cguest(t, "planner"), "lanes=4"))
	c, err := b.NewContext(backend.ContextInfo{CommID: 7, NRanks: 2, Rank: 0, Contexts: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !c.PlansOps() || !c.WantsCompletions() {
		t.Fatal("planner should plan ops and want completions")
	}
	plan := backend.OpPlan{Lane: -1}
	if err := c.PlanOp(&backend.Op{Kind: backend.OpPut, Peer: 3, Size: 8}, &plan); err != nil {
		t.Fatal(err)
	}
	if plan.Lane != 3 {
		t.Fatalf("lane %d", plan.Lane)
	}
	t.Log(b.Devices())
}
