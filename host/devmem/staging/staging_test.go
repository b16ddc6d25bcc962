package staging

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/devtest"
)

// slowWriter notes whether a device copy ran while it wrote.
type slowWriter struct {
	bytes.Buffer
	d          *devtest.Pipe
	delay      time.Duration
	overlapped int
	chunks     int // the copies a pipeline makes; 0: do not wait for one
	failAt     int // 1-based write that fails
	writes     int
}

func (w *slowWriter) Write(p []byte) (int, error) {
	w.writes++
	if w.writes == w.failAt {
		return 0, errors.New("injected write failure")
	}
	time.Sleep(w.delay)
	if w.d.Copying.Load() {
		w.overlapped++
	} else if w.chunks > 0 {
		// A pipeline copies the next chunk while this one is written:
		// wait for that copy to end rather than hope to catch it running.
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Microsecond) {
			if n := int(w.d.Copies.Load()); n > w.writes {
				w.overlapped++
				break
			} else if n >= w.chunks {
				break
			}
		}
	}
	return w.Buffer.Write(p)
}

// TestStagingPipeline checks both directions byte for byte around chunk
// boundaries, that device copies overlap socket writes, and that a failing
// copy or write ends the transfer with an error and leaves the stager idle.
func TestStagingPipeline(t *testing.T) {
	const chunk = 4 << 10
	d := &devtest.Pipe{Mem: make([]byte, 72*chunk), Base: 0x7e00_0000_0000}
	for i := range d.Mem {
		d.Mem[i] = byte(i*13 + i>>12)
	}
	devmem.Register(d)
	defer devmem.Register(nil)
	for _, n := range []uint64{1, chunk - 1, chunk, chunk + 1, 2 * chunk, 5*chunk + 3, 32 * chunk} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			w := &slowWriter{d: d}
			if err := WriteFromDevice(w, 1, d.Base+7, n, chunk); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(w.Bytes(), d.At(d.Base+7, n)) {
				t.Fatal("writeFromDevice sent wrong bytes")
			}
			src := append([]byte(nil), w.Bytes()...)
			dst := d.Base + 32*chunk + 3
			clear(d.At(dst, n))
			if err := ReadToDevice(bytes.NewReader(src), 1, dst, n, chunk); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(d.At(dst, n), src) {
				t.Fatal("readToDevice landed wrong bytes")
			}
		})
	}
	t.Run("overlap", func(t *testing.T) {
		d.Delay.Store(int64(2 * time.Millisecond))
		defer d.Delay.Store(0)
		d.Copies.Store(0)
		w := &slowWriter{d: d, delay: 2 * time.Millisecond, chunks: 16}
		if err := WriteFromDevice(w, 1, d.Base, 16*chunk, chunk); err != nil {
			t.Fatal(err)
		}
		if w.overlapped == 0 {
			t.Fatal("no device copy ran while a chunk was written")
		}
	})
	t.Run("failures", func(t *testing.T) {
		for _, at := range []int32{1, 2, 5} {
			d.Copies.Store(0)
			d.FailAt.Store(at)
			if err := WriteFromDevice(&slowWriter{d: d}, 1, d.Base, 8*chunk, chunk); err == nil {
				t.Fatalf("copy %d failed but writeFromDevice did not", at)
			}
			d.Copies.Store(0)
			if err := ReadToDevice(bytes.NewReader(make([]byte, 8*chunk)), 1, d.Base, 8*chunk, chunk); err == nil {
				t.Fatalf("copy %d failed but readToDevice did not", at)
			}
		}
		d.FailAt.Store(0)
		if err := WriteFromDevice(&slowWriter{d: d, failAt: 3}, 1, d.Base, 8*chunk, chunk); err == nil {
			t.Fatal("a write failed but writeFromDevice did not")
		}
		if err := ReadToDevice(bytes.NewReader(make([]byte, 5*chunk)), 1, d.Base, 8*chunk, chunk); err == nil {
			t.Fatal("a short stream did not fail readToDevice")
		}
		// Each failure left its stager idle: the pool hands them out again.
		for range 4 {
			if err := WriteFromDevice(&slowWriter{d: d}, 1, d.Base, 8*chunk, chunk); err != nil {
				t.Fatal(err)
			}
		}
	})
	stagers.mu.Lock()
	pooled := 0
	for _, s := range stagers.free {
		if s.dev == d { // not an earlier run's (-count)
			pooled++
		}
	}
	stagers.mu.Unlock()
	if d.Live() != 2*pooled {
		t.Fatalf("%d pinned buffers live for %d pooled stagers", d.Live(), pooled)
	}
}

// gatedReader hands out its bytes only once gate is closed, so that the
// stagers of several transfers are taken at once.
type gatedReader struct {
	gate <-chan struct{}
	r    *bytes.Reader
}

func (g *gatedReader) Read(p []byte) (int, error) {
	<-g.gate
	return g.r.Read(p)
}

// TestPrewarmNoPinnedOnDataPath: after Prewarm (device registration), the
// data path allocates no pinned memory, even with more transfers staged
// at once than stagers were prewarmed (a pinned allocation can wait for
// the application's running kernels); every byte still lands, and
// Release frees what Prewarm made.
func TestPrewarmNoPinnedOnDataPath(t *testing.T) {
	const chunk = 8 << 10
	const n = PrewarmStagers + 3
	d := &devtest.Pipe{Mem: make([]byte, n*chunk), Base: 0x7e00_0000_0000}
	devmem.Register(d)
	defer devmem.Register(nil)
	Release()
	Prewarm(1, chunk)
	warm := d.Live()
	if warm < 2*PrewarmStagers {
		t.Fatalf("Prewarm left %d pinned buffers, want at least %d", warm, 2*PrewarmStagers)
	}
	gate := make(chan struct{})
	errs := make(chan error, n)
	src := make([][]byte, n)
	for i := range src {
		src[i] = bytes.Repeat([]byte{byte(0x30 + i)}, chunk)
		go func() {
			errs <- ReadToDevice(&gatedReader{gate, bytes.NewReader(src[i])}, 1, d.Base+uintptr(i*chunk), chunk, chunk)
		}()
	}
	time.Sleep(50 * time.Millisecond) // every transfer holds a stager, blocked on its reader
	close(gate)
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for i := range src {
		if !bytes.Equal(d.At(d.Base+uintptr(i*chunk), chunk), src[i]) {
			t.Fatalf("transfer %d landed wrong bytes", i)
		}
	}
	if got := d.Live(); got != warm {
		t.Fatalf("%d pinned buffers after %d concurrent transfers, want the %d Prewarm made: the data path allocated pinned memory", got, n, warm)
	}
	Release()
	if got := d.Live(); got != 0 {
		t.Fatalf("%d pinned buffers left after Release", got)
	}
}
