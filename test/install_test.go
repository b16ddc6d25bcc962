package test

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestInstall: make install DESTDIR=... PREFIX=/usr puts the library, its
// NCCL-name link, rmaw, the sample backends and the docs in place; the
// installed library logs its version line at init; make uninstall removes
// every file install wrote. It reuses what the other tests built.
func TestInstall(t *testing.T) {
	root := buildGuests(t)
	dest := t.TempDir()
	mk := func(target string) {
		t.Helper()
		cmd := exec.Command("make", "--no-print-directory", target, "DESTDIR="+dest, "PREFIX=/usr")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make %s: %v\n%s", target, err, out)
		}
	}
	mk("install")
	usr := filepath.Join(dest, "usr")
	for _, f := range []string{
		"lib/librccl-rma-wasm.so", "bin/rmaw",
		"share/rccl-rma-wasm/backends/passthrough.wasm", "share/rccl-rma-wasm/backends/multirail.wasm",
		"share/rccl-rma-wasm/backends/telemetry.wasm", "share/rccl-rma-wasm/backends/passthrough-go.wasm",
		"share/doc/rccl-rma-wasm/README.md", "share/doc/rccl-rma-wasm/CHANGELOG.md",
		"share/doc/rccl-rma-wasm/docs/README.md", "share/doc/rccl-rma-wasm/docs/guide/variables.md",
		"share/doc/rccl-rma-wasm/docs/spec/wire.md",
	} {
		if fi, err := os.Stat(filepath.Join(usr, f)); err != nil || fi.Size() == 0 {
			t.Errorf("%s not installed (%v)", f, err)
		}
	}
	if l, err := os.Readlink(filepath.Join(usr, "lib/libnccl-rma-wasm.so")); err != nil || l != "librccl-rma-wasm.so" {
		t.Errorf("libnccl-rma-wasm.so -> %q (%v), want librccl-rma-wasm.so", l, err)
	}

	// The installed rmaw and the installed library say the same version.
	out, err := exec.Command(filepath.Join(usr, "bin/rmaw"), "version").Output()
	ver := strings.TrimSpace(string(out))
	if err != nil || !strings.HasPrefix(ver, "rccl-rma-wasm ") {
		t.Fatalf("rmaw version: %q (%v)", ver, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hello := exec.CommandContext(ctx, filepath.Join(root, "build/hello_rma"), filepath.Join(usr, "lib/libnccl-rma-wasm.so"))
	hello.Env = append(os.Environ(), "NCCL_RMA_WASM_ADDR=127.0.0.1", "NCCL_RMA_WASM_CACHE_DIR="+t.TempDir())
	text, err := hello.CombinedOutput()
	if err != nil || !strings.Contains(string(text), "NET/wasm: "+ver) {
		t.Errorf("hello_rma on the installed library (%v) does not log %q:\n%s", err, "NET/wasm: "+ver, text)
	}

	mk("uninstall")
	var left []string
	filepath.WalkDir(dest, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			left = append(left, strings.TrimPrefix(p, dest))
		}
		return nil
	})
	if len(left) > 0 {
		t.Errorf("uninstall left %d files: %v", len(left), left)
	}
	if _, err := os.Stat(filepath.Join(usr, "share/rccl-rma-wasm")); !os.IsNotExist(err) {
		t.Errorf("uninstall left share/rccl-rma-wasm (%v)", err)
	}
}
