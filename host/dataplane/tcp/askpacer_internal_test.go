package tcp

import (
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp/waitpolicy"
)

// A flush waits askAfter before it asks for held acks until waitpolicy.MissesMax
// flushes in a row had to ask; then it asks at once, except once every
// waitpolicy.RetryEvery flushes, and acks that came unasked turn the wait back on.
func TestAskPacerAdapts(t *testing.T) {
	var a askPacer
	for i := 0; i < waitpolicy.MissesMax; i++ {
		if d := a.after(true); d != askAfter {
			t.Fatalf("flush %d: waits %v, want %v", i, d, askAfter)
		}
		a.asked()
	}
	waits := 0
	for i := 0; i < 2*waitpolicy.RetryEvery; i++ {
		if a.after(true) != 0 {
			waits++
		}
		a.asked()
	}
	if waits != 2 {
		t.Fatalf("after %d asks in a row: %d of %d flushes waited, want 2", waitpolicy.MissesMax, waits, 2*waitpolicy.RetryEvery)
	}
	if got, want := a.early.Load(), uint64(2*waitpolicy.RetryEvery-2); got != want {
		t.Fatalf("%d flushes counted as asking at once, want %d", got, want)
	}
	if got, want := a.asks.Load(), uint64(waitpolicy.MissesMax+2*waitpolicy.RetryEvery); got != want {
		t.Fatalf("%d asks counted, want %d", got, want)
	}
	a.cameAlone()
	if d := a.after(true); d != askAfter {
		t.Fatalf("after acks that came unasked: waits %v, want %v", d, askAfter)
	}
	// Off, a flush always waits.
	var off askPacer
	for i := 0; i < 2*waitpolicy.MissesMax; i++ {
		if d := off.after(false); d != askAfter {
			t.Fatalf("adapting off, flush %d: waits %v, want %v", i, d, askAfter)
		}
		off.asked()
	}
	// Fewer than waitpolicy.MissesMax asks in a row keep the wait.
	a.asked()
	if d := a.after(true); d != askAfter {
		t.Fatalf("after one ask: waits %v, want %v", d, askAfter)
	}
}
