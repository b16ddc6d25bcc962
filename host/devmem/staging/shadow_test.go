package staging

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/devtest"
)

// streamDevice is a devtest.Stream (one in-order stream, slowed down per
// operation) with the stream operations the staging code uses; caps picks
// what it offers.
type streamDevice struct {
	*devtest.Stream
	caps   devmem.Caps
	writes atomic.Int64 // WriteWord calls
	adds   atomic.Int64 // AtomicAdd calls
	rmw    atomic.Int64 // synchronous DtoH of a word (read-backs)
	noDtoD bool         // DtoDAsync says ErrUnsupported
	failEv atomic.Bool  // Passed fails
}

// peek returns a copy of n bytes of device memory at addr, read between
// two stream operations.
func (d *streamDevice) peek(addr uintptr, n uint64) []byte { return d.Peek(addr, n) }

// peekWord reads the word at addr between two stream operations.
func (d *streamDevice) peekWord(addr uintptr) uint64 {
	return binary.LittleEndian.Uint64(d.peek(addr, 8))
}

func newStreamDevice(size int, caps devmem.Caps, delay time.Duration) *streamDevice {
	return &streamDevice{Stream: devtest.NewStream(size, delay), caps: caps}
}

func (d *streamDevice) enqueue(f func()) { d.Enqueue(f) }

func (d *streamDevice) word(addr uintptr) *uint64 {
	return (*uint64)(unsafe.Pointer(&d.Mem[addr-d.Base]))
}

func (d *streamDevice) DtoH(ctx uintptr, dst unsafe.Pointer, src uintptr, n uint64) error {
	if n == 8 {
		d.rmw.Add(1)
	}
	return d.Pipe.DtoH(ctx, dst, src, n)
}

func (d *streamDevice) Caps(uintptr) devmem.Caps { return d.caps }
func (d *streamDevice) WriteWord(_, addr uintptr, v uint64) error {
	if d.caps&devmem.CapWriteWord == 0 {
		return errors.New("WriteWord not offered")
	}
	d.writes.Add(1)
	d.enqueue(func() { atomic.StoreUint64(d.word(addr), v) })
	return nil
}
func (d *streamDevice) AtomicAdd(_, addr uintptr, v uint64) error {
	if d.caps&(devmem.CapAtomicAdd|devmem.CapStreamAtomic) == 0 {
		return errors.New("AtomicAdd not offered")
	}
	d.adds.Add(1)
	d.enqueue(func() { atomic.AddUint64(d.word(addr), v) })
	return nil
}
func (d *streamDevice) DtoDAsync(ctx, dst, src uintptr, n uint64) error {
	if d.noDtoD {
		return devmem.ErrUnsupported
	}
	return d.Stream.DtoDAsync(ctx, dst, src, n)
}
func (d *streamDevice) Passed(ctx, ev uintptr) (bool, error) {
	if d.failEv.Load() {
		return false, errors.New("injected event failure")
	}
	return d.Stream.Passed(ctx, ev)
}

// spreadSum is what peers p = 0.. add to word i of words when each adds
// p+1, per times, its k-th add to word (p+k) % words.
func spreadSum(i, words, peers, per int) uint64 {
	var sum uint64
	for p := range peers {
		for k := range per {
			if (p+k)%words == i {
				sum += uint64(p + 1)
			}
		}
	}
	return sum
}

