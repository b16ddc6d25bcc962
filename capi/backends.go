package main

import (
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/plugin"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/sandbox"
)

// The library links the Wasm sandbox; the host runtime only knows the hook,
// which keeps its own tests free of wazero.
func init() {
	plugin.RegisterGuestLoader(func(name string) (backend.Backend, error) {
		o := sandbox.OptionsFromEnv()
		o.Name = name
		return sandbox.Open(o)
	})
}
