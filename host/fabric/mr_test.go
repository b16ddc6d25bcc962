package fabric

import "testing"

// TestDescribeMR checks the registration attributes the shim builds, with
// no NIC and no libfabric call: host memory by range; device memory only
// on an FI_HMEM endpoint, with its interface and device; a DMA-BUF passed
// as one (FI_MR_DMABUF) from API 1.20 on, else its range by address.
func TestDescribeMR(t *testing.T) {
	base := Alloc(64) // registered memory is never Go memory
	defer Free(base)
	const remote = 1<<12 | 1<<13 // FI_REMOTE_READ | FI_REMOTE_WRITE
	old, dmabufAPI := Version(1, 10), Version(1, 20)
	if APIDMABUF != dmabufAPI {
		t.Fatalf("APIDMABUF %#x", APIDMABUF)
	}

	v, err := DescribeMR(false, old, MRRequest{Base: base, Len: 64, WantKey: 7, DMABUFFd: -1})
	if err != nil || v.Iface != IfaceSystem || v.DMABUF || v.Flags != 0 || v.Base != uintptr(base) || v.Len != 64 ||
		v.RequestedKey != 7 || v.IOVCount != 1 || v.Access&remote != remote || v.Fd != -1 {
		t.Fatalf("host memory: %+v %v", v, err)
	}
	if _, err := DescribeMR(false, dmabufAPI, MRRequest{Base: base, Len: 64, Iface: IfaceCUDA, DMABUFFd: 5}); err == nil {
		t.Fatal("device memory accepted on an endpoint without FI_HMEM")
	}
	if _, err := DescribeMR(true, dmabufAPI, MRRequest{Base: base, Len: 64, Iface: 7, DMABUFFd: -1}); err == nil {
		t.Fatal("unknown interface accepted")
	}
	// CUDA, a DMA-BUF fd, a library older than 1.20: the range, by address.
	v, err = DescribeMR(true, old, MRRequest{Base: base, Len: 64, Iface: IfaceCUDA, Device: 3, DMABUFFd: 9, DMABUFOff: 4096})
	if err != nil || v.Iface != IfaceCUDA || v.Device != 3 || v.DMABUF || v.Flags != 0 || v.Base != uintptr(base) || v.Len != 64 {
		t.Fatalf("CUDA by address: %+v %v", v, err)
	}
	// The same at 1.20: the DMA-BUF itself.
	v, err = DescribeMR(true, dmabufAPI, MRRequest{Base: base, Len: 64, Iface: IfaceCUDA, Device: 3, DMABUFFd: 9, DMABUFOff: 4096})
	if err != nil || !v.DMABUF || v.Flags != FlagDMABUF || v.Fd != 9 || v.Offset != 4096 || v.Len != 64 || v.Base != uintptr(base) ||
		v.Iface != IfaceCUDA || v.Device != 3 {
		t.Fatalf("CUDA DMA-BUF: %+v %v", v, err)
	}
	// No fd: by address even at 1.20.
	v, err = DescribeMR(true, dmabufAPI, MRRequest{Base: base, Len: 64, Iface: IfaceCUDA, Device: 1, DMABUFFd: -1})
	if err != nil || v.DMABUF || v.Flags != 0 || v.Device != 1 {
		t.Fatalf("CUDA without fd: %+v %v", v, err)
	}
	// ROCm: the interface, no device id (the address names it).
	v, err = DescribeMR(true, old, MRRequest{Base: base, Len: 64, Iface: IfaceROCR, Device: 2, DMABUFFd: -1})
	if err != nil || v.Iface != IfaceROCR || v.Device != -1 || v.DMABUF {
		t.Fatalf("ROCR: %+v %v", v, err)
	}
	// A host request never becomes a DMA-BUF, whatever the fd says.
	v, err = DescribeMR(true, dmabufAPI, MRRequest{Base: base, Len: 64, DMABUFFd: 9})
	if err != nil || v.DMABUF || v.Iface != IfaceSystem {
		t.Fatalf("host memory with an fd: %+v %v", v, err)
	}
}
