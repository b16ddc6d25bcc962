package plugin

import (
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx/logtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/version"
)

// TestVersionLine: init logs the build's version line once per process,
// the string rmaw version prints.
func TestVersionLine(t *testing.T) {
	lines := logtest.All(t)
	versionLogged.Store(false)
	logVersion()
	logVersion()
	want := "NET/wasm: " + version.String()
	n := 0
	for _, l := range lines() {
		if l == want {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("version line logged %d times, want once (%q); lines: %q", n, want, lines())
	}
}
