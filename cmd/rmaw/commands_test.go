package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestConformancePasses(t *testing.T) {
	for _, name := range []string{"planner", "passthrough"} {
		t.Run(name, func(t *testing.T) {
			rc, out, errs := rmaw(t, "test", "-ops", "2000", "-contexts", "16", cModule(t, name))
			if rc != 0 || !strings.Contains(out, "12 passed, 0 failed") {
				t.Fatalf("rc %d:\n%s\n%s", rc, out, errs)
			}
		})
	}
}

// TestConformanceCatches: each careless guest fails the check that exists
// for its mistake, and only that one (the rest still pass or are skipped
// because the backend is disabled).
func TestConformanceCatches(t *testing.T) {
	careless := cModule(t, filepath.Join(repoRoot(t), "cmd/rmaw/testdata/careless.c"))
	planner := cModule(t, "planner")
	for _, c := range []struct {
		name, module, config, check, why string
	}{
		{"unknown-kind", careless, "kinds=1", "plan-op-hostile", "rmaw_plan_op trapped"},
		{"context-table", careless, "ctxs=1", "many-contexts", "rmaw_ctx_open trapped"},
		{"chatty", careless, "chatty=1", "plan-op-volume", "log lines for 2000 plan_op calls"},
		{"batch", careless, "batch=1", "completions", "rmaw_completions trapped"},
		{"close-status", careless, "status=1", "context", "rmaw_ctx_close returned status -4"},
		{"metrics-labels", careless, "metrics=1", "metrics", `label "rank" is the host's`},
		{"bad-lane", planner, "bad_lane=7", "plan-op-kinds", "lane 1000 outside"},
		{"hang", planner, "hang=2", "context", "exceeded its time budget"},
		{"fail-always-ok", planner, "fail_every=1", "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			rc, out, _ := rmaw(t, "test", "-ops", "2000", "-contexts", "32", "-config", c.config, c.module)
			if c.check == "" { // failing ops on purpose is a policy, not a fault
				if rc != 0 {
					t.Fatalf("rc %d:\n%s", rc, out)
				}
				if !regexp.MustCompile(`plan-op-kinds \(144 ops, 144 failed on purpose`).MatchString(out) {
					t.Fatalf("the deliberate failures are not reported:\n%s", out)
				}
				return
			}
			if rc != 1 {
				t.Fatalf("rc %d, want 1:\n%s", rc, out)
			}
			m := regexp.MustCompile(`(?m)^FAIL ` + regexp.QuoteMeta(c.check) + `: .*` + regexp.QuoteMeta(c.why)).FindString(out)
			if m == "" {
				t.Fatalf("no FAIL %s mentioning %q:\n%s", c.check, c.why, out)
			}
		})
	}
}

func TestConformanceRunFilter(t *testing.T) {
	rc, out, _ := rmaw(t, "test", "-run", "^devices$", cModule(t, "planner"))
	if rc != 0 || !strings.Contains(out, "2 passed, 0 failed") || strings.Contains(out, "many-contexts") {
		t.Fatalf("rc %d:\n%s", rc, out)
	}
	rc, out, _ = rmaw(t, "test", watModule(t, "nomarker", module(map[string]string{"marker": ""})))
	if rc != 1 || !strings.Contains(out, "FAIL load") {
		t.Fatalf("rc %d:\n%s", rc, out)
	}
}

func TestInspect(t *testing.T) {
	rc, out, errs := rmaw(t, "inspect", "-config", "lanes=3", cModule(t, "planner"))
	if rc != 0 {
		t.Fatalf("rc %d:\n%s\n%s", rc, out, errs)
	}
	for _, want := range []string{
		"abi: v1 (this host speaks v1.1)",
		"rmaw_plan_op       (i32, i32, i32, i64, i32, i32) -> (i32) (optional)",
		"rmaw_devices       -                         (optional, absent)",
		"rmaw.log                                 (i32, i32, i32) -> (i32)",
		`"memory": min 2 pages`,
		"guest enables plan_op+completions (0x3)",
		"64 completion records",
		"conn plan     lanes 3,",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out)
		}
	}
	// A module that does not load still shows what it declares.
	rc, out, _ = rmaw(t, "inspect", watModule(t, "v2", module(map[string]string{"marker": `(func (export "rmaw_abi_v2"))`})))
	if rc != 1 || !strings.Contains(out, "abi: v2 (this host speaks v1.1)") || !strings.Contains(out, "load: FAILS") {
		t.Fatalf("rc %d:\n%s", rc, out)
	}
}

