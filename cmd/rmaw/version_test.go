package main

import (
	"strings"
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/version"
)

// TestVersion: rmaw version prints host/version's string, the one the
// plugin logs at init, and takes no arguments.
func TestVersion(t *testing.T) {
	rc, out, errs := rmaw(t, "version")
	if rc != 0 || out != version.String()+"\n" || errs != "" {
		t.Fatalf("rc %d, out %q, err %q; want %q", rc, out, errs, version.String())
	}
	if rc, _, errs := rmaw(t, "version", "extra"); rc != 2 || !strings.Contains(errs, "takes no arguments") {
		t.Fatalf("rc %d, err %q", rc, errs)
	}
}
