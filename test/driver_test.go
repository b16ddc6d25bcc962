// Package test runs the plugin the way RCCL/NCCL do: the C harness in
// test/harness/ (build/rma_driver) dlopens build/librccl-rma-wasm.so, resolves a versioned table, and
// runs every rank as its own process over real sockets, verifying every byte
// and every signal. These tests only pass when the driver prints
// "RESULT PASS" and exits 0; they check the scenario-specific lines too.
package test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	buildOnce, guestsOnce sync.Once
	buildErr, guestsErr   error
)

// repoRoot finds the directory holding go.mod.
func repoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test directory")
		}
		dir = parent
	}
}

// build runs `make all` once per test binary: the library, the driver and
// the hello_rma sample, which need only Go and a C compiler.
func build(t testing.TB) string {
	t.Helper()
	root := repoRoot(t)
	buildOnce.Do(func() { buildErr = runMake(root, "all") })
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return root
}

// buildGuests also builds the guest backends (clang, lld and Go's wasip1
// port): only the tests that load a guest from build/guests need them.
func buildGuests(t testing.TB) string {
	t.Helper()
	root := build(t)
	guestsOnce.Do(func() { guestsErr = runMake(root, "guests") })
	if guestsErr != nil {
		t.Fatal(guestsErr)
	}
	return root
}

func runMake(root, target string) error {
	cmd := exec.Command("make", target)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("make %s: %v\n%s", target, err, out)
	}
	return nil
}

// runDriver runs the driver with args and extra environment and returns its
// combined output; it fails the test unless the run passes.
func runDriver(t *testing.T, env []string, args ...string) string {
	t.Helper()
	root := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	full := append([]string{"--lib", filepath.Join(root, "build/librccl-rma-wasm.so")}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(root, "build/rma_driver"), full...)
	cmd.Dir = root
	cmd.Env = append(append(os.Environ(), "NCCL_RMA_WASM_ADDR=127.0.0.1", "NCCL_RMA_WASM_CACHE_DIR="+t.TempDir()), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	text := out.String()
	if ctx.Err() != nil {
		t.Fatalf("driver %v hung (killed after the timeout):\n%s", args, tail(text))
	}
	if err != nil || !strings.Contains(text, "RESULT PASS") || strings.Contains(text, "] FAIL") {
		t.Fatalf("driver %v failed (%v):\n%s", args, err, tail(text))
	}
	return text
}

func tail(s string) string {
	lines := strings.Split(s, "\n")
	if len(lines) > 60 {
		lines = lines[len(lines)-60:]
	}
	return strings.Join(lines, "\n")
}

func TestRanksAndVersions(t *testing.T) {
	for _, c := range []struct{ ranks, version, threads int }{
		{2, 14, 1}, {2, 15, 2}, {2, 16, 2}, {4, 15, 2}, {4, 16, 3}, {8, 15, 1}, {8, 14, 2},
	} {
		t.Run(fmt.Sprintf("ranks%d_v%d_threads%d", c.ranks, c.version, c.threads), func(t *testing.T) {
			out := runDriver(t, nil, "--ranks", fmt.Sprint(c.ranks), "--version", fmt.Sprint(c.version),
				"--threads", fmt.Sprint(c.threads), "--size", "262144", "--iters", "2")
			if n := strings.Count(out, "] PASS"); n != c.ranks {
				t.Fatalf("%d ranks reported PASS, want %d:\n%s", n, c.ranks, tail(out))
			}
		})
	}
}

// TestBackends runs one workload on every backend kind; each run verifies
// every byte itself, so identical PASS lines mean identical results.
func TestBackends(t *testing.T) {
	root := buildGuests(t)
	for _, c := range []struct {
		name string
		env  []string
		want string
	}{
		{"native", []string{"NCCL_RMA_WASM_BACKEND=native"}, "backend native"},
		{"embedded", nil, "backend default"},
		{"go-sdk", []string{"NCCL_RMA_WASM_BACKEND=passthrough-go", "NCCL_RMA_WASM_DIR=" + filepath.Join(root, "build/guests")}, "backend passthrough-go"},
		{"c-planner", []string{"NCCL_RMA_WASM_BACKEND=planner", "NCCL_RMA_WASM_DIR=" + filepath.Join(root, "build/guests")}, "backend planner"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := runDriver(t, c.env, "--verbose", "--ranks", "3", "--threads", "2", "--size", "131072", "--iters", "2")
			if !strings.Contains(out, c.want) {
				t.Fatalf("output does not show %q:\n%s", c.want, tail(out))
			}
		})
	}
}

