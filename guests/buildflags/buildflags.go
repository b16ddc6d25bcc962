// Package buildflags is the one definition of how a guest is compiled. The
// flags live in text files beside this file, read by make (guests/guests.mk,
// the `rmaw new` Makefiles) and, through this package, by the Go tests, the
// conformance kit and the scaffolded backends' tests:
//
//   - cflags.txt: the clang flags of a C guest (with -I <sdk> -o out src);
//   - goenv.txt and goflags.txt: the environment and the `go build` flags
//     of a Go guest (wasip1, c-shared, stripped).
//
// Changing cflags.txt changes host/sandbox/embedded/default.wasm: run
// `make guests-embedded` after.
package buildflags

import (
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

//go:embed cflags.txt
var cflags string

//go:embed goenv.txt
var goenv string

//go:embed goflags.txt
var goflags string

// The flags files' paths from the repository root.
const (
	File        = "guests/buildflags/cflags.txt"
	GoEnvFile   = "guests/buildflags/goenv.txt"
	GoFlagsFile = "guests/buildflags/goflags.txt"
)

// CFlags returns the clang flags of a C guest (freestanding wasm32, no
// entry point, stripped), without -I and -o.
func CFlags() []string { return strings.Fields(cflags) }

// ClangArgs returns the clang arguments that compile src into out with the
// C SDK header (rmaw.h) from sdkDir, normally <repository>/guests/c.
func ClangArgs(sdkDir, out, src string) []string {
	return append(CFlags(), "-I", sdkDir, "-o", out, src)
}

// GoEnv returns the environment entries (NAME=value) of a Go guest build.
func GoEnv() []string { return strings.Fields(goenv) }

// GoFlags returns the `go build` flags of a Go guest, as a shell reads the
// file (make does): words split at spaces outside double quotes, the quotes
// removed.
func GoFlags() []string {
	var words []string
	var w strings.Builder
	quoted, in := false, false
	for _, r := range strings.TrimSpace(goflags) {
		switch {
		case r == '"':
			quoted, in = !quoted, true
		case (r == ' ' || r == '\t' || r == '\n') && !quoted:
			if in {
				words = append(words, w.String())
				w.Reset()
			}
			in = false
		default:
			w.WriteRune(r)
			in = true
		}
	}
	if in {
		words = append(words, w.String())
	}
	return words
}

// GoArgs returns the go command's arguments that build the Go guest package
// pkg into out (run with GoEnv in the environment).
func GoArgs(pkg, out string) []string {
	return append(append([]string{"build"}, GoFlags()...), "-o", out, pkg)
}

// Root returns the repository root of this source tree (the checkout this
// package was built from).
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// CompileC compiles the C guest src into out with clang (from PATH), the
// flags of cflags.txt and the SDK of this checkout (guests/c/rmaw.h). The
// error holds clang's output.
func CompileC(src, out string) error {
	clang, err := exec.LookPath("clang")
	if err != nil {
		return fmt.Errorf("clang is required to build C guests: %v", err)
	}
	if b, err := exec.Command(clang, ClangArgs(filepath.Join(Root(), "guests", "c"), out, src)...).CombinedOutput(); err != nil {
		return fmt.Errorf("clang %s: %v\n%s", src, err, b)
	}
	return nil
}

// CompileGo builds the Go guest package pkg (a path as `go build` takes it,
// relative to dir) into out with the go command from PATH, GoEnv and
// GoFlags. The error holds the command's output.
func CompileGo(dir, pkg, out string) error {
	cmd := exec.Command("go", GoArgs(pkg, out)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), GoEnv()...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return nil
}
