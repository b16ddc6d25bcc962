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

// Rails across real NICs: every rank runs in a network namespace of its
// own with two veths, rmaw0 and rmaw1, each to a bridge of its own (rail
// 0: 10.77.0.0/24, rail 1: 10.78.0.0/24) in a further namespace, so
// tcp;ofi_rxm offers two domains (plus loopback) in each rank. With two
// lanes the plugin opens a fabric endpoint on both, stripes large puts,
// puts with signal and gets over them, and the harness verifies every
// byte and signal; the test checks that both veths of every rank carried
// a share of the payload and that the plugin's own per-rail counters agree.

const railRanks, railCount = 3, 2

type railNetns struct {
	t      *testing.T
	prefix string
}

func newRailNetns(t *testing.T) *railNetns {
	t.Helper()
	return &railNetns{t: t, prefix: buildNetns(t, "rmwr", railRanks, railCount)}
}

// txBytes is what rank r's NIC dev sent so far.
func (n *railNetns) txBytes(r int, dev string) uint64 { return nsTxBytes(n.t, n.prefix, r, dev) }

func (n *railNetns) run(env []string, args ...string) string {
	t := n.t
	t.Helper()
	root := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	full := append([]string{"--lib", filepath.Join(root, "build/librccl-rma-wasm.so"), "--netns", n.prefix}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(root, "build/rma_driver"), full...)
	// Every interface of the namespaces is ours: FI_TCP_IFACE (which the
	// loopback tests set) must not narrow the provider to one.
	var base []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FI_TCP_IFACE=") {
			base = append(base, kv)
		}
	}
	cmd.Env = append(append(base, "NCCL_RMA_WASM_ADDR=rmaw0", "NCCL_RMA_WASM_INTRANODE=0", "NCCL_RMA_WASM_CACHE_DIR="+t.TempDir()), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	text := out.String()
	if ctx.Err() != nil {
		t.Fatalf("driver hung (killed after the timeout):\n%s", tail(text))
	}
	if err != nil || !strings.Contains(text, "RESULT PASS") || strings.Contains(text, "] FAIL") {
		t.Fatalf("driver %v failed (%v):\n%s", args, err, tail(text))
	}
	return text
}

func TestFabricRailsNamespaces(t *testing.T) {
	needFabric(t)
	n := newRailNetns(t)
	fab := []string{"NCCL_RMA_WASM_TRANSPORT=fabric", "NCCL_RMA_WASM_FI_PROVIDER=tcp;ofi_rxm"}
	t.Run("lanes", func(t *testing.T) {
		n.t = t
		n.railRun(append(fab, "NCCL_RMA_WASM_LANES=2"))
	})
	// The backend's connection plan chooses rails as it chooses lanes: the
	// multirail sample asks for 4 lanes and stripes ops of 256 KiB or more
	// itself (plan.chunk_size); 4 lanes over 2 NICs are 2 rails.
	t.Run("multirail-backend", func(t *testing.T) {
		n.t = t
		root := buildGuests(t)
		n.railRun(append(fab, "NCCL_RMA_WASM_BACKEND=multirail", "NCCL_RMA_WASM_DIR="+filepath.Join(root, "build/guests"),
			"NCCL_RMA_WASM_CONFIG=lanes=4,stripe=256k"))
	})
}

// railRun runs 3 ranks over both veths with env and checks the rails, the
// plugin's per-rail counts and the veths' own.
func (n *railNetns) railRun(env []string) {
	t := n.t
	t.Helper()
	const size, iters = 4 << 20, 3
	var before [railRanks][railCount]uint64
	for r := range before {
		for k := range before[r] {
			before[r][k] = n.txBytes(r, fmt.Sprintf("rmaw%d", k))
		}
	}
	// Device 0 is one of the veths (libfabric lists loopback last); its
	// rails are it and the other veth.
	out := n.run(env, "--verbose", "--ranks", fmt.Sprint(railRanks), "--size", fmt.Sprint(size), "--iters", fmt.Sprint(iters), "--threads", "2", "--timeout", "60")
	checkFabric(t, out, "tcp;ofi_rxm", railRanks)
	rails := regexp.MustCompile(`rank (\d+): 2 fabric rails \[(rmaw[01]) (rmaw[01])\]`).FindAllStringSubmatch(out, -1)
	if len(rails) != railRanks {
		t.Fatalf("%d ranks opened two rails on the veths, want %d:\n%s", len(rails), railRanks, tail(out))
	}
	for _, m := range rails {
		if m[2] == m[3] {
			t.Fatalf("rank %s: both rails on %s", m[1], m[2])
		}
	}
	// The plugin's own count, per rail, at close.
	counted := regexp.MustCompile(`rank (\d+): bytes put and got by fabric rail: rail 0 \((rmaw[01])\) (\d+) rail 1 \((rmaw[01])\) (\d+)`).FindAllStringSubmatch(out, -1)
	if len(counted) != railRanks {
		t.Fatalf("%d ranks logged their rail bytes, want %d:\n%s", len(counted), railRanks, tail(out))
	}
	for _, m := range counted {
		b0, _ := strconv.ParseUint(m[3], 10, 64)
		b1, _ := strconv.ParseUint(m[5], 10, 64)
		if b0 == 0 || b1 == 0 {
			t.Errorf("rank %s: rail bytes %d (%s) and %d (%s): a rail carried nothing", m[1], b0, m[2], b1, m[4])
		}
		t.Logf("rank %s: the plugin counted %d bytes on %s, %d on %s", m[1], b0, m[2], b1, m[4])
	}
	// What the NICs saw: each rank puts size bytes to each of the other
	// ranks per round and serves their gets of size bytes; striped over
	// two rails, each veth must have sent a good part of it (a quarter,
	// leaving room for pieces the plan puts on one lane), and both
	// together all of it.
	want := uint64(2 * (railRanks - 1) * size * iters)
	for r := 0; r < railRanks; r++ {
		var sum uint64
		for k := 0; k < railCount; k++ {
			dev := fmt.Sprintf("rmaw%d", k)
			sent := n.txBytes(r, dev) - before[r][k]
			sum += sent
			t.Logf("rank %d: %s sent %d bytes (%.0f%% of the %d payload bytes)", r, dev, sent, 100*float64(sent)/float64(want), want)
			if sent < want/4 {
				t.Errorf("rank %d: %s sent %d bytes, less than a quarter of the %d the rank put and served", r, dev, sent, want)
			}
		}
		if sum < want {
			t.Errorf("rank %d: its veths sent %d bytes, less than the %d it put and served", r, sum, want)
		}
	}
}
