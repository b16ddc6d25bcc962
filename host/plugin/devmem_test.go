package plugin

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
)

// fakeDevice stands in for a GPU: its "device addresses" lie far outside
// anything mapped, so a host dereference of one would crash the test, and
// every byte must move through DtoH and HtoD.
type fakeDevice struct {
	mu     sync.Mutex
	next   uintptr
	allocs map[uintptr][]byte
	copies int
	broken bool          // every copy fails, as when the GPU falls off the bus
	delay  time.Duration // per copy, like a busy GPU: keeps operations in flight

	pinned     map[unsafe.Pointer][]byte // AllocPinned's buffers
	noPinned   bool                      // AllocPinned fails (staging falls back to Go memory)
	unpinned   int                       // copies of more than a signal word through other memory
	pinnedLive int                       // pinned buffers allocated and not freed
	freed      map[uintptr]bool          // allocations the test released: a copy into one is a use after free
	lateCopies int                       // copies into freed allocations
	htod       int                       // HtoD copies made
	hostRegs   map[unsafe.Pointer]uint64 // HostRegister'ed ranges (the intra-node staging ring), by start
	ringPins   int                       // HostRegister calls
}

const fakeBase = 0x7e00_0000_0000

func newFakeDevice() *fakeDevice {
	return &fakeDevice{next: fakeBase, allocs: map[uintptr][]byte{}, pinned: map[unsafe.Pointer][]byte{}}
}

func (d *fakeDevice) AllocPinned(ctx uintptr, n uint64) (unsafe.Pointer, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.noPinned || ctx != 0xc0ffee {
		return nil, fmt.Errorf("AllocPinned: ctx %#x, disabled %v", ctx, d.noPinned)
	}
	b := make([]byte, n)
	p := unsafe.Pointer(&b[0])
	d.pinned[p] = b
	d.pinnedLive++
	return p, nil
}

func (d *fakeDevice) FreePinned(p unsafe.Pointer) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.pinned[p]; !ok {
		panic("FreePinned of memory AllocPinned did not return")
	}
	delete(d.pinned, p)
	d.pinnedLive--
}

// HostRegister pins memory the plugin mapped itself: it counts as pinned.
func (d *fakeDevice) HostRegister(ctx uintptr, p unsafe.Pointer, n uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.noPinned || ctx != 0xc0ffee {
		return fmt.Errorf("HostRegister: ctx %#x, disabled %v", ctx, d.noPinned)
	}
	if d.hostRegs == nil {
		d.hostRegs = map[unsafe.Pointer]uint64{}
	}
	d.hostRegs[p] = n
	d.ringPins++
	d.pinnedLive++
	return nil
}

func (d *fakeDevice) HostUnregister(ctx uintptr, p unsafe.Pointer) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if ctx != 0xc0ffee {
		panic("HostUnregister with another context than HostRegister's")
	}
	if _, ok := d.hostRegs[p]; !ok {
		panic("HostUnregister of memory HostRegister did not pin")
	}
	delete(d.hostRegs, p)
	d.pinnedLive--
}

// notePinned counts a payload copy whose host side is not a pinned buffer;
// called with d.mu held.
func (d *fakeDevice) notePinned(h unsafe.Pointer, n uint64) {
	if n <= 8 {
		return // signal words
	}
	for p, b := range d.pinned {
		if uintptr(h) >= uintptr(p) && uintptr(h)+uintptr(n) <= uintptr(p)+uintptr(len(b)) {
			return
		}
	}
	for p, m := range d.hostRegs {
		if uintptr(h) >= uintptr(p) && uintptr(h)+uintptr(n) <= uintptr(p)+uintptr(m) {
			return
		}
	}
	d.unpinned++
}

func (d *fakeDevice) alloc(n int) uintptr {
	d.mu.Lock()
	defer d.mu.Unlock()
	a := d.next
	d.allocs[a] = make([]byte, n)
	d.next += uintptr(n+4095) &^ 4095
	return a
}

