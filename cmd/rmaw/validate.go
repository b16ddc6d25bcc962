package main

// validate: load the module with host/sandbox exactly as the plugin does
// (meter, compile, check exports/imports/memory, _initialize, rmaw_init,
// features, descriptor area, rmaw_devices), then open a context and ask for
// a connection plan. The first rule broken is reported with what to fix.

import (
	"flag"
	"fmt"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/guests/conformance"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/sandbox"
)

// loadFlags are the flags of every command that loads a module.
type loadFlags struct {
	config  string
	memMiB  uint
	timeout time.Duration
}

func (l *loadFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&l.config, "config", "", "configuration string handed to the guest (default: <module>.conf beside it)")
	fs.UintVar(&l.memMiB, "memory-mb", sandbox.DefaultMemoryLimitMiB, "linear memory cap per instance (NCCL_RMA_WASM_GUEST_MEMORY_MB)")
	fs.DurationVar(&l.timeout, "timeout", sandbox.DefaultCallTimeout, "control-plane call budget (NCCL_RMA_WASM_GUEST_TIMEOUT_MS); plan_op gets 1/100")
}

// loadCommand returns the flags of a command that loads a module: e.flags
// with the loader flags registered.
func (e *env) loadCommand(name string) (*flag.FlagSet, *loadFlags) {
	fs := e.flags(name)
	lf := new(loadFlags)
	lf.register(fs)
	return fs, lf
}

// options are the kit's load options from the flags.
func (l *loadFlags) options() conformance.Options {
	return conformance.Options{Config: l.config, MemoryLimitMiB: uint32(l.memMiB), CallTimeout: l.timeout}
}

// open loads path with the plugin's loader (conformance.Open: the
// compilation cache is off so that nothing is written outside the module's
// directory).
func (l *loadFlags) open(path string) (*sandbox.Backend, error) {
	return conformance.Open(path, l.options())
}

func runValidate(e *env, args []string) error {
	fs, lf := e.loadCommand("validate")
	path, err := oneModule(fs, args)
	if err != nil {
		return err
	}
	if !validate(e, lf, path) {
		return errFailed
	}
	return nil
}

// validate prints one line per stage and reports whether all passed.
func validate(e *env, lf *loadFlags, path string) bool {
	fail := func(stage string, err error) bool {
		fmt.Fprintf(e.stdout, "FAIL %s: %v\n     fix: %s\n", stage, err, conformance.Hint(err))
		fmt.Fprintf(e.stdout, "%s: INVALID\n", path)
		return false
	}
	b, err := lf.open(path)
	if err != nil {
		return fail("load", err)
	}
	defer b.Close()
	inf := b.Info()
	fmt.Fprintf(e.stdout, "ok   load: marker %s, exports and imports, memory, rmaw_init (features %s), descriptor area at %#x (%d completion records), %d device(s)\n",
		guestabi.Marker, conformance.FeatureNames(inf.Features), inf.Area, inf.CompCap, len(b.Devices()))
	c, err := b.NewContext(backend.ContextInfo{CommID: 1, NRanks: 2, Rank: 0, Contexts: 1})
	if err != nil {
		return fail("context", err)
	}
	if err := c.Close(); err != nil {
		return fail("context close", err)
	}
	fmt.Fprintf(e.stdout, "ok   context: a second instance initialises, opens and closes a context\n")
	if _, err := b.ConnectionPlan(2, 0); err != nil {
		return fail("connection plan", err)
	}
	fmt.Fprintf(e.stdout, "ok   connection plan: accepted for 2 ranks\n")
	for _, w := range lint(inf) {
		fmt.Fprintf(e.stdout, "note %s\n", w)
	}
	fmt.Fprintf(e.stdout, "%s: valid (Guest ABI v%d)\n", path, guestabi.Version)
	return true
}

// lint lists things that are legal but probably not what the author meant.
func lint(inf sandbox.Info) []string {
	has := map[string]bool{}
	for _, x := range inf.Exports {
		has[x] = true
	}
	var out []string
	if has[guestabi.ExportInitialize] {
		return nil // an SDK with a runtime (Go) exports every hook and forwards what exists
	}
	if has[guestabi.ExportPlanOp] && inf.Features&guestabi.FeaturePlanOp == 0 {
		out = append(out, "rmaw_plan_op is exported but rmaw_init does not enable RMAW_FEATURE_PLAN_OP: it is never called")
	}
	if has[guestabi.ExportCompletions] && inf.Features&guestabi.FeatureCompletions == 0 {
		out = append(out, "rmaw_completions is exported but rmaw_init does not enable RMAW_FEATURE_COMPLETIONS: it is never called")
	}
	return out
}
