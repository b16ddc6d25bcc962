package test

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// Faults across processes (SPEC.md §3, "Faults"). Each run is the C harness
// with every rank a process of its own over real sockets; the parent
// strikes --kill-rank while every rank keeps operations of one kind in
// flight. The harness fails a rank unless every operation it posted
// completes, at least one with ncclRemoteError and none with another
// error code, and queryLastError reports the loss, within --timeout.

// A survivor of a reset may instead meet the struck rank's own refusal
// (it tore down and released the registration while a stream the reset
// did not reach still carried puts): the harness reports that as clean.
var faultLine = regexp.MustCompile(`\[rank (\d+)\] fault (\S+): lost rank (\d+): .* (?:ncclRemoteError|refusal \(ncclInvalidArgument\)) after ([0-9.]+) s, queryLastError true after ([0-9.]+) s`)

// faultFailedAt matches the end of a fault line: when the first operation
// failed on the host's monotonic clock, which every process shares.
var faultFailedAt = regexp.MustCompile(`\[rank (\d+)\] fault (\S+): lost rank .* none pending \(failed at ([0-9.]+)\)`)

// faultSince returns, per reporting rank, the seconds from the parent's
// strike (the first match of strike in out, whose group 1 is its monotonic
// time) to that rank's first failed operation. Unlike faultRuns' phase
// clocks, which start when each rank got going, it counts from the strike
// itself, however late a loaded machine ran a survivor.
func faultSince(t *testing.T, out, fault, strike string, want int) map[int]float64 {
	t.Helper()
	m := regexp.MustCompile(strike).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no %q line:\n%s", strike, tail(out))
	}
	at, _ := strconv.ParseFloat(m[1], 64)
	got := perRank(t, out, fault, faultFailedAt, 3, want)
	for r := range got {
		got[r] -= at
	}
	return got
}

// faultRuns returns, per reporting rank, the seconds after the start of the
// fault phase at which an operation failed.
func faultRuns(t *testing.T, out, fault string, want int) map[int]float64 {
	t.Helper()
	return perRank(t, out, fault, faultLine, 4, want)
}

// perRank returns, per rank reporting fault on a line re matches (the rank
// in group 1, the fault in group 2), the number in group g; want ranks.
func perRank(t *testing.T, out, fault string, re *regexp.Regexp, g, want int) map[int]float64 {
	t.Helper()
	got := map[int]float64{}
	for _, m := range re.FindAllStringSubmatch(out, -1) {
		if m[2] != fault {
			continue
		}
		r, _ := strconv.Atoi(m[1])
		got[r], _ = strconv.ParseFloat(m[g], 64)
	}
	if len(got) != want {
		t.Fatalf("%d ranks reported the %s fault, want %d:\n%s", len(got), fault, want, tail(out))
	}
	return got
}

// TestFaultKillMidOperation SIGKILLs a rank 300 ms into a phase of large
// puts, large gets, or a storm of signals (every rank, the victim too, has
// operations in flight), over TCP and over the intra-node path.
func TestFaultKillMidOperation(t *testing.T) {
	for _, c := range []struct{ fault, size, intra string }{
		{"kill-put", "8m", "0"}, {"kill-get", "8m", "0"}, {"kill-signal", "64k", "0"},
		{"kill-put", "8m", "1"}, {"kill-get", "8m", "1"},
	} {
		t.Run(c.fault+"/intranode="+c.intra, func(t *testing.T) {
			out := runDriver(t, []string{"NCCL_RMA_WASM_INTRANODE=" + c.intra},
				"--ranks", "3", "--scenario", "fault", "--fault", c.fault, "--kill-rank", "2",
				"--size", c.size, "--iters", "1", "--timeout", "20")
			if !strings.Contains(out, "SIGKILL rank 2") {
				t.Fatalf("the victim was not killed:\n%s", tail(out))
			}
			faultRuns(t, out, c.fault, 2)
			for r, s := range faultSince(t, out, c.fault, `SIGKILL rank 2 \(at ([0-9.]+)\)`, 2) {
				// Nothing fails before the kill, and the loss shows
				// within 10 s of it.
				if s < 0 || s > 10 {
					t.Errorf("rank %d saw the loss %.3f s after the kill, want it within 10 s", r, s)
				}
			}
		})
	}
}

