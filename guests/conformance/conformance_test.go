package conformance_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/guests/buildflags"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/guests/conformance"
)

// repoRoot is the module root (two levels up from guests/conformance).
func repoRoot(t testing.TB) string { return buildflags.Root() }

// cBackend compiles guests/<name>/<name>.c with the SDK flags.
func cBackend(t testing.TB, name string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), name+".wasm")
	if err := buildflags.CompileC(filepath.Join(repoRoot(t), "guests", name, name+".c"), out); err != nil {
		t.Fatal(err)
	}
	return out
}

// goBackend builds the Go backend in guests/<name> for wasip1.
func goBackend(t testing.TB, name string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), name+".wasm")
	if err := buildflags.CompileGo(repoRoot(t), "./guests/"+name, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// quick keeps the volume checks short; the checks are the same.
var quick = conformance.Options{Ops: 2000, Contexts: 16}

// TestBackends runs the kit on every backend of the repository: each
// guests/<name>/<name>.c and the Go passthrough, with its default
// configuration.
func TestBackends(t *testing.T) {
	srcs, err := filepath.Glob(filepath.Join(repoRoot(t), "guests", "*", "*.c"))
	if err != nil || len(srcs) < 8 {
		t.Fatalf("backends under guests/: %v %v", srcs, err)
	}
	want := len(conformance.Checks()) + 1 // and the load
	for _, src := range srcs {
		name := strings.TrimSuffix(filepath.Base(src), ".c")
		if filepath.Base(filepath.Dir(src)) != name {
			continue // guests/<name>/<name>.c only
		}
		t.Run(name, func(t *testing.T) {
			if s := conformance.Run(t, cBackend(t, name), quick); s.Passed != want || !s.OK() {
				t.Fatalf("%+v, want %d passed", s, want)
			}
		})
	}
	t.Run("passthrough-go", func(t *testing.T) {
		if s := conformance.Run(t, goBackend(t, "passthrough-go"), quick); s.Passed != want || !s.OK() {
			t.Fatalf("%+v, want %d passed", s, want)
		}
	})
}

// recorder is a conformance.T that keeps what the kit reports.
type recorder struct{ logs, errs []string }

func (r *recorder) Helper() {}
func (r *recorder) Logf(format string, args ...any) {
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// TestRunReportsFailure: a nonsense answer fails its check through t, with
// what to fix, and Report prints the same line.
func TestRunReportsFailure(t *testing.T) {
	planner := cBackend(t, "planner")
	o := quick
	o.Config = "bad_lane=7"
	var r recorder
	s := conformance.Run(&r, planner, o)
	if s.OK() || len(r.errs) != s.Failed {
		t.Fatalf("%+v, errors %q", s, r.errs)
	}
	if !strings.HasPrefix(r.errs[0], "FAIL plan-op-kinds: ") || !strings.Contains(r.errs[0], "lane 1000 outside") ||
		!strings.Contains(r.errs[0], "     fix: ") {
		t.Fatalf("first error %q", r.errs[0])
	}
	var b strings.Builder
	if s2 := conformance.Report(&b, planner, o); s2 != s || !strings.Contains(b.String(), r.errs[0]) ||
		!strings.HasSuffix(b.String(), fmt.Sprintf("%d passed, %d failed\n", s.Passed, s.Failed)) {
		t.Fatalf("Report %+v:\n%s", s2, b.String())
	}
	if s := conformance.Run(&r, filepath.Join(t.TempDir(), "none.wasm"), o); s.Failed != 1 || s.Passed != 0 ||
		!strings.HasPrefix(r.errs[len(r.errs)-1], "FAIL load: ") {
		t.Fatalf("a missing module: %+v %q", s, r.errs)
	}
}
