//go:build wasip1

// Command goplanner is a test backend written with the Go SDK that plans
// every operation and proves, from inside the guest, that the SDK's per-op
// path allocates nothing: every 1024 calls it compares the runtime's malloc
// count and fails the operation (status 3) if anything was allocated.
package main

import (
	"runtime"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/guests/go/rmaw"
)

type planner struct {
	calls   uint64
	mallocs uint64
	ms      runtime.MemStats
}

func (p *planner) Init(config string, hostFeatures uint64) (uint64, int32) {
	runtime.ReadMemStats(&p.ms)
	p.mallocs = p.ms.Mallocs
	return guestabi.FeaturePlanOp, 0
}

func (p *planner) PlanOp(op *rmaw.Op, plan *rmaw.Plan) int32 {
	p.calls++
	if p.calls%1024 == 0 {
		runtime.ReadMemStats(&p.ms)
		if p.ms.Mallocs != p.mallocs {
			return 3 // ncclInternalError: the per-op path allocated
		}
	}
	plan.Lane = int32(op.Peer % 2)
	return 0
}

func (p *planner) ConnPlan(nranks, rank int32, c *rmaw.ConnPlan) int32 {
	c.Lanes = 2
	return 0
}

func init() { rmaw.Register(&planner{}) }

func main() {}
