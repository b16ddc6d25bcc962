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

// TestEmbeddedMatchesSource rebuilds guests/c/passthrough.c with the SDK
// flags and requires the committed embedded/default.wasm to be identical.
// Regenerate with `make guests-embedded`.
func TestEmbeddedMatchesSource(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join(repoRoot(t), "guests", "guests.mk"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mk), "GUEST_CFLAGS = "+guestCFlags+"\n") {
		t.Fatalf("guests/guests.mk GUEST_CFLAGS differs from the flags this test uses (%s)", guestCFlags)
	}
	built, err := os.ReadFile(cguest(t, "passthrough"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(built, DefaultWasm()) {
		t.Fatalf("host/sandbox/embedded/default.wasm (%d bytes) does not match guests/c/passthrough.c built now (%d bytes): run `make guests-embedded` (or check the clang version)", len(DefaultWasm()), len(built))
	}
}

// TestDefaultDeviceAgrees keeps the default device written once in Go
// (guestabi.DefaultDevice*, through backend.DefaultDevice) and repeated in
// guests/c/passthrough.c, the embedded default, and in SPEC.md.
func TestDefaultDeviceAgrees(t *testing.T) {
	want := backend.DefaultDevice()
	if d := (backend.Native{}).Devices(); len(d) != 1 || d[0] != want {
		t.Fatalf("native devices %+v, want [%+v]", d, want)
	}
	b := mustOpen(t, testOptions(t, "default", ""))
	if d := b.Devices(); len(d) != 1 || d[0] != want {
		t.Fatalf("embedded default (guests/c/passthrough.c) devices %+v, want [%+v]", d, want)
	}
	spec, err := os.ReadFile(filepath.Join(repoRoot(t), "SPEC.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{fmt.Sprintf("one device `%s`, %d Mbps, %g µs", want.Name, want.SpeedMbps, want.LatencyUs),
		fmt.Sprintf("the embedded default says %d Mbps, %g µs", want.SpeedMbps, want.LatencyUs)} {
		if !strings.Contains(string(spec), s) {
			t.Errorf("SPEC.md does not say %q", s)
		}
	}
}
