// Command capi is the C boundary of librccl-rma-wasm.so, built with
// -buildmode=c-shared. It holds no logic: tables.c defines the data symbols
// ncclRmaPlugin_v14/_v15/_v16 whose slots call the //export'ed rmawasm_*
// functions in exports.go, which convert arguments, check NULL
// out-pointers, recover panics and call host/plugin.
package main

/*
#cgo CFLAGS: -Wall -Werror=incompatible-pointer-types -Werror=int-conversion -Werror=implicit-function-declaration
#include <stdlib.h>
*/
import "C"

import (
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
)

func init() {
	// os.Getenv only sees the environment as it was at exec time inside a
	// c-shared library; NCCL and test harnesses setenv() later.
	config.SetGetenv(libcGetenv)
}

func libcGetenv(name string) string {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	v := C.getenv(cs)
	if v == nil {
		return ""
	}
	return C.GoString(v)
}

func main() {}
