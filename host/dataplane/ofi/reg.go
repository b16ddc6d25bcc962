package ofi

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric/nics"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// Registration: communicator memory registered with every rail's domain,
// so that peers write and read it by key. Without a fabric endpoint these
// do nothing and the memory is reached over the TCP lanes.

// Register registers a communicator registration on every rail
// (Mesh.RegisterMemory) and returns the key peers write with; 0 without
// libfabric.
func (r *Rails) Register(id uint32, base unsafe.Pointer, size uint64, dev bool) (uint64, error) {
	if r == nil {
		return 0, nil
	}
	if dev {
		// Not reachable by the provider: operations on it are staged over
		// the TCP lanes (dev.go); peers learn it is device memory
		// from the MsgReg.
		return 0, nil
	}
	// Every rail's domain registers it; rail 0's key rides the MsgReg the
	// caller posts, the others' are sent ahead of it (Link.Submit).
	var key uint64
	for i, e := range r.eps {
		k, err := e.Regs.Register(id, fabric.MRRequest{Base: base, Len: size, DMABUFFd: -1})
		if err != nil {
			for _, d := range r.eps[:i] {
				d.Regs.Deregister(id)
			}
			return 0, fmt.Errorf("fabric rail %d (%s): %w", i, e.Info.Domain, err)
		}
		if i == 0 {
			key = k
		}
	}
	return key, nil
}

// RegisterDevice registers device memory on every rail where the
// provider reaches it (FI_HMEM; Mesh.RegisterDevice) and returns rail 0's
// key and direct = true; otherwise (no fabric, no FI_HMEM, or the
// provider refuses it, which an INFO line reports) key 0 and direct =
// false: operations on it are staged over the TCP lanes (dev.go).
func (r *Rails) RegisterDevice(id uint32, base uintptr, size uint64, d link.DeviceMemory) (key uint64, direct bool) {
	if r == nil || !r.eps[0].Info.HMEM {
		return 0, false
	}
	if !takesDmaBuf(r.eps[0].Info.Provider, r.noDmaBuf) {
		// shm reaches device memory through the driver's IPC by address
		// (with a DMA-BUF registration its transfers never completed on
		// the H200 with libfabric 1.22), and tcp copies: neither wants one.
		d.DMABUFFd, d.Export = -1, nil
	}
	if d.DMABUFFd < 0 && d.Export != nil && fabric.RuntimeVersion() >= fabric.APIDMABUF {
		if fd, off, err := d.Export(); err == nil {
			defer unix.Close(fd)
			d.DMABUFFd, d.DMABUFOff = fd, off
		} else {
			logx.Info(abi.SubsysNet|abi.SubsysReg, "NET/wasm: fabric: no DMA-BUF of device memory (%v); registering the address range", err)
		}
	}
	req := fabric.MRRequest{Base: *(*unsafe.Pointer)(unsafe.Pointer(&base)), Len: size, Iface: d.Iface, Device: d.Device, DMABUFFd: d.DMABUFFd, DMABUFOff: d.DMABUFOff}
	for i, e := range r.eps {
		k, err := e.Regs.Register(id, req)
		if err != nil {
			for _, u := range r.eps[:i] {
				u.Regs.Deregister(id)
			}
			logx.Info(abi.SubsysNet|abi.SubsysReg, "NET/wasm: fabric %s rail %d: device memory (interface %d, device %d, dmabuf fd %d) not registered: %v; its operations are staged through host memory",
				e.Info.Provider, i, d.Iface, d.Device, d.DMABUFFd, err)
			return 0, false
		}
		if i == 0 {
			key = k
		}
	}
	return key, true
}

// takesDmaBuf reports whether device memory goes to provider prov as a
// DMA-BUF (when one is at hand or can be exported): NIC providers only,
// unless no (Options.NoDmaBuf, NCCL_RMA_WASM_FI_DMABUF=0).
func takesDmaBuf(prov string, no bool) bool { return !no && nics.Hardware(prov) }

// Deregister undoes Register and RegisterDevice once nothing uses the
// memory.
func (r *Rails) Deregister(id uint32) {
	if r == nil {
		return
	}
	for _, e := range r.eps {
		e.Regs.Deregister(id)
	}
}
