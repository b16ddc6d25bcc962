package plugin

import (
	"fmt"
	"os"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/profile"
)

// writeTrace writes the process's trace points (NCCL_RMA_WASM_PROFILE_TRACE)
// to <prefix>.<pid>, replacing what an earlier close wrote: every close
// writes every point so far. A failure is an INFO line: the trace is a
// diagnostic, and a communicator's close does not fail for it.
func writeTrace(rank int) {
	path := fmt.Sprintf("%s.%d", config.ProfileTrace.Get(), os.Getpid())
	f, err := os.Create(path)
	if err == nil {
		err = profile.WriteTrace(f, fmt.Sprintf("rank %d (pid %d)", rank, os.Getpid()))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		logx.Info(abi.SubsysNet, "NET/wasm: rank %d: trace not written: %v (%s)", rank, err, config.ProfileTrace.Name)
		return
	}
	logx.Info(abi.SubsysNet, "NET/wasm: rank %d: trace written to %s", rank, path)
}
