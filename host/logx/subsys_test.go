package logx

import (
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
)

// TestWarnPassesEverySubsystemMask: NCCL drops lines whose flags miss
// NCCL_DEBUG_SUBSYS (default INIT,BOOTSTRAP,ENV) at every level, so a WARN
// goes to the logger with every flag set, as NCCL's own WARNs do; INFO
// keeps its subsystem, which is what NCCL_DEBUG_SUBSYS selects.
func TestWarnPassesEverySubsystemMask(t *testing.T) {
	var got []uint64
	SetSink(func(level abi.LogLevel, subsys uint64, _ string, _ int, _ string) { got = append(got, subsys) })
	defer SetSink(nil)
	Warn(abi.SubsysNet, "a net warning")
	Info(abi.SubsysNet, "a net info line")
	const ncclDefaultMask = abi.SubsysInit | 0x1000 /* BOOTSTRAP */ | abi.SubsysEnv
	if len(got) != 2 || got[0]&ncclDefaultMask == 0 || got[0] != abi.SubsysAll {
		t.Fatalf("WARN flags %#x: NCCL's default mask %#x would drop it", got, ncclDefaultMask)
	}
	if got[1] != abi.SubsysNet {
		t.Fatalf("INFO flags %#x, want NET (%#x)", got[1], abi.SubsysNet)
	}
}
