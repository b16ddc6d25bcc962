package staging

import (
	"bytes"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/devtest"
)

// fusedDevice is a device whose contexts run a device agent that lands a
// payload and its signal as one command (devmem.FusedLander): one
// operation on the stream, the copy and then the write or add. refuse
// makes LandSignal decline, as an agent that cannot take the copy does.
type fusedDevice struct {
	agentDevice
	fused  *atomic.Int64
	refuse *atomic.Bool
}

func newFusedDevice(size int, caps devmem.Caps, delay time.Duration) fusedDevice {
	return fusedDevice{agentDevice{newStreamDevice(size, caps, delay)}, new(atomic.Int64), new(atomic.Bool)}
}

func (d fusedDevice) LandSignal(_, dst uintptr, src unsafe.Pointer, n uint64, sig uintptr, v uint64, add bool) (bool, error) {
	if d.refuse.Load() {
		return false, nil
	}
	d.fused.Add(1)
	d.enqueue(func() {
		copy(d.At(dst, n), unsafe.Slice((*byte)(src), n))
		if add {
			atomic.AddUint64(d.word(sig), v)
		} else {
			atomic.StoreUint64(d.word(sig), v)
		}
	})
	return true, nil
}

// fusedSetup registers d with asynchronous copies and fused landings on.
func fusedSetup(t *testing.T, d devmem.Device) {
	t.Helper()
	asyncSetup(t, d)
	SetFusedLanding(true)
	t.Cleanup(func() { SetFusedLanding(false) })
}

