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
	if !strings.Contains(string(mk), "GUEST_CFLAGS := $(shell cat "+File+")\n") {
		t.Fatalf("guests/guests.mk does not read GUEST_CFLAGS from %s", File)
	}
}