// find returns the backing bytes of [addr, addr+n).
func (d *fakeDevice) find(addr uintptr, n uint64) ([]byte, error) {
	for base, b := range d.allocs {
		if addr >= base && uint64(addr-base)+n <= uint64(len(b)) {
			return b[addr-base : uint64(addr-base)+n], nil
		}
	}
	return nil, fmt.Errorf("%#x+%d is not fake device memory", addr, n)
}

// free forgets an allocation, as cuMemFree does: later copies of it fail.
func (d *fakeDevice) free(addr uintptr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.allocs, addr)
}

func (d *fakeDevice) Name() string { return "fake" }

func (d *fakeDevice) Inspect(ptr uintptr, size uint64) (uintptr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err := d.find(ptr, size); err != nil {
		return 0, err
	}
	return 0xc0ffee, nil
}

func (d *fakeDevice) DtoH(ctx uintptr, dst unsafe.Pointer, src uintptr, n uint64) error {
	time.Sleep(d.delay)
	d.mu.Lock()
	defer d.mu.Unlock()
	b, err := d.find(src, n)
	if err != nil || ctx != 0xc0ffee || d.broken {
		return fmt.Errorf("DtoH: ctx %#x: %v (broken %v)", ctx, err, d.broken)
	}
	copy(unsafe.Slice((*byte)(dst), n), b)
	d.notePinned(dst, n)
	d.copies++
	return nil
}

func (d *fakeDevice) HtoD(ctx uintptr, dst uintptr, src unsafe.Pointer, n uint64) error {
	time.Sleep(d.delay)
	d.mu.Lock()
	defer d.mu.Unlock()
	for base := range d.freed {
		if b := d.allocs[base]; dst >= base && dst < base+uintptr(len(b)) {
			d.lateCopies++
		}
	}
	b, err := d.find(dst, n)
	if err != nil || ctx != 0xc0ffee {
		return fmt.Errorf("HtoD: ctx %#x: %v", ctx, err)
	}
	copy(b, unsafe.Slice((*byte)(src), n))
	d.notePinned(src, n)
	d.copies++
	d.htod++
	return nil
}

func (d *fakeDevice) read(addr uintptr, n int) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, err := d.find(addr, uint64(n))
	if err != nil {
		panic(err)
	}
	return append([]byte(nil), b...)
}

func (d *fakeDevice) write(addr uintptr, p []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, err := d.find(addr, uint64(len(p)))
	if err != nil {
		panic(err)
	}
	copy(b, p)
}

