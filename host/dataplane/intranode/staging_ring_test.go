package intranode_test

import (
	"bytes"
	"errors"
	"fmt"
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
			ms, os, d := meshtest.RingMesh(t, size, lanes)
			src := d.At(os[0].Dev, size)
			dst := d.At(os[1].Dev, size)
			meshtest.Fill(src, lanes)
			d.Delay.Store(int64(time.Millisecond))
			sig := (*uint64)(unsafe.Pointer(&os[1].Host[0]))
			ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: 1, Local: meshtest.AddrPtr(uint64(os[0].Dev)), LocalCtx: 1, Size: size, SigMrID: 2, SigOp: abi.SignalOpAdd, SigValue: 5}}, false, -1)
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
			if st := meshtest.WaitDone(t, &os[0].MemOwner, 1); st != abi.Success {
				t.Fatalf("put completed with %v", st)
			}
			d.Delay.Store(0)
			if d.Overlap.Load() == 0 {
				t.Fatal("no device copy of the sender ran while the target copied in: the ring stages ran one after the other")
			}
			x := ms[0].Peer(1).Transport().(*intranode.Link)
			rings := 0
			for _, l := range x.Lanes() {
				if meshtest.IntraOf(l).RingState() == intranode.RingOn {
					rings++
				}
			}
			if rings != lanes {
				t.Fatalf("%d of %d lanes used the staging ring", rings, lanes)
			}
			if d.Registered.Load() != int32(2*lanes) {
				t.Fatalf("%d ring mappings pinned, want %d (both ends of each lane)", d.Registered.Load(), 2*lanes)
			}

			// Host memory to device memory, and device memory to host
			// memory (an odd size: a partial last chunk).
			h := os[0].Host[:40<<10+3]
			meshtest.Fill(h, 9)
			ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 2, Local: unsafe.Pointer(&h[0]), Size: uint64(len(h)), Off: 5}}, false, -1)
			if st := meshtest.WaitDone(t, &os[0].MemOwner, 2); st != abi.Success || !bytes.Equal(dst[5:5+len(h)], h) {
				t.Fatalf("host->device put through the ring: %v", st)
			}
			ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 2, Tag: 3, Local: meshtest.AddrPtr(uint64(os[0].Dev) + 100), LocalCtx: 1, Size: 48 << 10, Off: 8}, Route: dataplane.Route{Remote: uint64(uintptr(unsafe.Pointer(&os[1].Host[8])))}}, false, -1)
			if st := meshtest.WaitDone(t, &os[0].MemOwner, 3); st != abi.Success || !bytes.Equal(os[1].Host[8:8+48<<10], src[100:100+48<<10]) {
				t.Fatalf("device->host put through the ring: %v", st)
			}
			// A put the target rejects still empties its slots: the
			// next one lands.
			ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 4, Local: meshtest.AddrPtr(uint64(os[0].Dev)), LocalCtx: 1, Size: 32 << 10, Off: size - 100}}, false, -1)
			if st := meshtest.WaitDone(t, &os[0].MemOwner, 4); st != abi.InvalidArgument {
				t.Fatalf("out-of-range put through the ring completed with %v", st)
			}
			clear(dst)
			ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 5, Local: meshtest.AddrPtr(uint64(os[0].Dev)), LocalCtx: 1, Size: 32 << 10}}, false, -1)
			if st := meshtest.WaitDone(t, &os[0].MemOwner, 5); st != abi.Success || !bytes.Equal(dst[:32<<10], src[:32<<10]) {
				t.Fatalf("put after a rejected one: %v", st)
			}
			for _, m := range ms {
				if err := m.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if n := d.Registered.Load(); n != 0 {
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
	ms, os, d := meshtest.RingMesh(t, size, 1)
	src, dst := d.At(os[0].Dev, size), d.At(os[1].Dev, size)
	meshtest.Fill(src, 3)
	for tag := uint64(1); tag <= 3; tag++ {
		clear(dst)
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: tag, Local: meshtest.AddrPtr(uint64(os[0].Dev)), LocalCtx: 1, Size: size}}, false, -1)
		if st := meshtest.WaitDone(t, &os[0].MemOwner, tag); st != abi.Success || !bytes.Equal(dst, src) {
			t.Fatalf("put %d with the ring refused: %v", tag, st)
		}
	}
	if l := ms[0].Peer(1).Transport().(*intranode.Link).Lanes()[0]; meshtest.IntraOf(l).RingState() != intranode.RingOff {
		t.Fatalf("ring state %d after a refusal, want off", meshtest.IntraOf(l).RingState())
	}
}

