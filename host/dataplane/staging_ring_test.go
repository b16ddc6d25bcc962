package dataplane

import (
	"bytes"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/intranode"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/devtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// devOwner is a target with device memory (registration 1, of a
// devtest.Pipe) and host memory (registration 2).
type devOwner struct {
	memOwner
	dev  uintptr
	size uint64
	host []byte
}

func (o *devOwner) Resolve(id uint32) (unsafe.Pointer, uint64, uintptr, Pin, bool) {
	switch id {
	case 1:
		return addrPtr(uint64(o.dev)), o.size, 1, NewPin(&o.pins), true
	case 2:
		return unsafe.Pointer(&o.host[0]), uint64(len(o.host)), 0, NewPin(&o.pins), true
	}
	return nil, 0, 0, Pin{}, false
}

// ringDevice is a devtest.Pipe that pins host memory too, and counts it;
// slowIn (nanoseconds) slows its copies to the device further.
type ringDevice struct {
	*devtest.Pipe
	registered atomic.Int32
	slowIn     atomic.Int64
}

func (d *ringDevice) HtoD(ctx uintptr, dst uintptr, src unsafe.Pointer, n uint64) error {
	time.Sleep(time.Duration(d.slowIn.Load()))
	return d.Pipe.HtoD(ctx, dst, src, n)
}

func (d *ringDevice) HostRegister(_ uintptr, p unsafe.Pointer, n uint64) error {
	if p == nil || n == 0 {
		return errors.New("empty range")
	}
	d.registered.Add(1)
	return nil
}
func (d *ringDevice) HostUnregister(ctx uintptr, _ unsafe.Pointer) {
	if ctx != 1 {
		panic("HostUnregister with another context than HostRegister's")
	}
	d.registered.Add(-1)
}

// ringMesh connects two ranks over the intra-node path with device memory
// of size bytes each (rank r's at base+r*size) and 64 KiB of host memory.
func ringMesh(t *testing.T, size uint64, lanes int) ([]*Mesh, []*devOwner, *ringDevice) {
	return ringMeshStripe(t, size, lanes, 64<<10)
}

func ringMeshStripe(t *testing.T, size uint64, lanes int, stripe uint64) ([]*Mesh, []*devOwner, *ringDevice) {
	t.Helper()
	// Both ranks' memory is mapped outside Go's heap: the two ends of the
	// ring synchronise through shared memory and futexes, which the race
	// detector cannot see, as two processes would.
	pd := &devtest.Pipe{Mem: mapAnon(t, 2*size), Base: 0x7e00_0000_0000}
	d := &ringDevice{Pipe: pd}
	devmem.Register(d)
	t.Cleanup(func() { devmem.Register(nil) })
	os := make([]*devOwner, 2)
	for r := range os {
		os[r] = &devOwner{memOwner: memOwner{done: map[uint64]abi.Result{}}, dev: pd.Base + uintptr(r)*uintptr(size), size: size, host: mapAnon(t, 64<<10)}
	}
	ms := connectOwners(t, []Owner{os[0], os[1]}, Options{Timeout: 10 * time.Second, IntraNode: true, Lanes: lanes,
		StripeThreshold: stripe, ChunkSize: 64 << 10, CloseTimeout: 2 * time.Second, StageChunk: 4 << 10})
	return ms, os, d
}

func mapAnon(t *testing.T, n uint64) []byte {
	b, err := unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

func fill(b []byte, seed int) {
	for i := range b {
		b[i] = byte(i*7 + seed + i>>10)
	}
}

// TestRingPipelined: device-to-device, host-to-device and device-to-host
// puts between two ranks of one host move through the staging ring, every
// byte lands, the signal is visible only once the whole payload is, and
// the sender's device-to-ring copies overlap the target's ring-to-device
// copies (with the stages run one after the other, no copy ever starts
// while one of the other direction runs, and this fails).
func TestRingPipelined(t *testing.T) {
	const size = 256 << 10
	for _, lanes := range []int{1, 2} {
		t.Run(fmt.Sprint("lanes", lanes), func(t *testing.T) {
			ms, os, d := ringMesh(t, size, lanes)
			src := d.At(os[0].dev, size)
			dst := d.At(os[1].dev, size)
			fill(src, lanes)
			d.Delay.Store(int64(time.Millisecond))
			sig := (*uint64)(unsafe.Pointer(&os[1].host[0]))
			ms[0].Post(1, &Op{Request: Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: 1, Local: addrPtr(uint64(os[0].dev)), LocalCtx: 1, Size: size, SigMrID: 2, SigOp: abi.SignalOpAdd, SigValue: 5}}, false, -1)
			// The signal says the payload is there: check it the moment
			// the signal appears.
			deadline := time.Now().Add(20 * time.Second)
			for atomic.LoadUint64(sig) == 0 {
				if time.Now().After(deadline) {
					t.Fatal("signal never arrived")
				}
				time.Sleep(100 * time.Microsecond)
			}
			if !bytes.Equal(dst, src) {
				t.Fatal("the signal was visible before the whole payload landed")
			}
			if v := atomic.LoadUint64(sig); v != 5 {
				t.Fatalf("signal %d, want 5", v)
			}
			if st := waitDone(t, &os[0].memOwner, 1); st != abi.Success {
				t.Fatalf("put completed with %v", st)
			}
			d.Delay.Store(0)
			if d.Overlap.Load() == 0 {
				t.Fatal("no device copy of the sender ran while the target copied in: the ring stages ran one after the other")
			}
			x := ms[0].peers[1].t.(*intranode.Link)
			rings := 0
			for _, l := range x.Lanes() {
				if intraOf(l).RingState() == intranode.RingOn {
					rings++
				}
			}
			if rings != lanes {
				t.Fatalf("%d of %d lanes used the staging ring", rings, lanes)
			}
			if d.registered.Load() != int32(2*lanes) {
				t.Fatalf("%d ring mappings pinned, want %d (both ends of each lane)", d.registered.Load(), 2*lanes)
			}

			// Host memory to device memory, and device memory to host
			// memory (an odd size: a partial last chunk).
			h := os[0].host[:40<<10+3]
			fill(h, 9)
			ms[0].Post(1, &Op{Request: Request{Msg: wire.MsgPut, MrID: 1, Tag: 2, Local: unsafe.Pointer(&h[0]), Size: uint64(len(h)), Off: 5}}, false, -1)
			if st := waitDone(t, &os[0].memOwner, 2); st != abi.Success || !bytes.Equal(dst[5:5+len(h)], h) {
				t.Fatalf("host->device put through the ring: %v", st)
			}
			ms[0].Post(1, &Op{Request: Request{Msg: wire.MsgPut, MrID: 2, Tag: 3, Local: addrPtr(uint64(os[0].dev) + 100), LocalCtx: 1, Size: 48 << 10, Off: 8}, Route: Route{Remote: uint64(uintptr(unsafe.Pointer(&os[1].host[8])))}}, false, -1)
			if st := waitDone(t, &os[0].memOwner, 3); st != abi.Success || !bytes.Equal(os[1].host[8:8+48<<10], src[100:100+48<<10]) {
				t.Fatalf("device->host put through the ring: %v", st)
			}
			// A put the target rejects still empties its slots: the
			// next one lands.
			ms[0].Post(1, &Op{Request: Request{Msg: wire.MsgPut, MrID: 1, Tag: 4, Local: addrPtr(uint64(os[0].dev)), LocalCtx: 1, Size: 32 << 10, Off: size - 100}}, false, -1)
			if st := waitDone(t, &os[0].memOwner, 4); st != abi.InvalidArgument {
				t.Fatalf("out-of-range put through the ring completed with %v", st)
			}
			clear(dst)
			ms[0].Post(1, &Op{Request: Request{Msg: wire.MsgPut, MrID: 1, Tag: 5, Local: addrPtr(uint64(os[0].dev)), LocalCtx: 1, Size: 32 << 10}}, false, -1)
			if st := waitDone(t, &os[0].memOwner, 5); st != abi.Success || !bytes.Equal(dst[:32<<10], src[:32<<10]) {
				t.Fatalf("put after a rejected one: %v", st)
			}
			for _, m := range ms {
				if err := m.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if n := d.registered.Load(); n != 0 {
				t.Fatalf("%d ring mappings still pinned after close", n)
			}
		})
	}
}

// TestRingRefusedFallsBack: a target that cannot map the ring refuses it,
// and device payloads ride the stream instead, every byte intact.
func TestRingRefusedFallsBack(t *testing.T) {
	*intranode.AttachHook() = func() error { return errors.New("refused by the test") }
	defer func() { *intranode.AttachHook() = nil }()
	const size = 64 << 10
	ms, os, d := ringMesh(t, size, 1)
	src, dst := d.At(os[0].dev, size), d.At(os[1].dev, size)
	fill(src, 3)
	for tag := uint64(1); tag <= 3; tag++ {
		clear(dst)
		ms[0].Post(1, &Op{Request: Request{Msg: wire.MsgPut, MrID: 1, Tag: tag, Local: addrPtr(uint64(os[0].dev)), LocalCtx: 1, Size: size}}, false, -1)
		if st := waitDone(t, &os[0].memOwner, tag); st != abi.Success || !bytes.Equal(dst, src) {
			t.Fatalf("put %d with the ring refused: %v", tag, st)
		}
	}
	if l := ms[0].peers[1].t.(*intranode.Link).Lanes()[0]; intraOf(l).RingState() != intranode.RingOff {
		t.Fatalf("ring state %d after a refusal, want off", intraOf(l).RingState())
	}
}

// TestRingWithoutProcessVM: with the single-copy path refused (as Yama
// refuses process_vm_writev between sibling processes), device payloads
// still take the ring, which needs only read access to the peer's fds.
func TestRingWithoutProcessVM(t *testing.T) {
	const size = 64 << 10
	ms, os, d := ringMesh(t, size, 1)
	ms[0].peers[1].t.(*intranode.Link).On().Store(false)
	src, dst := d.At(os[0].dev, size), d.At(os[1].dev, size)
	fill(src, 5)
	ms[0].Post(1, &Op{Request: Request{Msg: wire.MsgPut, MrID: 1, Tag: 1, Local: addrPtr(uint64(os[0].dev)), LocalCtx: 1, Size: size}}, false, -1)
	if st := waitDone(t, &os[0].memOwner, 1); st != abi.Success || !bytes.Equal(dst, src) {
		t.Fatalf("put: %v", st)
	}
	if l := ms[0].peers[1].t.(*intranode.Link).Lanes()[0]; intraOf(l).RingState() != intranode.RingOn {
		t.Fatalf("ring state %d with process_vm_writev refused, want on", intraOf(l).RingState())
	}
}

// TestRingPeerGone: a target that dies in the middle of a put through the
// ring leaves the sender failing it, not waiting forever.
func TestRingPeerGone(t *testing.T) {
	const size = 256 << 10
	ms, os, d := ringMesh(t, size, 1)
	d.Delay.Store(int64(20 * time.Millisecond)) // the target copies slowly: the sender waits for slots
	ms[0].Post(1, &Op{Request: Request{Msg: wire.MsgPut, MrID: 1, Tag: 1, Local: addrPtr(uint64(os[0].dev)), LocalCtx: 1, Size: size}}, false, -1)
	time.Sleep(60 * time.Millisecond)
	ms[1].Close()
	if st := waitDone(t, &os[0].memOwner, 1); st == abi.Success {
		t.Fatal("a put whose target closed in the middle succeeded")
	}
}

// TestRingLaneFailover: the stream of the lane whose ring carries a put
// breaks mid-put (another lane lives). The sender abandons the ring, the
// target fails that lane alone instead of the peer, and the put is resent
// on the live lane: it completes once, every byte lands, its signal is
// applied once.
func TestRingLaneFailover(t *testing.T) {
	const size = 256 << 10
	ms, os, d := ringMeshStripe(t, size, 2, 1<<40)
	openLanes(t, ms[0], 1)                      // the live lane the put fails over to
	d.slowIn.Store(int64(2 * time.Millisecond)) // the target lags: the sender waits for slots
	src, dst := d.At(os[0].dev, size), d.At(os[1].dev, size)
	fill(src, 8)
	sig := (*uint64)(unsafe.Pointer(&os[1].host[0]))
	ms[0].Post(1, &Op{Request: Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: 1, Local: addrPtr(uint64(os[0].dev)), LocalCtx: 1, Size: size, SigMrID: 2, SigOp: abi.SignalOpAdd, SigValue: 3}}, false, 0)
	waitUntil(t, "the ring to carry part of the put", func() bool { return d.Overlap.Load()+d.Copies.Load() > 4 })
	c := ms[1].peers[0].t.(*intranode.Link).Ins()[0] // reset at the target, as ss -K does
	if err := c.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if st := waitDone(t, &os[0].memOwner, 1); st != abi.Success {
		t.Fatalf("put whose lane failed mid-ring: %v", st)
	}
	waitUntil(t, "the signal", func() bool { return atomic.LoadUint64(sig) == 3 })
	if !bytes.Equal(dst, src) {
		t.Fatal("bytes differ after the put was resent")
	}
	if ms[0].peers[1].dead.Load() || ms[1].peers[0].dead.Load() {
		t.Fatal("a lane failing mid-ring dropped the peer")
	}
	d.slowIn.Store(0)
	time.Sleep(20 * time.Millisecond)
	if v := atomic.LoadUint64(sig); v != 3 {
		t.Fatalf("signal %d, want 3 (applied once)", v)
	}
}
