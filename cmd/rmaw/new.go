package main

// new: scaffold a backend from the templates embedded in this binary. The
// result builds with the checkout's SDK (clang for C, Go's wasip1 port for
// Go) and passes validate and test; tests build every template.

import (
	"bytes"
	"embed"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"text/template"
)

//go:embed templates
var templates embed.FS

// modulePath is the repository's module, used to recognise a checkout.
const modulePath = "github.com/rccl-rma-wasm/rccl-rma-wasm"

var validName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)

func runNew(e *env, args []string) error {
	fs := e.flags("new")
	lang := fs.String("lang", "", "go or c")
	name := fs.String("name", "", "backend name (default: the directory's base name)")
	repo := fs.String("repo", "", "rccl-rma-wasm checkout whose SDK the backend uses (default: found above the working directory or this binary)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err.Error()}
	}
	if fs.NArg() != 1 {
		return usageError{"want exactly one directory"}
	}
	dir := fs.Arg(0)
	if *lang != "go" && *lang != "c" {
		return usageError{"-lang must be go or c"}
	}
	if *name == "" {
		*name = filepath.Base(filepath.Clean(dir))
	}
	if !validName.MatchString(*name) {
		return usageError{fmt.Sprintf("backend name %q: use a lower-case letter, then lower-case letters, digits or _ (at most 63); pass -name", *name)}
	}
	root := *repo
	if root == "" {
		root = findRepo()
		if root == "" {
			return usageError{"no rccl-rma-wasm checkout above the working directory or this binary: pass -repo"}
		}
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return err
	}
	if !isRepo(root) {
		return usageError{fmt.Sprintf("-repo %s: not an rccl-rma-wasm checkout (no go.mod of %s)", root, modulePath)}
	}
	if ents, err := os.ReadDir(dir); err == nil && len(ents) > 0 {
		return fmt.Errorf("%s exists and is not empty; rmaw new writes only into a new or empty directory", dir)
	}
	files := map[string]string{"README.md": "templates/README.md.tmpl"}
	if *lang == "c" {
		files[*name+".c"] = "templates/c/backend.c.tmpl"
		files["Makefile"] = "templates/c/Makefile.tmpl"
	} else {
		files["main.go"] = "templates/go/main.go.tmpl"
		files["conformance_test.go"] = "templates/go/conformance_test.go.tmpl"
		files["go.mod"] = "templates/go/go.mod.tmpl"
		files["Makefile"] = "templates/go/Makefile.tmpl"
	}
	data := struct {
		Name, Lang, Repo, GoVersion string
		Requires                    []string
	}{*name, *lang, root, goVersion(root), requires(root)}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for out, tmpl := range files {
		src, err := templates.ReadFile(tmpl)
		if err != nil {
			return err
		}
		t, err := template.New(tmpl).Option("missingkey=error").Parse(string(src))
		if err != nil {
			return fmt.Errorf("template %s: %w", tmpl, err)
		}
		var buf bytes.Buffer
		if err := t.Execute(&buf, data); err != nil {
			return fmt.Errorf("template %s: %w", tmpl, err)
		}
		if err := os.WriteFile(filepath.Join(dir, out), buf.Bytes(), 0o644); err != nil {
			return err
		}
	}
	if *lang == "go" { // the checkout's sums: go test builds the conformance kit offline
		sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(e.stdout, "created %s backend %q in %s (SDK from %s)\nnext:\n  cd %s && make && make validate test demo\n",
		*lang, *name, dir, root, dir)
	return nil
}

// isRepo reports whether dir holds the repository's go.mod.
func isRepo(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	return err == nil && strings.HasPrefix(string(b), "module "+modulePath+"\n")
}

// goVersion is the go directive of the checkout's go.mod: a module that
// requires it must not ask for less.
func goVersion(root string) string {
	b, _ := os.ReadFile(filepath.Join(root, "go.mod"))
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "go "); ok {
			return strings.TrimSpace(v)
		}
	}
	return "1.26"
}

// requires lists the checkout's module requirements ("path version"): a Go
// backend requires the same versions, so that its go test (the conformance
// kit, host/sandbox, wazero) builds with the checkout's go.sum.
func requires(root string) []string {
	b, _ := os.ReadFile(filepath.Join(root, "go.mod"))
	var out []string
	block := false
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if c := strings.Index(l, "//"); c >= 0 {
			l = strings.TrimSpace(l[:c])
		}
		switch {
		case l == "require (":
			block = true
		case block && l == ")":
			block = false
		case block && l != "":
			out = append(out, l)
		case strings.HasPrefix(l, "require ") && !strings.HasSuffix(l, "("):
			out = append(out, strings.TrimSpace(strings.TrimPrefix(l, "require ")))
		}
	}
	return out
}

// findRepo looks above the working directory, then above the executable
// (build/rmaw lives in the checkout's build/).
func findRepo() string {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if exe, err := os.Executable(); err == nil {
		starts = append(starts, filepath.Dir(exe))
	}
	for _, d := range starts {
		for {
			if isRepo(d) {
				return d
			}
			p := filepath.Dir(d)
			if p == d {
				break
			}
			d = p
		}
	}
	return ""
}
