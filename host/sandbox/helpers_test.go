package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/guests/buildflags"
)

// repoRoot is the module root (two levels up from host/sandbox).
func repoRoot(t testing.TB) string { return buildflags.Root() }

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

// cguest compiles guests/<name>/<name>.c (or a path) with the SDK flags.
func cguest(t testing.TB, src string) string {
	t.Helper()
	if !strings.Contains(src, "/") { // a backend of this repository
		src = filepath.Join(repoRoot(t), "guests", src, src+".c")
	}
	out := filepath.Join(t.TempDir(), strings.TrimSuffix(filepath.Base(src), ".c")+".wasm")
	if err := buildflags.CompileC(src, out); err != nil {
		t.Fatal(err)
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
