package staging

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
)

// pipeDevice is a device whose memory is one Go slice at a fake address;
// it records whether a copy is running and can fail the Nth copy.
type pipeDevice struct {
	mem     []byte
	base    uintptr
	delay   atomic.Int64 // per copy, nanoseconds
	failAt  int32        // 1-based copy number that fails; 0: none
	n       atomic.Int32
	copying atomic.Bool
	mu      sync.Mutex
	live    int
	// Payload copies (more than a signal word) running now in each
	// direction, and how many started while one of the other direction
	// ran: the stages of a pipeline overlap.
	dtoh, htod atomic.Int32
	overlap    atomic.Int32
}

func (d *pipeDevice) Name() string { return "pipe" }
func (d *pipeDevice) Inspect(uintptr, uint64) (uintptr, error) {
	return 1, nil
}
func (d *pipeDevice) at(a uintptr, n uint64) []byte { return d.mem[a-d.base : uint64(a-d.base)+n] }
func (d *pipeDevice) copy(dst, src []byte) error {
	d.copying.Store(true)
	defer d.copying.Store(false)
	time.Sleep(time.Duration(d.delay.Load()))
	if k := d.n.Add(1); k == d.failAt {
		return errors.New("injected copy failure")
	}
	copy(dst, src)
	return nil
}
func (d *pipeDevice) DtoH(_ uintptr, dst unsafe.Pointer, src uintptr, n uint64) error {
	defer d.stage(n, &d.dtoh, &d.htod)()
	return d.copy(unsafe.Slice((*byte)(dst), n), d.at(src, n))
}
func (d *pipeDevice) HtoD(_ uintptr, dst uintptr, src unsafe.Pointer, n uint64) error {
	defer d.stage(n, &d.htod, &d.dtoh)()
	return d.copy(d.at(dst, n), unsafe.Slice((*byte)(src), n))
}

// stage counts a payload copy in mine while it runs, and an overlap when
// one in other runs as it starts.
func (d *pipeDevice) stage(n uint64, mine, other *atomic.Int32) func() {
	if n <= 8 {
		return func() {}
	}
	mine.Add(1)
	if other.Load() > 0 {
		d.overlap.Add(1)
	}
	return func() { mine.Add(-1) }
}
func (d *pipeDevice) AllocPinned(_ uintptr, n uint64) (unsafe.Pointer, error) {
	d.mu.Lock()
	d.live++
	d.mu.Unlock()
	return unsafe.Pointer(&make([]byte, n)[0]), nil
}
func (d *pipeDevice) FreePinned(unsafe.Pointer) {
	d.mu.Lock()
	d.live--
	d.mu.Unlock()
}

// slowWriter notes whether a device copy ran while it wrote.
type slowWriter struct {
	bytes.Buffer
	d          *pipeDevice
	delay      time.Duration
	overlapped int
	failAt     int // 1-based write that fails
	writes     int
}

func (w *slowWriter) Write(p []byte) (int, error) {
	w.writes++
	if w.writes == w.failAt {
		return 0, errors.New("injected write failure")
	}
	time.Sleep(w.delay)
	if w.d.copying.Load() {
		w.overlapped++
	}
	return w.Buffer.Write(p)
}

// TestStagingPipeline checks both directions byte for byte around chunk
// boundaries, that device copies overlap socket writes, and that a failing
// copy or write ends the transfer with an error and leaves the stager idle.
func TestStagingPipeline(t *testing.T) {
	const chunk = 4 << 10
	d := &pipeDevice{mem: make([]byte, 72*chunk), base: 0x7e00_0000_0000}
	for i := range d.mem {
		d.mem[i] = byte(i*13 + i>>12)
	}
	devmem.Register(d)
	defer devmem.Register(nil)
	for _, n := range []uint64{1, chunk - 1, chunk, chunk + 1, 2 * chunk, 5*chunk + 3, 32 * chunk} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			w := &slowWriter{d: d}
			if err := WriteFromDevice(w, 1, d.base+7, n, chunk); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(w.Bytes(), d.at(d.base+7, n)) {
				t.Fatal("writeFromDevice sent wrong bytes")
			}
			src := append([]byte(nil), w.Bytes()...)
			dst := d.base + 32*chunk + 3
			clear(d.at(dst, n))
			if err := ReadToDevice(bytes.NewReader(src), 1, dst, n, chunk); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(d.at(dst, n), src) {
				t.Fatal("readToDevice landed wrong bytes")
			}
		})
	}
	t.Run("overlap", func(t *testing.T) {
		d.delay.Store(int64(2 * time.Millisecond))
		defer d.delay.Store(0)
		w := &slowWriter{d: d, delay: 2 * time.Millisecond}
		if err := WriteFromDevice(w, 1, d.base, 16*chunk, chunk); err != nil {
			t.Fatal(err)
		}
		if w.overlapped == 0 {
			t.Fatal("no device copy ran while a chunk was written")
		}
	})
	t.Run("failures", func(t *testing.T) {
		for _, at := range []int32{1, 2, 5} {
			d.n.Store(0)
			d.failAt = at
			if err := WriteFromDevice(&slowWriter{d: d}, 1, d.base, 8*chunk, chunk); err == nil {
				t.Fatalf("copy %d failed but writeFromDevice did not", at)
			}
			d.n.Store(0)
			if err := ReadToDevice(bytes.NewReader(make([]byte, 8*chunk)), 1, d.base, 8*chunk, chunk); err == nil {
				t.Fatalf("copy %d failed but readToDevice did not", at)
			}
		}
		d.failAt = 0
		if err := WriteFromDevice(&slowWriter{d: d, failAt: 3}, 1, d.base, 8*chunk, chunk); err == nil {
			t.Fatal("a write failed but writeFromDevice did not")
		}
		if err := ReadToDevice(bytes.NewReader(make([]byte, 5*chunk)), 1, d.base, 8*chunk, chunk); err == nil {
			t.Fatal("a short stream did not fail readToDevice")
		}
		// Each failure left its stager idle: the pool hands them out again.
		for range 4 {
			if err := WriteFromDevice(&slowWriter{d: d}, 1, d.base, 8*chunk, chunk); err != nil {
				t.Fatal(err)
			}
		}
	})
	stagers.mu.Lock()
	pooled := len(stagers.free)
	stagers.mu.Unlock()
	if d.live != 2*pooled {
		t.Fatalf("%d pinned buffers live for %d pooled stagers", d.live, pooled)
	}
}
