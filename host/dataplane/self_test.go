package dataplane

import (
	"bytes"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
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
	ms, os, d := ringMesh(t, size, 1)
	x := ms[0].peers[0].t.(*intraLink)
	src := d.At(os[0].dev, size)
	fill(src[:size/2], 3)
	clear(src[size/2:])
	sig := (*uint64)(unsafe.Pointer(&os[0].host[0]))

	// Device to device, 8 bytes (the flush) and 20 KiB, with a signal.
	for k, n := range []uint64{8, 20 << 10} {
		tag := uint64(10 + k)
		ms[0].Post(0, &Op{Msg: wire.MsgPutSignal, MrID: 1, Tag: tag, Local: addrPtr(uint64(os[0].dev)), LocalCtx: 1, Size: n, Off: size / 2,
			SigMrID: 2, SigOp: abi.SignalOpAdd, SigValue: 1}, false, -1)
		if st := waitDone(t, &os[0].memOwner, tag); st != abi.Success {
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
	h := os[0].host[64 : 64+4096]
	fill(h, 5)
	ms[0].Post(0, &Op{Msg: wire.MsgPut, MrID: 1, Tag: 20, Local: unsafe.Pointer(&h[0]), Size: 4096, Off: 100}, false, -1)
	if st := waitDone(t, &os[0].memOwner, 20); st != abi.Success || !bytes.Equal(src[100:100+4096], h) {
		t.Fatalf("host->device self put: %v", st)
	}
	g := os[0].host[8192 : 8192+4096]
	ms[0].Post(0, &Op{Msg: wire.MsgGet, MrID: 1, Tag: 21, Local: unsafe.Pointer(&g[0]), Size: 4096, Off: 200}, false, -1)
	if st := waitDone(t, &os[0].memOwner, 21); st != abi.Success || !bytes.Equal(g, src[200:200+4096]) {
		t.Fatalf("device->host self get: %v", st)
	}
	if n := x.selfs.Load(); n != 4 {
		t.Fatalf("%d of 4 operations to itself moved by local copies", n)
	}
	// Out of range: refused as over the socket.
	ms[0].Post(0, &Op{Msg: wire.MsgPut, MrID: 1, Tag: 22, Local: addrPtr(uint64(os[0].dev)), LocalCtx: 1, Size: 4096, Off: size - 100}, false, -1)
	if st := waitDone(t, &os[0].memOwner, 22); st != abi.InvalidArgument {
		t.Fatalf("out-of-range self put completed with %v", st)
	}
	// The next copy fails: the put goes through the socket and lands. (The
	// refused put completed at its header: its payload may still be in
	// the writer's hands.)
	for deadline := time.Now().Add(10 * time.Second); !x.idle(); time.Sleep(50 * time.Microsecond) {
		if time.Now().After(deadline) {
			t.Fatal("the lane never went idle")
		}
	}
	d.FailAt.Store(d.Copies.Load() + 1)
	clear(src[size/2 : size/2+64])
	ms[0].Post(0, &Op{Msg: wire.MsgPut, MrID: 1, Tag: 23, Local: addrPtr(uint64(os[0].dev)), LocalCtx: 1, Size: 64, Off: size / 2}, false, -1)
	if st := waitDone(t, &os[0].memOwner, 23); st != abi.Success || !bytes.Equal(src[size/2:size/2+64], src[:64]) {
		t.Fatalf("self put after a failed local copy: %v", st)
	}
	if n := x.selfs.Load(); n != 4 {
		t.Fatalf("%d operations moved locally, want still 4", n)
	}
	for _, m := range ms {
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
