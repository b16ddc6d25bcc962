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
	nameMu sync.Mutex
	names  = map[string]*C.char{}
)

// cName returns a C copy of s that is never freed: NCCL keeps the name
// pointer for the lifetime of the library.
func cName(s string) *C.char {
	nameMu.Lock()
	defer nameMu.Unlock()
	if c, ok := names[s]; ok {
		return c
	}
	c := C.CString(s)
	names[s] = c
	return c
}
