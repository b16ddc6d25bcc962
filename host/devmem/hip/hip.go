// Package hip registers the AMD HIP runtime as the devmem.Device. It is cgo:
// hip.c finds libamdhip64.so with dlopen at run time (never linked), so the
// library still loads on machines without ROCm. RCCL passes HIP memory as
// NCCL_PTR_CUDA; capi probes CUDA first and this package only when CUDA
// found no device.
package hip

/*
#cgo CFLAGS: -Wall -Werror=incompatible-pointer-types -Werror=int-conversion -Werror=implicit-function-declaration
#include <stdlib.h>
#include "hip_shim.h"
*/
import "C"

import (
	"errors"
	"sync"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// hipDevice reaches the HIP runtime through hip.c. Its contexts are device
// ordinals + 1.
type hipDevice struct{}

var hipOnce sync.Once

// Probe loads the HIP runtime once and registers it with devmem when a
// device is there and no other device runtime was registered.
// NCCL_RMA_WASM_HIP=0 skips it.
func Probe() {
	hipOnce.Do(func() {
		if devmem.Get() != nil {
			return
		}
		if !config.HIP.Get() {
			logx.Info(abi.SubsysInit, "NET/wasm: HIP device memory disabled by %s", config.HIP.Name)
			return
		}
		n, err := open("")
		if err != nil {
			logx.Info(abi.SubsysInit, "NET/wasm: no HIP device memory support: %v", err)
			return
		}
		devmem.Register(hipDevice{})
		logx.Info(abi.SubsysInit, "NET/wasm: HIP runtime loaded, %d device(s): ptrSupport includes NCCL_PTR_CUDA", n)
	})
}

// open loads the runtime (lib, or the usual names when empty) and counts
// its devices.
func open(lib string) (int, error) {
	var buf [256]C.char
	var name *C.char
	if lib != "" {
		name = C.CString(lib)
		defer C.free(unsafe.Pointer(name))
	}
	n := C.rmaw_hip_open(name, &buf[0], C.size_t(len(buf)))
	if n < 0 {
		return 0, errors.New(C.GoString(&buf[0]))
	}
	return int(n), nil
}

func (hipDevice) Name() string { return "HIP" }

// Locate: a HIP context is the device ordinal + 1 (hip.c); libfabric's
// FI_HMEM_ROCR finds the device from the address itself.
func (hipDevice) Locate(ctx, _ uintptr) (int, int, error) {
	if ctx == 0 {
		return 0, 0, errors.New("not HIP device memory")
	}
	return devmem.IfaceROCR, int(ctx) - 1, nil
}

func (hipDevice) Inspect(ptr uintptr, size uint64) (uintptr, error) {
	var ctx C.uintptr_t
	var buf [256]C.char
	if C.rmaw_hip_inspect(C.uint64_t(ptr), C.uint64_t(size), &ctx, &buf[0], C.size_t(len(buf))) != 0 {
		return 0, errors.New(C.GoString(&buf[0]))
	}
	return uintptr(ctx), nil
}

func (hipDevice) DtoH(ctx uintptr, dst unsafe.Pointer, src uintptr, n uint64) error {
	var buf [256]C.char
	if C.rmaw_hip_copy(C.uintptr_t(ctx), 0, dst, C.uint64_t(src), C.uint64_t(n), &buf[0], C.size_t(len(buf))) != 0 {
		return errors.New(C.GoString(&buf[0]))
	}
	return nil
}

func (hipDevice) HtoD(ctx uintptr, dst uintptr, src unsafe.Pointer, n uint64) error {
	var buf [256]C.char
	if C.rmaw_hip_copy(C.uintptr_t(ctx), 1, src, C.uint64_t(dst), C.uint64_t(n), &buf[0], C.size_t(len(buf))) != 0 {
		return errors.New(C.GoString(&buf[0]))
	}
	return nil
}

// Pinned staging memory is C memory (hipHostMalloc, portable).
func (hipDevice) AllocPinned(ctx uintptr, n uint64) (unsafe.Pointer, error) {
	var p unsafe.Pointer
	var buf [256]C.char
	if C.rmaw_hip_host_alloc(C.uintptr_t(ctx), C.uint64_t(n), &p, &buf[0], C.size_t(len(buf))) != 0 {
		return nil, errors.New(C.GoString(&buf[0]))
	}
	return p, nil
}

func (hipDevice) FreePinned(p unsafe.Pointer) { C.rmaw_hip_host_free(p) }

// HostRegister pins memory mapped outside Go's heap (the staging ring).
func (hipDevice) HostRegister(ctx uintptr, p unsafe.Pointer, n uint64) error {
	var buf [256]C.char
	if C.rmaw_hip_host_register(C.uintptr_t(ctx), p, C.uint64_t(n), &buf[0], C.size_t(len(buf))) != 0 {
		return errors.New(C.GoString(&buf[0]))
	}
	return nil
}

func (hipDevice) HostUnregister(ctx uintptr, p unsafe.Pointer) {
	C.rmaw_hip_host_unregister(C.uintptr_t(ctx), p)
}

// ExportDmaBuf exports the pages under [ptr, ptr+size) as a DMA-BUF
// (hipMemGetHandleForAddressRange), for the RDMA path.
func (hipDevice) ExportDmaBuf(ctx, ptr uintptr, size uint64) (int, uint64, error) {
	base, n, off := devmem.PageSpan(ptr, size)
	var fd C.int
	var buf [256]C.char
	if C.rmaw_hip_export_dmabuf(C.uintptr_t(ctx), C.uint64_t(base), C.uint64_t(n), &fd, &buf[0], C.size_t(len(buf))) != 0 {
		return -1, 0, errors.New(C.GoString(&buf[0]))
	}
	return int(fd), off, nil
}
