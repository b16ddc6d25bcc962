package fabric

import (
	"os"
	"testing"
	"time"
)

// TestSignalBeforeWait: a Signal that lands before Wait starts ends that
// Wait (fi_trywait resets the CQ's own signal, so an fi_cq_signal there
// was lost and a closing endpoint waited out the whole timeout). The
// Wait's own bound is ten minutes; the test gives up after a minute.
func TestSignalBeforeWait(t *testing.T) {
	if os.Getenv("FI_TCP_IFACE") == "" {
		t.Setenv("FI_TCP_IFACE", "lo") // loopback only
	}
	lib := os.Getenv("NCCL_RMA_WASM_FI_LIBRARY")
	if lib == "" {
		lib = "libfabric.so.1"
	}
	if err := Load(lib); err != nil {
		t.Skip(err)
	}
	e, err := Open("tcp;ofi_rxm", "")
	if err != nil {
		t.Skip(err)
	}
	defer e.Close()
	if !e.CanWait() {
		t.Skip("tcp;ofi_rxm's CQ has no wait fd here")
	}
	for i := 0; i < 3; i++ {
		e.Signal()
		done := make(chan error, 1)
		go func() { done <- e.Wait(10 * 60 * 1000) }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("wait %d: %v", i, err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("wait %d: a signal sent before it did not end it", i)
		}
	}
}
