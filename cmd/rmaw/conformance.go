package main

// test: the conformance kit (guests/conformance) with the loader flags; the
// kit prints its report, one PASS or FAIL line per check.

import (
	"fmt"
	"regexp"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/guests/conformance"
)

func runTest(e *env, args []string) error {
	fs, lf := e.loadCommand("test")
	pattern := fs.String("run", "", "run only the checks whose name matches this regular expression")
	contexts := fs.Int("contexts", conformance.DefaultContexts, "contexts open at once in many-contexts")
	ops := fs.Int("ops", conformance.DefaultOps, "plan_op calls in plan-op-volume")
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "usage: rmaw test [flags] <mod.wasm>\n\nchecks:\n")
		for _, c := range conformance.Checks() {
			fmt.Fprintf(e.stderr, "  %-20s %s\n", c.Name, c.What)
		}
		fmt.Fprintf(e.stderr, "\nflags:\n")
		fs.PrintDefaults()
	}
	path, err := oneModule(fs, args)
	if err != nil {
		return err
	}
	o := lf.options()
	o.Contexts, o.Ops = *contexts, *ops
	if *pattern != "" {
		if o.Match, err = regexp.Compile(*pattern); err != nil {
			return usageError{fmt.Sprintf("-run: %v", err)}
		}
	}
	if o.Contexts < 1 || o.Contexts > 4096 {
		return usageError{"-contexts must be 1..4096"}
	}
	o.Log = func(level abi.LogLevel, msg string) { e.sink(level, 0, "", 0, msg) }
	if !conformance.Report(e.stdout, path, o).OK() {
		return errFailed
	}
	return nil
}
