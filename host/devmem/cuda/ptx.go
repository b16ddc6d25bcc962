package cuda

/*
#include "cuda_shim.h"
*/
import "C"

import (
	_ "embed" // the kernels' PTX
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
