// Package sandbox runs a backend's policy as a WebAssembly guest under wazero
// (Guest ABI v1, SPEC.md §8) and presents it as a backend.Backend.
//
// A module is validated, metered (package meter) and compiled once per
// process; the Backend keeps one "control" instance for process-wide
// questions (devices, connection plans) and every backend.Context gets an
// instance of its own. Guests see only their own linear memory, the "rmaw" host module
// (log, get_config) and a WASI that denies everything. Every call runs on a
// fuel budget, so a guest that loops forever is stopped; traps and nonsense
// answers become errors, the instance is replaced, and after MaxFaults the
// backend is disabled.
//
// Files: options.go (Options, the environment), validate.go (exports and
// imports of a module), backend.go (Backend, faults), instance.go (one guest
// instance and its calls), context.go (backend.Context), runtime.go (shared
// wazero runtimes, the rmaw host functions), memory.go (guest memory),
// metercache.go (the on-disk cache of metered modules).
package sandbox

import _ "embed" // the default backend, below

//go:embed embedded/default.wasm
var defaultWasm []byte

// DefaultWasm returns the embedded default backend (guests/passthrough/passthrough.c).
func DefaultWasm() []byte { return defaultWasm }
