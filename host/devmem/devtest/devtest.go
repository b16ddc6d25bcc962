// Package devtest holds a fake device for the tests of the packages that
// stage device memory (host/devmem/staging, host/dataplane). Only tests
// import it.
package devtest

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Pipe is a device whose memory is one Go slice at a fake address; it
// records whether a copy is running and can fail the Nth copy.
type Pipe struct {
	Mem     []byte
	Base    uintptr
	Delay   atomic.Int64 // per copy, nanoseconds
	FailAt  atomic.Int32 // 1-based copy number that fails; 0: none
	Copies  atomic.Int32 // copies started
	Copying atomic.Bool
	// Payload copies (more than a signal word) that started while one of
	// the other direction ran: the stages of a pipeline overlap.
	Overlap atomic.Int32

	mu         sync.Mutex
	live       int          // pinned buffers allocated and not freed
	dtoh, htod atomic.Int32 // payload copies running now in each direction
}

func (d *Pipe) Name() string { return "pipe" }
func (d *Pipe) Inspect(uintptr, uint64) (uintptr, error) {
	return 1, nil
}

// At is the memory of n bytes at device address a.
func (d *Pipe) At(a uintptr, n uint64) []byte { return d.Mem[a-d.Base : uint64(a-d.Base)+n] }

// Live is the number of pinned buffers allocated and not freed.
func (d *Pipe) Live() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.live
}

func (d *Pipe) copy(dst, src []byte) error {
	d.Copying.Store(true)
	defer d.Copying.Store(false)
	time.Sleep(time.Duration(d.Delay.Load()))
	if k := d.Copies.Add(1); k == d.FailAt.Load() {
		return errors.New("injected copy failure")
	}
	copy(dst, src)
	return nil
}
func (d *Pipe) DtoH(_ uintptr, dst unsafe.Pointer, src uintptr, n uint64) error {
	defer d.stage(n, &d.dtoh, &d.htod)()
	return d.copy(unsafe.Slice((*byte)(dst), n), d.At(src, n))
}
func (d *Pipe) HtoD(_ uintptr, dst uintptr, src unsafe.Pointer, n uint64) error {
	defer d.stage(n, &d.htod, &d.dtoh)()
	return d.copy(d.At(dst, n), unsafe.Slice((*byte)(src), n))
}

// stage counts a payload copy in mine while it runs, and an overlap when
// one in other runs as it starts.
func (d *Pipe) stage(n uint64, mine, other *atomic.Int32) func() {
	if n <= 8 {
		return func() {}
	}
	mine.Add(1)
	if other.Load() > 0 {
		d.Overlap.Add(1)
	}
	return func() { mine.Add(-1) }
}
func (d *Pipe) AllocPinned(_ uintptr, n uint64) (unsafe.Pointer, error) {
	d.mu.Lock()
	d.live++
	d.mu.Unlock()
	return unsafe.Pointer(&make([]byte, n)[0]), nil
}
func (d *Pipe) FreePinned(unsafe.Pointer) {
	d.mu.Lock()
	d.live--
	d.mu.Unlock()
}
