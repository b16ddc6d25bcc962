// Package buildflags is the one definition of how a C guest is compiled:
// the clang flags live in cflags.txt beside this file, read by make
// (guests/guests.mk, the `rmaw new -lang c` Makefile) and, through this
// package, by the Go tests and the conformance kit. Changing them changes
// host/sandbox/embedded/default.wasm: run `make guests-embedded` after.
package buildflags

import (
	_ "embed"
	"strings"
)

//go:embed cflags.txt
var cflags string

// File is the flags file's path from the repository root.
const File = "guests/buildflags/cflags.txt"

// CFlags returns the clang flags of a C guest (freestanding wasm32, no
// entry point, stripped), without -I and -o.
func CFlags() []string { return strings.Fields(cflags) }

// ClangArgs returns the clang arguments that compile src into out with the
// C SDK header (rmaw.h) from sdkDir, normally <repository>/guests/c.
func ClangArgs(sdkDir, out, src string) []string {
	return append(CFlags(), "-I", sdkDir, "-o", out, src)
}
