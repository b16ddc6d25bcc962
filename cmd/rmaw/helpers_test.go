package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/guests/buildflags"
)

func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

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
	tool, err := exec.LookPath("clang")
	if err != nil {
		t.Fatalf("clang is required to build C guests: %v", err)
	}
	root := repoRoot(t)
	if !strings.Contains(src, "/") {
		src = filepath.Join(root, "guests", src, src+".c")
	}
	out := filepath.Join(t.TempDir(), strings.TrimSuffix(filepath.Base(src), ".c")+".wasm")
	args := buildflags.ClangArgs(filepath.Join(root, "guests", "c"), out, src)
	if b, err := exec.Command(tool, args...).CombinedOutput(); err != nil {
		t.Fatalf("clang %s: %v\n%s", src, err, b)
	}
	return out
}
