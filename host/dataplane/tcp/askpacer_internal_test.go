package tcp

import "testing"

// A flush waits askAfter before it asks for held acks until waitMissesMax
// flushes in a row had to ask; then it asks at once, except once every
// waitRetryEvery flushes, and acks that came unasked turn the wait back on.
func TestAskPacerAdapts(t *testing.T) {
	var a askPacer
	for i := 0; i < waitMissesMax; i++ {
		if d := a.after(true); d != askAfter {
			t.Fatalf("flush %d: waits %v, want %v", i, d, askAfter)
		}
		a.asked()
	}
	waits := 0
	for i := 0; i < 2*waitRetryEvery; i++ {
		if a.after(true) != 0 {
			waits++
		}
		a.asked()
	}
	if waits != 2 {
		t.Fatalf("after %d asks in a row: %d of %d flushes waited, want 2", waitMissesMax, waits, 2*waitRetryEvery)
	}
	if got, want := a.early.Load(), uint64(2*waitRetryEvery-2); got != want {
		t.Fatalf("%d flushes counted as asking at once, want %d", got, want)
	}
	if got, want := a.asks.Load(), uint64(waitMissesMax+2*waitRetryEvery); got != want {
		t.Fatalf("%d asks counted, want %d", got, want)
	}
	a.cameAlone()
	if d := a.after(true); d != askAfter {
		t.Fatalf("after acks that came unasked: waits %v, want %v", d, askAfter)
	}
	// Off, a flush always waits.
	var off askPacer
	for i := 0; i < 2*waitMissesMax; i++ {
		if d := off.after(false); d != askAfter {
			t.Fatalf("adapting off, flush %d: waits %v, want %v", i, d, askAfter)
		}
		off.asked()
	}
	// Fewer than waitMissesMax asks in a row keep the wait.
	a.asked()
	if d := a.after(true); d != askAfter {
		t.Fatalf("after one ask: waits %v, want %v", d, askAfter)
	}
}
