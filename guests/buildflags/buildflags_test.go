package buildflags

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOneLine: make reads the file with $(shell cat ...), which joins lines
// with spaces; keep it one line so that the file reads the same everywhere.
func TestOneLine(t *testing.T) {
	if strings.Count(strings.TrimRight(cflags, "\n"), "\n") != 0 || len(CFlags()) == 0 {
		t.Fatalf("cflags.txt must be one non-empty line, got %q", cflags)
	}
	if got := ClangArgs("sdk", "o.wasm", "s.c"); strings.Join(got[len(got)-5:], " ") != "-I sdk -o o.wasm s.c" {
		t.Fatalf("ClangArgs: %q", got)
	}
}

// TestMakeReadsFile: guests/guests.mk takes GUEST_CFLAGS from the file.
func TestMakeReadsFile(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join("..", "guests.mk"))
	if err != nil {
		t.Fatal(err)
	}
	for v, f := range map[string]string{"GUEST_CFLAGS": File, "GUEST_GOENV": GoEnvFile, "GUEST_GOFLAGS": GoFlagsFile} {
		if !strings.Contains(string(mk), v+" := $(shell cat "+f+")\n") {
			t.Fatalf("guests/guests.mk does not read %s from %s", v, f)
		}
	}
}

// TestGoFlags: the Go files are one line each, and GoFlags reads the quoted
// -ldflags as the shell in make's recipe does: one word.
func TestGoFlags(t *testing.T) {
	for _, s := range []string{goenv, goflags} {
		if strings.Count(strings.TrimRight(s, "\n"), "\n") != 0 {
			t.Fatalf("%q must be one line", s)
		}
	}
	if got := strings.Join(GoEnv(), "|"); got != "GOOS=wasip1|GOARCH=wasm" {
		t.Fatalf("GoEnv: %s", got)
	}
	if got := strings.Join(GoArgs("./p", "o.wasm"), "|"); got != "build|-buildmode=c-shared|-trimpath|-ldflags=-s -w|-o|o.wasm|./p" {
		t.Fatalf("GoArgs: %s", got)
	}
}
