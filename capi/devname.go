package main

/*
#include <stdlib.h>
*/
import "C"

import (
	"strconv"
	"sync"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/plugin"
)

// deviceName is the name NCCL shows for dev (ncclNetProperties_v12_t.name,
// also the topology key); never empty.
func deviceName(dev int32) string {
	if n := plugin.DeviceName(dev); n != "" {
		return n
	}
	return plugin.PluginName + "_" + strconv.Itoa(int(dev))
}

var (
	cStringsMu sync.Mutex
	cStrings   = map[string]*C.char{}
)

// cString returns a C copy of s that is never freed, one per distinct
// string: NCCL keeps the device name and PCI path pointers for the
// lifetime of the library, and the host logger may keep a source-file
// name's (a small, fixed set).
func cString(s string) *C.char {
	cStringsMu.Lock()
	defer cStringsMu.Unlock()
	if c, ok := cStrings[s]; ok {
		return c
	}
	c := C.CString(s)
	cStrings[s] = c
	return c
}
