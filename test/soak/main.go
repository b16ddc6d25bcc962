// Command soak compresses hours of churn into minutes (make soak; not run
// in CI): it runs the C harness (build/rma_driver, every rank a process
// over real sockets, every byte and signal verified) over and over with a
// random shape each time — ranks, sizes, rounds, threads, lanes, transport,
// backend, init..finalize cycles per process, and two communicators at
// once — and injects a random fault into most runs: a rank killed in the
// middle of large puts, gets or a signal storm, a rank stopped for good (a
// short peer timeout fails it) or stopped and resumed, every connection of
// a rank reset, descriptors cut short, or a planning guest that fails or
// traps every Nth operation. A killed or stopped rank's communicator is
// replaced by the next run's fresh processes, as NCCL replaces an aborted
// communicator.
//
// Each run must end in its expected outcome: a PASS, or, for a guest that
// fails operations (or descriptors that run out after setup, the WARN
// naming it), a clean failure (an operation's error code); never a
// crash, a hang, a wrong byte or a missed fault. It prints the totals.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

type run struct {
	args   []string
	env    []string
	fault  string // "" for none
	guest  bool   // the guest fails or traps: a clean failure is expected
	ranks  int
	cycles int
	fabric string // the libfabric provider the run asked for ("" none)
}

type totals struct {
	mu                           sync.Mutex
	runs, passed, cleanFail, bad int
	faults                       map[string]int
	fabric                       map[string]int // runs per libfabric provider
	ops                          uint64
	bytes                        float64 // MiB verified
	comms                        int
}

var (
	moved   = regexp.MustCompile(`\] PASS cycles=(\d+) ops=(\d+) moved=([0-9.]+) MiB`)
	cleanRe = regexp.MustCompile(`RESULT FAIL rank \d+: (cycle \d+ iter \d+ thread \d+: )?(test\(.*\)|iput|iget|iputSignal.*) (returned|to rank \d+ returned) \d+ \((ncclInvalidArgument|ncclRemoteError|ncclInternalError|ncclSystemError|ncclInvalidUsage)\)`)
	badRe   = regexp.MustCompile(`died with signal|is wrong|hung|global timeout|watchdog expired|exceeds the expected|fatal error|panic`)
)

func pick[T any](r *rand.Rand, xs ...T) T { return xs[r.IntN(len(xs))] }

func shape(r *rand.Rand, guests string) run {
	ranks := 2 + r.IntN(4)
	size := pick(r, "4k", "64k", "256k", "1m", "4m", "8m")
	x := run{ranks: ranks, cycles: 1}
	x.args = []string{"--ranks", fmt.Sprint(ranks), "--size", size, "--iters", fmt.Sprint(1 + r.IntN(4)),
		"--threads", fmt.Sprint(1 + r.IntN(3)), "--version", pick(r, "14", "15", "16"), "--timeout", "60"}
	lanes := pick(r, "1", "2", "4")
	x.env = []string{"NCCL_RMA_WASM_ADDR=127.0.0.1", "NCCL_RMA_WASM_INTRANODE=" + pick(r, "0", "1"),
		"NCCL_RMA_WASM_LANES=" + lanes}
	// The planner answers lanes of its own configuration (4 unless told):
	// it must agree with NCCL_RMA_WASM_LANES, or every op fails as planned
	// on a lane outside the connection.
	planner := "NCCL_RMA_WASM_CONFIG=lanes=" + lanes
	// A third of the runs go over the libfabric transport (where the
	// library is missing the plugin says so and uses TCP): the same
	// shapes and faults, with loopback-only tcp or shm.
	if r.IntN(3) == 0 {
		x.fabric = pick(r, "tcp;ofi_rxm", "shm") // its variables follow the fault
	}
	if guests != "" {
		x.env = append(x.env, "NCCL_RMA_WASM_DIR="+guests)
		b := pick(r, "default", "native", "planner", "passthrough-go")
		x.env = append(x.env, "NCCL_RMA_WASM_BACKEND="+b)
		if b == "planner" {
			x.env = append(x.env, planner)
		}
	}
	victim := fmt.Sprint(r.IntN(ranks))
	switch f := r.IntN(12); {
	case f < 3:
		x.fault = pick(r, "kill-put", "kill-get", "kill-signal")
	case f == 3:
		x.fault = "reset"
	case f == 4:
		x.fault = "stop"
		x.env = append(x.env, "NCCL_RMA_WASM_PEER_TIMEOUT_MS=1500")
	case f == 5:
		x.fault = "stop-cont"
		x.args = append(x.args, "--stop-ms", fmt.Sprint(200+r.IntN(1500)))
	case f == 6 && guests != "":
		x.fault, x.guest = "guest", true
		x.env = append(x.env, "NCCL_RMA_WASM_BACKEND=planner",
			planner+", "+pick(r, "fail_every=", "trap_every=")+fmt.Sprint(2+r.IntN(30)))
	case f == 7:
		x.fault = "nofile"
		x.args = append(x.args, "--nofile", fmt.Sprint(8+r.IntN(24)))
		x.env = append(x.env, "NCCL_RMA_WASM_CONNECT_TIMEOUT_MS=5000")
	case f == 8:
		x.cycles = 2 + r.IntN(10)
		x.args = append(x.args, "--cycles", fmt.Sprint(x.cycles))
	}
	// libfabric 1.17's shm cannot survive a peer killed or stopped for
	// good in mid-traffic: its senders spin on a lock in the dead peer's
	// shared region (SPEC.md §4, "Dead shm peers"). Those faults run over
	// tcp;ofi_rxm; shm gets the rest.
	if x.fabric == "shm" && (strings.HasPrefix(x.fault, "kill-") || x.fault == "stop") {
		x.fabric = "tcp;ofi_rxm"
	}
	if x.fabric != "" {
		x.env = append(x.env, "NCCL_RMA_WASM_TRANSPORT=fabric", "NCCL_RMA_WASM_FI_PROVIDER="+x.fabric, "FI_TCP_IFACE=lo")
	}
	if x.fault != "" && x.fault != "guest" && x.fault != "nofile" {
		if x.fault == "stop-cont" {
			x.args = append(x.args, "--iters", "3")
		}
		x.args = append(x.args, "--scenario", "fault", "--fault", x.fault, "--kill-rank", victim,
			"--fault-delay-ms", fmt.Sprint(50+r.IntN(500)))
	}
	return x
}

