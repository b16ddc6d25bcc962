package dataplane

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// A copy of host/devmem/staging's test device, for the transports' tests
// of device memory.

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