func TestBench(t *testing.T) {
	rc, out, errs := rmaw(t, "bench", "-ops", "5000", "-reps", "1", cModule(t, "planner"))
	if rc != 0 {
		t.Fatalf("rc %d:\n%s\n%s", rc, out, errs)
	}
	m := regexp.MustCompile(`message rate vs native +([0-9.]+)x`).FindStringSubmatch(out)
	if m == nil || m[1] == "0.00" || !strings.Contains(out, "plan_op true, completions true") {
		t.Fatalf("no message-rate ratio:\n%s", out)
	}
	// A guest that faults on every op makes bench fail, not report numbers.
	if rc, out, _ := rmaw(t, "bench", "-ops", "100", "-reps", "1", "-config", "trap_every=1", cModule(t, "planner")); rc != 1 {
		t.Fatalf("a trapping guest: rc %d:\n%s", rc, out)
	}
}

// TestNew scaffolds a backend in each language and runs the scaffold's own
// make targets as the tutorial does: build, validate and the conformance kit
// (the rmaw binary, built here: outside the race detector, wazero compiles
// a Go guest in seconds rather than a minute).
func TestNew(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatal("make is required")
	}
	bin := filepath.Join(t.TempDir(), "rmaw")
	build := exec.Command("go", "build", "-o", bin, "./cmd/rmaw")
	build.Dir = repoRoot(t)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building rmaw: %v\n%s", err, out)
	}
	for _, lang := range []string{"c", "go"} {
		t.Run(lang, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "my_"+lang)
			rc, out, errs := rmaw(t, "new", "-lang", lang, "-repo", repoRoot(t), dir)
			if rc != 0 {
				t.Fatalf("rc %d:\n%s\n%s", rc, out, errs)
			}
			cmd := exec.Command("make", "RMAW="+bin, "my_"+lang+".wasm", "validate", "test")
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "GOPROXY=off")
			b, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("make in the scaffold: %v\n%s", err, b)
			}
			for _, want := range []string{"my_" + lang + ".wasm: valid (Guest ABI v1)", "12 passed, 0 failed"} {
				if !strings.Contains(string(b), want) {
					t.Fatalf("make validate test does not say %q:\n%s", want, b)
				}
			}
			if lang == "go" { // the scaffold's own go test runs the conformance kit as a library
				gt := exec.Command("go", "test", "-count=1", "-v", ".")
				gt.Dir = dir
				gt.Env = append(os.Environ(), "GOPROXY=off")
				b, err := gt.CombinedOutput()
				if err != nil || !strings.Contains(string(b), "12 passed, 0 failed") {
					t.Fatalf("go test in the scaffold: %v\n%s", err, b)
				}
			}
			if rc, _, _ := rmaw(t, "new", "-lang", lang, "-repo", repoRoot(t), dir); rc != 1 {
				t.Fatalf("new into a non-empty directory: rc %d, want 1", rc)
			}
		})
	}
	if rc, _, errs := rmaw(t, "new", "-lang", "c", "-repo", t.TempDir(), filepath.Join(t.TempDir(), "x")); rc != 2 || !strings.Contains(errs, "not an rccl-rma-wasm checkout") {
		t.Fatalf("a -repo that is not a checkout: rc %d\n%s", rc, errs)
	}
	if rc, _, _ := rmaw(t, "new", "-lang", "c", filepath.Join(t.TempDir(), "Bad-Name")); rc != 2 {
		t.Fatalf("a bad name: rc %d", rc)
	}
}

// TestBenchE2E: -e2e runs rmabench's two-process message-rate series with
// the module as its per-op hook and reports the ratio against native.
func TestBenchE2E(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "rmabench")
	build := exec.Command("go", "build", "-o", bin, "./cmd/rmabench")
	build.Dir = repoRoot(t)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building rmabench: %v\n%s", err, out)
	}
	rc, out, errs := rmaw(t, "bench", "-ops", "1000", "-reps", "1", "-e2e", "-rmabench", bin, cModule(t, "planner"))
	if rc != 0 {
		t.Fatalf("rc %d:\n%s\n%s", rc, out, errs)
	}
	m := regexp.MustCompile(`message rate vs native, plan_op only +([0-9.]+) x`).FindStringSubmatch(out)
	if m == nil || m[1] == "0" {
		t.Fatalf("no end-to-end ratio:\n%s", out)
	}
	if rc, _, _ := rmaw(t, "bench", "-ops", "100", "-reps", "1", "-e2e", "-rmabench", filepath.Join(t.TempDir(), "none"), cModule(t, "planner")); rc != 1 {
		t.Fatalf("a missing rmabench: rc %d", rc)
	}
}