// TestShadowSignals: several peers add to a few never-reset words at once;
// every word ends exact, only the first update of a word reads it, and
// adds that met a pending write were folded into it.
func TestShadowSignals(t *testing.T) {
	d := newStreamDevice(1<<12, devmem.CapWriteWord|devmem.CapAtomicAdd, 20*time.Microsecond)
	devmem.Register(d)
	defer devmem.Register(nil)
	const words, peers, per = 4, 6, 400
	for i := range words {
		*d.word(d.Base + uintptr(8*i)) = uint64(1000 * i) // the application's initial values
	}
	sh := NewShadow(d.Base, 8*words)
	var wg sync.WaitGroup
	for p := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range per {
				if err := AddSignal(1, d.Base+uintptr(8*((p+k)%words)), uint64(p+1), sh); err != nil {
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
	for i := range words {
		want := uint64(1000*i) + spreadSum(i, words, peers, per)
		if got := *d.word(d.Base + uintptr(8*i)); got != want {
			t.Errorf("word %d = %d, want %d", i, got, want)
		}
	}
	if n := d.rmw.Load(); n != words {
		t.Errorf("%d read-backs of signal words, want one per word (%d)", n, words)
	}
	if d.adds.Load() != 0 {
		t.Error("never-reset words took the atomic path")
	}
	if int64(sh.Folds())+d.writes.Load() != peers*per {
		t.Errorf("%d folds + %d writes != %d adds", sh.Folds(), d.writes.Load(), peers*per)
	}
	t.Logf("%d writes, %d folded", d.writes.Load(), sh.Folds())
}

// TestSignalPaths: without a shadow the atomic is queued where allowed (a
// stream atomic always, the kernel where NCCL_RMA_WASM_DEVICE_ATOMIC
// allows it); without either stream operation (a runtime lacking the
// symbols) the read-modify-write runs, waiting for the stream first;
// every path ends exact.
func TestSignalPaths(t *testing.T) {
	atomicKernel.Store(true)
	defer atomicKernel.Store(false)
	for _, c := range []struct {
		name       string
		caps       devmem.Caps
		shadow     bool
		adds, rmws bool
	}{
		{"atomic", devmem.CapWriteWord | devmem.CapAtomicAdd | devmem.CapAsync, false, true, false},
		{"shadow-without-write", devmem.CapAtomicAdd, true, true, false},
		{"fallback", 0, false, false, true},
		{"atomic-off", devmem.CapAtomicAdd, false, false, true},
		{"stream-atomic", devmem.CapStreamAtomic | devmem.CapAsync, false, true, false},
		{"stream-atomic-kernel-off", devmem.CapStreamAtomic, false, true, false},
		{"fallback-shadow", devmem.CapAsync, true, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			atomicKernel.Store(c.name != "atomic-off" && c.name != "stream-atomic-kernel-off")
			d := newStreamDevice(64, c.caps, 0)
			devmem.Register(d)
			defer devmem.Register(nil)
			var sh *Shadow
			if c.shadow {
				sh = NewShadow(d.Base, 64)
			}
			var wg sync.WaitGroup
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 100 {
						if err := AddSignal(1, d.Base+8, 3, sh); err != nil {
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
			if got := *d.word(d.Base + 8); got != 1200 {
				t.Fatalf("signal = %d, want 1200", got)
			}
			if (d.adds.Load() > 0) != c.adds || (d.rmw.Load() > 0) != c.rmws || d.writes.Load() != 0 {
				t.Fatalf("%d atomics, %d read-backs, %d writes", d.adds.Load(), d.rmw.Load(), d.writes.Load())
			}
		})
	}
}

// TestShadowCompare: Compare reports each word non-zero on either side,
// in order, with the shadow's and the device's values (a difference is a
// write late or lost), reads no word past compareMax, and allocates no
// pinned memory beyond the signal page.
func TestShadowCompare(t *testing.T) {
	d := &devtest.Pipe{Mem: make([]byte, 8*(compareMax+4)), Base: 0x7e00_0000_0000}
	devmem.Register(d)
	defer devmem.Register(nil)
	Release()
	defer Release()
	sh := NewShadow(d.Base, uint64(len(d.Mem)))
	binary.LittleEndian.PutUint64(d.At(d.Base+8, 8), 7)                // word 1: shadow and device agree
	binary.LittleEndian.PutUint64(d.At(d.Base+8*3, 8), 5)              // word 3: device only
	binary.LittleEndian.PutUint64(d.At(d.Base+8*(compareMax+1), 8), 1) // past the bound
	sh.words[1].val.Store(7)
	sh.words[2].val.Store(4) // shadow only: a write that did not land
	type row struct {
		i         int
		host, dev uint64
	}
	var got []row
	if err := sh.Compare(1, func(i int, host, dev uint64) { got = append(got, row{i, host, dev}) }); err != nil {
		t.Fatal(err)
	}
	want := []row{{1, 7, 7}, {2, 4, 0}, {3, 0, 5}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Compare reported %v, want %v", got, want)
	}
	if d.Live() != 1 {
		t.Fatalf("%d pinned buffers after Compare, want 1 (the signal page)", d.Live())
	}
}

// agentDevice is a streamDevice whose contexts run a device agent and
// whose driver has no stream atomics: the agent's adds are its only
// atomics (as on an H100 whose driver reported no stream atomic
// reductions).
type agentDevice struct{ *streamDevice }

func (agentDevice) AgentRuns(uintptr) bool { return true }
func (d agentDevice) AtomicAdd(_, addr uintptr, v uint64) error {
	d.adds.Add(1)
	d.enqueue(func() { atomic.AddUint64(d.word(addr), v) })
	return nil
}

// TestSignalAgentAdds: where the device agent runs and the driver has no
// stream atomics, adds to a plain signal word are the agent's (no
// read-back), and only then are the registration's words offered to the
// peers' agents (DeviceAtomicAdds).
func TestSignalAgentAdds(t *testing.T) {
	SetAgentAdds(true)
	defer SetAgentAdds(false)
	d := agentDevice{newStreamDevice(64, devmem.CapAsync, 0)}
	devmem.Register(d)
	defer devmem.Register(nil)
	if !DeviceAtomicAdds(1) {
		t.Fatal("DeviceAtomicAdds is false with the agent running")
	}
	for range 100 {
		if err := AddSignal(1, d.Base+8, 3, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := Quiesce(1); err != nil {
		t.Fatal(err)
	}
	if got := *d.word(d.Base + 8); got != 300 || d.adds.Load() != 100 || d.rmw.Load() != 0 {
		t.Fatalf("signal %d, %d agent adds, %d read-backs; want 300, 100, 0", got, d.adds.Load(), d.rmw.Load())
	}
	plain := newStreamDevice(64, devmem.CapAsync, 0)
	devmem.Register(plain)
	if DeviceAtomicAdds(1) {
		t.Fatal("DeviceAtomicAdds is true with no agent and no stream atomics (its adds are read-modify-writes)")
	}
}
