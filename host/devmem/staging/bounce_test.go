package staging

import (
	"bytes"
	"encoding/binary"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/devtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx/logtest"
)

const asyncCaps = devmem.CapWriteWord | devmem.CapAsync

// asyncSetup registers d, turns asynchronous copies on and gives context
// 1 its bounce slots; everything is undone at cleanup.
func asyncSetup(t *testing.T, d devmem.Device, ctxs ...uintptr) {
	t.Helper()
	devmem.Register(d)
	SetAsyncCopy(64 << 10)
	for _, c := range append([]uintptr{1}, ctxs...) {
		Prewarm(c, 64<<10)
	}
	t.Cleanup(func() {
		Release()
		SetAsyncCopy(0)
		devmem.Register(nil)
	})
}

func pattern(n, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(seed*131 + i*7 + i>>8)
	}
	return b
}

// TestLandAsync: a small payload lands without a synchronous copy, its copy
// still queued when LandOnDevice returns, and the never-reset signal
// written after it becomes visible only after the payload.
func TestLandAsync(t *testing.T) {
	d := newStreamDevice(1<<20, asyncCaps, 2*time.Millisecond)
	asyncSetup(t, d)
	sh := NewShadow(d.Base+4096, 64)
	for k, n := range []int{8, 64, 4096, 64 << 10} {
		p := pattern(n, k)
		dst := d.Base + uintptr(8192+k*(64<<10))
		sync0 := d.Copies.Load()
		if err := LandOnDevice(bytes.NewReader(p), 1, dst, uint64(n), 0); err != nil {
			t.Fatal(err)
		}
		if d.Copies.Load() != sync0 {
			t.Fatalf("%d bytes: a synchronous copy on the target's path", n)
		}
		if bytes.Equal(d.peek(dst, uint64(n)), p) {
			t.Fatalf("%d bytes: the payload landed before LandOnDevice returned: not asynchronous", n)
		}
		sig := d.Base + 4096 + uintptr(8*k)
		if err := AddSignal(1, sig, 1, sh); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(time.Minute)
		for d.peekWord(sig) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%d bytes: no signal", n)
			}
			time.Sleep(50 * time.Microsecond)
		}
		if !bytes.Equal(d.peek(dst, uint64(n)), p) {
			t.Fatalf("%d bytes: signal visible before the payload", n)
		}
	}
	// One past the bounce size takes the synchronous path.
	n := 64<<10 + 1
	if err := LandOnDevice(bytes.NewReader(pattern(n, 9)), 1, d.Base+8192, uint64(n), 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(d.peek(d.Base+8192, uint64(n)), pattern(n, 9)) {
		t.Fatal("a large payload did not land before LandOnDevice returned")
	}
}

// TestSyncCopiesFollowAsync: a synchronous copy (a large put, a get, a
// read-modify-write of a signal) starts after the asynchronous copies
// queued before it executed, so it neither overtakes an earlier write to
// the same bytes nor reads them stale.
func TestSyncCopiesFollowAsync(t *testing.T) {
	d := newStreamDevice(1<<20, asyncCaps, 3*time.Millisecond)
	asyncSetup(t, d)
	a, x, y := d.Base+4096, pattern(4096, 1), pattern(4096, 2)
	// A get (WriteFromDevice) after an asynchronous put reads the put.
	if err := LandOnDevice(bytes.NewReader(x), 1, a, 4096, 0); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	if err := WriteFromDevice(&got, 1, a, 4096, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), x) {
		t.Fatal("a get read device memory before the put queued ahead of it landed")
	}
	// A synchronous write after an asynchronous one to the same bytes wins.
	if err := LandOnDevice(bytes.NewReader(y), 1, a, 4096, 0); err != nil {
		t.Fatal(err)
	}
	if err := ReadToDevice(bytes.NewReader(x), 1, a, 4096, 0); err != nil {
		t.Fatal(err)
	}
	if err := Quiesce(1); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(d.peek(a, 4096), x) {
		t.Fatal("an earlier asynchronous copy overwrote a later synchronous one")
	}
	// A read-modify-write of a signal (no shadow) follows the payload.
	if err := LandOnDevice(bytes.NewReader(y), 1, a, 4096, 0); err != nil {
		t.Fatal(err)
	}
	sig := d.Base + 64
	if err := AddSignal(1, sig, 1, nil); err != nil {
		t.Fatal(err)
	}
	if d.peekWord(sig) != 1 || !bytes.Equal(d.peek(a, 4096), y) {
		t.Fatal("a read-modify-write signal was applied before its payload landed")
	}
}

