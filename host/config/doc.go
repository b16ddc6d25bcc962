package config

import (
	"bytes"
	"fmt"
	"regexp"
)

//go:generate go run ./gendoc -o ../../docs/guide/variables.md

// VariablesPath is where the generated variables page lives, relative to
// the repository root.
const VariablesPath = "docs/guide/variables.md"

// specPage maps a section number of the specification to its page,
// relative to docs/guide/.
func specPage(section string) string {
	switch section {
	case "4":
		return "../spec/wire.md"
	case "8":
		return "../spec/guest-abi.md"
	case "9":
		return "../design/architecture.md"
	}
	return "../spec/c-abi.md"
}

var (
	specRef = regexp.MustCompile(`SPEC\.md §([0-9]+)(\.[0-9]+)?`)
	docsRef = regexp.MustCompile(`docs/(design|spec|guide|bench)/([a-z0-9-]+)\.md`)
)

// linkify turns "SPEC.md §3" and "docs/design/x.md" in a declaration's text
// into links that work from docs/guide/.
func linkify(s string) string {
	s = specRef.ReplaceAllStringFunc(s, func(m string) string {
		sub := specRef.FindStringSubmatch(m)
		return fmt.Sprintf("[§%s%s](%s)", sub[1], sub[2], specPage(sub[1]))
	})
	return docsRef.ReplaceAllStringFunc(s, func(m string) string {
		sub := docsRef.FindStringSubmatch(m)
		if sub[1] == "guide" {
			return fmt.Sprintf("[%s.md](%s.md)", sub[2], sub[2])
		}
		return fmt.Sprintf("[%s](../%s/%s.md)", m, sub[1], sub[2])
	})
}

// VariablesPage renders docs/guide/variables.md from Table. The page is
// generated (go generate ./host/config, or make docs) and
// TestVariablesPage fails when the committed page differs.
func VariablesPage() []byte {
	var b bytes.Buffer
	b.WriteString(`# Variables

<!-- Generated from host/config (config.go's declarations) by host/config/gendoc:
     run "make docs" (or "go generate ./host/config") after changing a declaration. Do not edit. -->

Every variable the plugin reads, with its default and meaning, in declaration order. For people
who configure a job; [configuration.md](configuration.md) says how the variables are read and
which ones matter for which setup.

All are read with libc ` + "`getenv`" + ` at the call that needs them, so values set by the application
after start-up (Python ` + "`os.environ`" + `, NCCL's config file) are seen. A malformed or out-of-range
value is reported by one WARN line per variable per process and the default is used.

| variable | default | meaning |
|---|---|---|
`)
	for _, v := range Table {
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", v.Name, v.Default, linkify(v.Doc))
	}
	b.WriteString("\n## Accepted values\n\n| variable | kind | accepted |\n|---|---|---|\n")
	for _, v := range Table {
		want := v.want()
		if v.Kind == KindEnum {
			want = "one of " + want
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", v.Name, v.Kind, want)
	}
	return b.Bytes()
}
