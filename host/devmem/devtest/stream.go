package devtest

import (
	"bytes"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Stream is a Pipe with one in-order stream, as a GPU stream orders its
// work: a goroutine runs the queued operations one at a time, each after
// OpDelay, so that work done outside the stream's order (a signal written
// before its payload's copy executed, a request completed before its copy
// ran) becomes visible. Events are numbers of operations issued.
type Stream struct {
	Pipe
	OpDelay time.Duration
	// Exec is held while the stream runs an operation: a test reads device
	// memory under it (Peek), as the GPU's writes race the host.
	Exec *sync.Mutex

	// DtoDs counts the device-to-device copies queued (DtoDAsync).
	DtoDs atomic.Int32

	mu     sync.Mutex
	cond   *sync.Cond
	queue  []func()
	issued uint64
	done   uint64
}

// NewStream returns a Stream over size bytes of device memory, its
// goroutine started.
func NewStream(size int, delay time.Duration) *Stream {
	d := &Stream{Pipe: Pipe{Mem: make([]byte, size), Base: 0x7e00_0000_0000}, OpDelay: delay, Exec: new(sync.Mutex)}
	d.cond = sync.NewCond(&d.mu)
	go d.run()
	return d
}

func (d *Stream) run() {
	d.mu.Lock()
	for {
		for len(d.queue) == 0 {
			d.cond.Wait()
		}
		f := d.queue[0]
		d.queue = d.queue[1:]
		d.mu.Unlock()
		time.Sleep(d.OpDelay)
		d.Exec.Lock()
		f()
		d.Exec.Unlock()
		d.mu.Lock()
		d.done++
		d.cond.Broadcast()
	}
}

// Enqueue queues f on the stream.
func (d *Stream) Enqueue(f func()) {
	d.mu.Lock()
	d.queue = append(d.queue, f)
	d.issued++
	d.cond.Broadcast()
	d.mu.Unlock()
}

// Left is the number of operations queued and not yet run.
func (d *Stream) Left() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.issued - d.done
}

// Peek returns a copy of n bytes of device memory at addr, read between
// two stream operations.
func (d *Stream) Peek(addr uintptr, n uint64) []byte {
	d.Exec.Lock()
	defer d.Exec.Unlock()
	return bytes.Clone(d.At(addr, n))
}

// HtoDAsync, DtoHAsync and DtoDAsync queue copies on the stream
// (devmem.Streams, devmem.AsyncDeviceCopier).
func (d *Stream) HtoDAsync(_, dst uintptr, src unsafe.Pointer, n uint64) error {
	d.Enqueue(func() { copy(d.At(dst, n), unsafe.Slice((*byte)(src), n)) })
	return nil
}
func (d *Stream) DtoHAsync(_ uintptr, dst unsafe.Pointer, src uintptr, n uint64) error {
	d.Enqueue(func() { copy(unsafe.Slice((*byte)(dst), n), d.At(src, n)) })
	return nil
}
func (d *Stream) DtoDAsync(_, dst, src uintptr, n uint64) error {
	d.DtoDs.Add(1)
	d.Enqueue(func() { copy(d.At(dst, n), d.At(src, n)) })
	return nil
}

// Record, Passed, FreeEvent and Sync are devmem.Streams' events.
func (d *Stream) Record(_ uintptr, ev *uintptr) error {
	d.mu.Lock()
	*ev = uintptr(d.issued) + 1 // 0 means no event
	d.mu.Unlock()
	return nil
}
func (d *Stream) Passed(_, ev uintptr) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.done >= uint64(ev-1), nil
}
func (d *Stream) FreeEvent(_, _ uintptr) {}
func (d *Stream) Sync(uintptr) error {
	d.mu.Lock()
	for d.done < d.issued {
		d.cond.Wait()
	}
	d.mu.Unlock()
	return nil
}
