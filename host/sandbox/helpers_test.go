package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// repoRoot is the module root (two levels up from host/sandbox).
func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// guestCFlags must equal GUEST_CFLAGS in guests/guests.mk.
var guestCFlags = "--target=wasm32 -O2 -ffreestanding -nostdlib -fno-builtin -Wall -Wextra -Werror -Wl,--no-entry -Wl,--strip-all"

// wat compiles testdata/<name>.wat with wat2wasm into a temp dir. A missing
// wat2wasm fails the test: the sandbox guarantees are not optional.
func wat(t testing.TB, name string) string {
	t.Helper()
	tool, err := exec.LookPath("wat2wasm")
	if err != nil {
		t.Fatalf("wat2wasm (wabt) is required for the sandbox tests: %v", err)
	}
	out := filepath.Join(t.TempDir(), name+".wasm")
	cmd := exec.Command(tool, "--enable-all", "-o", out, filepath.Join("testdata", name+".wat"))
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("wat2wasm %s: %v\n%s", name, err, b)
	}
	return out
}

// cguest compiles guests/c/<name>.c (or a path) with the SDK flags.
func cguest(t testing.TB, src string) string {
	t.Helper()
	tool, err := exec.LookPath("clang")
	if err != nil {
		t.Fatalf("clang is required to build C guests: %v", err)
	}
	if !strings.Contains(src, "/") { // an SDK guest, else a sample backend
		name := src
		src = filepath.Join(repoRoot(t), "guests", "c", name+".c")
		if _, err := os.Stat(src); err != nil {
			src = filepath.Join(repoRoot(t), "guests", name, name+".c")
		}
	}
	out := filepath.Join(t.TempDir(), strings.TrimSuffix(filepath.Base(src), ".c")+".wasm")
	args := append(strings.Fields(guestCFlags), "-I", filepath.Join(repoRoot(t), "guests", "c"), "-o", out, src)
	if b, err := exec.Command(tool, args...).CombinedOutput(); err != nil {
		t.Fatalf("clang %s: %v\n%s", src, err, b)
	}
	return out
}

func testOptions(t testing.TB, name, cfg string) Options {
	return Options{Name: name, Config: cfg, CacheDir: "off", CallTimeout: 100 * time.Millisecond}
}

func mustOpen(t testing.TB, o Options) *Backend {
	t.Helper()
	b, err := open(o)
	if err != nil {
		t.Fatalf("open %s: %v", o.Name, err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// runWat2wasm compiles a .wat file outside testdata.
func runWat2wasm(in, out string) ([]byte, error) {
	tool, err := exec.LookPath("wat2wasm")
	if err != nil {
		return nil, err
	}
	return exec.Command(tool, "--enable-all", "-o", out, in).CombinedOutput()
}
