package sandbox

// The policies of the sample backends in guests/<name>/, driven op by op through
// the sandbox (the end-to-end runs through the plugin are in test/).

import (
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
)

func sampleContext(t *testing.T, name, cfg string) backend.Context {
	t.Helper()
	b := mustOpen(t, testOptions(t, cguest(t, name), cfg))
	c, err := b.NewContext(info)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func plan(t *testing.T, c backend.Context, kind backend.OpKind, peer uint32, size uint64) backend.OpPlan {
	t.Helper()
	p := backend.OpPlan{Lane: -1}
	if err := c.PlanOp(&backend.Op{Kind: kind, Peer: peer, Size: size}, &p); err != nil {
		t.Fatal(err)
	}
	if p.Status != 0 {
		t.Fatalf("op to %d of %d bytes failed with %d", peer, size, p.Status)
	}
	return p
}

// TestMultirailFailover: a failed completion on a lane takes it out of
// rotation for that peer (whole ops on the other lanes, no striping), other
// peers keep striping, a probe goes on the lane after `probe` ops, and a
// successful probe brings it back. No op is ever failed.
func TestMultirailFailover(t *testing.T) {
	c := sampleContext(t, "multirail", "lanes=4,stripe=64k,probe=8")
	const mb = 1 << 20
	if p := plan(t, c, backend.OpPut, 1, mb); p.Lane != -1 || p.ChunkSize != mb/4 {
		t.Fatalf("all lanes up: %+v, want striped in 4 pieces", p)
	}
	if err := c.Completions([]backend.Completion{{Kind: backend.OpPut, Peer: 1, Size: 4096, Lane: 2, Status: 2}}); err != nil {
		t.Fatal(err)
	}
	used := map[int32]int{}
	for i := 0; i < 7; i++ {
		p := plan(t, c, backend.OpPut, 1, mb)
		if p.Lane < 0 || p.Lane == 2 || p.ChunkSize != mb {
			t.Fatalf("op %d after lane 2 failed: %+v, want a whole op on lane 0, 1 or 3", i, p)
		}
		used[p.Lane]++
	}
	if len(used) != 3 {
		t.Fatalf("lanes used %v, want the three that are up", used)
	}
	if p := plan(t, c, backend.OpPut, 0, mb); p.Lane != -1 {
		t.Fatalf("peer 0 lost striping: %+v", p)
	}
	probe := plan(t, c, backend.OpGet, 1, 8192) // the 8th op to peer 1 since the failure
	if probe.Lane != 2 {
		t.Fatalf("no probe on lane 2: %+v", probe)
	}
	if p := plan(t, c, backend.OpPut, 1, mb); p.Lane == 2 || p.Lane < 0 {
		t.Fatalf("lane 2 in rotation before its probe completed: %+v", p)
	}
	if err := c.Completions([]backend.Completion{{Kind: backend.OpGet, Peer: 1, Size: 8192, Lane: 2}}); err != nil {
		t.Fatal(err)
	}
	if p := plan(t, c, backend.OpPut, 1, mb); p.Lane != -1 || p.ChunkSize != mb/4 {
		t.Fatalf("after the probe succeeded: %+v, want striping again", p)
	}
	// Every lane failing still sends every op.
	for l := int32(0); l < 4; l++ {
		c.Completions([]backend.Completion{{Kind: backend.OpPut, Peer: 3, Size: 1, Lane: l, Status: 6}})
	}
	if p := plan(t, c, backend.OpPut, 3, 100); p.Lane < 0 || p.Lane > 3 {
		t.Fatalf("with every lane down: %+v", p)
	}
}

// TestMultirailLaneEvents: a lane the host failed over (an EventLaneDown
// record, FeatureLaneEvents) leaves the rotation for good: no striping
// over it, no probe on it, and a success completion planned on it (an op
// the host moved) does not bring it back.
func TestMultirailLaneEvents(t *testing.T) {
	c := sampleContext(t, "multirail", "lanes=4,stripe=64k,probe=4")
	if le, ok := c.(backend.LaneEventer); !ok || !le.WantsLaneEvents() {
		t.Fatal("multirail does not ask for lane events")
	}
	const mb = 1 << 20
	if err := c.Completions([]backend.Completion{{Kind: backend.EventLaneDown, Peer: 1, Size: 17, Lane: 3, Status: 6}}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 40; i++ {
		p := plan(t, c, backend.OpPut, 1, mb)
		if p.Lane < 0 || p.Lane == 3 || p.ChunkSize != mb {
			t.Fatalf("op %d after lane 3 failed over: %+v, want a whole op on lane 0, 1 or 2, never a probe of 3", i, p)
		}
		// An op planned on lane 3 before the event completes there, fine.
		if err := c.Completions([]backend.Completion{{Kind: backend.OpPut, Peer: 1, Size: mb, Lane: 3}}); err != nil {
			t.Fatal(err)
		}
	}
	if p := plan(t, c, backend.OpPut, 2, mb); p.Lane != -1 || p.ChunkSize != mb/4 {
		t.Fatalf("peer 2 lost striping: %+v", p)
	}
}

// TestMultirailSmallOps: ops below `small` stay on the peer's first lane
// that is up (a stream of them spread over every lane makes the peer read
// every lane), larger ones still go round robin, and small=0 spreads all.
func TestMultirailSmallOps(t *testing.T) {
	c := sampleContext(t, "multirail", "lanes=4,stripe=1m,small=4k,probe=1000")
	lanes := func(peer uint32, size uint64, n int) map[int32]int {
		used := map[int32]int{}
		for i := 0; i < n; i++ {
			p := plan(t, c, backend.OpPut, peer, size)
			if p.Lane < 0 || p.ChunkSize != size {
				t.Fatalf("a %d-byte op: %+v, want it whole on one lane", size, p)
			}
			used[p.Lane]++
		}
		return used
	}
	if used := lanes(1, 8, 12); len(used) != 1 || used[0] != 12 {
		t.Fatalf("8-byte ops on lanes %v, want all on lane 0", used)
	}
	if used := lanes(1, 64<<10, 8); len(used) != 4 {
		t.Fatalf("64 KiB ops on lanes %v, want round robin over 4", used)
	}
	// Lane 0 out: small ops move to the next lane up.
	if err := c.Completions([]backend.Completion{{Kind: backend.OpPut, Peer: 1, Size: 8, Lane: 0, Status: 2}}); err != nil {
		t.Fatal(err)
	}
	if used := lanes(1, 4095, 6); len(used) != 1 || used[1] != 6 {
		t.Fatalf("small ops with lane 0 out on lanes %v, want all on lane 1", used)
	}
	if used := lanes(2, 100, 5); used[0] != 5 {
		t.Fatalf("peer 2's small ops on lanes %v, want lane 0 (only peer 1 lost it)", used)
	}
	c = sampleContext(t, "multirail", "lanes=4,small=0")
	if used := lanes(1, 8, 8); len(used) != 4 {
		t.Fatalf("small=0: 8-byte ops on lanes %v, want round robin", used)
	}
}

// TestChaosSeeded: the same seed gives the same decisions, another seed
// other ones, and the rates follow the configuration.
func TestChaosSeeded(t *testing.T) {
	run := func(seed string) (out []backend.OpPlan) {
		c := sampleContext(t, "chaos", "seed="+seed+",fail_ppm=100000,fail_code=3,delay_ppm=200000,delay_ns=5000")
		for i := 0; i < 5000; i++ {
			p := backend.OpPlan{Lane: -1}
			if err := c.PlanOp(&backend.Op{Kind: backend.OpKind(1 + i%3), Peer: uint32(i % 4), Size: 64}, &p); err != nil {
				t.Fatal(err)
			}
			out = append(out, p)
		}
		return out
	}
	a, b, other := run("42"), run("42"), run("43")
	same, failed, delayed := 0, 0, 0
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("op %d: %+v and %+v with the same seed", i, a[i], b[i])
		}
		if a[i] == other[i] {
			same++
		}
		switch {
		case a[i].Status == 3:
			failed++
		case a[i].Status != 0:
			t.Fatalf("op %d failed with %d, want 3", i, a[i].Status)
		case a[i].DelayNs > 0:
			delayed++
			if a[i].DelayNs > 5000 {
				t.Fatalf("delay %d above delay_ns", a[i].DelayNs)
			}
		}
	}
	if same == len(a) {
		t.Fatal("seeds 42 and 43 decide alike")
	}
	if failed < 400 || failed > 600 || delayed < 850 || delayed > 1150 {
		t.Fatalf("%d failed (want ~500), %d delayed (want ~1000) of 5000", failed, delayed)
	}
}

