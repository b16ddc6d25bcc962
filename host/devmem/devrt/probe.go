package devrt

import (
	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// Load is the start of a runtime package's Probe: unless the runtime's
// setting is off, open loads the runtime (lib: "CUDA driver", "HIP
// runtime") and counts its devices, failing when it cannot or there are
// none. Each outcome is logged; true means there is a device to register.
func Load(name, lib string, setting config.BoolVar, open func() (int, error)) bool {
	if !setting.Get() {
		logx.Info(abi.SubsysInit, "NET/wasm: %s device memory disabled by %s", name, setting.Name)
		return false
	}
	n, err := open()
	if err != nil {
		logx.Info(abi.SubsysInit, "NET/wasm: no %s device memory support: %v", name, err)
		return false
	}
	logx.Info(abi.SubsysInit, "NET/wasm: %s loaded, %d device(s): ptrSupport includes NCCL_PTR_CUDA", lib, n)
	return true
}
