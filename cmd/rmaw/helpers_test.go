package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/guests/buildflags"
)

func repoRoot(t testing.TB) string { return buildflags.Root() }

// rmaw runs the tool in-process and returns its exit status and output.
func rmaw(t testing.TB, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	rc := run(args, &out, &errb)
	return rc, out.String(), errb.String()
}

// watModule compiles WebAssembly text with wat2wasm (installed by
// test/setup.sh; the sandbox's tests need it too).
func watModule(t testing.TB, name, src string) string {
	t.Helper()
	tool, err := exec.LookPath("wat2wasm")
	if err != nil {
		t.Fatalf("wat2wasm (wabt) is required: %v", err)
	}
	dir := t.TempDir()
	in, out := filepath.Join(dir, name+".wat"), filepath.Join(dir, name+".wasm")
	if err := os.WriteFile(in, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command(tool, "--enable-all", "-o", out, in).CombinedOutput(); err != nil {
		t.Fatalf("wat2wasm %s: %v\n%s\n%s", name, err, b, src)
	}
	return out
}

// cModule compiles a C guest (a path, or the name of a backend folder
// guests/<name>) with the SDK.
func cModule(t testing.TB, src string) string {
	t.Helper()
	if !strings.Contains(src, "/") {
		src = filepath.Join(repoRoot(t), "guests", src, src+".c")
	}
	out := filepath.Join(t.TempDir(), strings.TrimSuffix(filepath.Base(src), ".c")+".wasm")
	if err := buildflags.CompileC(src, out); err != nil {
		t.Fatal(err)
	}
	return out
}
