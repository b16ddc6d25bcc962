package test

// The sample backends of guests/ (multirail, chaos, shaper, telemetry)
// through the plugin: rank processes over real sockets, every byte and
// signal verified by the harness, plus what each backend reports.

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
	"testing"
	"time"
)

func sampleEnv(root, backend, config string) []string {
	return []string{"NCCL_RMA_WASM_BACKEND=" + backend, "NCCL_RMA_WASM_DIR=" + filepath.Join(root, "build/guests"),
		"NCCL_RMA_WASM_CONFIG=" + config}
}

// runDriverFails runs the driver expecting RESULT FAIL and returns its output.
func runDriverFails(t *testing.T, env []string, args ...string) string {
	t.Helper()
	root := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	full := append([]string{"--lib", filepath.Join(root, "build/librccl-rma-wasm.so"), "--timeout", "30"}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(root, "build/rma_driver"), full...)
	cmd.Env = append(append(os.Environ(), "NCCL_RMA_WASM_ADDR=127.0.0.1", "NCCL_RMA_WASM_CACHE_DIR="+t.TempDir()), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("driver %v hung:\n%s", args, tail(out.String()))
	}
	if err == nil || !strings.Contains(out.String(), "RESULT FAIL") {
		t.Fatalf("driver %v should have failed (%v):\n%s", args, err, tail(out.String()))
	}
	return out.String()
}

// lanes parses "name [a b c d]" from a multirail line.
func lanes(t *testing.T, line, name string) []int {
	t.Helper()
	m := regexp.MustCompile(regexp.QuoteMeta(name) + ` \[([0-9 ]+)\]`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("no %q in %q", name, line)
	}
	var v []int
	for _, f := range strings.Fields(m[1]) {
		n, _ := strconv.Atoi(f)
		v = append(v, n)
	}
	return v
}

func TestSampleMultirail(t *testing.T) {
	root := buildGuests(t)
	for _, c := range []struct {
		name, config string
		down         int // lane out of rotation, -1 none
	}{
		{"striped", "lanes=4,stripe=64k", -1},
		{"lane-down", "lanes=4,stripe=64k,down=4", 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := runDriver(t, sampleEnv(root, "multirail", c.config), "--verbose", "--ranks", "3", "--threads", "2", "--size", "1m", "--iters", "2")
			reports := regexp.MustCompile(`multirail: rank \d+: planned per lane .*`).FindAllString(out, -1)
			if len(reports) != 6 { // 3 ranks x 2 contexts
				t.Fatalf("%d multirail reports, want 6:\n%s", len(reports), tail(out))
			}
			for _, r := range reports {
				planned, completed, failed := lanes(t, r, "planned per lane"), lanes(t, r, "completed"), lanes(t, r, "failed")
				total := 0
				for l := range planned {
					// The completion records carry the lane the plan chose.
					if planned[l] != completed[l] || failed[l] != 0 {
						t.Errorf("lane %d: planned %d, completed %d, failed %d: %s", l, planned[l], completed[l], failed[l], r)
					}
					if l == c.down && planned[l] != 0 {
						t.Errorf("lane %d is down but got %d ops: %s", l, planned[l], r)
					}
					if l != c.down && c.down >= 0 && planned[l] == 0 {
						t.Errorf("lane %d is up but got no ops: %s", l, r)
					}
					total += planned[l]
				}
				m := regexp.MustCompile(`striped (\d+) \(completed (\d+)\)`).FindStringSubmatch(r)
				if m == nil || m[1] != m[2] {
					t.Errorf("striped ops do not all complete: %s", r)
				}
				if striped, _ := strconv.Atoi(m[1]); (c.down < 0) != (striped > 0) {
					t.Errorf("striped %d ops with lane down %d: %s", striped, c.down, r)
				}
				if striped, _ := strconv.Atoi(m[1]); striped+total != 30 { // 3 peers x 2 rounds x 5 planned ops
					t.Errorf("%d ops planned, want 30: %s", striped+total, r)
				}
			}
		})
	}
}

// chaosFirstFailure predicts, from chaos.c's seeded stream, which op of a
// one-rank, one-thread run fails first: the stream is the contract.
func chaosFirstFailure(seed uint64, ppm uint64) (round int, op string) {
	rng := seed ^ 1*0x9e3779b97f4a7c15 // rank 0, context 1
	next := func() uint64 {
		rng += 0x9e3779b97f4a7c15
		z := rng
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		return z ^ (z >> 31)
	}
	// The harness's planned ops per round and peer (iflush is not planned).
	names := []string{"iput", "iputSignal(INC)", "iputSignal(size 0, ADD)", "iputSignal(size 0, ADD)", "iget"}
	for k := 0; ; k++ {
		r1 := next() % 1000000
		next()
		if r1 < ppm {
			return k / len(names), names[k%len(names)]
		}
	}
}

