package sandbox

import (
	"strings"
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
)

// TestV11Fields: a v1.1 guest's chunk, delay, codec and transport reach
// the host only with the feature bits it enabled, and are checked.
func TestV11Fields(t *testing.T) {
	wasm := cguest(t, "plan11")
	zstd3 := backend.Codec(guestabi.Codec(guestabi.CodecZstd, 3))
	s2 := backend.Codec(guestabi.Codec(guestabi.CodecS2, 0))

	b := mustOpen(t, testOptions(t, wasm, "codec=1, op_codec=2, op_level=3, op_min=1000, chunk=65536, delay=5000, transport=3"))
	p, err := b.ConnectionPlan(2, 0)
	if err != nil || p.Codec != s2 || p.Transport != backend.TransportFabric {
		t.Fatalf("conn plan %+v, %v; want codec %#x transport fabric", p, err, s2)
	}
	c, err := b.NewContext(info)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, x := range []struct {
		size  uint64
		codec backend.Codec
	}{{999, s2}, {1000, zstd3}} {
		plan := backend.OpPlan{Lane: -1, Codec: p.Codec}
		if err := c.PlanOp(&backend.Op{Kind: backend.OpPut, Peer: 1, Size: x.size}, &plan); err != nil {
			t.Fatal(err)
		}
		if plan.Codec != x.codec || plan.ChunkSize != 65536 || plan.DelayNs != 5000 || plan.Status != 0 {
			t.Fatalf("size %d: plan %+v, want codec %#x chunk 65536 delay 5000", x.size, plan, x.codec)
		}
	}
	op, plan := &backend.Op{Kind: backend.OpPut, Peer: 1, Size: 4096}, &backend.OpPlan{}
	if a := testing.AllocsPerRun(200, func() {
		*plan = backend.OpPlan{Lane: -1, Codec: p.Codec}
		_ = c.PlanOp(op, plan)
	}); a != 0 {
		t.Fatalf("PlanOp with v1.1 fields: %v allocs", a)
	}

	// Only compression: chunk and delay written by nobody stay 0, even if
	// the runtime's pre-fill were stale.
	b2 := mustOpen(t, testOptions(t, wasm, "codec=2, level=4"))
	p2, _ := b2.ConnectionPlan(2, 0)
	if p2.Codec != backend.Codec(guestabi.Codec(guestabi.CodecZstd, 4)) || p2.Transport != backend.TransportAuto {
		t.Fatalf("conn plan %+v", p2)
	}
	c2, err := b2.NewContext(info)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if c2.PlansOps() {
		t.Fatal("a guest without plan_op features plans ops")
	}
}

// TestV11Nonsense: out-of-range v1.1 answers are nonsense (a fault), and
// fields whose feature is off are ignored.
func TestV11Nonsense(t *testing.T) {
	wasm := cguest(t, "plan11")
	for _, x := range []struct{ cfg, want string }{
		{"delay=10000001", "delay 10000001 ns above the cap"},
		{"chunk=2000000000000", "chunk size 2000000000000 above 2^40"},
		{"op_codec=3", "unknown codec word 0x3"},
		{"op_codec=1, op_level=3", "unknown codec word 0x301"},
		{"op_codec=2, op_level=5", "unknown codec word 0x502"},
	} {
		b := mustOpen(t, testOptions(t, wasm, x.cfg))
		c, err := b.NewContext(info)
		if err != nil {
			t.Fatal(err)
		}
		plan := backend.OpPlan{Lane: -1}
		err = c.PlanOp(&backend.Op{Kind: backend.OpPut, Size: 8}, &plan)
		if err == nil || !strings.Contains(err.Error(), x.want) {
			t.Errorf("%s: %v, want %q", x.cfg, err, x.want)
		}
		c.Close()
	}
	for _, x := range []struct{ cfg, want string }{
		{"codec=7", "unknown codec word 0x7"},
		{"transport=4", "unknown transport 4"},
	} {
		b := mustOpen(t, testOptions(t, wasm, x.cfg))
		if _, err := b.ConnectionPlan(2, 0); err == nil || !strings.Contains(err.Error(), x.want) {
			t.Errorf("%s: %v, want %q", x.cfg, err, x.want)
		}
	}
}

