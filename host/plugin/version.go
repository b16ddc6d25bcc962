package plugin

import (
	"sync/atomic"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/version"
)

// versionLogged is set once the version line was logged: one per process.
var versionLogged atomic.Bool

// logVersion logs, at the first init of the process, one INFO line with
// the build's version and commit (host/version; `rmaw version` prints the
// same string):
//
//	NET/wasm: rccl-rma-wasm v0.1.0-5-g1cc6bd3 (commit 1cc6bd3a9f0e)
func logVersion() {
	if versionLogged.CompareAndSwap(false, true) {
		logx.Info(abi.SubsysInit|abi.SubsysNet, "NET/wasm: %s", version.String())
	}
}