// TestDeviceMemory registers "device" buffers on every rank and moves puts,
// signals (into device memory) and gets between device and host memory, on
// one lane and striped over three, with and without the intra-node path
// (which must stay away from device memory).
func TestDeviceMemory(t *testing.T) {
	for _, c := range []struct{ lanes, intra string }{{"", "0"}, {"", "1"}, {"3", "1"}} {
		t.Run("lanes="+c.lanes+",intranode="+c.intra, func(t *testing.T) {
			testLanes, testIntraNode = c.lanes, c.intra
			defer func() { testLanes, testIntraNode = "", "1" }()
			dev := newFakeDevice()
			devmem.Register(dev)
			defer devmem.Register(nil)
			const n, size = 2, 3<<20 + 5 // striped under the default plan when lanes > 1
			rs := setup(t, n, 64)
			var p abi.NetProperties
			if GetProperties(0, &p) != abi.Success || p.PtrSupport&abi.PtrCuda == 0 {
				t.Fatalf("ptrSupport %#x does not advertise device memory", p.PtrSupport)
			}
			type bufs struct{ src, dst, sig, get uintptr }
			dv := make([]bufs, n)
			mh := make([][4]uint64, n)
			var wg sync.WaitGroup
			for i := range rs {
				dv[i] = bufs{dev.alloc(size), dev.alloc(size * n), dev.alloc(8 * n), dev.alloc(size)}
				src := make([]byte, size)
				for j := range src {
					src[j] = byte(i*29 + j*5)
				}
				dev.write(dv[i].src, src)
				wg.Add(1)
				go func(i int) { // registration is collective
					defer wg.Done()
					for k, a := range []uintptr{dv[i].src, dv[i].dst, dv[i].sig, dv[i].get} {
						sz := []uint64{size, size * n, 8 * n, size}[k]
						h, res := RegMr(rs[i].coll, a, sz, abi.PtrCuda, 0)
						if res != abi.Success {
							t.Errorf("rank %d: regMr(CUDA): %v", i, res)
						}
						mh[i][k] = h
					}
				}(i)
			}
			wg.Wait()
			if t.Failed() {
				t.FailNow()
			}
			// Every rank puts its device source into every rank's device
			// destination, with a signal in device memory.
			for i, r := range rs {
				for p := 0; p < n; p++ {
					req, res := IputSignal(r.rma, 0, 0, mh[i][0], size, uint64(i*size), mh[i][1], uint32(p),
						uint64(8*i), mh[i][2], 3, abi.SignalOpAdd, true, 0)
					if res != abi.Success || wait(t, r.coll, req) != abi.Success {
						t.Fatalf("putSignal %d->%d: %v", i, p, res)
					}
				}
			}
			for i := range rs {
				for p := 0; p < n; p++ {
					deadline := time.Now().Add(10 * time.Second)
					for binary.LittleEndian.Uint64(dev.read(dv[i].sig+uintptr(8*p), 8)) != 3 {
						if time.Now().After(deadline) {
							t.Fatalf("rank %d: no device signal from %d", i, p)
						}
						time.Sleep(time.Millisecond)
					}
					if !bytes.Equal(dev.read(dv[i].dst+uintptr(p*size), size), dev.read(dv[p].src, size)) {
						t.Fatalf("rank %d: device bytes from %d differ after the signal", i, p)
					}
				}
			}
			// Device -> host put, and a get from device memory into host memory.
			r0 := rs[0]
			req, res := Iput(r0.rma, 0, 0, mh[0][0], 64, 0, r0.dstMh, 1, 0)
			if res != abi.Success || wait(t, r0.coll, req) != abi.Success {
				t.Fatalf("device->host put: %v", res)
			}
			req, res = Iget(r0.rma, 0, 0, mh[0][0], size, 0, mh[0][3], 1, 0)
			if res != abi.Success || wait(t, r0.coll, req) != abi.Success {
				t.Fatalf("device get: %v", res)
			}
			if !bytes.Equal(dev.read(dv[0].get, size), dev.read(dv[1].src, size)) {
				t.Fatal("get from device memory returned wrong bytes")
			}
			req, res = Iget(r0.rma, 0, 0, r0.getMh, 64, 0, mh[0][3], 1, 0) // host -> device
			if res != abi.Success || wait(t, r0.coll, req) != abi.Success {
				t.Fatalf("host->device get: %v", res)
			}
			if !bytes.Equal(dev.read(dv[0].get, 64), rs[1].get[:64]) {
				t.Fatal("get from host into device memory returned wrong bytes")
			}
			for i := range rs {
				for _, h := range mh[i] {
					DeregMr(rs[i].coll, h)
				}
			}
			dev.mu.Lock()
			copies := dev.copies
			dev.mu.Unlock()
			if copies == 0 {
				t.Fatal("no device copies were made")
			}
		})
	}
}

// TestDeviceCopyFailure breaks the device after registration: a put from
// device memory fails its request, queryLastError reports it, and nothing
// hangs.
func TestDeviceCopyFailure(t *testing.T) {
	testIntraNode = "0"
	defer func() { testIntraNode = "1" }()
	dev := newFakeDevice()
	devmem.Register(dev)
	defer devmem.Register(nil)
	rs := setup(t, 2, 64)
	src := make([]uintptr, 2)
	mh := make([]uint64, 2)
	var wg sync.WaitGroup
	for i := range rs {
		src[i] = dev.alloc(4096)
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			var res abi.Result
			if mh[i], res = RegMr(rs[i].coll, src[i], 4096, abi.PtrCuda, 0); res != abi.Success {
				t.Errorf("regMr: %v", res)
			}
		}(i)
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	dev.mu.Lock()
	dev.broken = true
	dev.mu.Unlock()
	r := rs[0]
	req, res := Iput(r.rma, 0, 0, mh[0], 64, 0, r.dstMh, 1, 0)
	if res != abi.Success {
		t.Fatalf("iput: %v", res)
	}
	if st := wait(t, r.coll, req); st == abi.Success {
		t.Fatal("a put whose device copy failed reported success")
	}
	if bad, _ := QueryLastError(r.rma); !bad {
		t.Fatal("queryLastError does not report the failed device copy")
	}
}