// TestV1GuestsUnchanged: the v1 guests (embedded default, C planner, Go
// passthrough) load on this v1.1 host, enable no v1.1 bit, and plan as
// before: the host zeroes and ignores the v1.1 fields for them.
func TestV1GuestsUnchanged(t *testing.T) {
	b := mustOpen(t, testOptions(t, cguest(t, "planner"), "lanes=4, stripe=1k, completions=0"))
	c, err := b.NewContext(info)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	gc := c.(*guestContext)
	if gc.in.features&^guestabi.FeaturesV1 != 0 {
		t.Fatalf("v1 planner enabled %#x", gc.in.features)
	}
	plan := backend.OpPlan{Lane: -1, Codec: 5, ChunkSize: 77, DelayNs: 99}
	if err := c.PlanOp(&backend.Op{Kind: backend.OpPut, Peer: 2, Size: 8}, &plan); err != nil {
		t.Fatal(err)
	}
	if plan.Lane != 2 || plan.Codec != 5 || plan.ChunkSize != 77 || plan.DelayNs != 99 {
		t.Fatalf("v1 guest's plan %+v: lane 2 expected, v1.1 fields untouched", plan)
	}
	if cp, err := b.ConnectionPlan(2, 0); err != nil || cp.Codec != 0 || cp.Lanes != 4 {
		t.Fatalf("v1 conn plan %+v %v", cp, err)
	}
	d := mustOpen(t, testOptions(t, "default", ""))
	if d.ctl.features != 0 {
		t.Fatalf("default enabled %#x", d.ctl.features)
	}
}

// TestPlanBatch: rmaw_plan_ops plans a batch in one call with the same
// fields as plan_op, allocation-free, and its answers are checked.
func TestPlanBatch(t *testing.T) {
	wasm := cguest(t, "plan11")
	b := mustOpen(t, testOptions(t, wasm, "batch=1, codec=1, op_codec=2, op_min=100, chunk=8192"))
	c, err := b.NewContext(info)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	bp, ok := c.(backend.BatchPlanner)
	if !ok || bp.BatchCap() != 64 {
		t.Fatalf("batch planner %v, cap %d; want 64 (128 completion slots)", ok, bp.BatchCap())
	}
	s2 := backend.Codec(guestabi.Codec(guestabi.CodecS2, 0))
	ops := make([]backend.Op, 64)
	plans := make([]backend.OpPlan, 64)
	fill := func() {
		for i := range ops {
			ops[i] = backend.Op{Kind: backend.OpPut, Peer: uint32(i % 3), Size: uint64(i * 10)}
			plans[i] = backend.OpPlan{Lane: -1, Codec: s2}
		}
	}
	fill()
	if err := bp.PlanOps(ops, plans); err != nil {
		t.Fatal(err)
	}
	for i, p := range plans {
		want := s2
		if ops[i].Size >= 100 {
			want = backend.Codec(guestabi.Codec(guestabi.CodecZstd, 0))
		}
		if p.Codec != want || p.ChunkSize != 8192 || p.Lane != -1 || p.Status != 0 {
			t.Fatalf("record %d: %+v, want codec %#x chunk 8192", i, p, want)
		}
	}
	if a := testing.AllocsPerRun(50, func() { fill(); _ = bp.PlanOps(ops, plans) }); a != 0 {
		t.Fatalf("PlanOps: %v allocations per batch", a)
	}
	if err := bp.PlanOps(make([]backend.Op, 65), make([]backend.OpPlan, 65)); err == nil {
		t.Fatal("a batch above the capacity was accepted")
	}

	// Per-record statuses: 1..6 fail the op; anything else is nonsense.
	b2 := mustOpen(t, testOptions(t, wasm, "batch=1, batch_status=4"))
	c2, _ := b2.NewContext(info)
	defer c2.Close()
	fill()
	if err := c2.(backend.BatchPlanner).PlanOps(ops[:3], plans[:3]); err != nil || plans[2].Status != 4 {
		t.Fatalf("status 4: %v %+v", err, plans[2])
	}
	b3 := mustOpen(t, testOptions(t, wasm, "batch=1, batch_status=9"))
	c3, _ := b3.NewContext(info)
	defer c3.Close()
	fill()
	if err := c3.(backend.BatchPlanner).PlanOps(ops[:3], plans[:3]); err == nil || !strings.Contains(err.Error(), "status 9") {
		t.Fatalf("status 9: %v", err)
	}
	// A v1 guest has no batches.
	b4 := mustOpen(t, testOptions(t, cguest(t, "planner"), ""))
	c4, _ := b4.NewContext(info)
	defer c4.Close()
	if c4.(backend.BatchPlanner).BatchCap() != 0 {
		t.Fatal("the v1 planner got a batch capacity")
	}
}
