package devrt

import (
	"strings"
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx/logtest"
)

// TestStuckCopyWarns: a synchronous copy still running after stuckAfter
// gets one WARN naming its size, direction and the remedies; a copy that
// ended in time gets none.
func TestStuckCopyWarns(t *testing.T) {
	stuckAfter.Store(int64(100 * time.Millisecond))
	warns := logtest.Warnings(t)
	quick := beginCopy(8, false)
	endCopy(quick)
	slow := beginCopy(4096, true)
	time.Sleep(600 * time.Millisecond)
	endCopy(slow)
	lines := warns()
	if len(lines) != 1 {
		t.Fatalf("%d WARNs, want one for the stuck copy: %q", len(lines), lines)
	}
	for _, want := range []string{"a copy of 4096 bytes to device memory has waited", "NCCL_RMA_WASM_COPY_CONTEXT=0", "CUDA_DEVICE_MAX_CONNECTIONS"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("WARN %q lacks %q", lines[0], want)
		}
	}
}
