package intranode_test

import (
	"bytes"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/intranode"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// TestMappedPeer: operations whose target device memory is mapped into
// this process (Op.Mapped, SPEC.md §4 "Device windows mapped") move by
// one device copy, not through the socket. A put from device memory is
// queued on the stream (which runs each operation 2 ms late here) and its
// signal reaches the target only after it ran; a plain put completes
// only once its bytes are there; a get copies out of the mapping. No
// payload byte crosses the socket or a bounce slot.
func TestMappedPeer(t *testing.T) {
	const size = 1 << 20
	d := meshtest.QueuedDevice(t, 2*size)
	os, owners := devOwners(d, size)
	ms := meshtest.ConnectOwners(t, owners, dataplane.Options{Timeout: 10 * time.Second, IntraNode: true, Lanes: 1, StripeThreshold: 1 << 40, ChunkSize: 64 << 10,
		CloseTimeout: 2 * time.Second, StageChunk: 4 << 10})
	x := ms[0].Peer(1).Transport().(*intranode.Link)
	src := d.At(os[0].Dev, size)
	meshtest.Fill(src[:size/2], 7)
	target := os[1].Dev // rank 1's device memory, "mapped" here: one process
	sig := (*uint64)(unsafe.Pointer(&os[1].Host[0]))
	sent := x.Lanes()[0].Writes().Load()

	// Put+signal: when the target applied the signal, the bytes are there.
	for k, n := range []uint64{8, 40 << 10} {
		off := uint64(k) * (64 << 10)
		tag := uint64(10 + k)
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: tag, Local: meshtest.AddrPtr(uint64(os[0].Dev)), LocalCtx: 1, Size: n, Off: off, SigMrID: 2, SigOp: abi.SignalOpAdd, SigValue: 1}, Route: dataplane.Route{Mapped: uint64(target) + off, MapCtx: 1}}, false, -1)
		for deadline := time.Now().Add(10 * time.Second); atomic.LoadUint64(sig) != uint64(k+1); time.Sleep(20 * time.Microsecond) {
			if time.Now().After(deadline) {
				t.Fatalf("put+signal of %d bytes: signal %d", n, atomic.LoadUint64(sig))
			}
		}
		if !bytes.Equal(d.Peek(target+uintptr(off), n), src[:n]) {
			t.Fatalf("put+signal of %d bytes: the signal came before the bytes", n)
		}
		if st := meshtest.WaitDone(t, &os[0].MemOwner, tag); st != abi.Success {
			t.Fatalf("put+signal of %d bytes: %v", n, st)
		}
	}
	// A plain put completes once its bytes are there.
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 20, Local: meshtest.AddrPtr(uint64(os[0].Dev) + 4096), LocalCtx: 1, Size: 8192, Off: size / 2}, Route: dataplane.Route{Mapped: uint64(target) + size/2, MapCtx: 1}}, false, -1)
	if st := meshtest.WaitDone(t, &os[0].MemOwner, 20); st != abi.Success || !bytes.Equal(d.Peek(target+size/2, 8192), src[4096:4096+8192]) {
		t.Fatalf("plain put: %v, or completed before its bytes landed", st)
	}
	// A get out of the mapping.
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgGet, MrID: 1, Tag: 21, Local: meshtest.AddrPtr(uint64(os[0].Dev) + size*3/4), LocalCtx: 1, Size: 4096, Off: size / 2}, Route: dataplane.Route{Mapped: uint64(target) + size/2, MapCtx: 1}}, false, -1)
	if st := meshtest.WaitDone(t, &os[0].MemOwner, 21); st != abi.Success || !bytes.Equal(d.Peek(os[0].Dev+size*3/4, 4096), src[4096:8192]) {
		t.Fatalf("get: %v", st)
	}
	// One batch: a queued put, then a get of the same bytes copied on the
	// spot, which must wait for the put's copy.
	meshtest.Fill(src[:4096], 9)
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 30, Local: meshtest.AddrPtr(uint64(os[0].Dev)), LocalCtx: 1, Size: 4096, Off: 3 * size / 4}, Route: dataplane.Route{Mapped: uint64(target) + 3*size/4, MapCtx: 1}}, true, -1)
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgGet, MrID: 1, Tag: 31, Local: meshtest.AddrPtr(uint64(os[0].Dev) + size/4), LocalCtx: 1, Size: 4096, Off: 3 * size / 4}, Route: dataplane.Route{Mapped: uint64(target) + 3*size/4, MapCtx: 1}}, false, -1)
	if st := meshtest.WaitDone(t, &os[0].MemOwner, 31); st != abi.Success || !bytes.Equal(d.Peek(os[0].Dev+size/4, 4096), src[:4096]) {
		t.Fatalf("get behind a queued put of the same bytes: %v, or it overtook the put's copy", st)
	}
	if st := meshtest.WaitDone(t, &os[0].MemOwner, 30); st != abi.Success {
		t.Fatalf("put before the get: %v", st)
	}
	if n := x.Mapped().Load(); n != 6 {
		t.Fatalf("%d of 6 operations moved through the mapping", n)
	}
	if n := d.DtoDs.Load(); n != 4 {
		t.Fatalf("%d device-to-device copies queued, want 4 (the puts)", n)
	}
	// Two signals went as headers; the plain puts and the gets needed none.
	if w := x.Lanes()[0].Writes().Load() - sent; w > 2 {
		t.Fatalf("%d writes on the stream, want at most 2 (the signals' headers)", w)
	}
	// Rank 1's staged put into rank 0's shared registration: the target
	// acknowledges it once it landed, not once its copy is queued (rank 0's
	// mapping peers read and write it without the target's service).
	meshtest.Fill(os[1].Host[:8192], 11)
	copies := d.Copies.Load()
	ms[1].Post(0, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 40, Local: unsafe.Pointer(&os[1].Host[0]), Size: 8192, Off: 4096}}, false, -1)
	for deadline := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
		// Looked at the moment it completes, both ranks polling as NCCL's
		// proxies do (acks leave at once): the stream runs the landing
		// 2 ms after it was queued.
		ms[0].Progress()
		ms[1].Progress()
		st, ok := os[1].Status(40)
		if !ok {
			if time.Now().After(deadline) {
				t.Fatal("staged put into a shared registration never completed")
			}
			continue
		}
		if st != abi.Success || !bytes.Equal(d.Peek(os[0].Dev+4096, 8192), os[1].Host[:8192]) {
			t.Fatalf("staged put into a shared registration: %v, or acknowledged before it landed", st)
		}
		break
	}
	if d.Copies.Load() == copies {
		t.Fatal("the staged put into a shared registration was landed by a queued copy, not one waited for")
	}
	for _, m := range ms {
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// devOwners are two ranks' owners of the stand-in device d, size bytes of
// its memory each (rank r's at d.Base + r*size), their registration 1
// handed to the peer (sharedOwner).
func devOwners(d *meshtest.StreamSelfDevice, size uintptr) ([]*meshtest.DevOwner, []dataplane.Owner) {
	os := make([]*meshtest.DevOwner, 2)
	owners := make([]dataplane.Owner, 2)
	for r := range os {
		os[r] = &meshtest.DevOwner{MemOwner: meshtest.MemOwner{Done: map[uint64]abi.Result{}}, Dev: d.Base + uintptr(r)*size, Size: uint64(size), Host: make([]byte, 64<<10)}
		owners[r] = sharedOwner{os[r]}
	}
	return os, owners
}

// sharedOwner is a meshtest.DevOwner whose device registration was handed to a
// peer (SharedOwner).
type sharedOwner struct{ *meshtest.DevOwner }

func (sharedOwner) Shared(id uint32) bool { return id == 1 }