// TestDeviceStaging drives the pipelined staging path with 4 KiB chunks:
// sizes on and around chunk boundaries, one chunk or less (one synchronous
// copy), many chunks, and large enough to be striped over three lanes.
// Device-to-device puts with a device signal (the payload must be complete
// when the signal is seen, while copies are slowed down) and gets, over TCP
// and with the intra-node path on; every payload copy goes through pinned
// buffers, and falling back to pageable memory still works.
func TestDeviceStaging(t *testing.T) {
	t.Setenv("NCCL_RMA_WASM_STAGE_CHUNK_KB", "4")
	const chunk = 4 << 10
	sizes := []int{1, chunk - 1, chunk, chunk + 1, 2 * chunk, 3*chunk + 7, 300<<10 + 13}
	total := 0
	for _, n := range sizes {
		total += n
	}
	for _, c := range []struct {
		intra    string
		noPinned bool
	}{{"0", false}, {"1", false}, {"0", true}} {
		t.Run(fmt.Sprintf("intranode=%s,pinned=%v", c.intra, !c.noPinned), func(t *testing.T) {
			testLanes, testIntraNode = "3", c.intra
			defer func() { testLanes, testIntraNode = "", "1" }()
			dev := newFakeDevice()
			dev.delay = 20 * time.Microsecond
			dev.noPinned = c.noPinned
			devmem.Register(dev)
			defer devmem.Register(nil)
			t.Cleanup(func() { // after setup's cleanup, which finalizes
				// Finalize frees idle pinned staging memory; a target's
				// stager may come back a moment after the initiator saw
				// its request complete.
				deadline := time.Now().Add(5 * time.Second)
				for {
					dev.mu.Lock()
					live := dev.pinnedLive
					dev.mu.Unlock()
					if live == 0 {
						return
					}
					if time.Now().After(deadline) {
						t.Errorf("%d pinned staging buffers still allocated after finalize", live)
						return
					}
					time.Sleep(time.Millisecond)
					staging.Release()
				}
			})
			pageable0 := staging.PageableStagers()
			rs := setup(t, 2, 64)
			type bufs struct{ src, dst, sig, get uintptr }
			dv := make([]bufs, 2)
			mh := make([][4]uint64, 2)
			var wg sync.WaitGroup
			for i := range rs {
				dv[i] = bufs{dev.alloc(total), dev.alloc(total), dev.alloc(8 * len(sizes)), dev.alloc(total)}
				src := make([]byte, total)
				for j := range src {
					src[j] = byte(i*31 + j*7 + j>>12)
				}
				dev.write(dv[i].src, src)
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					for k, a := range []uintptr{dv[i].src, dv[i].dst, dv[i].sig, dv[i].get} {
						sz := []uint64{uint64(total), uint64(total), uint64(8 * len(sizes)), uint64(total)}[k]
						h, res := RegMr(rs[i].coll, a, sz, abi.PtrCuda, 0)
						if res != abi.Success {
							t.Errorf("rank %d: regMr(CUDA): %v", i, res)
						}
						mh[i][k] = h
					}
				}(i)
			}
			wg.Wait()
			if t.Failed() {
				t.FailNow()
			}
			r0 := rs[0]
			off := 0
			for k, n := range sizes {
				req, res := IputSignal(r0.rma, 0, uint64(off), mh[0][0], uint64(n), uint64(off), mh[0][1], 1,
					uint64(8*k), mh[0][2], 1, abi.SignalOpAdd, true, 0)
				if res != abi.Success || wait(t, r0.coll, req) != abi.Success {
					t.Fatalf("putSignal of %d bytes: %v", n, res)
				}
				deadline := time.Now().Add(10 * time.Second)
				for binary.LittleEndian.Uint64(dev.read(dv[1].sig+uintptr(8*k), 8)) != 1 {
					if time.Now().After(deadline) {
						t.Fatalf("no device signal for the put of %d bytes", n)
					}
					time.Sleep(100 * time.Microsecond)
				}
				if !bytes.Equal(dev.read(dv[1].dst+uintptr(off), n), dev.read(dv[0].src+uintptr(off), n)) {
					t.Fatalf("put of %d bytes: device bytes differ once the signal is seen", n)
				}
				req, res = Iget(r0.rma, 0, uint64(off), mh[0][0], uint64(n), uint64(off), mh[0][3], 1, 0)
				if res != abi.Success || wait(t, r0.coll, req) != abi.Success {
					t.Fatalf("get of %d bytes: %v", n, res)
				}
				if !bytes.Equal(dev.read(dv[0].get+uintptr(off), n), dev.read(dv[1].src+uintptr(off), n)) {
					t.Fatalf("get of %d bytes returned wrong device bytes", n)
				}
				off += n
			}
			for i := range rs {
				for _, h := range mh[i] {
					DeregMr(rs[i].coll, h)
				}
			}
			dev.mu.Lock()
			unpinned := dev.unpinned
			dev.mu.Unlock()
			// Past PrewarmStagers payloads staged at once (both ranks
			// and three lanes share this process's pool) the extras use
			// pageable buffers by design; otherwise every copy is pinned.
			if !c.noPinned && unpinned != 0 && staging.PageableStagers() == pageable0 {
				t.Fatalf("%d payload copies did not use pinned staging memory", unpinned)
			}
			dev.mu.Lock()
			ringPins := dev.ringPins
			dev.mu.Unlock()
			if (c.intra == "1") != (ringPins > 0) {
				t.Fatalf("intranode=%s: %d staging ring ends pinned", c.intra, ringPins)
			}
		})
	}
}

