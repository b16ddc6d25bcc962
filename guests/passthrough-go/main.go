//go:build wasip1

// Command passthrough is the passthrough backend written with the Go SDK:
// the native policy (the default device, default connection plan), no
// per-op calls. Build: make guests (build/guests/passthrough-go.wasm).
package main

import "github.com/rccl-rma-wasm/rccl-rma-wasm/guests/go/rmaw"

type passthrough struct{}

func (passthrough) Init(config string, hostFeatures uint64) (uint64, int32) {
	rmaw.Log(2, "passthrough-go: ready")
	return 0, 0
}

func (passthrough) Devices(d []rmaw.Device) int32 {
	d[0].SetDefault()
	return 1
}

func init() { rmaw.Register(passthrough{}) }

func main() {}
