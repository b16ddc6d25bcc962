package sandbox

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
)

// TestEmbeddedMatchesSource rebuilds guests/passthrough/passthrough.c with
// the SDK flags (guests/buildflags, which make reads too) and requires the
// committed embedded/default.wasm to be identical. Regenerate with
// `make guests-embedded`.
func TestEmbeddedMatchesSource(t *testing.T) {
	built, err := os.ReadFile(cguest(t, "passthrough"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(built, DefaultWasm()) {
		t.Fatalf("host/sandbox/embedded/default.wasm (%d bytes) does not match guests/passthrough/passthrough.c built now (%d bytes): run `make guests-embedded` (or check the clang version)", len(DefaultWasm()), len(built))
	}
}

// TestDefaultDeviceAgrees keeps the default device written once in Go
// (guestabi.DefaultDevice*, through backend.DefaultDevice) and repeated in
// guests/passthrough/passthrough.c, the embedded default, and in the
// specification (docs/spec/).
func TestDefaultDeviceAgrees(t *testing.T) {
	want := backend.DefaultDevice()
	if d := (backend.Native{}).Devices(); len(d) != 1 || d[0] != want {
		t.Fatalf("native devices %+v, want [%+v]", d, want)
	}
	b := mustOpen(t, testOptions(t, "default", ""))
	if d := b.Devices(); len(d) != 1 || d[0] != want {
		t.Fatalf("embedded default (guests/passthrough/passthrough.c) devices %+v, want [%+v]", d, want)
	}
	// The specification's pages (SPEC.md is their index).
	var spec []byte
	for _, page := range []string{"c-abi.md", "guest-abi.md"} {
		b, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "spec", page))
		if err != nil {
			t.Fatal(err)
		}
		spec = append(spec, b...)
	}
	for _, s := range []string{fmt.Sprintf("one device `%s`, %d Mbps, %g µs", want.Name, want.SpeedMbps, want.LatencyUs),
		fmt.Sprintf("the embedded default says %d Mbps, %g µs", want.SpeedMbps, want.LatencyUs)} {
		if !strings.Contains(string(spec), s) {
			t.Errorf("docs/spec/{c-abi,guest-abi}.md do not say %q", s)
		}
	}
}
