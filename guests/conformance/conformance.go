// Package conformance is the guests' conformance kit, in the manner of
// http-wasm's tck: it drives a backend module through the Guest ABI
// contract (SPEC.md §8) with host/sandbox, the plugin's own loader,
// including inputs a careless guest trips over, and reports pass or fail
// per check. A check fails when the sandbox sees a fault (a trap, a
// nonsense answer, a budget overrun), when a call the host expects to
// succeed returns an error status, or when the backend ends up disabled.
//
// A backend's own Go test calls Run:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, "mybackend.wasm", conformance.Options{})
//	}
//
// `rmaw test` is Report with its command-line flags. The kit installs a
// process-wide log sink (host/logx) while it runs, so run one kit at a time.
package conformance

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/sandbox"
)

// Defaults of Options.Contexts and Options.Ops.
const (
	DefaultContexts = 64
	DefaultOps      = 20000
)

// Options tune a run; the zero value runs every check with the plugin's
// defaults.
type Options struct {
	// Config is the configuration string handed to the guest; when empty,
	// <module>.conf beside the module is used if it exists (as the plugin does).
	Config string
	// MemoryLimitMiB caps each instance's linear memory (0: the plugin's
	// default, sandbox.DefaultMemoryLimitMiB).
	MemoryLimitMiB uint32
	// CallTimeout is the control-plane call budget; plan_op gets 1/100 of it
	// (0: sandbox.DefaultCallTimeout).
	CallTimeout time.Duration
	// Contexts open at once in many-contexts (0: DefaultContexts).
	Contexts int
	// Ops is the number of plan_op calls in plan-op-volume (0: DefaultOps).
	Ops int
	// Match, if set, runs only the checks whose name it matches (the load
	// always runs).
	Match *regexp.Regexp
	// Log, if set, receives every plugin log line (the guest's included)
	// while the kit runs.
	Log func(level abi.LogLevel, msg string)
}

func (o Options) withDefaults() Options {
	if o.MemoryLimitMiB == 0 {
		o.MemoryLimitMiB = sandbox.DefaultMemoryLimitMiB
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = sandbox.DefaultCallTimeout
	}
	if o.Contexts <= 0 {
		o.Contexts = DefaultContexts
	}
	if o.Ops <= 0 {
		o.Ops = DefaultOps
	}
	return o
}

// Check names one check of the kit and says what it drives.
type Check struct {
	Name string
	What string
}

// Checks lists the kit's checks in the order they run (after the load).
func Checks() []Check {
	out := make([]Check, len(checks))
	for i, c := range checks {
		out[i] = Check{c.name, c.what}
	}
	return out
}

// Result is the outcome of the load ("load") or of one check.
type Result struct {
	Check  string
	Detail string // what a passing check saw; may be empty
	Err    error  // nil: passed
	Fix    string // for a failure: what to change (Hint of Err)
	// Disabled: after this failure the backend is disabled and the
	// remaining checks are skipped.
	Disabled bool
}

// Passed reports whether the check passed.
func (r Result) Passed() bool { return r.Err == nil }

// Summary counts the results of a run; the load counts as one.
type Summary struct {
	Passed, Failed int
}

// OK reports whether every check that ran passed.
func (s Summary) OK() bool { return s.Failed == 0 }

// Open loads module (a .wasm path) with the plugin's loader as the kit
// does; the compilation cache is off so that nothing is written outside
// the module's directory. rmaw validate, inspect and bench load with it.
func Open(module string, o Options) (*sandbox.Backend, error) {
	o = o.withDefaults()
	abs, err := filepath.Abs(module)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(abs); err != nil {
		return nil, err
	}
	b, err := sandbox.Open(sandbox.Options{Name: abs, Config: o.Config, CacheDir: "off",
		MemoryLimitMiB: o.MemoryLimitMiB, CallTimeout: o.CallTimeout})
	if err != nil {
		return nil, err
	}
	return b.(*sandbox.Backend), nil
}