func TestTransports(t *testing.T) {
	for _, intra := range []string{"0", "1"} {
		t.Run("intranode="+intra, func(t *testing.T) {
			runDriver(t, []string{"NCCL_RMA_WASM_INTRANODE=" + intra}, "--ranks", "3", "--size", "1048576", "--iters", "2")
		})
	}
}

func TestLargeTransfers(t *testing.T) {
	for _, intra := range []string{"0", "1"} {
		t.Run("intranode="+intra, func(t *testing.T) {
			runDriver(t, []string{"NCCL_RMA_WASM_INTRANODE=" + intra}, "--ranks", "2", "--threads", "1", "--size", "67108864", "--iters", "1")
		})
	}
}

func TestBadInput(t *testing.T) {
	out := runDriver(t, nil, "--ranks", "2", "--scenario", "bad-input", "--iters", "1")
	if !strings.Contains(out, "bad-input checks passed") {
		t.Fatalf("bad-input checks did not run:\n%s", tail(out))
	}
}

func TestPeerKilled(t *testing.T) {
	for _, intra := range []string{"0", "1"} {
		t.Run("intranode="+intra, func(t *testing.T) {
			out := runDriver(t, []string{"NCCL_RMA_WASM_INTRANODE=" + intra}, "--ranks", "3", "--scenario", "kill", "--kill-rank", "2", "--iters", "2")
			if got := len(regexp.MustCompile(`kill: detected the loss of rank 2`).FindAllString(out, -1)); got != 2 {
				t.Fatalf("%d survivors detected the loss, want 2:\n%s", got, tail(out))
			}
		})
	}
}

// TestReinit runs init..finalize several times in one process with dlclose
// and dlopen in between: the library is never unloaded and must start over.
func TestReinit(t *testing.T) {
	runDriver(t, nil, "--ranks", "2", "--cycles", "3", "--iters", "1", "--size", "65536")
}

// TestIntraNodeFallback makes the kernel refuse process_vm_writev (ranks
// drop CAP_SYS_PTRACE and turn non-dumpable): every rank must say why, once
// per peer, and still deliver every byte over TCP. The shared-memory
// request streams, on between every pair (a rank's own included) on a
// permissive host, are refused the same way (a non-dumpable process's
// memfd cannot be opened through /proc), and the sockets carry them.
func TestIntraNodeFallback(t *testing.T) {
	on := runDriver(t, nil, "--verbose", "--ranks", "3", "--size", "1m", "--iters", "1")
	if strings.Count(on, "; 3 on this host use the intra-node path") != 3 || strings.Contains(on, "refused by the kernel") {
		t.Fatalf("intra-node path not in use on a permissive host:\n%s", tail(on))
	}
	if got := strings.Count(on, "requests through a shared-memory stream"); got != 9 || strings.Contains(on, "refusing rank") {
		t.Fatalf("%d shared-memory streams, want 9 (3 ranks, 3 peers each), none refused:\n%s", got, tail(on))
	}
	off := runDriver(t, nil, "--verbose", "--no-ptrace", "--ranks", "3", "--size", "1m", "--iters", "1")
	// 3 ranks, 2 remote peers each: 6 refusals, each logged once.
	if got := strings.Count(off, "refused by the kernel"); got != 6 {
		t.Fatalf("%d refusals logged, want 6 (one per rank and remote peer):\n%s", got, tail(off))
	}
	if got, self := strings.Count(off, "shared-memory stream (open /proc/"), strings.Count(off, "requests through a shared-memory stream"); got != 6 || self != 3 {
		t.Fatalf("%d shared-memory streams refused (want 6) and %d taken (want 3, each rank's own):\n%s", got, self, tail(off))
	}
}

