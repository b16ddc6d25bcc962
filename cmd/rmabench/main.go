// Command rmabench measures the plugin runtime the way NCCL drives it, between
// two rank processes on this machine, next to raw baselines measured in the
// same run between the same two processes: a TCP stream, process_vm_writev
// and memcpy. It writes results.csv and charts (plots.go) and prints a table with
// ratios against the targets. Benchmarks report numbers; nothing here asserts
// a timing.
//
//	go run ./cmd/rmabench [-quick] [-out build/bench] [-guests build/guests]
//
// The launcher re-executes itself as two ranks (-role rank) joined by a
// socketpair for the bootstrap (handles, barriers, acknowledgements), and as
// short-lived processes (-role cold) for the cold-start measurement.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/plugin"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/sandbox"
)

type options struct {
	quick     bool
	reps      int
	out       string
	guests    string
	guestsAbs string
	cacheDir  string
	timeout   time.Duration
	spin      int
	coldRuns  int
	series    string // comma list of bw, rate, ping, cold, compress, fabric; empty: all
	// fiProvider is the libfabric provider of the fabric series.
	fiProvider string
	fabricPair bool // this rank pair runs the fabric series alone

	repBytes, minOps, maxOps uint64
	msgOps, pingIters        uint64
	rateRounds               int // message-rate measurements per repetition

	role, result, backend string
	rank                  int
}

var sizes = []uint64{8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20}

// runs reports whether series name is selected by -series.
func (o *options) runs(name string) bool {
	if o.series == "" {
		return true
	}
	for _, s := range strings.Split(o.series, ",") {
		if strings.TrimSpace(s) == name {
			return true
		}
	}
	return false
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "rmabench: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	var o options
	flag.BoolVar(&o.quick, "quick", false, "shorter run: fewer repetitions and operations")
	flag.IntVar(&o.reps, "reps", 0, "repetitions per point (default 7, -quick 3)")
	flag.StringVar(&o.out, "out", "build/bench", "output directory (results.csv, *.svg charts)")
	flag.StringVar(&o.guests, "guests", "build/guests", "directory of guest modules (planner.wasm, passthrough-go.wasm)")
	flag.DurationVar(&o.timeout, "timeout", 8*time.Minute, "kill the rank processes after this long")
	flag.IntVar(&o.spin, "spin", 64, "busy checks of a signal word before each wait starts yielding the CPU")
	flag.StringVar(&yieldMode, "yield", "both", "what a waiting loop does between checks: os (sched_yield), go (runtime.Gosched), both, none")
	flag.IntVar(&o.coldRuns, "cold-runs", 0, "warm-cache cold-start runs per backend (default 5, -quick 3)")
	flag.StringVar(&o.series, "series", "", "run only these series, a comma list of bw, rate, ping, cold, compress, fabric (default all)")
	flag.StringVar(&o.fiProvider, "fi-provider", "tcp;ofi_rxm", "libfabric provider of the fabric series (the plugin's NCCL_RMA_WASM_FI_PROVIDER and the raw baselines')")
	flag.BoolVar(&o.fabricPair, "fabric-pair", false, "internal: this rank pair runs only the fabric series")
	flag.StringVar(&o.role, "role", "", "internal: rank | cold")
	flag.IntVar(&o.rank, "rank", 0, "internal: rank of a -role rank process")
	flag.StringVar(&o.result, "result", "", "internal: where rank 0 writes its samples")
	flag.StringVar(&o.backend, "backend", "", "internal: backend of a -role cold process")
	flag.Parse()
	comms[commFabric].provider = o.fiProvider

	if o.reps <= 0 {
		o.reps = 7
		if o.quick {
			o.reps = 3
		}
	}
	if o.coldRuns <= 0 {
		o.coldRuns = 5
		if o.quick {
			o.coldRuns = 3
		}
	}
	o.repBytes, o.minOps, o.maxOps, o.msgOps, o.pingIters, o.rateRounds = 512<<20, 8, 100000, 200000, 5000, 2
	if o.quick {
		o.repBytes, o.minOps, o.maxOps, o.msgOps, o.pingIters, o.rateRounds = 128<<20, 2, 20000, 50000, 1000, 3
	}
	var err error
	if o.guestsAbs, err = filepath.Abs(o.guests); err != nil {
		fatalf("%v", err)
	}
	if o.cacheDir == "" {
		abs, _ := filepath.Abs(o.out)
		o.cacheDir = filepath.Join(abs, "wasm-cache")
	}
	if o.role != "" {
		plugin.RegisterGuestLoader(func(name string) (backend.Backend, error) {
			so := sandbox.OptionsFromEnv()
			so.Name = name
			return sandbox.Open(so)
		})
		logx.SetSink(logSink)
	}
	switch o.role {
	case "":
		launch(&o)
	case "rank":
		runRank(&o)
	case "cold":
		runCold(&o)
	default:
		fatalf("unknown -role %q", o.role)
	}
}