// TestFaultStoppedPeer SIGSTOPs a rank for good: its connections stay up
// and its kernel keeps acknowledging, so only the peer timeout
// (NCCL_RMA_WASM_PEER_TIMEOUT_MS) can fail the operations posted to it:
// not before the timeout, and not long after. On the intra-node path puts
// to the stopped process still land (the kernel copies into its memory)
// and complete until its stream's buffers fill, so the timeout counts
// from then.
func TestFaultStoppedPeer(t *testing.T) {
	for _, intra := range []string{"0", "1"} {
		t.Run("intranode="+intra, func(t *testing.T) {
			out := runDriver(t, []string{"NCCL_RMA_WASM_PEER_TIMEOUT_MS=2000", "NCCL_RMA_WASM_INTRANODE=" + intra},
				"--ranks", "3", "--scenario", "fault", "--fault", "stop", "--kill-rank", "2",
				"--size", "8m", "--iters", "1", "--timeout", "30")
			faultRuns(t, out, "stop", 2)
			for r, s := range faultSince(t, out, "stop", `SIGSTOP rank 2 \(pid \d+\) for good \(at ([0-9.]+)\)`, 2) {
				// No byte moves after the SIGSTOP, so the 2 s count cannot
				// end much before 2 s after it (a survivor's last byte may
				// have moved a little before it).
				if s < 1.5 || s > 20 {
					t.Errorf("rank %d failed the stopped peer %.3f s after the SIGSTOP, want the 2 s timeout (1.5..20)", r, s)
				}
			}
			if !strings.Contains(out, "moved no byte for 2s with operations outstanding") {
				t.Errorf("no WARN names the peer timeout:\n%s", tail(out))
			}
		})
	}
}

// TestFaultStopCont stops a rank for 1.5 s at the start of a round and
// lets it go on, well within the peer timeout: the round waits for it (no
// survivor ends it before the SIGCONT, on the host's monotonic clock, which
// every process shares), then every byte and signal of it and of the next
// round is verified and no rank reports an error.
func TestFaultStopCont(t *testing.T) {
	out := runDriver(t, []string{"NCCL_RMA_WASM_PEER_TIMEOUT_MS=20000", "NCCL_RMA_WASM_INTRANODE=0"},
		"--ranks", "3", "--scenario", "fault", "--fault", "stop-cont", "--stop-ms", "1500", "--kill-rank", "2",
		"--size", "4m", "--iters", "3", "--timeout", "30")
	re := regexp.MustCompile(`\[rank (\d+)\] stop-cont: round 1 took ([0-9.]+) s, every byte and signal verified \(ended at ([0-9.]+)\)`)
	m := re.FindAllStringSubmatch(out, -1)
	if len(m) != 3 || strings.Count(out, "stop-cont: round 2 took") != 3 {
		t.Fatalf("%d ranks verified round 1 (and round 2), want 3:\n%s", len(m), tail(out))
	}
	c := regexp.MustCompile(`SIGCONT rank 2 after [0-9.]+ s \(at ([0-9.]+)\)`).FindStringSubmatch(out)
	if c == nil {
		t.Fatalf("no SIGCONT line:\n%s", tail(out))
	}
	cont, _ := strconv.ParseFloat(c[1], 64)
	for _, x := range m {
		end, _ := strconv.ParseFloat(x[3], 64)
		if x[1] != "2" && end < cont {
			t.Errorf("rank %s finished round 1 (%s s) %.3f s before rank 2 was let go on", x[1], x[2], cont-end)
		}
	}
}

// TestFaultConnectionReset aborts every TCP connection of a rank with a RST
// (ss -K) while all ranks have large puts in flight: the rank and every
// peer talking to it must see ncclRemoteError and queryLastError.
func TestFaultConnectionReset(t *testing.T) {
	out := runDriver(t, []string{"NCCL_RMA_WASM_INTRANODE=0"},
		"--ranks", "3", "--scenario", "fault", "--fault", "reset", "--kill-rank", "2",
		"--size", "8m", "--iters", "1", "--timeout", "20")
	if regexp.MustCompile(`reset [1-9]\d* TCP connections of rank 2`).FindString(out) == "" {
		t.Fatalf("no connection was reset (is ss -K supported?):\n%s", tail(out))
	}
	faultRuns(t, out, "reset", 3)
}

