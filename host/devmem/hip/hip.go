// Package hip registers the AMD HIP runtime as the devmem.Device. It is cgo:
// driver.c finds libamdhip64.so with dlopen at run time (never linked), so
// the library still loads on machines without ROCm (the C files, one per
// concern, are listed in hip_internal.h). RCCL passes HIP memory as
// NCCL_PTR_CUDA; capi probes CUDA first and this package only when CUDA
// found no device.
package hip

/*
#cgo CFLAGS: -I${SRCDIR}/../devrt -Wall -Werror=incompatible-pointer-types -Werror=int-conversion -Werror=implicit-function-declaration
#include <stdlib.h>
#include "hip_shim.h"
*/
import "C"

import (
	"errors"
	"sync"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/devrt"
)

// hipDevice reaches the HIP runtime through the C files' ops table (devrt).
// Its contexts are device ordinals + 1.
type hipDevice struct {
	devrt.Runtime[hipOps]
}

// hipOps names the C files' ops table (driver.c).
type hipOps struct{}

func (hipOps) Ops() unsafe.Pointer { return unsafe.Pointer(&C.rmaw_hip_ops) }

// Probe loads the HIP runtime once and registers it with devmem when a
// device is there and no other device runtime was registered.
// NCCL_RMA_WASM_HIP=0 skips it.
var Probe = sync.OnceFunc(func() {
	if devmem.Get() != nil {
		return
	}
	if devrt.Load("HIP", "HIP runtime", config.HIP, func() (int, error) { return open("") }) {
		devmem.Register(hipDevice{})
	}
})

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

// Locate: a HIP context is the device ordinal + 1 (driver.c); libfabric's
// FI_HMEM_ROCR finds the device from the address itself.
func (hipDevice) Locate(ctx, _ uintptr) (int, int, error) {
	if ctx == 0 {
		return 0, 0, errors.New("not HIP device memory")
	}
	return devmem.IfaceROCR, int(ctx) - 1, nil
}
