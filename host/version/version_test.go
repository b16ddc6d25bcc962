package version

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	bi := &debug.BuildInfo{
		Main: debug.Module{Path: "github.com/rccl-rma-wasm/rccl-rma-wasm", Version: "(devel)"},
		Settings: []debug.BuildSetting{
			{Key: "-trimpath", Value: "true"},
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "de07d99a1b2c3d4e5f60718293a4b5c6d7e8f901"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	for _, c := range []struct {
		bi     *debug.BuildInfo
		linked string
		commit string
		want   string
	}{
		{bi, "", "", "rccl-rma-wasm devel (commit de07d99a1b2c, modified)"},
		{bi, "v0.3.0-12-gde07d99-dirty", "", "rccl-rma-wasm v0.3.0-12-gde07d99-dirty (commit de07d99a1b2c, modified)"},
		{&debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261205120000-de07d99a1b2c"}}, "", "", "rccl-rma-wasm v0.0.0-20261205120000-de07d99a1b2c (commit unknown)"},
		{nil, "", "", "rccl-rma-wasm devel (commit unknown)"},
		// -buildvcs=false: what the Makefile links in.
		{&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "1cc6bd3-dirty", "1cc6bd3a9f0e11223344556677889900aabbccdd", "rccl-rma-wasm 1cc6bd3-dirty (commit 1cc6bd3a9f0e, modified)"},
		{&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "v0.1.0", "1cc6bd3a9f0e11223344556677889900aabbccdd", "rccl-rma-wasm v0.1.0 (commit 1cc6bd3a9f0e)"},
	} {
		if got := fromBuildInfo(c.bi, c.linked, c.commit).String(); got != c.want {
			t.Errorf("got %q, want %q", got, c.want)
		}
	}
}

// TestString: the test binary's own build information gives a well-formed
// line (go test stamps no VCS information, so the commit may be unknown).
func TestString(t *testing.T) {
	s := String()
	if !strings.HasPrefix(s, "rccl-rma-wasm ") || !strings.Contains(s, "(commit ") || !strings.HasSuffix(s, ")") {
		t.Fatalf("malformed: %q", s)
	}
	if String() != s {
		t.Fatal("not stable")
	}
}