// TestFaultResetLazyLanes: with four lanes of which only lane 0 opened
// (small puts on one lane; the others open when first used), every
// connection of rank 2 is reset: the lanes never opened do not count as
// survivors, so the peer fails and every rank reports it, instead of
// moving lane 0's work to a lane that first has to dial (it hung: four
// requests pending forever, found by make soak).
func TestFaultResetLazyLanes(t *testing.T) {
	out := runDriver(t, []string{"NCCL_RMA_WASM_INTRANODE=1", "NCCL_RMA_WASM_LANES=4"},
		"--ranks", "3", "--scenario", "fault", "--fault", "reset", "--kill-rank", "2",
		"--size", "4k", "--iters", "1", "--threads", "1", "--version", "14", "--fault-delay-ms", "325", "--timeout", "20")
	if regexp.MustCompile(`reset [1-9]\d* TCP connections of rank 2`).FindString(out) == "" {
		t.Fatalf("no connection was reset (is ss -K supported?):\n%s", tail(out))
	}
	faultRuns(t, out, "reset", 3)
}

// TestFaultLaneReset resets one more outgoing TCP lane of rank 2 (ss -K)
// in each of rounds 1..3, 5 ms into the round, while every rank has puts,
// puts with signal, signals and gets in flight, under the multirail
// backend with 4 lanes per peer: the lane fails over (its unacknowledged
// operations go again on a live lane of the same peer, the target drops
// what already landed), every byte and signal of every round is verified
// exactly once by every rank, no operation fails and nobody reports an
// error; multirail hears of each failed lane and takes it out for good.
// Without failover the first reset fails the peer and the round.
func TestFaultLaneReset(t *testing.T) {
	for _, intra := range []string{"0", "1"} {
		t.Run("intranode="+intra, func(t *testing.T) {
			root := buildGuests(t)
			env := append(sampleEnv(root, "multirail", "lanes=4,stripe=256k"), "NCCL_RMA_WASM_INTRANODE="+intra)
			out := runDriver(t, env, "--ranks", "3", "--threads", "4", "--scenario", "fault", "--fault", "lane-reset",
				"--kill-rank", "2", "--size", "8m", "--iters", "4", "--fault-delay-ms", "5", "--timeout", "30")
			if n := len(regexp.MustCompile(`\[rank 2\] lane-reset: reset 1 TCP connection`).FindAllString(out, -1)); n != 3 {
				t.Fatalf("%d lanes reset, want 3:\n%s", n, tail(out))
			}
			for r := 0; r < 3; r++ {
				for round := 1; round <= 3; round++ {
					if !strings.Contains(out, fmt.Sprintf("[rank %d] lane-reset: round %d took", r, round)) {
						t.Fatalf("rank %d did not verify round %d:\n%s", r, round, tail(out))
					}
				}
			}
			failed := regexp.MustCompile(`NET/wasm: rank 2: lane (\d) to rank (\d) failed \(.*\); (\d+) operations moved to lane \d, none lost`).FindAllStringSubmatch(out, -1)
			if len(failed) != 3 {
				t.Fatalf("%d lane failovers at rank 2, want 3:\n%s", len(failed), tail(out))
			}
			for _, f := range failed {
				want := fmt.Sprintf("multirail: lane %s failed, the host moved its operations; out of rotation for good for rank %s", f[1], f[2])
				if !strings.Contains(out, want) {
					t.Errorf("multirail did not hear that lane %s to rank %s failed:\n%s", f[1], f[2], tail(out))
				}
			}
			if strings.Contains(out, "ncclRemoteError") || strings.Contains(out, "peer connection lost") {
				t.Fatalf("an operation failed or a peer was lost over one lane:\n%s", tail(out))
			}
		})
	}
}

