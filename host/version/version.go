// Package version says which build of the plugin is running: the string the
// plugin logs at init (INFO) and `rmaw version` prints, so that a line in a
// cluster's log can be tied to a build.
//
// The commit and whether the tree was modified come from the Go build
// information (vcs.revision, vcs.modified: go build stamps them from a git
// checkout unless -buildvcs=false, which some environments set in GOFLAGS),
// else from Commit and Version as the Makefile links them in (-ldflags -X
// from `git rev-parse HEAD` and `git describe --always --dirty`; a version
// ending in "-dirty" means modified). The version is Version when set, else
// the main module's version from the build information, else "devel".
package version

import (
	"runtime/debug"
	"strings"
	"sync"
)

// Version and Commit are set at link time by the Makefile:
//
//	-ldflags "-X github.com/rccl-rma-wasm/rccl-rma-wasm/host/version.Version=$(git describe --always --dirty --tags)
//	          -X github.com/rccl-rma-wasm/rccl-rma-wasm/host/version.Commit=$(git rev-parse HEAD)"
var Version, Commit string

// Info is what a build says about itself.
type Info struct {
	Version  string // "v1.2.3", a git describe string, or "devel"
	Commit   string // full hash, or "" when the build has no VCS stamp
	Modified bool   // built from a tree with uncommitted changes
}

var read = sync.OnceValue(func() Info {
	bi, _ := debug.ReadBuildInfo()
	return fromBuildInfo(bi, Version, Commit)
})

// Get returns the running build's information.
func Get() Info { return read() }

// String is "rccl-rma-wasm VERSION (commit HASH)", with ", modified" when
// the tree was; the plugin's init line and `rmaw version` print it.
func String() string { return Get().String() }

func fromBuildInfo(bi *debug.BuildInfo, linked, commit string) Info {
	in := Info{Version: linked, Commit: commit, Modified: strings.HasSuffix(linked, "-dirty")}
	if bi != nil {
		if in.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			in.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				in.Commit = s.Value
			case "vcs.modified":
				in.Modified = s.Value == "true"
			}
		}
	}
	if in.Version == "" {
		in.Version = "devel"
	}
	return in
}

// String renders the information; the commit is shortened to 12 digits.
func (in Info) String() string {
	var b strings.Builder
	b.WriteString("rccl-rma-wasm ")
	b.WriteString(in.Version)
	b.WriteString(" (commit ")
	switch c := in.Commit; {
	case c == "":
		b.WriteString("unknown")
	case len(c) > 12:
		b.WriteString(c[:12])
	default:
		b.WriteString(c)
	}
	if in.Modified {
		b.WriteString(", modified")
	}
	b.WriteString(")")
	return b.String()
}
