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
	"testing"
	"time"
)

// Several hosts on one machine: every rank runs in a network namespace of
// its own (the harness's --netns), joined to the others by a veth pair to a
// bridge in a further namespace, so its TCP streams cross a link as they
// would between hosts. The intra-node path is off except in
// TestNamespacesNotIntraNode, which checks that the host id (it hashes the
// namespaces in) keeps ranks in different namespaces off it, and the
// test checks that the bytes really crossed the veths. tbf limits each
// rank's egress; a bridge port taken down and up again stalls a rank's
// link; ss -K in a rank's namespace resets its connections. Nothing outside
// the namespaces this test creates is touched; they are removed at the end
// whatever happens.

const nsRanks = 3

type netns struct {
	t      *testing.T
	prefix string // rank r's namespace is prefix<r>; the bridge's prefix+"br"
}

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// buildNetns creates ranks network namespaces named prefix<r>, each with
// nics veths rmaw<k> (10.<77+k>.0.<r+1>/24) joined to bridge br<k> in a
// namespace prefix+"br" (rank r's port on bridge k is p<r>-<k>), and
// removes them all when the test ends; it skips the test saying why where
// namespaces cannot be made.
func buildNetns(t *testing.T, tag string, ranks, nics int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("needs root to create network namespaces (ip netns) with %d NIC(s) per rank", nics)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no ip command (iproute2)")
	}
	prefix := fmt.Sprintf("%s%d-%d-", tag, os.Getpid(), time.Now().UnixNano()%100000)
	br := prefix + "br"
	if err := ipCmd("netns", "add", br); err != nil {
		t.Skipf("ip netns does not work here: %v", err)
	}
	t.Cleanup(func() {
		for r := 0; r < ranks; r++ {
			if err := ipCmd("netns", "del", fmt.Sprintf("%s%d", prefix, r)); err != nil {
				t.Log(err)
			}
		}
		if err := ipCmd("netns", "del", br); err != nil {
			t.Log(err)
		}
	})
	var steps [][]string
	for k := 0; k < nics; k++ {
		steps = append(steps, []string{"-n", br, "link", "add", fmt.Sprintf("br%d", k), "type", "bridge"},
			[]string{"-n", br, "link", "set", fmt.Sprintf("br%d", k), "up"})
	}
	for r := 0; r < ranks; r++ {
		ns := fmt.Sprintf("%s%d", prefix, r)
		steps = append(steps, []string{"netns", "add", ns}, []string{"-n", ns, "link", "set", "lo", "up"})
		for k := 0; k < nics; k++ {
			dev, port := fmt.Sprintf("rmaw%d", k), fmt.Sprintf("p%d-%d", r, k)
			steps = append(steps,
				[]string{"-n", ns, "link", "add", dev, "type", "veth", "peer", "name", port, "netns", br},
				[]string{"-n", ns, "addr", "add", fmt.Sprintf("10.%d.0.%d/24", 77+k, r+1), "dev", dev},
				[]string{"-n", ns, "link", "set", dev, "up"},
				[]string{"-n", br, "link", "set", port, "master", fmt.Sprintf("br%d", k)},
				[]string{"-n", br, "link", "set", port, "up"})
		}
	}
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			t.Fatal(err)
		}
	}
	return prefix
}

// nsTxBytes is what rank r's interface dev sent so far.
func nsTxBytes(t *testing.T, prefix string, r int, dev string) uint64 {
	out, err := exec.Command("ip", "netns", "exec", fmt.Sprintf("%s%d", prefix, r), "cat", "/sys/class/net/"+dev+"/statistics/tx_bytes").Output()
	if err != nil {
		t.Fatalf("tx_bytes of rank %d %s: %v", r, dev, err)
	}
	v, _ := strconv.ParseUint(strings.TrimSpace(string(out)), 10, 64)
	return v
}

// newNetns builds the namespaces, one veth per rank, with a tbf rate
// limit on each rank's egress where rate is set.
func newNetns(t *testing.T, rate string) *netns {
	t.Helper()
	n := &netns{t: t, prefix: buildNetns(t, "rmaw", nsRanks, 1)}
	if rate != "" {
		for r := 0; r < nsRanks; r++ {
			ns := fmt.Sprintf("%s%d", n.prefix, r)
			out, err := exec.Command("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "rmaw0", "root",
				"tbf", "rate", rate, "burst", "256kb", "latency", "100ms").CombinedOutput()
			if err != nil {
				t.Fatalf("tc tbf in %s: %v: %s", ns, err, out)
			}
		}
	}
	return n
}

// txBytes is what rank r's veth sent so far.
func (n *netns) txBytes(r int) uint64 { return nsTxBytes(n.t, n.prefix, r, "rmaw0") }

// run starts the driver with its ranks in the namespaces; during (if not
// nil) runs while it does. It returns the output and the wall time.
func (n *netns) run(during func(), args ...string) (string, time.Duration) {
	n.t.Helper()
	return n.runEnv(nil, during, args...)
}