// TestFdExhaustion lowers RLIMIT_NOFILE in every rank: init, listen and
// connect either succeed or fail cleanly, with ncclSystemError (or
// ncclRemoteError from connect when a peer gave up) and a WARN line, never a
// crash or a hang. Before EnsurePoller the Go runtime aborted the process
// at 8 descriptors ("runtime: eventfd failed").
func TestFdExhaustion(t *testing.T) {
	failed := map[int]int{}
	for _, n := range []int{5, 8, 10, 13, 64} {
		out := runDriver(t, []string{"NCCL_RMA_WASM_CONNECT_TIMEOUT_MS=5000"},
			"--ranks", "3", "--nofile", fmt.Sprint(n), "--size", "64k", "--iters", "1", "--timeout", "30")
		m := regexp.MustCompile(`setup_failed=(\d+)`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("nofile %d: no setup_failed count:\n%s", n, tail(out))
		}
		failed[n], _ = strconv.Atoi(m[1])
		if failed[n] > 0 && !strings.Contains(out, "returned ncclSystemError with a WARN") {
			t.Errorf("nofile %d: ranks gave up but none with ncclSystemError:\n%s", n, tail(out))
		}
		if failed[n] == 0 && strings.Count(out, "] PASS cycles=1") != 3 {
			t.Errorf("nofile %d: no setup failure, yet not every rank moved and verified data:\n%s", n, tail(out))
		}
	}
	if failed[5] != 3 || failed[64] != 0 {
		t.Fatalf("ranks that gave up per limit %v: want all 3 at 5 descriptors and none at 64", failed)
	}
}

// TestFdExhaustionWithLazyLanes: connect failing past its streams (here
// libfabric's address vector, out of descriptors) closes what it opened,
// lanes not yet opened included (a nil stream once made it panic, and the
// call returned ncclInternalError), and returns ncclSystemError with a
// WARN (the soak found it: 5 ranks, 4 lanes, the shm provider, 23 descriptors).
func TestFdExhaustionWithLazyLanes(t *testing.T) {
	needFabric(t)
	out := runDriver(t, append(fabricEnv("shm"), "NCCL_RMA_WASM_CONNECT_TIMEOUT_MS=5000", "NCCL_RMA_WASM_LANES=4", "NCCL_RMA_WASM_INTRANODE=0"),
		"--ranks", "5", "--nofile", "23", "--size", "64k", "--iters", "1", "--timeout", "30")
	if strings.Contains(out, "recovered panic") || strings.Contains(out, "ncclInternalError") {
		t.Fatalf("connect panicked:\n%s", tail(out))
	}
	m := regexp.MustCompile(`setup_failed=(\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no setup_failed count:\n%s", tail(out))
	}
	if m[1] != "0" && !strings.Contains(out, "returned ncclSystemError with a WARN") {
		t.Fatalf("ranks gave up, none with ncclSystemError:\n%s", tail(out))
	}
}

// TestCyclesLeakNothing runs 200 init .. connect .. traffic .. finalize
// cycles (dlclose and dlopen in between) in each of two processes and
// compares the descriptors, resident memory and threads after the first
// and after the last cycle.
func TestCyclesLeakNothing(t *testing.T) {
	out := runDriver(t, nil, "--ranks", "2", "--cycles", "200", "--size", "64k", "--iters", "1", "--timeout", "60")
	re := regexp.MustCompile(`\[rank (\d)\] resources: after cycle 1 fds=(\d+) rss=(\d+) KiB threads=(\d+); after cycle 200 fds=(\d+) rss=(\d+) KiB threads=(\d+)`)
	m := re.FindAllStringSubmatch(out, -1)
	if len(m) != 2 {
		t.Fatalf("%d ranks reported resources after 200 cycles, want 2:\n%s", len(m), tail(out))
	}
	for _, x := range m {
		v := make([]int, 8)
		for i := 2; i < 8; i++ {
			v[i], _ = strconv.Atoi(x[i])
		}
		t.Logf("rank %s: fds %d -> %d, RSS %d -> %d KiB, threads %d -> %d", x[1], v[2], v[5], v[3], v[6], v[4], v[7])
		if v[5] > v[2] {
			t.Errorf("rank %s: %d descriptors open after cycle 1, %d after cycle 200", x[1], v[2], v[5])
		}
		if v[6]-v[3] > 32<<10 {
			t.Errorf("rank %s: resident memory grew by %d KiB over 199 cycles (bound 32 MiB)", x[1], v[6]-v[3])
		}
		if v[7] > v[4]+8 {
			t.Errorf("rank %s: %d threads after cycle 1, %d after cycle 200 (bound +8)", x[1], v[4], v[7])
		}
	}
}