func TestSampleChaos(t *testing.T) {
	root := buildGuests(t)
	t.Run("reproducible-faults", func(t *testing.T) {
		var seen []string
		for _, seed := range []uint64{1, 1, 2, 3} {
			out := runDriverFails(t, sampleEnv(root, "chaos", fmt.Sprintf("seed=%d,fail_code=5,fail_ppm=50000", seed)),
				"--ranks", "1", "--threads", "1", "--size", "64k", "--iters", "8")
			round, op := chaosFirstFailure(seed, 50000)
			want := fmt.Sprintf("[rank 0] FAIL: cycle 0 iter %d thread 0: test(%s) returned 5 (ncclInvalidUsage)", round, op)
			if !strings.Contains(out, want) {
				t.Fatalf("seed %d: want %q:\n%s", seed, want, tail(out))
			}
			if !strings.Contains(out, "backend chaos failed an operation to rank 0 with status 5") {
				t.Fatalf("seed %d: no WARN for the injected failure:\n%s", seed, tail(out))
			}
			seen = append(seen, want)
		}
		if seen[2] == seen[1] && seen[3] == seen[1] {
			t.Fatalf("three seeds fail the same op: %q", seen[1])
		}
	})
	t.Run("peer-reset", func(t *testing.T) {
		out := runDriverFails(t, sampleEnv(root, "chaos", "reset_peer=1,reset_at=2,reset_len=3"),
			"--ranks", "2", "--threads", "1", "--size", "64k", "--iters", "4")
		// Each rank's third op to rank 1 is the first of the window.
		if !regexp.MustCompile(`\[rank \d\] FAIL: cycle 0 iter 0 thread 0: test\(iputSignal\(size 0, ADD\)\) returned 6 \(ncclRemoteError\)`).MatchString(out) {
			t.Fatalf("no rank failed its third op to rank 1 with ncclRemoteError:\n%s", tail(out))
		}
		if !strings.Contains(out, "backend chaos failed an operation to rank 1 with status 6") {
			t.Fatalf("no WARN for the reset window:\n%s", tail(out))
		}
	})
	t.Run("delays", func(t *testing.T) {
		out := runDriver(t, sampleEnv(root, "chaos", "seed=9,delay_ppm=300000,delay_ns=200000"),
			"--verbose", "--ranks", "3", "--threads", "2", "--size", "256k", "--iters", "2")
		reports := regexp.MustCompile(`chaos: seed 9 rank \d ctx \d+: 30 ops, failed 0 \(code 2\), reset window failed 0, delayed (\d+) by (\d+) us in all; completions (\d+) \(0 with an error\)`).FindAllStringSubmatch(out, -1)
		if len(reports) != 6 {
			t.Fatalf("%d chaos reports, want 6:\n%s", len(reports), tail(out))
		}
		delayed := 0
		for _, r := range reports {
			n, _ := strconv.Atoi(r[1])
			delayed += n
			if us, _ := strconv.Atoi(r[2]); us > n*200 {
				t.Errorf("%d delays took %d us, more than 200 us each", n, us)
			}
		}
		// 180 ops at 30 %: far from 0 for any seed (the count is reproducible).
		if delayed < 20 {
			t.Fatalf("only %d of 180 ops delayed", delayed)
		}
	})
}

func TestSampleShaper(t *testing.T) {
	root := buildGuests(t)
	for _, c := range []struct {
		name, config string
		delays       bool
	}{
		{"limited", "rate=20m,get_rate=10m,burst=64k", true},
		{"unlimited", "burst=64k", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := runDriver(t, sampleEnv(root, "shaper", c.config), "--verbose", "--ranks", "2", "--threads", "2", "--size", "1m", "--iters", "3")
			reports := regexp.MustCompile(`shaper: rank \d: 30 ops \(put 3145728 bytes, get 3145728 bytes\), delayed (\d+) by (\d+) us`).FindAllStringSubmatch(out, -1)
			if len(reports) != 4 {
				t.Fatalf("%d shaper reports, want 4:\n%s", len(reports), tail(out))
			}
			for _, r := range reports {
				if n, _ := strconv.Atoi(r[1]); (n > 0) != c.delays {
					t.Errorf("%s: delayed %s ops", c.name, r[1])
				}
			}
		})
	}
}

