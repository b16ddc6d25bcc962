package sandbox

import (
	"testing"
	"unsafe"
)

func TestMmapMemory(t *testing.T) {
	const max = 8 << 20
	lm := mmapAllocator{}.Allocate(0, max)
	m, ok := lm.(*mmapMemory)
	if !ok {
		t.Fatalf("allocator fell back to %T", lm)
	}
	if len(m.res) != max {
		t.Fatalf("reserved %d bytes, want the max %d", len(m.res), max)
	}
	if a := uintptr(unsafe.Pointer(unsafe.SliceData(m.res))); a%hugePage != 0 {
		t.Errorf("reservation at %#x is not 2 MiB aligned", a)
	}
	b := lm.Reallocate(64 << 10)
	if len(b) != 64<<10 || cap(b) != 64<<10 {
		t.Fatalf("len %d cap %d", len(b), cap(b))
	}
	b[len(b)-1] = 1
	c := lm.Reallocate(3 << 20)
	if &c[0] != &b[0] || c[len(b)-1] != 1 || c[len(c)-1] != 0 {
		t.Fatal("memory moved or lost its contents on grow")
	}
	c[len(c)-1] = 2
	if lm.Reallocate(max+64<<10) != nil {
		t.Fatal("grew past the max")
	}
	if d := lm.Reallocate(max); len(d) != max || &d[0] != &b[0] {
		t.Fatal("cannot grow to the max")
	}
	n := liveReservations.Load()
	lm.Free()
	lm.Free() // idempotent
	if liveReservations.Load() != n-1 {
		t.Fatal("Free did not release the reservation")
	}
	if lm.Reallocate(64<<10) != nil {
		t.Fatal("Reallocate after Free")
	}
}

// TestGuestMemoryStaysPut: a host view of guest memory stays valid across
// memory.grow, and closing instances unmaps their memories.
func TestGuestMemoryStaysPut(t *testing.T) {
	before := liveReservations.Load()
	o := testOptions(t, wat(t, "grow"), "")
	o.MemoryLimitMiB = 256
	b, err := open(o)
	if err != nil {
		t.Fatal(err)
	}
	c, err := b.NewContext(info)
	if err != nil {
		t.Fatal(err)
	}
	if n := liveReservations.Load() - before; n != 2 {
		t.Fatalf("%d reservations for a control instance and a context, want 2", n)
	}
	mem := c.(*guestContext).in.mem
	view, ok := mem.Read(0, 16)
	if !ok {
		t.Fatal("read")
	}
	pages := mem.Size() / 65536
	if _, ok := mem.Grow(256); !ok {
		t.Fatal("grow within the cap refused")
	}
	after, _ := mem.Read(0, 16)
	if &after[0] != &view[0] || mem.Size()/65536 != pages+256 {
		t.Fatalf("memory moved (%p -> %p) or did not grow", &view[0], &after[0])
	}
	if _, ok := mem.Grow(256*16 - pages - 256 + 1); ok {
		t.Fatal("grew past the 256 MiB cap")
	}
	c.Close()
	b.Close()
	if n := liveReservations.Load() - before; n != 0 {
		t.Fatalf("%d guest memories still mapped after Close", n)
	}
}