// twoStreams is a device whose contexts 1 and 2 have a stream each over
// one memory, context 1's slow: a signal written on context 2's stream
// must still follow a payload queued on context 1's.
type twoStreams struct {
	*streamDevice // context 1
	two           *streamDevice
}

func (d *twoStreams) of(ctx uintptr) *streamDevice {
	if ctx == 2 {
		return d.two
	}
	return d.streamDevice
}
func (d *twoStreams) WriteWord(ctx, addr uintptr, v uint64) error {
	return d.of(ctx).WriteWord(ctx, addr, v)
}
func (d *twoStreams) HtoDAsync(ctx, dst uintptr, src unsafe.Pointer, n uint64) error {
	return d.of(ctx).HtoDAsync(ctx, dst, src, n)
}
func (d *twoStreams) DtoHAsync(ctx uintptr, dst unsafe.Pointer, src uintptr, n uint64) error {
	return d.of(ctx).DtoHAsync(ctx, dst, src, n)
}
func (d *twoStreams) Record(ctx uintptr, ev *uintptr) error { return d.of(ctx).Record(ctx, ev) }
func (d *twoStreams) Passed(ctx, ev uintptr) (bool, error)  { return d.of(ctx).Passed(ctx, ev) }
func (d *twoStreams) Sync(ctx uintptr) error                { return d.of(ctx).Sync(ctx) }

func TestSignalFollowsOtherContextsCopies(t *testing.T) {
	one := newStreamDevice(1<<20, asyncCaps, 5*time.Millisecond)
	two := newStreamDevice(0, asyncCaps, 0)
	two.Mem, two.Base, two.Exec = one.Mem, one.Base, one.Exec
	d := &twoStreams{streamDevice: one, two: two}
	asyncSetup(t, d, 2)
	sh := NewShadow(d.Base, 64)
	for k := range 3 {
		p := pattern(4096, k)
		a := d.Base + 4096
		if err := LandOnDevice(bytes.NewReader(p), 1, a, 4096, 0); err != nil {
			t.Fatal(err)
		}
		if err := AddSignal(2, d.Base+8, 1, sh); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(time.Minute)
		for d.peekWord(d.Base+8) != uint64(k+1) {
			if time.Now().After(deadline) {
				t.Fatal("no signal")
			}
			time.Sleep(20 * time.Microsecond)
		}
		if !bytes.Equal(d.peek(a, 4096), p) {
			t.Fatalf("round %d: the signal on context 2 was visible before the payload queued on context 1", k)
		}
	}
}