// logSink prints the runtime's warnings and keeps lines that say which
// transport a communicator uses.
var transportLines []string

// fabricLines are the runtime's "reaches N ranks over libfabric provider"
// lines: proof that plugin-fabric really uses libfabric.
var fabricLines []string

func logSink(level abi.LogLevel, subsys uint64, file string, line int, msg string) {
	if level == abi.LogWarn {
		fmt.Fprintf(os.Stderr, "rmabench: runtime WARN: %s\n", msg)
	}
	if os.Getenv("RMABENCH_VERBOSE") != "" {
		fmt.Fprintf(os.Stderr, "rmabench: runtime %d: %s\n", level, msg)
	}
	l := strings.ToLower(msg)
	if strings.Contains(l, "over libfabric provider") {
		fabricLines = append(fabricLines, msg)
	}
	if (strings.Contains(l, "intra") || strings.Contains(l, "process_vm") || strings.Contains(l, "transport")) && len(transportLines) < 32 {
		transportLines = append(transportLines, msg)
	}
}

// ---------------------------------------------------------------- launcher

func launch(o *options) {
	start := time.Now()
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		fatalf("%v", err)
	}
	notes := ensureGuests(o)
	self, err := os.Executable()
	if err != nil {
		fatalf("%v", err)
	}
	common := []string{"-out", o.out, "-guests", o.guests, "-reps", fmt.Sprint(o.reps), "-spin", fmt.Sprint(o.spin), "-yield", yieldMode, "-series", o.series, "-fi-provider", o.fiProvider}
	if o.quick {
		common = append(common, "-quick")
	}

	// Cold start: fresh processes, 1-rank communicator, init -> first completed put.
	fmt.Fprintf(os.Stderr, "rmabench: cold start (fresh processes)\n")
	var samples []Sample
	for _, b := range []struct{ name, backend string }{{"native", "native"}, {"default", "default"}, {"go-sdk", "passthrough-go"}} {
		if !o.runs("cold") {
			break
		}
		if b.backend == "passthrough-go" && !exists(filepath.Join(o.guests, "passthrough-go.wasm")) {
			notes = append(notes, "cold start go-sdk: "+filepath.Join(o.guests, "passthrough-go.wasm")+" is missing; skipped")
			continue
		}
		os.RemoveAll(o.cacheDir) // the first run compiles with an empty cache
		var warm []coldResult
		for i := 0; i <= o.coldRuns; i++ {
			cmd := exec.Command(self, append([]string{"-role", "cold", "-backend", b.backend}, common...)...)
			cmd.Stderr = os.Stderr
			out, err := cmd.Output()
			if err != nil {
				notes = append(notes, fmt.Sprintf("cold start %s run %d failed: %v", b.name, i, err))
				break
			}
			var cr coldResult
			if err := json.Unmarshal(bytes.TrimSpace(out), &cr); err != nil {
				notes = append(notes, fmt.Sprintf("cold start %s: bad output %q", b.name, out))
				break
			}
			if i == 0 && b.backend != "native" {
				samples = append(samples, cr.samples(b.name+"-cold-cache")...)
				continue
			}
			warm = append(warm, cr)
		}
		samples = append(samples, mergeCold(b.name, warm)...)
	}

	// The two ranks; then, for the fabric series, a second pair: libfabric's
	// transport choice is made once per process (nics.Select), so the
	// plugin-fabric communicator cannot share a process with the TCP ones.
	var failed []string
	if o.series != "fabric" {
		rr, f := runPair(o, self, common, "rank0.json", false)
		samples = append(samples, rr.Samples...)
		notes = append(notes, rr.Notes...)
		failed = append(failed, f...)
	}
	if o.runs("fabric") {
		fmt.Fprintf(os.Stderr, "rmabench: libfabric series (provider %s), a second pair of ranks\n", o.fiProvider)
		rr, f := runPair(o, self, common, "rank0-fabric.json", true)
		samples = append(samples, rr.Samples...)
		notes = append(notes, rr.Notes...)
		failed = append(failed, f...)
	}
	for _, f := range failed {
		notes = append(notes, "FAILED: "+f)
	}
	rep := newReport(o, samples, notes)
	rep.elapsed = time.Since(start)
	if err := rep.write(); err != nil {
		fatalf("%v", err)
	}
	rep.print(os.Stdout)
	if len(failed) > 0 {
		os.Exit(1)
	}
}

