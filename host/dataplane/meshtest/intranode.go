package meshtest

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/intranode"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/devtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
)

// IntraOf is an intra-node lane's side (intranode's ring.go, stream.go).
func IntraOf(l *tcp.Lane) *intranode.Lane { return l.Side().(*intranode.Lane) }

// AddrPtr turns an address in this process into a pointer.
func AddrPtr(a uint64) unsafe.Pointer { return intranode.AddrPtr(a) }

// DevOwner is a target with device memory (registration 1, of a
// devtest.Pipe at Dev) and host memory (registration 2, Host).
type DevOwner struct {
	MemOwner
	// Dev is the device memory's address, Size its size.
	Dev  uintptr
	Size uint64
	// Host is registration 2.
	Host []byte
}

// Resolve is registration 1 (the device memory, context 1) or 2.
func (o *DevOwner) Resolve(id uint32) (unsafe.Pointer, uint64, uintptr, dataplane.Pin, bool) {
	switch id {
	case 1:
		return AddrPtr(uint64(o.Dev)), o.Size, 1, dataplane.NewPin(&o.Pins), true
	case 2:
		return unsafe.Pointer(&o.Host[0]), uint64(len(o.Host)), 0, dataplane.NewPin(&o.Pins), true
	}
	return nil, 0, 0, dataplane.Pin{}, false
}

// RingDevice is a devtest.Pipe that pins host memory too, and counts it;
// SlowIn (nanoseconds) slows its copies to the device further.
type RingDevice struct {
	*devtest.Pipe
	// Registered counts the host ranges pinned.
	Registered atomic.Int32
	// SlowIn is how long each copy to the device sleeps first, in ns.
	SlowIn atomic.Int64
}

// HtoD copies to the device, SlowIn late.
func (d *RingDevice) HtoD(ctx uintptr, dst uintptr, src unsafe.Pointer, n uint64) error {
	time.Sleep(time.Duration(d.SlowIn.Load()))
	return d.Pipe.HtoD(ctx, dst, src, n)
}

// HostRegister counts a pinned host range.
func (d *RingDevice) HostRegister(_ uintptr, p unsafe.Pointer, n uint64) error {
	if p == nil || n == 0 {
		return errors.New("empty range")
	}
	d.Registered.Add(1)
	return nil
}

// HostUnregister counts an unpinned host range (of context 1 only).
func (d *RingDevice) HostUnregister(ctx uintptr, _ unsafe.Pointer) {
	if ctx != 1 {
		panic("HostUnregister with another context than HostRegister's")
	}
	d.Registered.Add(-1)
}

// RingMesh connects two ranks over the intra-node path with device memory
// of size bytes each (rank r's at base+r*size) and 64 KiB of host memory.
func RingMesh(t testing.TB, size uint64, lanes int) ([]*dataplane.Mesh, []*DevOwner, *RingDevice) {
	return RingMeshStripe(t, size, lanes, 64<<10)
}

// RingMeshStripe is RingMesh with operations from stripe bytes striped.
func RingMeshStripe(t testing.TB, size uint64, lanes int, stripe uint64) ([]*dataplane.Mesh, []*DevOwner, *RingDevice) {
	t.Helper()
	// Both ranks' memory is mapped outside Go's heap: the two ends of the
	// ring synchronise through shared memory and futexes, which the race
	// detector cannot see, as two processes would.
	pd := &devtest.Pipe{Mem: MapAnon(t, 2*size), Base: 0x7e00_0000_0000}
	d := &RingDevice{Pipe: pd}
	devmem.Register(d)
	t.Cleanup(func() { devmem.Register(nil) })
	os := make([]*DevOwner, 2)
	for r := range os {
		os[r] = &DevOwner{MemOwner: MemOwner{Done: map[uint64]abi.Result{}}, Dev: pd.Base + uintptr(r)*uintptr(size), Size: size, Host: MapAnon(t, 64<<10)}
	}
	ms := ConnectOwners(t, []dataplane.Owner{os[0], os[1]}, dataplane.Options{Timeout: 10 * time.Second, IntraNode: true, Lanes: lanes,
		StripeThreshold: stripe, ChunkSize: 64 << 10, CloseTimeout: 2 * time.Second, StageChunk: 4 << 10})
	return ms, os, d
}

// MapAnon maps n bytes of anonymous memory outside Go's heap, unmapped
// when the test ends.
func MapAnon(t testing.TB, n uint64) []byte {
	b, err := unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

// Fill writes a pattern of seed into b.
func Fill(b []byte, seed int) {
	for i := range b {
		b[i] = byte(i*7 + seed + i>>10)
	}
}

// StreamSelfDevice is a device with one in-order stream (devtest.Stream,
// which queues the copies and counts the device-to-device ones).
type StreamSelfDevice struct{ *devtest.Stream }

// Caps are word writes and asynchronous copies.
func (d *StreamSelfDevice) Caps(uintptr) devmem.Caps { return devmem.CapWriteWord | devmem.CapAsync }

// WriteWord queues a word's write on the stream.
func (d *StreamSelfDevice) WriteWord(_, addr uintptr, v uint64) error {
	d.Enqueue(func() { atomic.StoreUint64((*uint64)(unsafe.Pointer(&d.At(addr, 8)[0])), v) })
	return nil
}

// AtomicAdd is refused.
func (d *StreamSelfDevice) AtomicAdd(uintptr, uintptr, uint64) error {
	return errors.New("no atomic add")
}

// QueuedDevice registers a StreamSelfDevice of size bytes whose stream
// runs each operation 2 ms late, with asynchronous copies on and context
// 1's bounce slots made, all undone when t ends.
func QueuedDevice(t testing.TB, size int) *StreamSelfDevice {
	d := &StreamSelfDevice{Stream: devtest.NewStream(size, 2*time.Millisecond)}
	devmem.Register(d)
	staging.SetAsyncCopy(64 << 10)
	staging.Prewarm(1, 64<<10)
	t.Cleanup(func() {
		staging.Release()
		staging.SetAsyncCopy(0)
		devmem.Register(nil)
	})
	return d
}
