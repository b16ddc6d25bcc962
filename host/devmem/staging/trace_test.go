package staging

import (
	"bytes"
	"strings"
	"testing"
)

// TestSignalTrace: with the trace on, each update is written out with its
// word, add, value and path, oldest first; with it off nothing is kept.
func TestSignalTrace(t *testing.T) {
	SetTrace(false)
	traceSignal(0x1000, 9, 9, pathRMW)
	_, before := trace.log.Window()
	SetTrace(true)
	defer SetTrace(false)
	traceSignal(0x2000, 1, 5, pathShadow)
	traceSignal(0x2008, 2, 0, pathFolded)
	if _, next := trace.log.Window(); next != before+2 {
		t.Fatalf("%d updates kept, want 2 (the one made while off dropped)", next-before)
	}
	var b bytes.Buffer
	WriteTrace(&b)
	out := b.String()
	i := strings.Index(out, "0x2000 +1 -> 5 shadow write")
	j := strings.Index(out, "0x2008 +2 -> 0 folded into a pending write")
	if i < 0 || j < i || strings.Contains(out, "0x1000") {
		t.Fatalf("trace out of order or wrong:\n%s", out)
	}
}
