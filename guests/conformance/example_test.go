package conformance_test

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/guests/conformance"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/sandbox"
)

// Report prints what rmaw test prints. The module here is the embedded
// default backend (guests/passthrough), written to a file.
func ExampleReport() {
	dir, err := os.MkdirTemp("", "conformance-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	module := filepath.Join(dir, "passthrough.wasm")
	if err := os.WriteFile(module, sandbox.DefaultWasm(), 0o644); err != nil {
		panic(err)
	}
	conformance.Report(os.Stdout, module, conformance.Options{Match: regexp.MustCompile(`^(devices|conn-plan|finalize)$`)})
	// Output:
	// PASS load (features none)
	// PASS devices (wasm-tcp 40000 Mbps)
	// PASS conn-plan (1 distinct plan(s))
	// PASS finalize
	// 4 passed, 0 failed
}

// A backend's own go test: build the module, then hand it to Run, which
// reports each check through t (the scaffold of `rmaw new -lang go` has
// this test as conformance_test.go).
func ExampleRun() {
	TestMyBackend := func(t *testing.T) {
		conformance.Run(t, "mybackend.wasm", conformance.Options{Config: "lanes=4"})
	}
	_ = TestMyBackend
}
