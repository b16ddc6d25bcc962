module github.com/rccl-rma-wasm/rccl-rma-wasm

go 1.26.8

require (
	github.com/tetratelabs/wazero v1.12.0
	go.uber.org/multierr v1.11.0
	golang.org/x/sys v0.50.0
)

require github.com/klauspost/compress v1.20.4 // indirect
