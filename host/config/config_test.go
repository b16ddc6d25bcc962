package config

import (
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
)

// withEnv installs env as the environment and a warn hook that collects
// lines, and resets every variable's warn-once state around the test.
func withEnv(t *testing.T, env map[string]string) *[]string {
	t.Helper()
	reset := func() {
		for _, v := range Table {
			v.warned.Store(false)
		}
	}
	reset()
	var lines []string
	SetGetenv(func(k string) string { return env[k] })
	SetWarn(func(msg string) { lines = append(lines, msg) })
	t.Cleanup(func() {
		SetGetenv(os.Getenv)
		SetWarn(func(string) {})
		reset()
	})
	return &lines
}

func TestValidValues(t *testing.T) {
	env := map[string]string{
		Backend.Name: " planner ", BackendConfig.Name: " a=1 ", Lanes.Name: "0x8", CloseTimeout.Name: "250",
		ConnectTimeout.Name: "1", CUDA.Name: "off", IntraNode.Name: "Yes", LogFlavor.Name: "RCCL",
		GuestMemoryMiB.Name: "4096", GuestTimeout.Name: "7",
	}
	lines := withEnv(t, env)
	check := func(name string, got, want any) {
		t.Helper()
		if got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	check("Backend", Backend.Get(), "planner")
	check("BackendConfig", BackendConfig.Get(), " a=1 ") // handed to the guest as written
	check("Dir", Dir.Get(), "")
	check("Lanes", Lanes.Get(), int64(abi.MaxLanes))
	check("CloseTimeout", CloseTimeout.Get(), 250*time.Millisecond)
	check("ConnectTimeout", ConnectTimeout.Get(), time.Millisecond)
	check("CUDA", CUDA.Get(), false)
	check("IntraNode", IntraNode.Get(), true)
	check("LogFlavor", LogFlavor.Get(), "rccl")
	check("GuestMemoryMiB", GuestMemoryMiB.Get(), int64(4096))
	check("GuestTimeout", GuestTimeout.Get(), 7*time.Millisecond)
	if len(*lines) != 0 {
		t.Fatalf("valid values warned: %q", *lines)
	}
	clear(env)
	check("Backend unset", Backend.Get(), "default")
	check("Lanes unset", Lanes.Get(), int64(0))
	check("CloseTimeout unset", CloseTimeout.Get(), DefaultCloseTimeout)
	check("ConnectTimeout unset", ConnectTimeout.Get(), DefaultConnectTimeout)
	check("LogFlavor unset", LogFlavor.Get(), "auto")
	check("CUDA unset", CUDA.Get(), true)
	if len(*lines) != 0 {
		t.Fatalf("unset values warned: %q", *lines)
	}
}

// TestMalformedWarnsOnce: a bad value gives the default and one WARN per
// variable per process however often it is read (every rank, every
// communicator reads them).
func TestMalformedWarnsOnce(t *testing.T) {
	cases := []struct {
		v    *Var
		val  string
		get  func() any
		want any
	}{
		{Lanes.Var, "9", func() any { return Lanes.Get() }, int64(0)},
		{Lanes.Var, "-1", func() any { return Lanes.Get() }, int64(0)},
		{Lanes.Var, "four", func() any { return Lanes.Get() }, int64(0)},
		{CloseTimeout.Var, "0", func() any { return CloseTimeout.Get() }, DefaultCloseTimeout},
		{CloseTimeout.Var, "-5", func() any { return CloseTimeout.Get() }, DefaultCloseTimeout},
		{ConnectTimeout.Var, "soon", func() any { return ConnectTimeout.Get() }, DefaultConnectTimeout},
		{ConnectTimeout.Var, "99999999999999999999", func() any { return ConnectTimeout.Get() }, DefaultConnectTimeout},
		{GuestTimeout.Var, "0", func() any { return GuestTimeout.Get() }, DefaultGuestTimeout},
		{GuestMemoryMiB.Var, "4097", func() any { return GuestMemoryMiB.Get() }, int64(DefaultGuestMemoryMiB)},
		{GuestMemoryMiB.Var, "0", func() any { return GuestMemoryMiB.Get() }, int64(DefaultGuestMemoryMiB)},
		{IntraNode.Var, "maybe", func() any { return IntraNode.Get() }, true},
		{CUDA.Var, "bogus", func() any { return CUDA.Get() }, true},
		{LogFlavor.Var, "loud", func() any { return LogFlavor.Get() }, "auto"},
	}
	for _, c := range cases {
		t.Run(c.v.Name+"="+c.val, func(t *testing.T) {
			lines := withEnv(t, map[string]string{c.v.Name: c.val})
			for range 6 {
				if got := c.get(); got != c.want {
					t.Fatalf("got %v, want the default %v", got, c.want)
				}
			}
			if len(*lines) != 1 {
				t.Fatalf("%d warnings, want 1: %q", len(*lines), *lines)
			}
			if l := (*lines)[0]; !strings.Contains(l, c.v.Name) || !strings.Contains(l, strconv.Quote(c.val)) {
				t.Fatalf("warning %q does not name the variable and its value", l)
			}
		})
	}
}

func TestLogFlavorParseDoesNotWarn(t *testing.T) {
	lines := withEnv(t, map[string]string{LogFlavor.Name: "loud"})
	if v, ok := LogFlavor.Parse(); v != "auto" || ok {
		t.Fatalf("Parse = %q %v", v, ok)
	}
	if len(*lines) != 0 {
		t.Fatalf("Parse warned: %q", *lines)
	}
}

// TestDeclarations checks the table itself: one declaration per name, and
// a default text that says what the typed default is.
func TestDeclarations(t *testing.T) {
	seen := map[string]bool{}
	for _, v := range Table {
		if !strings.HasPrefix(v.Name, "NCCL_RMA_WASM_") || seen[v.Name] {
			t.Errorf("%s: bad or duplicate name", v.Name)
		}
		seen[v.Name] = true
		if v.Doc == "" || v.Default == "" || strings.Contains(v.Doc+v.Default, "|") || strings.Contains(v.Doc+v.Default, "\n") {
			t.Errorf("%s: doc and default must be one non-empty table cell each", v.Name)
		}
		if (v.Kind == KindInt || v.Kind == KindDurationMs) && v.Min > v.Max {
			t.Errorf("%s: range %d..%d", v.Name, v.Min, v.Max)
		}
	}
	for _, b := range []BoolVar{IntraNode, CUDA} {
		if want := map[bool]string{true: "1", false: "0"}[b.Def]; b.Default != want {
			t.Errorf("%s: default text %q, value %v", b.Name, b.Default, b.Def)
		}
	}
	for _, d := range []DurationVar{GuestTimeout, ConnectTimeout, CloseTimeout} {
		if d.Default != strconv.FormatInt(d.Def.Milliseconds(), 10) {
			t.Errorf("%s: default text %q, value %v", d.Name, d.Default, d.Def)
		}
	}
	if GuestMemoryMiB.Default != strconv.FormatInt(GuestMemoryMiB.Def, 10) {
		t.Errorf("%s: default text %q", GuestMemoryMiB.Name, GuestMemoryMiB.Default)
	}
	if Lanes.Min != 0 || Lanes.Max != abi.MaxLanes || Lanes.Def != 0 {
		t.Errorf("%s: range %d..%d default %d, want 0..%d default 0 (the backend's plan)", Lanes.Name, Lanes.Min, Lanes.Max, Lanes.Def, abi.MaxLanes)
	}
	if CloseTimeout.Min < 1 || ConnectTimeout.Min < 1 || GuestTimeout.Min < 1 {
		t.Error("timeouts must be positive")
	}
	if LogFlavor.Default != "`"+LogFlavor.Def+"`" || !slices.Contains(LogFlavor.Values, LogFlavor.Def) {
		t.Errorf("%s: default %q", LogFlavor.Name, LogFlavor.Default)
	}
	if Backend.Default != "`"+Backend.Def+"`" {
		t.Errorf("%s: default %q", Backend.Name, Backend.Default)
	}
}

func repoFile(t *testing.T, name string) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestVariablesPage keeps docs/guide/variables.md equal to what
// VariablesPage renders from the declarations: run "make docs" (or
// go generate ./host/config) after changing one.
func TestVariablesPage(t *testing.T) {
	got := repoFile(t, VariablesPath)
	want := string(VariablesPage())
	if got == want {
		return
	}
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range min(len(g), len(w)) {
		if g[i] != w[i] {
			t.Fatalf("%s is stale (run make docs): line %d is\n%s\nwant\n%s", VariablesPath, i+1, g[i], w[i])
		}
	}
	t.Fatalf("%s is stale (run make docs): %d lines, want %d", VariablesPath, len(g), len(w))
}

// TestVariablesPageRows: the page has one table row per declaration, in
// order, as Markdown renders them.
func TestVariablesPageRows(t *testing.T) {
	page := string(VariablesPage())
	var names []string
	main, _, _ := strings.Cut(page, "## Accepted values")
	for l := range strings.Lines(main) {
		if strings.HasPrefix(l, "| `NCCL_RMA_WASM_") && strings.Count(l, " | ") == 2 {
			names = append(names, strings.Split(l, "`")[1])
		}
	}
	if len(names) != len(Table) {
		t.Fatalf("%d rows, %d declarations", len(names), len(Table))
	}
	for i, v := range Table {
		if names[i] != v.Name {
			t.Errorf("row %d is %s, want %s", i, names[i], v.Name)
		}
	}
	if got := linkify(`x (SPEC.md §4, "Lanes") and docs/design/device-memory.md`); got != `x ([§4](../spec/wire.md), "Lanes") and [docs/design/device-memory.md](../design/device-memory.md)` {
		t.Errorf("linkify: %s", got)
	}
}

// docFiles lists the project's Markdown: the top level and docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	files, _ := filepath.Glob(filepath.Join(root, "*.md"))
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range files {
		files[i], _ = filepath.Rel(root, f)
	}
	return files
}

// TestDocsMentionDeclaredVariables: every NCCL_RMA_WASM_* the prose names
// is declared, and a "(default X)" next to one says the declared default.
func TestDocsMentionDeclaredVariables(t *testing.T) {
	byName := map[string]*Var{}
	for _, v := range Table {
		byName[v.Name] = v
	}
	name := regexp.MustCompile(`NCCL_RMA_WASM_[A-Z_]+`)
	def := regexp.MustCompile("`(NCCL_RMA_WASM_[A-Z_]+)` \\(default ([^)]+)\\)")
	for _, f := range docFiles(t) {
		text := repoFile(t, f)
		for _, n := range name.FindAllString(text, -1) {
			if byName[n] == nil {
				t.Errorf("%s names %s, which host/config does not declare", f, n)
			}
		}
		for _, m := range def.FindAllStringSubmatch(text, -1) {
			if v := byName[m[1]]; v != nil && v.Default != m[2] {
				t.Errorf("%s says %s defaults to %s; declared %s", f, m[1], m[2], v.Default)
			}
		}
	}
}
