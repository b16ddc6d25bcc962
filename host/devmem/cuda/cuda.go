// Package cuda registers the CUDA driver as the devmem.Device. It is cgo:
// cuda.c finds libcuda.so.1 with dlopen at run time (never linked), so the
// library still loads on machines without a GPU, and host stays pure Go.
package cuda

/*
#cgo CFLAGS: -Wall -Werror=incompatible-pointer-types -Werror=int-conversion -Werror=implicit-function-declaration
#include <stdlib.h>
#include "cuda_shim.h"
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

// cudaDevice reaches the CUDA driver through cuda.c.
type cudaDevice struct{}

var cudaOnce sync.Once

// Probe loads the CUDA driver once, at the first call (capi makes it at the
// plugin's init), and registers it with devmem when a GPU is there.
// NCCL_RMA_WASM_CUDA=0 skips it.
func Probe() {
	cudaOnce.Do(func() {
		if !config.CUDA.Get() {
			logx.Info(abi.SubsysInit, "NET/wasm: device memory disabled by %s", config.CUDA.Name)
			return
		}
		var buf [256]C.char
		n := C.rmaw_cuda_open(&buf[0], C.size_t(len(buf)))
		if n < 0 {
			logx.Info(abi.SubsysInit, "NET/wasm: no CUDA device memory support: %s", C.GoString(&buf[0]))
			return
		}
		logx.Info(abi.SubsysInit, "NET/wasm: CUDA driver loaded, %d device(s): ptrSupport includes NCCL_PTR_CUDA", int(n))
		if !config.GDRCopy.Get() {
			devmem.Register(cudaDevice{})
			return
		}
		if C.rmaw_gdr_open(&buf[0], C.size_t(len(buf))) != 0 {
			logx.Info(abi.SubsysInit, "NET/wasm: no GDRCopy (%s): device signal words are updated with copies", C.GoString(&buf[0]))
			devmem.Register(cudaDevice{})
			return
		}
		logx.Info(abi.SubsysInit, "NET/wasm: GDRCopy loaded: device signal words are updated through a CPU mapping")
		devmem.Register(gdrDevice{})
	})
}

func (cudaDevice) Name() string { return "CUDA" }

func (cudaDevice) Inspect(ptr uintptr, size uint64) (uintptr, error) {
	var ctx C.uintptr_t
	var buf [256]C.char
	if C.rmaw_cuda_inspect(C.uint64_t(ptr), C.uint64_t(size), &ctx, &buf[0], C.size_t(len(buf))) != 0 {
		return 0, errors.New(C.GoString(&buf[0]))
	}
	return uintptr(ctx), nil
}

// Locate says which CUDA device holds ptr, for direct registration with a
// NIC (libfabric FI_HMEM_CUDA).
func (cudaDevice) Locate(_, ptr uintptr) (int, int, error) {
	o := int(C.rmaw_cuda_ordinal(C.uint64_t(ptr)))
	if o < 0 {
		return 0, 0, errors.New("no CUDA device ordinal for this address")
	}
	return devmem.IfaceCUDA, o, nil
}

// The host buffers are Go memory pinned for the duration of the call, which
// the cgo rules allow: C does not keep them.
func (cudaDevice) DtoH(ctx uintptr, dst unsafe.Pointer, src uintptr, n uint64) error {
	var buf [256]C.char
	if C.rmaw_cuda_copy(C.uintptr_t(ctx), 0, dst, C.uint64_t(src), C.uint64_t(n), &buf[0], C.size_t(len(buf))) != 0 {
		return errors.New(C.GoString(&buf[0]))
	}
	return nil
}

func (cudaDevice) HtoD(ctx uintptr, dst uintptr, src unsafe.Pointer, n uint64) error {
	var buf [256]C.char
	if C.rmaw_cuda_copy(C.uintptr_t(ctx), 1, src, C.uint64_t(dst), C.uint64_t(n), &buf[0], C.size_t(len(buf))) != 0 {
		return errors.New(C.GoString(&buf[0]))
	}
	return nil
}

// Pinned staging memory is C memory (cuMemHostAlloc): Go never moves or
// frees it, and C may keep pointers to it.
func (cudaDevice) AllocPinned(ctx uintptr, n uint64) (unsafe.Pointer, error) {
	var p unsafe.Pointer
	var buf [256]C.char
	if C.rmaw_cuda_host_alloc(C.uintptr_t(ctx), C.uint64_t(n), &p, &buf[0], C.size_t(len(buf))) != 0 {
		return nil, errors.New(C.GoString(&buf[0]))
	}
	return p, nil
}

func (cudaDevice) FreePinned(p unsafe.Pointer) { C.rmaw_cuda_host_free(p) }

// HostRegister pins memory mapped outside Go's heap (the staging ring).
func (cudaDevice) HostRegister(ctx uintptr, p unsafe.Pointer, n uint64) error {
	var buf [256]C.char
	if C.rmaw_cuda_host_register(C.uintptr_t(ctx), p, C.uint64_t(n), &buf[0], C.size_t(len(buf))) != 0 {
		return errors.New(C.GoString(&buf[0]))
	}
	return nil
}

func (cudaDevice) HostUnregister(ctx uintptr, p unsafe.Pointer) {
	C.rmaw_cuda_host_unregister(C.uintptr_t(ctx), p)
}

// ExportDmaBuf exports the pages under [ptr, ptr+size) as a DMA-BUF.
func (cudaDevice) ExportDmaBuf(ctx, ptr uintptr, size uint64) (int, uint64, error) {
	base, n, off := devmem.PageSpan(ptr, size)
	var fd C.int
	var buf [256]C.char
	if C.rmaw_cuda_export_dmabuf(C.uintptr_t(ctx), C.uint64_t(base), C.uint64_t(n), &fd, &buf[0], C.size_t(len(buf))) != 0 {
		return -1, 0, errors.New(C.GoString(&buf[0]))
	}
	return int(fd), off, nil
}

// gdrDevice is the CUDA device with GDRCopy for signal words.
type gdrDevice struct{ cudaDevice }

func (gdrDevice) AddWord(ctx, addr uintptr, v uint64) (bool, error) {
	return C.rmaw_gdr_add(C.uintptr_t(ctx), C.uint64_t(addr), C.uint64_t(v)) == 1, nil
}

func (gdrDevice) Forget(addr uintptr, size uint64) {
	C.rmaw_gdr_forget(C.uint64_t(addr), C.uint64_t(size))
}
