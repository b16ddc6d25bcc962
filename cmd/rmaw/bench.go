package main

// bench: the per-op cost a backend adds, measured in this process through
// the plugin's own loader: for every operation the runtime calls PlanOp
// (when the guest enabled it) and hands completion records over in batches
// (when it asked for them). The same loop runs on backend.Native. The
// end-to-end figures between two processes come from `make bench`.

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/guests/conformance"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
)

// nativeOpNs is the native data path's cost of one 8-byte put on the
// reference machine (BENCH.md: 1.61 Mops/s); -op-ns overrides it.
const nativeOpNs = 620

func runBench(e *env, args []string) error {
	fs, lf := e.loadCommand("bench")
	ops := fs.Int("ops", 200000, "operations per repetition")
	reps := fs.Int("reps", 5, "repetitions (the median is reported)")
	batch := fs.Int("batch", 64, "completion records per batch")
	opNs := fs.Float64("op-ns", nativeOpNs, "native data-path cost of one 8-byte put, ns (make bench measures it)")
	size := fs.Uint64("size", 8, "bytes per operation")
	e2e := fs.Bool("e2e", false, "also run the two-process message-rate benchmark (build/rmabench -series rate) with this module as its per-op-hook backend")
	rmabench := fs.String("rmabench", "", "the rmabench binary for -e2e (default: build/rmabench of the checkout)")
	path, err := oneModule(fs, args)
	if err != nil {
		return err
	}
	if *ops < 1 || *reps < 1 || *batch < 1 || *opNs <= 0 {
		return usageError{"-ops, -reps, -batch and -op-ns must be positive"}
	}
	b, err := lf.open(path)
	if err != nil {
		fmt.Fprintf(e.stdout, "FAIL load: %v\n     fix: %s\n", err, conformance.Hint(err))
		return errFailed
	}
	defer b.Close()
	info := backend.ContextInfo{CommID: 1, NRanks: 2, Rank: 0, Contexts: 1}
	gc, err := b.NewContext(info)
	if err != nil {
		return fmt.Errorf("context: %w", err)
	}
	defer gc.Close()
	nc, _ := backend.Native{}.NewContext(info)
	bo := benchOpts{ops: *ops, reps: *reps, batch: *batch, size: *size}
	nat, err := bo.measure(nc)
	if err != nil {
		return err
	}
	mod, err := bo.measure(gc)
	if err != nil {
		return fmt.Errorf("%s: %w", b.Name(), err)
	}
	extra := max(mod-nat, 0)
	ratio := *opNs / (*opNs + extra)
	w := e.stdout
	fmt.Fprintf(w, "backend %s: plan_op %v, completions %v (batches of %d), %d-byte ops, %d ops x %d reps, medians\n",
		b.Name(), gc.PlansOps(), gc.WantsCompletions(), *batch, *size, *ops, *reps)
	fmt.Fprintf(w, "  %-22s %8.1f ns/op  %8.2f Mops/s (policy path only)\n", "native", nat, 1e3/nat)
	fmt.Fprintf(w, "  %-22s %8.1f ns/op  %8.2f Mops/s (policy path only)\n", b.Name(), mod, 1e3/mod)
	fmt.Fprintf(w, "  added per op           %8.1f ns\n", extra)
	fmt.Fprintf(w, "  message rate vs native %8.2fx  (estimated: native data path %.0f ns/op, -op-ns; the end-to-end figure is make bench)\n", ratio, *opNs)
	if inf := b.Info(); inf.Faults != 0 {
		fmt.Fprintf(w, "  faults: %d\n", inf.Faults)
		return errFailed
	}
	if *e2e {
		return benchE2E(e, path, *rmabench, lf.config)
	}
	return nil
}

