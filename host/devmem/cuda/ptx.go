package cuda

/*
#include "cuda_shim.h"
*/
import "C"

import (
	_ "embed" // the kernels' PTX
	"strings"
)

// The device agent's kernel (agent.c) and the one-thread atomic add
// (atomics.c), as the driver's cuModuleLoadData takes them: PTX text,
// handed over NUL-terminated.
var (
	//go:embed agent.ptx
	agentPTX string
	//go:embed atomics.ptx
	add64PTX string
)

// init copies the kernels into the C files' buffers (C holds no Go
// pointer) before anything calls into them: a package's init runs before
// capi's exports take calls.
func init() {
	fillPTX(C.rmacu_agent_ptx[:], agentPTX)
	fillPTX(C.rmacu_add64_ptx[:], add64PTX)
}

// agentAcqRelPTX is the agent's kernel with its two publishing fences
// (thread 0's, before a command's signal word and before its done word)
// acquire-release instead of sequentially consistent: each precedes a
// store that must not overtake the writes before it (the copies of every
// thread, ordered before thread 0 by their own fence and the barrier, and
// then the signal), a release, which needs no store-load ordering. The
// park handshake keeps its SC fence: there a store must precede a load
// (NCCL_RMA_WASM_DEVICE_AGENT_FENCE=acqrel; RATIONALE.md).
func agentAcqRelPTX(p string) string {
	p = strings.Replace(p, "  @!%p1 bra NEXT;\n  fence.sc.sys;", "  @!%p1 bra NEXT;\n  fence.acq_rel.sys;", 1)
	return strings.Replace(p, "PUBLISH:\n  fence.sc.sys;", "PUBLISH:\n  fence.acq_rel.sys;", 1)
}

// agentLeanPTX is the agent's kernel with thread 0's fence before a
// command's signal word kept only for the fused commands (kinds 7 to 10:
// a copy, then its signal in the same command), where it orders the
// block's copies before the signal. Any other command has no copy of its
// own before the store: the previous command's copies were fenced before
// its done word (PUBLISH), and a signal that follows a payload landed
// elsewhere (a peer's agent, the context's stream, the host) is ordered
// by the acquire of the slot's number, after the host saw that payload
// land. agent_probe measured that fence at 0.5–0.6 µs per command on an
// H100 (NCCL_RMA_WASM_DEVICE_AGENT_FENCE=lean; RATIONALE.md).
func agentLeanPTX(p string) string {
	return strings.Replace(p, "  @!%p1 bra NEXT;\n  fence.sc.sys;", "  @!%p1 bra NEXT;\n  setp.ge.u64 %p39, %rd7, 7;\n  @%p39 fence.sc.sys;", 1)
}

// fillPTX copies s and a NUL into dst. A kernel that does not fit leaves
// dst empty, so that cuModuleLoadData fails and that kernel's path stays
// off (ptx_test.go fails first).
func fillPTX(dst []C.char, s string) {
	if len(s) >= len(dst) {
		return
	}
	for i := 0; i < len(s); i++ {
		dst[i] = C.char(s[i])
	}
	dst[len(s)] = 0
}

// ptxInC returns the C files' copies of the kernels, up to their NULs,
// and the room each buffer has (ptx_test.go).
func ptxInC() (agent, add64 string, agentRoom, add64Room int) {
	return C.GoString(&C.rmacu_agent_ptx[0]), C.GoString(&C.rmacu_add64_ptx[0]),
		len(C.rmacu_agent_ptx), len(C.rmacu_add64_ptx)
}