// TestShaperBuckets: bytes in flight above the burst are paced at the rate,
// per peer and per class; completions drain the bucket.
func TestShaperBuckets(t *testing.T) {
	c := sampleContext(t, "shaper", "put_rate=100m,burst=64k")
	const k64 = 64 << 10
	for i := uint64(0); i < 20; i++ {
		p := plan(t, c, backend.OpPut, 1, k64)
		want := min(i*k64*1e9/(100<<20), 10_000_000)
		if p.DelayNs != want {
			t.Fatalf("put %d: delay %d ns, want %d", i, p.DelayNs, want)
		}
	}
	if p := plan(t, c, backend.OpPut, 2, k64); p.DelayNs != 0 {
		t.Fatalf("another peer's bucket is shared: %+v", p)
	}
	if p := plan(t, c, backend.OpGet, 1, 1<<20); p.DelayNs != 0 {
		t.Fatalf("gets are not limited here: %+v", p)
	}
	var done []backend.Completion
	for i := 0; i < 20; i++ {
		done = append(done, backend.Completion{Kind: backend.OpPut, Peer: 1, Size: k64})
	}
	if err := c.Completions(done); err != nil {
		t.Fatal(err)
	}
	if p := plan(t, c, backend.OpPutSignal, 1, k64); p.DelayNs != 0 {
		t.Fatalf("after the bucket drained: %+v", p)
	}
}