// Execute runs the kit on module and hands each result to report as soon
// as it is known: the load first, then each check.
func Execute(module string, o Options, report func(Result)) Summary {
	o = o.withDefaults()
	k := &kit{o: o, path: module}
	logx.SetSink(k.sink)
	defer logx.SetSink(nil)
	return k.run(report)
}

// Report runs the kit and writes rmaw test's report to w: one PASS or
// FAIL line per check (a failure followed by what to fix) and a count.
func Report(w io.Writer, module string, o Options) Summary {
	s := Execute(module, o, func(r Result) { fmt.Fprint(w, r.line()) })
	fmt.Fprintf(w, "%d passed, %d failed\n", s.Passed, s.Failed)
	return s
}

// T is the part of testing.TB that Run uses (*testing.T satisfies it).
type T interface {
	Helper()
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
}

// Run runs the kit as part of a Go test: a passing check is logged, a
// failing one is an error of t with what to fix. WARN lines of the plugin
// are logged too unless o.Log takes them.
func Run(t T, module string, o Options) Summary {
	t.Helper()
	if o.Log == nil {
		o.Log = func(level abi.LogLevel, msg string) {
			if level == abi.LogWarn {
				t.Logf("log: %s", msg)
			}
		}
	}
	var rs []Result
	s := Execute(module, o, func(r Result) { rs = append(rs, r) })
	for _, r := range rs {
		if r.Passed() {
			t.Logf("%s", r.line())
		} else {
			t.Errorf("%s", r.line())
		}
	}
	t.Logf("%d passed, %d failed", s.Passed, s.Failed)
	return s
}

// line is the result as rmaw test prints it.
func (r Result) line() string {
	if r.Err != nil {
		s := fmt.Sprintf("FAIL %s: %v\n     fix: %s\n", r.Check, r.Err, r.Fix)
		if r.Disabled {
			s += "     the backend is disabled now; the remaining checks are skipped\n"
		}
		return s
	}
	if r.Detail != "" {
		return fmt.Sprintf("PASS %s (%s)\n", r.Check, r.Detail)
	}
	return fmt.Sprintf("PASS %s\n", r.Check)
}

// kit is one run's state.
type kit struct {
	o    Options
	path string
	b    *sandbox.Backend

	logMu sync.Mutex
	logs  []string // plugin log lines (guest output included) since the last takeLogs
}

func (k *kit) sink(level abi.LogLevel, _ uint64, _ string, _ int, msg string) {
	k.logMu.Lock()
	if len(k.logs) < 4096 {
		k.logs = append(k.logs, msg)
	}
	k.logMu.Unlock()
	if k.o.Log != nil {
		k.o.Log(level, msg)
	}
}

// takeLogs returns and clears the lines logged so far.
func (k *kit) takeLogs() []string {
	k.logMu.Lock()
	defer k.logMu.Unlock()
	l := k.logs
	k.logs = nil
	return l
}

func (k *kit) run(report func(Result)) Summary {
	var s Summary
	b, err := Open(k.path, k.o)
	if err != nil {
		s.Failed++
		report(Result{Check: "load", Err: err, Fix: Hint(err)})
		return s
	}
	k.b = b
	defer b.Close()
	s.Passed++
	report(Result{Check: "load", Detail: "features " + FeatureNames(b.Info().Features)})
	for _, c := range checks {
		if k.o.Match != nil && !k.o.Match.MatchString(c.name) {
			continue
		}
		k.takeLogs()
		before := b.Info().Faults
		detail, err := c.run(k)
		if err == nil && b.Info().Faults != before {
			err = fmt.Errorf("the sandbox counted %d fault(s) (see the log lines above)", b.Info().Faults-before)
		}
		if err != nil {
			s.Failed++
			r := Result{Check: c.name, Err: err, Fix: Hint(err), Disabled: b.Disabled()}
			report(r)
			if r.Disabled {
				break
			}
			continue
		}
		s.Passed++
		report(Result{Check: c.name, Detail: detail})
	}
	return s
}
