package main

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"path/filepath"
	"strings"
	"sync/atomic"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// flavor selects the log-level numbering of the host library (abi.Flavor).
var flavor atomic.Int32

// installLogger makes fn (a ncclDebugLogger_t) the process-wide sink of
// logx. The newest non-NULL logger handed to init wins.
func installLogger(fn C.uintptr_t) {
	f, how := detectFlavor(fn)
	flavor.Store(int32(f))
	C.rmawasm_set_logger(fn)
	logx.SetSink(sink)
	// detectFlavor could not warn (no sink yet); this read warns about a
	// bad value, once per process, now that the line has somewhere to go.
	_ = config.LogFlavor.Get()
	logx.Trace(abi.SubsysInit, "logger installed, %s log levels (%s)", f, how)
}

// detectFlavor honours NCCL_RMA_WASM_LOG_FLAVOR=auto|nccl|rccl; with auto it
// asks dladdr which object holds the logger: a file name containing "rccl"
// (librccl.so.1) means RCCL numbering, anything else NCCL numbering.
// A bad value means auto; the caller warns once the sink is installed.
func detectFlavor(fn C.uintptr_t) (f abi.Flavor, how string) {
	v, _ := config.LogFlavor.Parse()
	switch v {
	case "nccl":
		return abi.FlavorNCCL, config.LogFlavor.Name + "=nccl"
	case "rccl":
		return abi.FlavorRCCL, config.LogFlavor.Name + "=rccl"
	}
	p := C.rmawasm_object_path(fn)
	if p == nil {
		return abi.FlavorNCCL, "logger object unknown"
	}
	path := C.GoString(p)
	if strings.Contains(strings.ToLower(filepath.Base(path)), "rccl") {
		return abi.FlavorRCCL, "logger in " + path
	}
	return abi.FlavorNCCL, "logger in " + path
}

func sink(level abi.LogLevel, subsys uint64, file string, line int, msg string) {
	f := abi.Flavor(flavor.Load())
	cmsg := C.CString(msg)
	C.rmawasm_log(C.int(f.Level(level)), C.ulong(subsys), cString(file), C.int(line), cmsg)
	C.free(unsafe.Pointer(cmsg))
}