// TestLanes stripes large puts and gets over several TCP streams per peer
// (and over the intra-node path): every byte and signal is still verified.
func TestLanes(t *testing.T) {
	for _, intra := range []string{"0", "1"} {
		t.Run("intranode="+intra, func(t *testing.T) {
			runDriver(t, []string{"NCCL_RMA_WASM_LANES=3", "NCCL_RMA_WASM_INTRANODE=" + intra},
				"--ranks", "3", "--threads", "2", "--size", "4m", "--iters", "2")
		})
	}
}

// TestSignalStorm delivers SIGUSR1 every 50 µs to every rank (handler with
// SA_ONSTACK) while threads run inside Go and the planning guest: nothing may
// crash or hang, and every byte is still verified.
func TestSignalStorm(t *testing.T) {
	root := buildGuests(t)
	out := runDriver(t, []string{"NCCL_RMA_WASM_BACKEND=planner", "NCCL_RMA_WASM_DIR=" + filepath.Join(root, "build/guests")},
		"--signal-storm", "--ranks", "3", "--threads", "3", "--size", "256k", "--iters", "20")
	if got := strings.Count(out, "SIGUSR1 handled"); got != 3 {
		t.Fatalf("%d ranks reported the storm, want 3:\n%s", got, tail(out))
	}
}

// TestTeardownDelivers: in every cycle one rank receives and the others put,
// put with a signal and signal, then tear down at once without ever calling
// test() (destroyContext, deregMrSym, then overwrite the source, closeColl,
// finalize). The receiver must see every byte and signal, on one lane and
// striped over four, over TCP and the intra-node path, small and large.
func TestTeardownDelivers(t *testing.T) {
	for _, c := range []struct{ lanes, intra, size string }{
		{"1", "0", "4k"}, {"1", "1", "4m"}, {"4", "0", "4m"}, {"4", "1", "64k"}, {"4", "1", "16m"},
	} {
		t.Run("lanes="+c.lanes+",intranode="+c.intra+",size="+c.size, func(t *testing.T) {
			out := runDriver(t, []string{"NCCL_RMA_WASM_LANES=" + c.lanes, "NCCL_RMA_WASM_INTRANODE=" + c.intra},
				"--verbose", "--ranks", "3", "--scenario", "teardown", "--cycles", "12", "--size", c.size, "--timeout", "30")
			if got := strings.Count(out, "senders delivered every byte and signal"); got != 12 {
				t.Fatalf("%d of 12 cycles delivered, want all:\n%s", got, tail(out))
			}
		})
	}
}

// TestNoProgress never calls rmaProgress: test() alone must drive every
// request to completion, over TCP and over the intra-node path.
func TestNoProgress(t *testing.T) {
	for _, intra := range []string{"0", "1"} {
		t.Run("intranode="+intra, func(t *testing.T) {
			out := runDriver(t, []string{"NCCL_RMA_WASM_INTRANODE=" + intra},
				"--no-progress", "--ranks", "3", "--threads", "2", "--size", "512k", "--iters", "2")
			if !strings.Contains(out, "scenario=basic no-progress") {
				t.Fatalf("the driver did not run in no-progress mode:\n%s", tail(out))
			}
		})
	}
}

// TestSummary checks what make demo shows: the backend, the lanes and the
// transport to each peer as the plugin logged them, and what was verified.
func TestSummary(t *testing.T) {
	root := buildGuests(t)
	for _, c := range []struct {
		name string
		env  []string
		row  string // rank 0's row: backend, lanes, intra-node peers, TCP-only peers
		more string
	}{
		{"default-tcp", []string{"NCCL_RMA_WASM_INTRANODE=0", "NCCL_RMA_WASM_LANES=2"}, `0 +default +2 +- +0-2 `, "backend default runs as Wasm"},
		{"planner-intranode", []string{"NCCL_RMA_WASM_BACKEND=planner", "NCCL_RMA_WASM_DIR=" + filepath.Join(root, "build/guests")},
			`0 +planner +4 +0-2 +- `, "the backend's last lines: planner: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := runDriver(t, c.env, "--summary", "--ranks", "3", "--size", "256k", "--iters", "2")
			if !regexp.MustCompile(`(?m)^  ` + c.row).MatchString(out) {
				t.Fatalf("no summary row matching %q:\n%s", c.row, tail(out))
			}
			// 2 rounds x (put half + get) of 3 x 256 KiB; 3 signals per sender and thread.
			if got := strings.Count(out, " 3.0 MiB      36 "); got != 3 {
				t.Fatalf("%d ranks report 3.0 MiB and 36 signals verified, want 3:\n%s", got, tail(out))
			}
			if !strings.Contains(out, c.more) {
				t.Fatalf("summary lacks %q:\n%s", c.more, tail(out))
			}
		})
	}
}