// waitWord waits until the word at sig reads want (the stream runs late).
func waitWord(t *testing.T, d *streamDevice, sig uintptr, want uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for d.peekWord(sig) != want {
		if time.Now().After(deadline) {
			t.Fatalf("signal word reads %d, want %d", d.peekWord(sig), want)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// TestFusedLanding: a held payload and its signal (a never-reset shadow's
// write, then the agent's add to a plain word) go to the agent as one
// command, queued only when the signal is applied; a plain put landed
// before it on the slow stream is in place when the signal is seen.
func TestFusedLanding(t *testing.T) {
	for _, shadow := range []bool{true, false} {
		d := newFusedDevice(1<<20, asyncCaps, 2*time.Millisecond)
		fusedSetup(t, d)
		SetAgentAdds(!shadow)
		var sh *Shadow
		if shadow {
			sh = NewShadow(d.Base+4096, 64)
		}
		var h Held
		for k, n := range []int{8, 64, 65, 4096} {
			earlier, p := pattern(512, 100+k), pattern(n, k)
			edst, dst := d.Base+uintptr(8192+k*(16<<10)), d.Base+uintptr(8192+k*(16<<10)+1024)
			if err := LandOnDevice(bytes.NewReader(earlier), 1, edst, 512, 0); err != nil {
				t.Fatal(err)
			}
			queued := d.Left()
			ok, err := LandHeld(bytes.NewReader(p), 1, dst, uint64(n), &h)
			if err != nil || !ok || !h.Pending() {
				t.Fatalf("%d bytes: LandHeld = %v, %v, pending %v; want it held", n, ok, err, h.Pending())
			}
			if d.Left() > queued {
				t.Fatalf("%d bytes: a held payload's copy was queued before its signal", n)
			}
			sig := d.Base + 4096 + uintptr(8*k)
			fused, writes, adds := d.fused.Load(), d.writes.Load(), d.adds.Load()
			if err := AddSignalAfter(1, sig, uint64(k+1), sh, &h); err != nil {
				t.Fatal(err)
			}
			if h.Pending() {
				t.Fatalf("%d bytes: still held after its signal", n)
			}
			if d.fused.Load() != fused+1 || d.writes.Load() != writes || d.adds.Load() != adds {
				t.Fatalf("shadow %v, %d bytes: %d fused commands, %d writes, %d adds; want one fused command alone",
					shadow, n, d.fused.Load()-fused, d.writes.Load()-writes, d.adds.Load()-adds)
			}
			waitWord(t, d.streamDevice, sig, uint64(k+1))
			if !bytes.Equal(d.peek(dst, uint64(n)), p) || !bytes.Equal(d.peek(edst, 512), earlier) {
				t.Fatalf("shadow %v, %d bytes: signal visible before a payload", shadow, n)
			}
		}
		if err := Quiesce(1); err != nil {
			t.Fatal(err)
		}
		SetAgentAdds(false)
	}
}

// TestHeldFallbacks: a held payload whose signal cannot be fused (the
// agent declines it, the signal is of another context, nothing applies)
// is queued first, and the signal still follows it.
func TestHeldFallbacks(t *testing.T) {
	d := newFusedDevice(1<<20, asyncCaps, time.Millisecond)
	fusedSetup(t, d)
	sh := NewShadow(d.Base+4096, 64)
	var h Held
	p := pattern(64, 7)
	dst, sig := d.Base+8192, d.Base+4096

	d.refuse.Store(true)
	if ok, err := LandHeld(bytes.NewReader(p), 1, dst, 64, &h); !ok || err != nil {
		t.Fatalf("LandHeld = %v, %v", ok, err)
	}
	if err := AddSignalAfter(1, sig, 5, sh, &h); err != nil {
		t.Fatal(err)
	}
	waitWord(t, d.streamDevice, sig, 5)
	if !bytes.Equal(d.peek(dst, 64), p) || d.fused.Load() != 0 || h.Pending() {
		t.Fatal("a declined fusion: the signal came before the payload, or it fused, or it stayed held")
	}
	d.refuse.Store(false)

	// No shadow and no device atomics: a read-modify-write, after the
	// held copy, which is queued first.
	r := pattern(64, 9)
	if ok, err := LandHeld(bytes.NewReader(r), 1, dst, 64, &h); !ok || err != nil {
		t.Fatalf("LandHeld = %v, %v", ok, err)
	}
	if err := AddSignalAfter(1, sig+8, 3, nil, &h); err != nil {
		t.Fatal(err)
	}
	if d.peekWord(sig+8) != 3 || !bytes.Equal(d.peek(dst, 64), r) || d.fused.Load() != 0 || h.Pending() {
		t.Fatal("a read-modify-write signal came before its held payload, or it fused, or the payload stayed held")
	}

	// Flush alone: the copy is queued and lands.
	q := pattern(64, 8)
	if ok, err := LandHeld(bytes.NewReader(q), 1, dst, 64, &h); !ok || err != nil {
		t.Fatalf("LandHeld = %v, %v", ok, err)
	}
	if err := h.Flush(); err != nil || h.Pending() {
		t.Fatalf("Flush: %v, pending %v", err, h.Pending())
	}
	if err := Quiesce(1); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(d.peek(dst, 64), q) {
		t.Fatal("a flushed payload did not land")
	}

	// Off, no agent, too large, or one already held: not held.
	SetFusedLanding(false)
	if ok, _ := LandHeld(bytes.NewReader(q), 1, dst, 64, &h); ok {
		t.Fatal("held with fused landings off")
	}
	SetFusedLanding(true)
	if ok, _ := LandHeld(bytes.NewReader(q), 1, dst, 64<<10+1, &h); ok {
		t.Fatal("held a payload larger than a bounce slot")
	}
	if ok, _ := LandHeld(bytes.NewReader(q), 1, dst, 64, &h); !ok {
		t.Fatal("not held")
	}
	if ok, _ := LandHeld(bytes.NewReader(q), 1, dst, 64, &h); ok {
		t.Fatal("held a second payload in a Held that holds one")
	}
	if err := h.Flush(); err != nil {
		t.Fatal(err)
	}
	plain := newStreamDevice(1<<16, asyncCaps, 0)
	devmem.Register(plain)
	Prewarm(1, 64<<10)
	if ok, _ := LandHeld(bytes.NewReader(q), 1, plain.Base, 64, &h); ok {
		t.Fatal("held on a device without a device agent's fused landing")
	}
}

// TestFusedConcurrent: services of several peers add to a few never-reset
// words at once, half of them with held payloads; every word ends exact
// (no add lost between fused writes and the folding of the others) and
// every payload landed.
func TestFusedConcurrent(t *testing.T) {
	d := newFusedDevice(1<<20, asyncCaps, 20*time.Microsecond)
	fusedSetup(t, d)
	const words, peers, per = 4, 6, 150
	sh := NewShadow(d.Base, 8*words)
	var wg sync.WaitGroup
	for p := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var h Held
			for k := range per {
				sig := d.Base + uintptr(8*((p+k)%words))
				dst := d.Base + uintptr(4096+(p*per+k)*64)
				if p%2 == 0 {
					if ok, err := LandHeld(bytes.NewReader(pattern(64, p*per+k)), 1, dst, 64, &h); !ok || err != nil {
						t.Errorf("LandHeld = %v, %v", ok, err)
						return
					}
				} else if err := LandOnDevice(bytes.NewReader(pattern(64, p*per+k)), 1, dst, 64, 0); err != nil {
					t.Error(err)
					return
				}
				if err := AddSignalAfter(1, sig, uint64(p+1), sh, &h); err != nil {
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
		want := spreadSum(i, words, peers, per)
		if got := d.peekWord(d.Base + uintptr(8*i)); got != want {
			t.Errorf("word %d: %d, want %d", i, got, want)
		}
	}
	for p := range peers {
		for k := range per {
			if !bytes.Equal(d.peek(d.Base+uintptr(4096+(p*per+k)*64), 64), pattern(64, p*per+k)) {
				t.Fatalf("peer %d put %d: payload missing", p, k)
			}
		}
	}
	if d.fused.Load() == 0 {
		t.Fatal("no fused command")
	}
}

// immediateFused is immediateDevice with a device agent that lands a
// payload and its signal in one command, as queued, allocating nothing.
type immediateFused struct{ immediateDevice }

func (d *immediateFused) AgentRuns(uintptr) bool { return true }
func (d *immediateFused) LandSignal(_, dst uintptr, src unsafe.Pointer, n uint64, sig uintptr, v uint64, _ bool) (bool, error) {
	copy(d.At(dst, n), unsafe.Slice((*byte)(src), n))
	binary.LittleEndian.PutUint64(d.At(sig, 8), v)
	return true, nil
}

// TestHeldPathAllocatesNothing: holding a small payload and landing it
// with its never-reset signal allocate nothing (the per-operation path's
// rule).
func TestHeldPathAllocatesNothing(t *testing.T) {
	d := &immediateFused{immediateDevice{devtest.Pipe{Mem: make([]byte, 1<<20), Base: 0x7e00_0000_0000}}}
	fusedSetup(t, d)
	sh := NewShadow(d.Base, 64)
	p := pattern(64, 3)
	var r bytes.Reader
	var h Held
	if err := AddSignal(1, d.Base, 1, sh); err != nil { // the word's one read-back
		t.Fatal(err)
	}
	a := testing.AllocsPerRun(200, func() {
		r.Reset(p)
		if ok, err := LandHeld(&r, 1, d.Base+8192, 64, &h); !ok || err != nil {
			t.Fatalf("LandHeld = %v, %v", ok, err)
		}
		if err := AddSignalAfter(1, d.Base, 1, sh, &h); err != nil {
			t.Fatal(err)
		}
	})
	if a != 0 {
		t.Fatalf("%.1f allocations per held put", a)
	}
	if !bytes.Equal(d.At(d.Base+8192, 64), p) || binary.LittleEndian.Uint64(d.At(d.Base, 8)) != 202 {
		t.Fatal("payload or signal differs")
	}
}