// runPair runs the two rank processes (the fabric pair when fabricPair)
// and returns rank 0's samples and notes, and what failed.
func runPair(o *options, self string, common []string, result string, fabricPair bool) (rankResult, []string) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		fatalf("socketpair: %v", err)
	}
	resultPath := filepath.Join(o.out, result)
	os.Remove(resultPath)
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	var cmds []*exec.Cmd
	for rank := 0; rank < 2; rank++ {
		args := append([]string{"-role", "rank", "-rank", fmt.Sprint(rank), "-result", resultPath, fmt.Sprintf("-fabric-pair=%v", fabricPair)}, common...)
		if fabricPair {
			// That pair holds only plugin-fabric: the other series have
			// no communicator there (the last -series given wins).
			args = append(args, "-series", "fabric")
		}
		cmd := exec.CommandContext(ctx, self, args...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		cmd.ExtraFiles = []*os.File{os.NewFile(uintptr(fds[rank]), fmt.Sprintf("bootstrap%d", rank))}
		if err := cmd.Start(); err != nil {
			fatalf("start rank %d: %v", rank, err)
		}
		cmd.ExtraFiles[0].Close()
		cmds = append(cmds, cmd)
	}
	var failed []string
	for rank, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			failed = append(failed, fmt.Sprintf("rank %d: %v", rank, err))
		}
	}
	if ctx.Err() != nil {
		failed = append(failed, fmt.Sprintf("killed after -timeout %v", o.timeout))
	}
	var rr rankResult
	if b, err := os.ReadFile(resultPath); err != nil {
		failed = append(failed, fmt.Sprintf("no results from rank 0: %v", err))
	} else if err := json.Unmarshal(b, &rr); err != nil {
		failed = append(failed, fmt.Sprintf("results of rank 0: %v", err))
	}
	return rr, failed
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// ensureGuests builds guest modules the bench needs when they are missing.
func ensureGuests(o *options) []string {
	var notes []string
	for _, f := range []string{"planner.wasm", "passthrough-go.wasm", "plan11.wasm"} {
		p := filepath.Join(o.guests, f)
		if exists(p) {
			continue
		}
		fmt.Fprintf(os.Stderr, "rmabench: %s is missing; building it with guests/guests.mk\n", p)
		cmd := exec.Command("make", "-f", "guests/guests.mk", "GUEST_OUT="+o.guests, p)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			notes = append(notes, fmt.Sprintf("could not build %s (%v); measurements that need it are skipped", p, err))
		}
	}
	return notes
}

// ---------------------------------------------------------------- ranks

type rankResult struct {
	Samples []Sample
	Notes   []string
}

func runRank(o *options) {
	f := os.NewFile(3, "bootstrap")
	c, err := netFileConn(f)
	if err != nil {
		fatalf("rank %d: bootstrap: %v", o.rank, err)
	}
	r := newRank(o.rank, o, &ctl{c: c})
	if o.rank == 1 {
		if err := r.serve(); err != nil {
			fatalf("rank 1: %v", err)
		}
		return
	}
	res, err := r.drive()
	if err != nil {
		res.Notes = append(res.Notes, "FAILED: rank 0: "+err.Error())
		fmt.Fprintf(os.Stderr, "rmabench: rank 0: %v\n", err)
	}
	b, _ := json.Marshal(res)
	if werr := os.WriteFile(o.result, b, 0o644); werr != nil {
		fatalf("%v", werr)
	}
	if err != nil {
		os.Exit(1)
	}
}
