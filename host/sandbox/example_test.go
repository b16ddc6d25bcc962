package sandbox_test

import (
	"fmt"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/sandbox"
)

// Loading the embedded default backend, as the plugin does when
// NCCL_RMA_WASM_BACKEND is unset; sandbox.OptionsFromEnv() reads the
// NCCL_RMA_WASM_* variables instead of this literal.
func Example() {
	b, err := sandbox.Open(sandbox.Options{Name: "default", CacheDir: "off"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()
	fmt.Println(b.Name(), b.Devices()[0].Name)

	// The lane count follows the core count (one per four, up to four);
	// the striping threshold does not.
	plan, _ := b.ConnectionPlan(8, 0)
	fmt.Println("stripe from:", plan.StripeThreshold, "bytes")

	ctx, _ := b.NewContext(backend.ContextInfo{CommID: 1, NRanks: 8, Rank: 0, Contexts: 1})
	defer ctx.Close()
	fmt.Println("per-op calls:", ctx.PlansOps())
	// Output:
	// default wasm-tcp
	// stripe from: 262144 bytes
	// per-op calls: false
}