// TestDeviceDmaBuf: with a device runtime, ptrSupport advertises DMA-BUF and
// regMrSymDmaBuf registers device memory by its address range (the fd is
// not used); host memory through it is refused.
func TestDeviceDmaBuf(t *testing.T) {
	testIntraNode = "0"
	defer func() { testIntraNode = "1" }()
	dev := newFakeDevice()
	devmem.Register(dev)
	defer devmem.Register(nil)
	rs := setup(t, 2, 64)
	var p abi.NetProperties
	if GetProperties(0, &p) != abi.Success || p.PtrSupport&abi.PtrDmaBuf == 0 {
		t.Fatalf("ptrSupport %#x lacks NCCL_PTR_DMABUF with a device runtime", p.PtrSupport)
	}
	const size = 5<<20 + 3
	src := make([]uintptr, 2)
	mh := make([]uint64, 2)
	var wg sync.WaitGroup
	for i := range rs {
		src[i] = dev.alloc(size)
		dev.write(src[i], bytes.Repeat([]byte{byte(i + 1)}, size))
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			var res abi.Result
			if mh[i], res = RegMrDmaBuf(rs[i].coll, src[i], size, abi.PtrCuda, 4096, -1, 0); res != abi.Success {
				t.Errorf("regMrSymDmaBuf(CUDA): %v", res)
			}
		}(i)
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	r := rs[0]
	req, res := Iput(r.rma, 0, 0, mh[0], 64, 0, r.dstMh, 1, 0)
	if res != abi.Success || wait(t, r.coll, req) != abi.Success {
		t.Fatalf("put from DMA-BUF registered device memory: %v", res)
	}
	req, res = Iget(r.rma, 0, 0, mh[0], size, 0, mh[0], 1, 0)
	if res != abi.Success || wait(t, r.coll, req) != abi.Success {
		t.Fatalf("get into DMA-BUF registered device memory: %v", res)
	}
	if !bytes.Equal(dev.read(src[0], size), dev.read(src[1], size)) {
		t.Fatal("get between DMA-BUF registrations returned wrong bytes")
	}
	if _, res := RegMrDmaBuf(r.coll, addr(r.src), 64, abi.PtrHost, 0, 3, 0); res == abi.Success {
		t.Fatal("host memory registered through regMrSymDmaBuf")
	}
	for i := range rs {
		DeregMr(rs[i].coll, mh[i])
	}
}

