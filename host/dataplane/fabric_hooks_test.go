package dataplane

import "github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/ofi"

// The libfabric transport under the names its integration tests use;
// they reach its internals through ofi's test hooks (ofi/testhooks.go).
type (
	fabricLink = ofi.Link
	fabEP      = ofi.EP
)
