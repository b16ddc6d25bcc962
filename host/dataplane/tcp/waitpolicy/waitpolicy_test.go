package waitpolicy_test

import (
	"fmt"
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp/waitpolicy"
)

// A policy waits until MissesMax waits in a row were in vain, then once
// every RetryEvery decisions; a wait that paid turns waiting back on, and
// fewer misses in a row than MissesMax never stop it.
func TestPolicy(t *testing.T) {
	var p waitpolicy.Policy
	for i := 0; i < waitpolicy.MissesMax; i++ {
		if !p.Waiting() {
			t.Fatalf("stopped waiting after %d misses", i)
		}
		p.Vain()
	}
	waits := 0
	for i := 0; i < 2*waitpolicy.RetryEvery; i++ {
		if p.Waiting() {
			waits++
			p.Vain()
		}
	}
	if waits != 2 {
		t.Fatalf("after %d misses in a row: %d waits in %d decisions, want 2", waitpolicy.MissesMax, waits, 2*waitpolicy.RetryEvery)
	}
	p.Paid()
	for i := 0; i < 3*waitpolicy.MissesMax; i++ {
		if !p.Waiting() {
			t.Fatalf("decision %d after a wait that paid: not waiting", i)
		}
		if i%waitpolicy.MissesMax == waitpolicy.MissesMax-1 {
			p.Paid()
		} else {
			p.Vain()
		}
	}
}

// Example: a caller that waits for a peer's word, as long as waiting pays.
func ExamplePolicy() {
	var p waitpolicy.Policy
	arrived := func() bool { return false } // the peer never sends in time
	waited := 0
	for i := 0; i < 100; i++ {
		if !p.Waiting() {
			continue // go on without waiting
		}
		waited++
		if arrived() {
			p.Paid()
		} else {
			p.Vain()
		}
	}
	fmt.Println(waited) // MissesMax, then one in RetryEvery
	// Output: 5
}