// benchE2E runs rmabench's message-rate series between two processes with
// the module in place of the planner (its per-op-hook series): rmabench
// loads "planner" from its -guests directory, so a temporary directory
// holds the module under that name.
func benchE2E(e *env, path, bin, config string) error {
	if bin == "" {
		root := findRepo()
		if root == "" {
			return usageError{"-e2e: no rccl-rma-wasm checkout found for build/rmabench: pass -rmabench"}
		}
		bin = filepath.Join(root, "build", "rmabench")
	}
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("-e2e needs %s (make bench-build builds it): %w", bin, err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "rmaw-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	guests := filepath.Join(dir, "guests")
	if err := os.MkdirAll(guests, 0o755); err != nil {
		return err
	}
	if err := os.Symlink(abs, filepath.Join(guests, "planner.wasm")); err != nil {
		return err
	}
	if config != "" { // rmabench hands the planner its own configuration; a .conf is read only when that is empty
		fmt.Fprintf(e.stderr, "rmaw bench: -e2e: rmabench configures its per-op-hook series itself; -config is not passed\n")
	}
	out := filepath.Join(dir, "out")
	cmd := exec.Command(bin, "-quick", "-series", "rate", "-out", out, "-guests", guests)
	cmd.Stderr = e.stderr
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	fmt.Fprintf(e.stdout, "end to end: %s -quick -series rate (two processes on this host, the module as the per-op hook)\n", bin)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("rmabench: %w\n%s", err, stdout.String())
	}
	csv, err := os.ReadFile(filepath.Join(out, "results.csv"))
	if err != nil {
		return err
	}
	found := false
	for _, line := range strings.Split(string(csv), "\n") {
		f := strings.Split(line, ",")
		if len(f) != 6 {
			continue
		}
		label := map[string]string{
			"msg_rate/native":                         "native",
			"msg_rate/planner":                        "this module, plan_op only",
			"msg_rate/planner+telemetry":              "this module, plan_op and completions",
			"ratio_msg_rate/planner/native":           "message rate vs native, plan_op only",
			"ratio_msg_rate/planner+telemetry/native": "message rate vs native, with completions",
		}[f[0]+"/"+f[1]]
		if label == "" || f[2] != "8" {
			continue
		}
		found = true
		unit := f[4]
		if unit == "x" {
			fmt.Fprintf(e.stdout, "  %-42s %8s x (median of %s repetitions)\n", label, f[3], f[5])
		} else {
			fmt.Fprintf(e.stdout, "  %-42s %8s %s\n", label, f[3], unit)
		}
	}
	if !found {
		return fmt.Errorf("rmabench reported no message rate for the module:\n%s", stdout.String())
	}
	return nil
}

type benchOpts struct {
	ops, reps, batch int
	size             uint64
}

// measure returns the median ns per op of the runtime's policy calls on c.
func (o benchOpts) measure(c backend.Context) (float64, error) {
	comps := make([]backend.Completion, 0, o.batch)
	op := backend.Op{Kind: backend.OpPut, Peer: 1, Size: o.size}
	var plan backend.OpPlan
	res := make([]float64, 0, o.reps)
	for r := 0; r < o.reps+1; r++ { // the first repetition warms up
		start := time.Now()
		for i := 0; i < o.ops; i++ {
			plan = backend.OpPlan{Lane: -1}
			op.Peer = uint32(i & 1)
			if c.PlansOps() {
				if err := c.PlanOp(&op, &plan); err != nil {
					return 0, fmt.Errorf("op %d: %w", i, err)
				}
			}
			if c.WantsCompletions() {
				comps = append(comps, backend.Completion{Kind: op.Kind, Peer: op.Peer, Size: op.Size, Status: plan.Status, Latency: 5000})
				if len(comps) == o.batch {
					if err := c.Completions(comps); err != nil {
						return 0, fmt.Errorf("completions: %w", err)
					}
					comps = comps[:0]
				}
			}
		}
		if r > 0 {
			res = append(res, float64(time.Since(start).Nanoseconds())/float64(o.ops))
		}
	}
	sort.Float64s(res)
	return res[len(res)/2], nil
}