// TestBounceSlotsRecycle: many more small payloads than slots, several
// landing at once, each from a slot the device may still be copying
// from; every byte lands, and the slots all come back.
func TestBounceSlotsRecycle(t *testing.T) {
	d := newStreamDevice(1<<20, asyncCaps, 30*time.Microsecond)
	asyncSetup(t, d)
	const writers, per, n = 4, 50, 1024
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range per {
				i := w*per + k
				if err := LandOnDevice(bytes.NewReader(pattern(n, i)), 1, d.Base+uintptr(i*n), n, 0); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := Quiesce(1); err != nil {
		t.Fatal(err)
	}
	for i := range writers * per {
		if !bytes.Equal(d.peek(d.Base+uintptr(i*n), n), pattern(n, i)) {
			t.Fatalf("payload %d differs", i)
		}
	}
	q := queueOf(d, 1)
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.free != 1<<bounceSlots-1 || q.held != 0 || q.nq != 0 || q.queued.Load() != 0 {
		t.Fatalf("after Quiesce: free %#x held %#x queued %d", q.free, q.held, q.nq)
	}
}

// TestGather: a sender's small device payloads share slots, are waited
// for once, and hold the right bytes; past gatherSlots, or above the
// bounce size, Add says to copy synchronously; Done gives every slot back.
func TestGather(t *testing.T) {
	d := newStreamDevice(1<<20, asyncCaps, 200*time.Microsecond)
	asyncSetup(t, d)
	const n = 8 << 10
	d.Exec.Lock()
	for i := range 64 {
		copy(d.At(d.Base+uintptr(i*n), n), pattern(n, i))
	}
	d.Exec.Unlock()
	var g Gather
	var got [][]byte
	for i := range 64 {
		b, err := g.Add(1, d.Base+uintptr(i*n), n)
		if err != nil {
			t.Fatal(err)
		}
		if b == nil {
			break
		}
		got = append(got, b)
	}
	// 64 KiB slots hold 8 payloads of 8 KiB each; gatherSlots slots.
	if len(got) != 8*gatherSlots {
		t.Fatalf("gathered %d payloads, want %d", len(got), 8*gatherSlots)
	}
	if b, _ := g.Add(1, d.Base, 64<<10+8); b != nil {
		t.Fatal("a payload above the bounce size was gathered")
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	for i, b := range got {
		if !bytes.Equal(b, pattern(n, i)) {
			t.Fatalf("gathered payload %d differs", i)
		}
	}
	g.Done()
	// A batch that failed before Wait: Done waits for its copies, then
	// the slots are free for the targets.
	if b, err := g.Add(1, d.Base, n); b == nil || err != nil {
		t.Fatalf("Add after Done: %v", err)
	}
	g.Done()
	q := queueOf(d, 1)
	if q.held != 0 || g.Pending() {
		t.Fatalf("slots still held after Done: %#x", q.held)
	}
	left := d.Left()
	if left != 0 {
		t.Fatal("Done returned with a gathered copy still queued")
	}
}

// TestAsyncOffOrUnsupported: with asynchronous copies off, or a device
// without them, small payloads take the synchronous copy and no slot is
// made.
func TestAsyncOffOrUnsupported(t *testing.T) {
	for _, c := range []struct {
		name string
		caps devmem.Caps
		size uint64
	}{{"off", asyncCaps, 0}, {"no-async", devmem.CapWriteWord, 64 << 10}} {
		t.Run(c.name, func(t *testing.T) {
			d := newStreamDevice(1<<16, c.caps, 0)
			devmem.Register(d)
			SetAsyncCopy(c.size)
			defer func() { Release(); SetAsyncCopy(0); devmem.Register(nil) }()
			Prewarm(1, 64<<10)
			if queueOf(d, 1) != nil {
				t.Fatal("bounce slots made")
			}
			sync0 := d.Copies.Load()
			if err := LandOnDevice(bytes.NewReader(pattern(64, 1)), 1, d.Base, 64, 0); err != nil {
				t.Fatal(err)
			}
			if d.Copies.Load() != sync0+1 || !bytes.Equal(d.peek(d.Base, 64), pattern(64, 1)) {
				t.Fatal("the payload did not take one synchronous copy")
			}
		})
	}
}

// immediateDevice runs stream work as it is queued, allocating nothing:
// what TestAsyncPathAllocatesNothing measures is the plugin's side alone.
type immediateDevice struct{ devtest.Pipe }

func (d *immediateDevice) Caps(uintptr) devmem.Caps { return asyncCaps }
func (d *immediateDevice) WriteWord(_, addr uintptr, v uint64) error {
	binary.LittleEndian.PutUint64(d.At(addr, 8), v)
	return nil
}
func (d *immediateDevice) AtomicAdd(_, _ uintptr, _ uint64) error { return nil }
func (d *immediateDevice) HtoDAsync(_, dst uintptr, src unsafe.Pointer, n uint64) error {
	copy(d.At(dst, n), unsafe.Slice((*byte)(src), n))
	return nil
}
func (d *immediateDevice) DtoHAsync(_ uintptr, dst unsafe.Pointer, src uintptr, n uint64) error {
	copy(unsafe.Slice((*byte)(dst), n), d.At(src, n))
	return nil
}
func (d *immediateDevice) Record(_ uintptr, ev *uintptr) error { *ev = 1; return nil }
func (d *immediateDevice) Passed(_, _ uintptr) (bool, error)   { return true, nil }
func (d *immediateDevice) FreeEvent(_, _ uintptr)              {}
func (d *immediateDevice) Sync(uintptr) error                  { return nil }

// TestAsyncPathAllocatesNothing: landing a small payload, writing its
// never-reset signal, and a sender's gather, wait and give-back allocate
// nothing (the per-operation path's rule).
func TestAsyncPathAllocatesNothing(t *testing.T) {
	d := &immediateDevice{devtest.Pipe{Mem: make([]byte, 1<<20), Base: 0x7e00_0000_0000}}
	asyncSetup(t, d)
	sh := NewShadow(d.Base, 64)
	p := pattern(4096, 3)
	var r bytes.Reader
	var g Gather
	if err := AddSignal(1, d.Base, 1, sh); err != nil { // the word's one read-back
		t.Fatal(err)
	}
	a := testing.AllocsPerRun(200, func() {
		r.Reset(p)
		if err := LandOnDevice(&r, 1, d.Base+8192, 4096, 0); err != nil {
			t.Fatal(err)
		}
		if err := AddSignal(1, d.Base, 1, sh); err != nil {
			t.Fatal(err)
		}
		if b, err := g.Add(1, d.Base+8192, 4096); b == nil || err != nil {
			t.Fatalf("gather: %v", err)
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		g.Done()
	})
	if a != 0 {
		t.Fatalf("%.1f allocations per small put on the asynchronous path", a)
	}
	if !bytes.Equal(d.At(d.Base+8192, 4096), p) {
		t.Fatal("payload differs")
	}
}

// TestFence: Fence returns once every queued copy executed (what a host
// signal word waits for), and costs nothing without a device.
func TestFence(t *testing.T) {
	if err := Fence(); err != nil {
		t.Fatal(err)
	}
	d := newStreamDevice(1<<16, asyncCaps, 3*time.Millisecond)
	asyncSetup(t, d)
	p := pattern(4096, 5)
	if err := LandOnDevice(bytes.NewReader(p), 1, d.Base, 4096, 0); err != nil {
		t.Fatal(err)
	}
	if err := Fence(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(d.peek(d.Base, 4096), p) {
		t.Fatal("Fence returned before the queued copy executed")
	}
}

// TestWriteQueues: the stall report's view of the slots names a copy
// queued and not yet executed, and one executed.
func TestWriteQueues(t *testing.T) {
	d := newStreamDevice(1<<16, asyncCaps, 50*time.Millisecond)
	asyncSetup(t, d)
	if err := LandOnDevice(bytes.NewReader(pattern(64, 1)), 1, d.Base, 64, 0); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	WriteQueues(&b)
	if !strings.Contains(b.String(), "15 free, 0 held, 1 queued; oldest queued copy not executed") {
		t.Fatalf("while the copy waits:\n%s", b.String())
	}
	if err := d.Sync(1); err != nil {
		t.Fatal(err)
	}
	b.Reset()
	WriteQueues(&b)
	if !strings.Contains(b.String(), "1 queued; oldest queued copy executed") {
		t.Fatalf("after the stream:\n%s", b.String())
	}
}

// TestStuckQueueWarns: a queued copy that has not executed after
// stuckAfter gets one WARN naming the remedies, and only one while it
// stays stuck.
func TestStuckQueueWarns(t *testing.T) {
	warns := logtest.Warnings(t)
	d := newStreamDevice(1<<16, asyncCaps, 0)
	asyncSetup(t, d)
	q := queueOf(d, 1)
	// Hold the stream: a copy queued now does not execute.
	d.Exec.Lock()
	release := sync.OnceFunc(d.Exec.Unlock)
	defer release()
	if err := LandOnDevice(bytes.NewReader(pattern(64, 1)), 1, d.Base, 64, 0); err != nil {
		t.Fatal(err)
	}
	q.checkStuck() // too young
	old := stuckAfter.Swap(int64(time.Millisecond))
	defer stuckAfter.Store(old)
	time.Sleep(5 * time.Millisecond)
	q.checkStuck()
	q.checkStuck()
	release()
	lines := warns()
	if len(lines) != 1 {
		t.Fatalf("%d WARNs, want one: %q", len(lines), lines)
	}
	for _, want := range []string{"asynchronous copy", "not executed", "NCCL_RMA_WASM_COPY_CONTEXT=0", "CUDA_DEVICE_MAX_CONNECTIONS=32"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("WARN lacks %q: %s", want, lines[0])
		}
	}
}

// TestQueueBound: at most maxQueues contexts get bounce slots; one past
// the bound lands its small payloads with a synchronous copy.
func TestQueueBound(t *testing.T) {
	d := newStreamDevice(1<<16, asyncCaps, 0)
	devmem.Register(d)
	SetAsyncCopy(4096)
	defer func() { Release(); SetAsyncCopy(0); devmem.Register(nil) }()
	for c := uintptr(1); c <= maxQueues+1; c++ {
		Prewarm(c, 4096)
	}
	if n := queues.n.Load(); n != maxQueues {
		t.Fatalf("%d contexts with bounce slots, want %d", n, maxQueues)
	}
	if queueOf(d, maxQueues+1) != nil {
		t.Fatal("the context past the bound got bounce slots")
	}
	sync0 := d.Copies.Load()
	if err := LandOnDevice(bytes.NewReader(pattern(64, 1)), maxQueues+1, d.Base, 64, 0); err != nil {
		t.Fatal(err)
	}
	if d.Copies.Load() != sync0+1 || !bytes.Equal(d.peek(d.Base, 64), pattern(64, 1)) {
		t.Fatal("past the bound, the payload did not take one synchronous copy")
	}
}
