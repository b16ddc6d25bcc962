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
