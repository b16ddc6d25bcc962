// Package config reads the NCCL_RMA_WASM_* variables. Values come from libc
// getenv (installed by capi) because os.Getenv inside a c-shared library only
// sees the environment as it was at exec, not what the host setenv()s later.
package config

import (
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

var getenv atomic.Pointer[func(string) string]

// SetGetenv installs the lookup used by Get. Tests and pure-Go callers can
// leave the default (os.Getenv).
func SetGetenv(f func(string) string) { getenv.Store(&f) }

// Get returns the value of name, or "" when unset.
func Get(name string) string {
	if f := getenv.Load(); f != nil {
		return (*f)(name)
	}
	return os.Getenv(name)
}

// String returns the variable or def when it is unset or blank.
func String(name, def string) string {
	if v := strings.TrimSpace(Get(name)); v != "" {
		return v
	}
	return def
}

// Int returns the variable parsed as an integer, def when unset, and def plus
// ok=false when it does not parse (callers WARN).
func Int(name string, def int64) (int64, bool) {
	v := strings.TrimSpace(Get(name))
	if v == "" {
		return def, true
	}
	n, err := strconv.ParseInt(v, 0, 64)
	if err != nil {
		return def, false
	}
	return n, true
}

// Bool accepts 1/0, true/false, yes/no, on/off.
func Bool(name string, def bool) (bool, bool) {
	switch strings.ToLower(strings.TrimSpace(Get(name))) {
	case "":
		return def, true
	case "1", "true", "yes", "on":
		return true, true
	case "0", "false", "no", "off":
		return false, true
	}
	return def, false
}

// Duration reads a millisecond count.
func Duration(name string, def time.Duration) (time.Duration, bool) {
	ms, ok := Int(name, int64(def/time.Millisecond))
	if ms < 0 {
		return def, false
	}
	return time.Duration(ms) * time.Millisecond, ok
}

// The variables, documented in SPEC.md ("Configuration").
const (
	Backend        = "NCCL_RMA_WASM_BACKEND"         // backend name: "default" (embedded), "native", or a module in Dir
	Dir            = "NCCL_RMA_WASM_DIR"             // directory of .wasm backends
	BackendConfig  = "NCCL_RMA_WASM_CONFIG"          // configuration string handed to the guest
	CacheDir       = "NCCL_RMA_WASM_CACHE_DIR"       // compilation cache; "off" disables it
	GuestMemoryMiB = "NCCL_RMA_WASM_GUEST_MEMORY_MB" // linear memory cap per guest instance
	GuestTimeoutMs = "NCCL_RMA_WASM_GUEST_TIMEOUT_MS"
	Addr           = "NCCL_RMA_WASM_ADDR" // address to listen on and advertise
	ConnectTimeout = "NCCL_RMA_WASM_CONNECT_TIMEOUT_MS"
	CloseTimeout   = "NCCL_RMA_WASM_CLOSE_TIMEOUT_MS" // bound on delivering posted operations at teardown
	LogFlavor      = "NCCL_RMA_WASM_LOG_FLAVOR"       // auto | nccl | rccl
	IntraNode      = "NCCL_RMA_WASM_INTRANODE"        // 1 (default) | 0
	Lanes          = "NCCL_RMA_WASM_LANES"            // TCP streams per peer, overriding the backend's plan
	CUDA           = "NCCL_RMA_WASM_CUDA"             // 1 (default) | 0: load the CUDA driver for device memory
	DebugStderr    = "NCCL_RMA_WASM_DEBUG_STDERR"     // log to stderr until NCCL installs its logger
)