// runEnv is run with extra variables, which win over run's.
func (n *netns) runEnv(env []string, during func(), args ...string) (string, time.Duration) {
	t := n.t
	t.Helper()
	root := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	full := append([]string{"--lib", filepath.Join(root, "build/librccl-rma-wasm.so"), "--netns", n.prefix}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(root, "build/rma_driver"), full...)
	cmd.Env = append(append(os.Environ(), "NCCL_RMA_WASM_ADDR=rmaw0", "NCCL_RMA_WASM_INTRANODE=0", "NCCL_RMA_WASM_CACHE_DIR="+t.TempDir()), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if during != nil {
		during()
	}
	err := cmd.Wait()
	took := time.Since(start)
	text := out.String()
	if ctx.Err() != nil {
		t.Fatalf("driver hung (killed after the timeout):\n%s", tail(text))
	}
	if err != nil || !strings.Contains(text, "RESULT PASS") || strings.Contains(text, "] FAIL") {
		t.Fatalf("driver %v failed (%v):\n%s", args, err, tail(text))
	}
	return text, took
}

var aggregate = regexp.MustCompile(`aggregate=([0-9.]+) MB/s per_rank=([0-9.]+) MB/s`)

// TestNamespacesNotIntraNode: with the intra-node path on (the default),
// ranks of one machine in different network namespaces have different
// host ids (the namespaces are hashed in), so each reaches the others
// over TCP through the veths, never the intra-node path; every byte and
// signal is verified by the harness.
func TestNamespacesNotIntraNode(t *testing.T) {
	n := newNetns(t, "")
	size := 1 << 20
	var before [nsRanks]uint64
	for r := range before {
		before[r] = n.txBytes(r)
	}
	out, _ := n.runEnv([]string{"NCCL_RMA_WASM_INTRANODE=1"}, nil, "--summary", "--ranks", fmt.Sprint(nsRanks),
		"--size", fmt.Sprint(size), "--iters", "1", "--timeout", "60")
	if rows := regexp.MustCompile(`(?m)^  \d +\S+ +\d+ +- +0-2 `).FindAllString(out, -1); len(rows) != nsRanks {
		t.Fatalf("%d summary rows show every peer over TCP only, want %d:\n%s", len(rows), nsRanks, tail(out))
	}
	for r := 0; r < nsRanks; r++ {
		if sent, want := n.txBytes(r)-before[r], uint64((nsRanks-1)*size); sent < want {
			t.Errorf("rank %d's veth sent %d bytes, less than the %d it put", r, sent, want)
		}
	}
}

// TestNamespaces moves data between ranks in separate namespaces under a
// tbf rate limit, with a link stalled for two seconds, and with every
// connection of one rank reset; every byte and signal is verified by the
// harness each time.
func TestNamespaces(t *testing.T) {
	n := newNetns(t, "400mbit")
	size, iters := 2<<20, 3

	t.Run("tbf", func(t *testing.T) {
		n.t = t
		var before [nsRanks]uint64
		for r := range before {
			before[r] = n.txBytes(r)
		}
		out, took := n.run(nil, "--summary", "--ranks", fmt.Sprint(nsRanks), "--size", fmt.Sprint(size),
			"--iters", fmt.Sprint(iters), "--threads", "2", "--timeout", "60")
		// No rank may list a peer on the intra-node path: all are TCP only.
		if rows := regexp.MustCompile(`(?m)^  \d +\S+ +\d+ +- +0-2 `).FindAllString(out, -1); len(rows) != nsRanks {
			t.Fatalf("%d summary rows show every peer over TCP only, want %d:\n%s", len(rows), nsRanks, tail(out))
		}
		for r := 0; r < nsRanks; r++ {
			// Each rank puts size bytes to each of the 2 other ranks per
			// round (and serves their gets of size bytes): all of it
			// must have left through its veth.
			sent, want := n.txBytes(r)-before[r], uint64(2*(nsRanks-1)*size*iters)
			if sent < want {
				t.Errorf("rank %d's veth sent %d bytes, less than the %d the rank put and served", r, sent, want)
			}
		}
		m := aggregate.FindStringSubmatch(out)
		t.Logf("3 namespaces, tbf 400 mbit (50 MB/s) per rank egress: %s MB/s aggregate, %s MB/s per rank; run %.2f s", m[1], m[2], took.Seconds())
	})

	t.Run("stall", func(t *testing.T) {
		n.t = t
		// Rank 1's link goes down for 2 s a second into a longer run:
		// TCP retransmits, nothing fails (the peer timeout is 60 s), and
		// every byte still arrives.
		stall := func() {
			time.Sleep(time.Second)
			if err := ipCmd("-n", n.prefix+"br", "link", "set", "p1-0", "down"); err != nil {
				t.Error(err)
			}
			time.Sleep(2 * time.Second)
			if err := ipCmd("-n", n.prefix+"br", "link", "set", "p1-0", "up"); err != nil {
				t.Error(err)
			}
		}
		out, took := n.run(stall, "--ranks", fmt.Sprint(nsRanks), "--size", fmt.Sprint(size),
			"--iters", "8", "--threads", "2", "--timeout", "60")
		m := aggregate.FindStringSubmatch(out)
		t.Logf("a 2 s link stall of rank 1 under tbf: every byte verified, run %.2f s, %s MB/s aggregate", took.Seconds(), m[1])
	})

	t.Run("reset", func(t *testing.T) {
		n.t = t
		out, _ := n.run(nil, "--ranks", fmt.Sprint(nsRanks), "--scenario", "fault", "--fault", "reset",
			"--kill-rank", "2", "--size", fmt.Sprint(size), "--iters", "1", "--timeout", "30")
		if regexp.MustCompile(`reset [1-9]\d* TCP connections of rank 2`).FindString(out) == "" {
			t.Fatalf("no connection was reset:\n%s", tail(out))
		}
		faultRuns(t, out, "reset", nsRanks)
	})
}
