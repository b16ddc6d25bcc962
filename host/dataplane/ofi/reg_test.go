package ofi

import "testing"

// TestTakesDmaBuf: device memory goes to NIC providers as a DMA-BUF, to
// shm and tcp by address, and to none when NCCL_RMA_WASM_FI_DMABUF=0.
func TestTakesDmaBuf(t *testing.T) {
	for prov, want := range map[string]bool{"verbs;ofi_rxm": true, "efa": true, "cxi": true, "psm3": true, "opx": true,
		"shm": false, "tcp;ofi_rxm": false, "tcp": false, "verbsx": false} {
		if got := takesDmaBuf(prov, false); got != want {
			t.Errorf("takesDmaBuf(%q) = %v, want %v", prov, got, want)
		}
	}
	if takesDmaBuf("efa", true) {
		t.Error("efa takes a DMA-BUF with NCCL_RMA_WASM_FI_DMABUF=0")
	}
}