// TestCompressChooses: a trial runs every candidate for `trial` puts, the
// one with the most bytes per ns of completion latency wins for `period`
// puts; small puts try only none and S2; tiny ones and gets get no codec.
func TestCompressChooses(t *testing.T) {
	c := sampleContext(t, "compress", "min=4k,large=256k,trial=2,period=3,zstd_level=3")
	const big = 1 << 20
	s2, zstd := uint32(1|1<<8), uint32(2|3<<8)
	want := []uint32{0, 0, s2, s2, zstd, zstd}
	for i, w := range want {
		if p := plan(t, c, backend.OpPut, 1, big); uint32(p.Codec) != w {
			t.Fatalf("trial put %d: codec %#x, want %#x", i, p.Codec, w)
		}
	}
	// Latencies: none 4 ms, S2 2 ms, zstd 1 ms per MiB.
	var done []backend.Completion
	for _, ns := range []uint64{4e6, 4e6, 2e6, 2e6, 1e6, 1e6} {
		done = append(done, backend.Completion{Kind: backend.OpPut, Peer: 1, Size: big, Latency: ns})
	}
	if err := c.Completions(done); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if p := plan(t, c, backend.OpPutSignal, 1, big); uint32(p.Codec) != zstd {
			t.Fatalf("after the trial, put %d: codec %#x, want zstd", i, p.Codec)
		}
	}
	if p := plan(t, c, backend.OpPut, 1, big); p.Codec != 0 {
		t.Fatalf("the next trial starts with none: %#x", p.Codec)
	}
	// Another peer and the medium class run trials of their own.
	for i, w := range []uint32{0, 0, s2, s2, 0} {
		if p := plan(t, c, backend.OpPut, 2, 64<<10); uint32(p.Codec) != w {
			t.Fatalf("medium put %d: codec %#x, want %#x", i, p.Codec, w)
		}
	}
	if p := plan(t, c, backend.OpPut, 1, 1000); p.Codec != 0 {
		t.Fatalf("a put under min: %#x", p.Codec)
	}
	if p := plan(t, c, backend.OpGet, 1, big); p.Codec != 0 {
		t.Fatalf("a get: %#x", p.Codec)
	}
}