func main() {
	dur := flag.Duration("duration", 3*time.Minute, "how long to churn")
	par := flag.Int("parallel", 2, "communicators (driver runs) at once")
	seed := flag.Uint64("seed", uint64(time.Now().UnixNano()), "random seed")
	root := flag.String("root", ".", "repository root (build/ holds the library, the driver and the guests)")
	flag.Parse()
	driver := filepath.Join(*root, "build/rma_driver")
	lib := filepath.Join(*root, "build/librccl-rma-wasm.so")
	guests := filepath.Join(*root, "build/guests")
	if _, err := os.Stat(filepath.Join(guests, "planner.wasm")); err != nil {
		guests = "" // make guests first for the guest faults
	}
	cache, _ := os.MkdirTemp("", "soak-cache")
	defer os.RemoveAll(cache)
	fmt.Printf("soak: %v, %d communicators at once, seed %d\n", *dur, *par, *seed)
	T := &totals{faults: map[string]int{}, fabric: map[string]int{}}
	end := time.Now().Add(*dur)
	var wg sync.WaitGroup
	for w := 0; w < *par; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(*seed, uint64(w)))
			for time.Now().Before(end) {
				x := shape(r, guests)
				ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
				cmd := exec.CommandContext(ctx, driver, append([]string{"--lib", lib}, x.args...)...)
				cmd.Env = append(append(os.Environ(), "NCCL_RMA_WASM_CACHE_DIR="+cache), x.env...)
				var out bytes.Buffer
				cmd.Stdout, cmd.Stderr = &out, &out
				err := cmd.Run()
				hung := ctx.Err() != nil
				cancel()
				judge(T, x, out.String(), err, hung)
			}
		}(w)
	}
	wg.Wait()
	fmt.Printf("soak: %d runs (%d communicators): %d passed, %d ended in the expected clean failure, %d bad\n",
		T.runs, T.comms, T.passed, T.cleanFail, T.bad)
	var fs []string
	n := 0
	for k, v := range T.faults {
		fs = append(fs, fmt.Sprintf("%s %d", k, v))
		n += v
	}
	fmt.Printf("soak: %d faults injected (%s)\n", n, strings.Join(fs, ", "))
	fmt.Printf("soak: %d runs over libfabric (tcp;ofi_rxm %d, shm %d)\n", T.fabric["tcp;ofi_rxm"]+T.fabric["shm"], T.fabric["tcp;ofi_rxm"], T.fabric["shm"])
	fmt.Printf("soak: %d data operations, %.1f MiB put and got, every byte verified\n", T.ops, T.bytes)
	if T.bad > 0 {
		fmt.Println("soak: FAIL")
		os.Exit(1)
	}
	fmt.Println("soak: PASS")
}

func judge(T *totals, x run, out string, err error, hung bool) {
	T.mu.Lock()
	defer T.mu.Unlock()
	T.runs++
	T.comms += x.cycles
	if x.fault != "" {
		T.faults[x.fault]++
	}
	if x.fabric != "" {
		T.fabric[x.fabric]++
	}
	for _, m := range moved.FindAllStringSubmatch(out, -1) {
		ops, _ := strconv.ParseUint(m[2], 10, 64)
		mib, _ := strconv.ParseFloat(m[3], 64)
		T.ops += ops
		T.bytes += mib
	}
	pass := err == nil && strings.Contains(out, "RESULT PASS")
	switch {
	case hung || badRe.MatchString(out):
	case pass:
		T.passed++
		return
	case x.guest && cleanRe.MatchString(out):
		T.cleanFail++
		return
	case x.fault == "nofile" && cleanRe.MatchString(out) && strings.Contains(out, "Too many open files"):
		// Out of descriptors after setup (libfabric's tcp provider
		// connects on its first write): a clean failure if the WARN
		// names the cause.
		T.cleanFail++
		return
	}
	T.bad++
	lines := strings.Split(out, "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	fmt.Printf("soak: BAD run (hung=%v, err=%v) %v %v:\n%s\n", hung, err, x.env, x.args, strings.Join(lines, "\n"))
}
