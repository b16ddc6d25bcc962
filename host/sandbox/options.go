package sandbox

// Options: what selects a guest backend and limits it, and how they are
// read from the environment.

import (
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
)

// Defaults of Options.
const (
	// The defaults of NCCL_RMA_WASM_GUEST_MEMORY_MB and _GUEST_TIMEOUT_MS.
	DefaultMemoryLimitMiB = config.DefaultGuestMemoryMiB
	DefaultCallTimeout    = config.DefaultGuestTimeout
	// MaxFaults is how many traps/nonsense answers a backend survives (each
	// replaces the instance that faulted); the next one disables it. Running
	// out of fuel (a guest that does not return) disables it at once.
	MaxFaults = 3
	// fuelPerNs calibrates budgets: one unit is one wasm instruction;
	// compiled code runs roughly one simple instruction per ns or faster.
	fuelPerNs = 1
	// planFuelDivisor: rmaw_plan_op gets CallTimeout/planFuelDivisor.
	planFuelDivisor = 100
)

// Options selects and limits a guest backend.
type Options struct {
	// Name is "" or "default" for the embedded default backend, a path to a
	// .wasm file (contains a '/' or ends in ".wasm"), or a module name looked
	// up as <Dir>/<Name>.wasm.
	Name string
	// Dir holds backend modules (NCCL_RMA_WASM_DIR).
	Dir string
	// CacheDir is the on-disk compilation cache; "" = default
	// (os.UserCacheDir()/rccl-rma-wasm), "off" disables it.
	CacheDir string
	// Config is handed to the guest at init; when empty, the file
	// <module>.conf beside the module is used if it exists.
	Config string
	// MemoryLimitMiB caps each instance's linear memory (default 64).
	MemoryLimitMiB uint32
	// CallTimeout bounds control-plane calls (init, contexts, completions);
	// rmaw_plan_op gets 1/100 of it. Default 100 ms.
	CallTimeout time.Duration
	// MetricsFile is where the host writes the Prometheus text of a guest
	// that exports rmaw_metrics (%p = the process id); "" = no file.
	MetricsFile string
	// MetricsAddr is a loopback host:port serving the same text at
	// /metrics; "" = no endpoint.
	MetricsAddr string
	// MetricsInterval is the most often a context's text is refreshed
	// (default 1 s); it is also refreshed when the context closes.
	MetricsInterval time.Duration
}

// OptionsFromEnv reads the NCCL_RMA_WASM_* variables through host/config.
// Unparsable values are reported with a WARN and replaced by defaults.
func OptionsFromEnv() Options {
	return Options{
		Name:           config.Backend.Get(),
		Dir:            config.Dir.Get(),
		CacheDir:       config.CacheDir.Get(),
		Config:         config.BackendConfig.Get(),
		MemoryLimitMiB: uint32(config.GuestMemoryMiB.Get()),
		CallTimeout:    config.GuestTimeout.Get(),

		MetricsFile:     config.MetricsFile.Get(),
		MetricsAddr:     config.MetricsAddr.Get(),
		MetricsInterval: config.MetricsInterval.Get(),
	}
}