// TestCompression runs the driver (every byte verified by each rank) with
// the v1.1 test guest choosing codecs per peer (conn.codec) and per op
// (plan.codec), with per-op chunks and pacing, on compressible and on
// pseudo-random data, over TCP between processes. The plugin's closing
// line says what the codec made of the payload.
func TestCompression(t *testing.T) {
	root := buildGuests(t)
	re := regexp.MustCompile(`compressed (\d+) payload bytes into (\d+) on the wire`)
	for _, c := range []struct{ name, config string }{
		{"s2-per-peer", "codec=1"},
		{"s2-better", "codec=1, level=2"},
		{"zstd3-per-peer", "codec=2, level=3"},
		{"zstd-per-op-lanes-chunk-delay", "lanes=3, op_codec=2, op_level=1, op_min=4096, chunk=16384, delay=20000"},
	} {
		for _, data := range []string{"compressible", "random"} {
			t.Run(c.name+"/"+data, func(t *testing.T) {
				args := []string{"--verbose", "--ranks", "3", "--threads", "2", "--size", "1m", "--iters", "2"}
				if data == "compressible" {
					args = append(args, "--compressible")
				}
				out := runDriver(t, []string{"NCCL_RMA_WASM_BACKEND=plan11", "NCCL_RMA_WASM_DIR=" + filepath.Join(root, "build/guests"),
					"NCCL_RMA_WASM_CONFIG=" + c.config, "NCCL_RMA_WASM_INTRANODE=0"}, args...)
				m := re.FindAllStringSubmatch(out, -1)
				if len(m) != 3 {
					t.Fatalf("%d ranks reported compression, want 3:\n%s", len(m), tail(out))
				}
				for _, x := range m {
					raw, _ := strconv.ParseUint(x[1], 10, 64)
					wire, _ := strconv.ParseUint(x[2], 10, 64)
					switch {
					case data == "compressible" && wire*3 > raw:
						t.Errorf("compressible data: %d bytes took %d on the wire", raw, wire)
					case data == "random" && (wire < raw || wire > raw+raw/100):
						t.Errorf("random data: %d bytes took %d on the wire (stored blocks expected)", raw, wire)
					}
				}
			})
		}
	}
}

// TestManyComms: eight communicators per process side by side on one
// plugin context (NCCL opens one per communicator), over TCP and the
// intra-node path, every byte and signal of each verified.
func TestManyComms(t *testing.T) {
	for _, intra := range []string{"0", "1"} {
		t.Run("intranode="+intra, func(t *testing.T) {
			out := runDriver(t, []string{"NCCL_RMA_WASM_INTRANODE=" + intra}, "--verbose", "--ranks", "4", "--comms", "8",
				"--threads", "2", "--size", "65536", "--iters", "2", "--version", "16")
			if got := strings.Count(out, "connected to 4 ranks"); got != 4*8 {
				t.Fatalf("%d communicators connected, want %d:\n%s", got, 4*8, tail(out))
			}
		})
	}
}

// TestPingPong runs the 8-byte put+signal ping-pong (TCP forced) briefly:
// every signal word and payload is checked by the driver; no timing is
// asserted, only that the figures are reported.
func TestPingPong(t *testing.T) {
	out := runDriver(t, nil, "--verbose", "--scenario", "pingpong", "--blocks", "2", "--iters", "50")
	if !regexp.MustCompile(`(?m)^PINGPONG raw_us=[0-9.]+ plugin_us=[0-9.]+ ratio=[0-9.]+ `).MatchString(out) {
		t.Fatalf("no PINGPONG line:\n%s", tail(out))
	}
	if got := strings.Count(out, "; 0 on this host use the intra-node path"); got != 2 {
		t.Fatalf("%d ranks connected over TCP only, want 2 (TCP forced):\n%s", got, tail(out))
	}
}