// TestRingWithoutProcessVM: with the single-copy path refused (as Yama
// refuses process_vm_writev between sibling processes), device payloads
// still take the ring, which needs only read access to the peer's fds.
func TestRingWithoutProcessVM(t *testing.T) {
	const size = 64 << 10
	ms, os, d := meshtest.RingMesh(t, size, 1)
	ms[0].Peer(1).Transport().(*intranode.Link).On().Store(false)
	src, dst := d.At(os[0].Dev, size), d.At(os[1].Dev, size)
	meshtest.Fill(src, 5)
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 1, Local: meshtest.AddrPtr(uint64(os[0].Dev)), LocalCtx: 1, Size: size}}, false, -1)
	if st := meshtest.WaitDone(t, &os[0].MemOwner, 1); st != abi.Success || !bytes.Equal(dst, src) {
		t.Fatalf("put: %v", st)
	}
	if l := ms[0].Peer(1).Transport().(*intranode.Link).Lanes()[0]; meshtest.IntraOf(l).RingState() != intranode.RingOn {
		t.Fatalf("ring state %d with process_vm_writev refused, want on", meshtest.IntraOf(l).RingState())
	}
}

// TestRingPeerGone: a target that dies in the middle of a put through the
// ring leaves the sender failing it, not waiting forever.
func TestRingPeerGone(t *testing.T) {
	const size = 256 << 10
	ms, os, d := meshtest.RingMesh(t, size, 1)
	d.Delay.Store(int64(20 * time.Millisecond)) // the target copies slowly: the sender waits for slots
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 1, Local: meshtest.AddrPtr(uint64(os[0].Dev)), LocalCtx: 1, Size: size}}, false, -1)
	time.Sleep(60 * time.Millisecond)
	ms[1].Close()
	if st := meshtest.WaitDone(t, &os[0].MemOwner, 1); st == abi.Success {
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
	ms, os, d := meshtest.RingMeshStripe(t, size, 2, 1<<40)
	meshtest.OpenLanes(t, ms[0], 1)             // the live lane the put fails over to
	d.SlowIn.Store(int64(2 * time.Millisecond)) // the target lags: the sender waits for slots
	src, dst := d.At(os[0].Dev, size), d.At(os[1].Dev, size)
	meshtest.Fill(src, 8)
	sig := (*uint64)(unsafe.Pointer(&os[1].Host[0]))
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: 1, Local: meshtest.AddrPtr(uint64(os[0].Dev)), LocalCtx: 1, Size: size, SigMrID: 2, SigOp: abi.SignalOpAdd, SigValue: 3}}, false, 0)
	meshtest.WaitUntil(t, "the ring to carry part of the put", func() bool { return d.Overlap.Load()+d.Copies.Load() > 4 })
	c := ms[1].Peer(0).Transport().(*intranode.Link).Ins()[0] // reset at the target, as ss -K does
	if err := c.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if st := meshtest.WaitDone(t, &os[0].MemOwner, 1); st != abi.Success {
		t.Fatalf("put whose lane failed mid-ring: %v", st)
	}
	meshtest.WaitUntil(t, "the signal", func() bool { return atomic.LoadUint64(sig) == 3 })
	if !bytes.Equal(dst, src) {
		t.Fatal("bytes differ after the put was resent")
	}
	if ms[0].Peer(1).Dead() || ms[1].Peer(0).Dead() {
		t.Fatal("a lane failing mid-ring dropped the peer")
	}
	d.SlowIn.Store(0)
	time.Sleep(20 * time.Millisecond)
	if v := atomic.LoadUint64(sig); v != 3 {
		t.Fatalf("signal %d, want 3 (applied once)", v)
	}
}
