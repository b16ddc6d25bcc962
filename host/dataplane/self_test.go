package dataplane_test

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/intranode"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// TestSelfDevice: a rank's puts and gets to itself with device memory at
// either end (NCCL's RMA proxy flush, GIN's puts to its own rank) move by
// the device's copies, not through its own socket: every byte lands, the
// signal follows the payload, an out-of-range one is still refused by the
// target side, and a failing copy falls back to the socket, which
// delivers it.
func TestSelfDevice(t *testing.T) {
	const size = 64 << 10
	ms, os, d := meshtest.RingMesh(t, size, 1)
	x := ms[0].Peer(0).Transport().(*intranode.Link)
	src := d.At(os[0].Dev, size)
	meshtest.Fill(src[:size/2], 3)
	clear(src[size/2:])
	sig := (*uint64)(unsafe.Pointer(&os[0].Host[0]))

	// Device to device, 8 bytes (the flush) and 20 KiB, with a signal.
	for k, n := range []uint64{8, 20 << 10} {
		tag := uint64(10 + k)
		ms[0].Post(0, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: tag, Local: meshtest.AddrPtr(uint64(os[0].Dev)), LocalCtx: 1, Size: n, Off: size / 2, SigMrID: 2, SigOp: abi.SignalOpAdd, SigValue: 1}}, false, -1)
		if st := meshtest.WaitDone(t, &os[0].MemOwner, tag); st != abi.Success {
			t.Fatalf("self put of %d bytes: %v", n, st)
		}
		deadline := time.Now().Add(10 * time.Second)
		for atomic.LoadUint64(sig) != uint64(k+1) {
			if time.Now().After(deadline) {
				t.Fatalf("self put of %d bytes: signal %d", n, atomic.LoadUint64(sig))
			}
			time.Sleep(50 * time.Microsecond)
		}
		if !bytes.Equal(src[size/2:size/2+n], src[:n]) {
			t.Fatalf("self put of %d bytes: device bytes differ", n)
		}
	}
	// Host to device, and a get from our device into our host memory.
	h := os[0].Host[64 : 64+4096]
	meshtest.Fill(h, 5)
	ms[0].Post(0, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 20, Local: unsafe.Pointer(&h[0]), Size: 4096, Off: 100}}, false, -1)
	if st := meshtest.WaitDone(t, &os[0].MemOwner, 20); st != abi.Success || !bytes.Equal(src[100:100+4096], h) {
		t.Fatalf("host->device self put: %v", st)
	}
	g := os[0].Host[8192 : 8192+4096]
	ms[0].Post(0, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgGet, MrID: 1, Tag: 21, Local: unsafe.Pointer(&g[0]), Size: 4096, Off: 200}}, false, -1)
	if st := meshtest.WaitDone(t, &os[0].MemOwner, 21); st != abi.Success || !bytes.Equal(g, src[200:200+4096]) {
		t.Fatalf("device->host self get: %v", st)
	}
	if n := x.Selfs().Load(); n != 4 {
		t.Fatalf("%d of 4 operations to itself moved by local copies", n)
	}
	// Out of range: refused as over the socket.
	ms[0].Post(0, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 22, Local: meshtest.AddrPtr(uint64(os[0].Dev)), LocalCtx: 1, Size: 4096, Off: size - 100}}, false, -1)
	if st := meshtest.WaitDone(t, &os[0].MemOwner, 22); st != abi.InvalidArgument {
		t.Fatalf("out-of-range self put completed with %v", st)
	}
	// The next copy fails: the put goes through the socket and lands. (The
	// refused put completed at its header: its payload may still be in
	// the writer's hands.)
	for deadline := time.Now().Add(10 * time.Second); !x.Idle(); time.Sleep(50 * time.Microsecond) {
		if time.Now().After(deadline) {
			t.Fatal("the lane never went idle")
		}
	}
	d.FailAt.Store(d.Copies.Load() + 1)
	clear(src[size/2 : size/2+64])
	ms[0].Post(0, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 23, Local: meshtest.AddrPtr(uint64(os[0].Dev)), LocalCtx: 1, Size: 64, Off: size / 2}}, false, -1)
	if st := meshtest.WaitDone(t, &os[0].MemOwner, 23); st != abi.Success || !bytes.Equal(src[size/2:size/2+64], src[:64]) {
		t.Fatalf("self put after a failed local copy: %v", st)
	}
	if n := x.Selfs().Load(); n != 4 {
		t.Fatalf("%d operations moved locally, want still 4", n)
	}
	for _, m := range ms {
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// partOwner is a meshtest.DevOwner whose requests can wait for a part more
// (PartOwner): the extra completions are counted, not recorded, and the
// first failure among them is kept.
type partOwner struct {
	*meshtest.DevOwner
	pmu    sync.Mutex
	extra  map[uint64]int
	added  atomic.Int32
	failed abi.Result
}

func (o *partOwner) AddPart(tag uint64) {
	o.pmu.Lock()
	o.extra[tag]++
	o.pmu.Unlock()
	o.added.Add(1)
}

func (o *partOwner) Complete(tag uint64, st abi.Result) {
	o.pmu.Lock()
	if o.extra[tag] > 0 {
		o.extra[tag]--
		if st != abi.Success && o.failed == abi.Success {
			o.failed = st
		}
		o.pmu.Unlock()
		return
	}
	o.pmu.Unlock()
	o.DevOwner.Complete(tag, st)
}

// TestSelfDeviceQueued: where the device queues copies on a stream, a
// rank's device-to-device operations to itself are queued there and the
// poster does not wait for them: each request completes only once its
// copy executed (and, for a put+signal, once the target's acknowledgement
// came too), every byte is there by then, the signal follows its payload,
// and no synchronous copy runs. (An owner without parts keeps the
// synchronous path: TestSelfDevice.)
func TestSelfDeviceQueued(t *testing.T) {
	// With two lanes operations are numbered (Seq): a numbered put is
	// acknowledged too, a numbered get is not.
	for _, lanes := range []int{1, 2} {
		t.Run(fmt.Sprint("lanes", lanes), func(t *testing.T) { selfDeviceQueued(t, lanes) })
	}
}

func selfDeviceQueued(t *testing.T, lanes int) {
	const size = 1 << 20
	d := meshtest.QueuedDevice(t, 2*size)
	os := make([]*partOwner, 2)
	owners := make([]dataplane.Owner, 2)
	for r := range os {
		os[r] = &partOwner{DevOwner: &meshtest.DevOwner{MemOwner: meshtest.MemOwner{Done: map[uint64]abi.Result{}}, Dev: d.Base + uintptr(r)*size,
			Size: size, Host: make([]byte, 64<<10)}, extra: map[uint64]int{}}
		owners[r] = os[r]
	}
	ms := meshtest.ConnectOwners(t, owners, dataplane.Options{Timeout: 10 * time.Second, IntraNode: true, Lanes: lanes, StripeThreshold: 1 << 40, ChunkSize: 64 << 10,
		CloseTimeout: 2 * time.Second, StageChunk: 4 << 10})
	x := ms[0].Peer(0).Transport().(*intranode.Link)
	src := d.At(os[0].Dev, size)
	meshtest.Fill(src[:size/2], 3)
	wait := func(tag uint64) abi.Result {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Microsecond) {
			staging.Reap() // as the plugin's test() does
			if st, ok := os[0].Status(tag); ok {
				return st
			}
		}
		t.Fatalf("tag %d never completed", tag)
		return 0
	}
	sync0 := d.Copies.Load()
	// Put+signal (the signal a host word: it waits for the queued copy),
	// a plain put, and a get, each device to device.
	sig := (*uint64)(unsafe.Pointer(&os[0].Host[0]))
	for k, n := range []uint64{8, 20 << 10} {
		tag := uint64(10 + k)
		off := size/2 + uint64(k)*(64<<10)
		ms[0].Post(0, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: tag, Local: meshtest.AddrPtr(uint64(os[0].Dev)), LocalCtx: 1, Size: n, Off: off, SigMrID: 2, SigOp: abi.SignalOpAdd, SigValue: 1}}, false, -1)
		if st := wait(tag); st != abi.Success {
			t.Fatalf("self put+signal of %d bytes: %v", n, st)
		}
		if !bytes.Equal(d.Peek(os[0].Dev+uintptr(off), n), src[:n]) {
			t.Fatalf("self put+signal of %d bytes: completed before its bytes landed", n)
		}
		for deadline := time.Now().Add(10 * time.Second); atomic.LoadUint64(sig) != uint64(k+1); time.Sleep(50 * time.Microsecond) {
			if time.Now().After(deadline) {
				t.Fatalf("self put+signal of %d bytes: signal %d", n, atomic.LoadUint64(sig))
			}
		}
	}
	ms[0].Post(0, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 20, Local: meshtest.AddrPtr(uint64(os[0].Dev) + 4096), LocalCtx: 1, Size: 4096, Off: size - 8192}}, false, -1)
	if st := wait(20); st != abi.Success || !bytes.Equal(d.Peek(os[0].Dev+size-8192, 4096), src[4096:8192]) {
		t.Fatalf("self put: %v, or completed before its bytes landed", st)
	}
	ms[0].Post(0, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgGet, MrID: 1, Tag: 21, Local: meshtest.AddrPtr(uint64(os[0].Dev) + size/4), LocalCtx: 1, Size: 4096, Off: 8192}}, false, -1)
	if st := wait(21); st != abi.Success || !bytes.Equal(d.Peek(os[0].Dev+size/4, 4096), src[8192:8192+4096]) {
		t.Fatalf("self get: %v, or completed before its bytes landed", st)
	}
	if n := d.DtoDs.Load(); n != 4 {
		t.Fatalf("%d of 4 operations to itself queued on the stream", n)
	}
	if n := d.Copies.Load() - sync0; n != 0 {
		t.Fatalf("%d synchronous copies ran", n)
	}
	// The put+signals, and with two lanes the numbered plain put: what
	// the target also acknowledges.
	if n, want := os[0].added.Load(), int32(1+lanes); n != want {
		t.Fatalf("%d requests got a part more, want %d", n, want)
	}
	if os[0].failed != abi.Success {
		t.Fatalf("a part failed: %v", os[0].failed)
	}
	if n := x.Selfs().Load(); n != 4 {
		t.Fatalf("%d operations to itself moved locally, want 4", n)
	}
	for _, m := range ms {
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for _, tag := range []uint64{10, 11, 20, 21} {
		if p := os[0].Parts[tag]; p != 1 {
			t.Fatalf("tag %d completed %d times", tag, p)
		}
	}
}
