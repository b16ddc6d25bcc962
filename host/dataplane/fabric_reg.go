package dataplane

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric/nics"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// Registration: communicator memory registered with every rail's domain,
// so that peers write and read it by key. Without a fabric endpoint these
// do nothing and the memory is reached over the TCP lanes.

// RegisterMemory registers a communicator registration with the fabric
// endpoint (regMrSym calls it before announcing the registration) and
// returns the key peers write with; 0 without a fabric endpoint.
func (m *Mesh) RegisterMemory(id uint32, base unsafe.Pointer, size uint64, dev bool) (uint64, error) {
	if m.fab == nil {
		return 0, nil
	}
	if dev {
		// Not reachable by the provider: operations on it are staged over
		// the TCP lanes (fabric_dev.go); peers learn it is device memory
		// from the MsgReg.
		return 0, nil
	}
	// Every rail's domain registers it; rail 0's key rides the MsgReg the
	// caller posts, the others' are sent ahead of it (fabricLink.submit).
	var key uint64
	for r, e := range m.rails {
		k, err := e.Regs.Register(id, fabric.MRRequest{Base: base, Len: size, DMABUFFd: -1})
		if err != nil {
			for _, d := range m.rails[:r] {
				d.Regs.Deregister(id)
			}
			return 0, fmt.Errorf("fabric rail %d (%s): %w", r, e.Info.Domain, err)
		}
		if r == 0 {
			key = k
		}
	}
	return key, nil
}

// RegisterDevice registers device memory with the fabric endpoint where
// the provider reaches it (FI_HMEM), on every rail, and returns rail 0's
// key and direct = true; otherwise (no fabric, no FI_HMEM, or the
// provider refuses it, which an INFO line reports) key 0 and direct =
// false: operations on it are staged over the TCP lanes (fabric_dev.go).
func (m *Mesh) RegisterDevice(id uint32, base uintptr, size uint64, d DeviceMemory) (key uint64, direct bool) {
	if m.fab == nil || !m.fab.Info.HMEM {
		return 0, false
	}
	if !takesDmaBuf(m.fab.Info.Provider, m.noDmaBuf) {
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
	r := fabric.MRRequest{Base: *(*unsafe.Pointer)(unsafe.Pointer(&base)), Len: size, Iface: d.Iface, Device: d.Device, DMABUFFd: d.DMABUFFd, DMABUFOff: d.DMABUFOff}
	for i, e := range m.rails {
		k, err := e.Regs.Register(id, r)
		if err != nil {
			for _, u := range m.rails[:i] {
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

// DeregisterMemory undoes RegisterMemory once nothing uses the memory.
func (m *Mesh) DeregisterMemory(id uint32) {
	for _, e := range m.rails {
		e.Regs.Deregister(id)
	}
}