// fakeGDR is the fake device with a CPU mapping of its words (GDRCopy).
type fakeGDR struct {
	*fakeDevice
	adds, forgets int
	unmappable    bool // AddWord declines: the copy path runs
}

func (g *fakeGDR) AddWord(ctx, addr uintptr, v uint64) (bool, error) {
	g.mu.Lock()
	if g.unmappable {
		g.mu.Unlock()
		return false, nil
	}
	b, err := g.find(addr, 8)
	if err != nil || ctx != 0xc0ffee {
		g.mu.Unlock()
		return false, fmt.Errorf("AddWord: ctx %#x: %v", ctx, err)
	}
	// A read and a write, like the mapped word: the caller must
	// serialise updates of one word, or an increment is lost here.
	w := binary.LittleEndian.Uint64(b)
	g.mu.Unlock()
	runtime.Gosched()
	g.mu.Lock()
	binary.LittleEndian.PutUint64(b, w+v)
	g.adds++
	g.mu.Unlock()
	return true, nil
}

func (g *fakeGDR) Forget(addr uintptr, size uint64) {
	g.mu.Lock()
	g.forgets++
	g.mu.Unlock()
}

// TestDeviceSignalWords: every rank's puts and bare signals add to one
// device word of rank 0 at once, over three lanes; no increment is lost,
// with a CPU mapping (GDRCopy) and when it declines the word (copies).
// The payload is complete when the signal is seen, and deregistration
// drops the mappings.
func TestDeviceSignalWords(t *testing.T) {
	for _, unmappable := range []bool{false, true} {
		t.Run(fmt.Sprint("mapped=", !unmappable), func(t *testing.T) {
			testLanes, testIntraNode = "3", "0"
			defer func() { testLanes, testIntraNode = "", "1" }()
			g := &fakeGDR{fakeDevice: newFakeDevice(), unmappable: unmappable}
			devmem.Register(g)
			defer devmem.Register(nil)
			const n, per, size = 3, 40, 300 << 10
			rs := setup(t, n, 64)
			sig, src, dst := make([]uintptr, n), make([]uintptr, n), make([]uintptr, n)
			mh := make([][3]uint64, n)
			var wg sync.WaitGroup
			for i := range rs {
				sig[i], src[i], dst[i] = g.alloc(8), g.alloc(size), g.alloc(n*size)
				g.write(src[i], bytes.Repeat([]byte{byte(i + 1)}, size))
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					for k, a := range []uintptr{sig[i], src[i], dst[i]} {
						var res abi.Result
						if mh[i][k], res = RegMr(rs[i].coll, a, []uint64{8, size, n * size}[k], abi.PtrCuda, 0); res != abi.Success {
							t.Errorf("regMr: %v", res)
						}
					}
				}(i)
			}
			wg.Wait()
			if t.Failed() {
				t.FailNow()
			}
			for i := range rs {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					r := rs[i]
					for k := 0; k < per; k++ {
						var req uint64
						var res abi.Result
						if k == per-1 { // the last one carries a striped payload
							req, res = IputSignal(r.rma, 0, 0, mh[i][1], size, uint64(i*size), mh[i][2], 0, 0, mh[i][0], 1, abi.SignalOpAdd, true, 0)
						} else {
							req, res = IputSignal(r.rma, 0, 0, 0, 0, 0, 0, 0, 0, mh[i][0], 1, abi.SignalOpAdd, true, 0)
						}
						if res != abi.Success || wait(t, r.coll, req) != abi.Success {
							t.Errorf("rank %d signal %d: %v", i, k, res)
							return
						}
					}
				}(i)
			}
			wg.Wait()
			deadline := time.Now().Add(10 * time.Second)
			for binary.LittleEndian.Uint64(g.read(sig[0], 8)) != n*per {
				if time.Now().After(deadline) {
					t.Fatalf("device signal %d, want %d: increments lost", binary.LittleEndian.Uint64(g.read(sig[0], 8)), n*per)
				}
				time.Sleep(time.Millisecond)
			}
			for i := range rs {
				if !bytes.Equal(g.read(dst[0]+uintptr(i*size), size), bytes.Repeat([]byte{byte(i + 1)}, size)) {
					t.Fatalf("payload from rank %d incomplete once every signal is seen", i)
				}
			}
			for i := range rs {
				for _, h := range mh[i] {
					DeregMr(rs[i].coll, h)
				}
			}
			g.mu.Lock()
			adds, forgets := g.adds, g.forgets
			g.mu.Unlock()
			if !unmappable && adds != n*per {
				t.Fatalf("%d signals went through the mapping, want %d", adds, n*per)
			}
			if forgets != 3*n {
				t.Fatalf("%d deregistrations of device memory dropped mappings, want %d", forgets, 3*n)
			}
		})
	}
}

