package sandbox

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
