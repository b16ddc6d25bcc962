package endpoint

import (
	"testing"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric"
)

// TestRegsAnswers: a table's key, descriptor and device answers by id,
// under each memory-registration mode, and for ids it does not hold.
func TestRegsAnswers(t *testing.T) {
	d1, d2 := unsafe.Pointer(new(byte)), unsafe.Pointer(new(byte))
	mrs := []fabric.MR{1: {Key: 11, Desc: d1}, 2: {Key: 12, Desc: d2, Dev: true}}
	for _, c := range []struct {
		mode   uint64
		d1, d2 unsafe.Pointer
	}{
		{0, nil, nil},
		{fabric.MRLocal, d1, d2},
		{fabric.MRHMEM, nil, d2}, // device buffers need theirs
		{fabric.MRLocal | fabric.MRHMEM, d1, d2},
	} {
		r := NewRegs(nil, c.mode, mrs)
		if r.Desc(1) != c.d1 || r.Desc(2) != c.d2 || r.Desc(3) != nil {
			t.Errorf("mode %#x: descriptors %p %p %p, want %p %p nil", c.mode, r.Desc(1), r.Desc(2), r.Desc(3), c.d1, c.d2)
		}
	}
	r := NewRegs(nil, 0, mrs)
	mrs[1].Key = 99 // the table holds its own copy
	if r.Key(1) != 11 || r.Key(2) != 12 || r.Key(0) != 0 || r.Key(7) != 0 {
		t.Errorf("keys %d %d %d %d, want 11 12 0 0", r.Key(1), r.Key(2), r.Key(0), r.Key(7))
	}
	if r.DevDirect(1) || !r.DevDirect(2) || r.DevDirect(7) {
		t.Errorf("device answers %v %v %v, want false true false", r.DevDirect(1), r.DevDirect(2), r.DevDirect(7))
	}
	r.Deregister(7) // not held: nothing to do
}

// TestRegsRegister: registrations on a real endpoint get their keys, go
// on Deregister, and none is made after Release.
func TestRegsRegister(t *testing.T) {
	es, _ := open2(t)
	r := es[0].Regs
	buf := fabric.Alloc(4096)
	defer fabric.Free(buf)
	k3, err := r.Register(3, fabric.MRRequest{Base: buf, Len: 4096, DMABUFFd: -1})
	if err != nil {
		t.Fatal(err)
	}
	k1, err := r.Register(1, fabric.MRRequest{Base: buf, Len: 0, DMABUFFd: -1}) // empty: one byte
	if err != nil {
		t.Fatal(err)
	}
	if r.Key(3) != k3 || r.Key(1) != k1 || r.Key(2) != 0 || r.DevDirect(3) {
		t.Fatalf("keys %d %d %d (want %d %d 0), device %v", r.Key(3), r.Key(1), r.Key(2), k3, k1, r.DevDirect(3))
	}
	r.Deregister(3)
	if r.Key(3) != 0 || r.Key(1) != k1 {
		t.Fatalf("after deregistering 3: keys %d %d", r.Key(3), r.Key(1))
	}
	r.close() // as Release does; Release's own call finds nothing more
	if _, err := r.Register(4, fabric.MRRequest{Base: buf, Len: 64, DMABUFFd: -1}); err == nil {
		t.Fatal("a registration after close succeeded")
	}
}