// TestDeviceShadowReregistered: registrations are shared by range and
// flags. A never-reset signal range registered again with the same flags
// is the same registration (same handle, one reference more); registered
// again without the flag it is a registration of its own, with no
// never-reset shadow: its words may be reset, which the first one's
// shadow would silently break.
func TestDeviceShadowReregistered(t *testing.T) {
	g := newFakeDevice()
	devmem.Register(g)
	defer devmem.Register(nil)
	rs := setup(t, 2, 64)
	sig := []uintptr{g.alloc(64), g.alloc(64)}
	reg := func(flags uint64) []uint64 {
		var wg sync.WaitGroup
		h := make([]uint64, len(rs))
		for i := range rs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var res abi.Result
				if h[i], res = RegMr(rs[i].coll, sig[i], 64, abi.PtrCuda, flags); res != abi.Success {
					t.Errorf("regMr (flags %#x): %v", flags, res)
				}
			}()
		}
		wg.Wait()
		return h
	}
	first, again, plain := reg(abi.MrFlagSignalNeverReset), reg(abi.MrFlagSignalNeverReset), reg(0)
	c := lookupColl(rs[0].coll)
	if again[0] != first[0] {
		t.Fatalf("the same range and flags registered twice: handles %#x and %#x, want one", first[0], again[0])
	}
	if m := c.lookupMR(first[0]); m == nil || m.shadow == nil || m.refs != 2 {
		t.Fatalf("the never-reset registration: %+v, want a shadow and 2 references", m)
	}
	if plain[0] == first[0] {
		t.Fatal("the range registered without NEVER_RESET shares the never-reset registration")
	}
	if m := c.lookupMR(plain[0]); m == nil || m.shadow != nil {
		t.Fatalf("the registration without NEVER_RESET: %+v, want one without a shadow", m)
	}
}

// TestFinalizeKeepsStagingForLiveContexts: pinned staging memory (stagers,
// the signal page) outlives the finalize of one plugin context while
// another lives, and goes at the last one.
func TestFinalizeKeepsStagingForLiveContexts(t *testing.T) {
	dev := newFakeDevice()
	devmem.Register(dev)
	defer devmem.Register(nil)
	staging.Release()
	setupEnv(t, 0, 0, nil) // the test's configuration, no ranks
	a, res := Init(1)
	if res != abi.Success {
		t.Fatal(res)
	}
	b, res := Init(2)
	if res != abi.Success {
		t.Fatal(res)
	}
	staging.Prewarm(0xc0ffee, 64<<10)
	live := func() int {
		dev.mu.Lock()
		defer dev.mu.Unlock()
		return dev.pinnedLive
	}
	n := live()
	if n == 0 {
		t.Fatal("Prewarm allocated no pinned memory")
	}
	Finalize(a)
	if live() != n {
		t.Fatalf("finalize of one context of two freed pinned staging memory (%d -> %d buffers)", n, live())
	}
	Finalize(b)
	if live() != 0 {
		t.Fatalf("%d pinned buffers after the last finalize", live())
	}
}