// TestSampleTelemetry: the host writes one textfile-collector file per
// process; its counters equal what the harness did, op by op and byte by byte.
func TestSampleTelemetry(t *testing.T) {
	root := buildGuests(t)
	dir := t.TempDir()
	const ranks, threads, iters, size = 3, 2, 2, 256 << 10
	env := append(sampleEnv(root, "telemetry", ""), "NCCL_RMA_WASM_METRICS_FILE="+filepath.Join(dir, "rmaw-%p.prom"))
	out := runDriver(t, env, "--ranks", fmt.Sprint(ranks), "--threads", fmt.Sprint(threads), "--size", "256k",
		"--iters", fmt.Sprint(iters), "--summary")
	files, _ := filepath.Glob(filepath.Join(dir, "rmaw-*.prom"))
	if len(files) != ranks {
		t.Fatalf("%d metrics files, want one per rank:\n%s", len(files), tail(out))
	}
	sum := func(text, re string) (s int) {
		for _, m := range regexp.MustCompile(`(?m)^`+re+` (\d+)$`).FindAllStringSubmatch(text, -1) {
			n, _ := strconv.Atoi(m[1])
			s += n
		}
		return s
	}
	seen := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		m := regexp.MustCompile(`rank="(\d+)"`).FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("%s has no rank label:\n%s", f, text)
		}
		r := m[1]
		seen[r] = true
		// Per context and peer and round: put, putSignal x3, get, flush.
		per := map[string]int{"put": 1, "putSignal": 3, "get": 1, "flush": 1}
		for kind, n := range per {
			if got, want := sum(text, `rmaw_ops_total\{rank="`+r+`",ctx="\d+",peer="\d",kind="`+kind+`"\}`), n*ranks*threads*iters; got != want {
				t.Errorf("rank %s: %s ops %d, want %d", r, kind, got, want)
			}
		}
		// Bytes: each round moves size/threads per peer and context as put
		// halves, and fetches size/threads: 2*ranks*iters*size per rank.
		if got, want := sum(text, `rmaw_bytes_total\{rank="`+r+`",ctx="\d+",peer="\d",kind="\w+"\}`), 2*ranks*iters*size; got != want {
			t.Errorf("rank %s: %d bytes, want %d", r, got, want)
		}
		if got := sum(text, `rmaw_op_errors_total\{rank="`+r+`",ctx="\d+",peer="\d"\}`); got != 0 {
			t.Errorf("rank %s: %d errors", r, got)
		}
		count := sum(text, `rmaw_op_latency_seconds_count\{rank="`+r+`",ctx="\d+",peer="\d"\}`)
		inf := sum(text, `rmaw_op_latency_seconds_bucket\{rank="`+r+`",ctx="\d+",peer="\d",le="\+Inf"\}`)
		if count != 6*ranks*threads*iters || inf != count {
			t.Errorf("rank %s: histogram count %d, +Inf bucket %d, want %d", r, count, inf, 6*ranks*threads*iters)
		}
	}
	if len(seen) != ranks {
		t.Fatalf("ranks %v in the files", seen)
	}
	if n := len(regexp.MustCompile(`telemetry: rank \d ctx \d+: 36 ops \(put 6, putSignal 18, get 6, flush 6\), 1572864 bytes, 0 errors, 3 peers`).FindAllString(out, -1)); n != ranks*threads {
		t.Fatalf("%d finalize summaries in NCCL's log, want %d:\n%s", n, ranks*threads, tail(out))
	}
}

// TestSampleCompress: compressed puts over TCP between processes, on data
// that compresses and on data that does not, with the codec forced and
// chosen; the harness verifies every byte.
func TestSampleCompress(t *testing.T) {
	root := buildGuests(t)
	for _, c := range []struct {
		name, config string
		compressible bool
		want         string // in every context's report
	}{
		{"zstd-forced", "codec=2,zstd_level=2", true, `puts none 0 \(0 B\) s2 0 \(0 B\) zstd 24 \(12582912 B\); trials decided 0 \(codec forced\)`},
		{"s2-forced-random", "codec=1", false, `puts none 0 \(0 B\) s2 24 \(12582912 B\) zstd 0 \(0 B\)`},
		{"choosing", "trial=2,period=4", true, `puts none [1-9]\d* \(\d+ B\) s2 [1-9]\d* \(\d+ B\) zstd [1-9]\d* \(\d+ B\); trials decided [1-9]`},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := append(sampleEnv(root, "compress", c.config), "NCCL_RMA_WASM_INTRANODE=0") // the codec acts on TCP
			args := []string{"--verbose", "--ranks", "2", "--threads", "2", "--size", "2m", "--iters", "6"}
			if c.compressible {
				args = append(args, "--compressible")
			}
			out := runDriver(t, env, args...)
			if n := len(regexp.MustCompile(`compress: rank \d: `+c.want).FindAllString(out, -1)); n != 4 {
				t.Fatalf("%d of 4 context reports match %q:\n%s", n, c.want, tail(out))
			}
		})
	}
}
