package dataplane_test

import (
	"bytes"
	"encoding/binary"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

func TestSpan(t *testing.T) {
	for _, c := range []struct {
		off, n, size uint64
		ok           bool
	}{{0, 0, 0, true}, {0, 8, 8, true}, {1, 8, 8, false}, {8, 0, 8, true}, {9, 0, 8, false}, {^uint64(0), 2, 8, false}, {4, ^uint64(0), 8, false}} {
		if dataplane.Span(c.off, c.n, c.size) != c.ok {
			t.Errorf("Span(%d, %d, %d) != %v", c.off, c.n, c.size, c.ok)
		}
	}
}

// TestTargetRejectsBadRanges sends operations the target must refuse: the
// initiator learns it through PeerFailed, gets fail, and the stream lives on.
func TestTargetRejectsBadRanges(t *testing.T) {
	for _, intra := range []bool{false, true} {
		ms, os := meshtest.Mesh2(t, intra)
		src := bytes.Repeat([]byte{7}, 64)
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 1, Local: unsafe.Pointer(&src[0]), Size: 64, Off: 250}}, false, -1)
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 9, Tag: 2, Local: unsafe.Pointer(&src[0]), Size: 8}}, false, -1)
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, SigMrID: 1, SigOp: abi.SignalOpInc, SigOff: 3, Tag: 3}}, false, -1)
		dst := make([]byte, 64)
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgGet, MrID: 1, Tag: 4, Local: unsafe.Pointer(&dst[0]), Size: 64, Off: 200}}, false, -1)
		if st := meshtest.WaitDone(t, os[0], 4); st != abi.InvalidArgument {
			t.Fatalf("out-of-range get: %v", st)
		}
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 5, Local: unsafe.Pointer(&src[0]), Size: 64, Off: 0}}, false, -1)
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgGet, MrID: 1, Tag: 6, Local: unsafe.Pointer(&dst[0]), Size: 64, Off: 0}}, false, -1)
		if st := meshtest.WaitDone(t, os[0], 6); st != abi.Success || !bytes.Equal(dst, src) {
			t.Fatalf("stream unusable after rejections: %v %v", st, dst[:8])
		}
		os[0].Mu.Lock()
		n := len(os[0].Failed)
		os[0].Mu.Unlock()
		if n < 4 {
			t.Fatalf("intra=%v: %d rejections reported, want at least 4", intra, n)
		}
		// The rejected puts and signals fail their own requests too, with
		// the target's code, and never complete as a success.
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, SigMrID: 9, SigOp: abi.SignalOpInc, Tag: 7, Local: unsafe.Pointer(&src[0]), Size: 64, Off: 64}}, false, -1)
		for _, tag := range []uint64{1, 2, 3, 7} {
			if st := meshtest.WaitDone(t, os[0], tag); st != abi.InvalidArgument {
				t.Fatalf("intra=%v: request %d rejected at the target completed with %v, want %v", intra, tag, st, abi.InvalidArgument)
			}
		}
		if st := meshtest.WaitDone(t, os[0], 5); st != abi.Success {
			t.Fatalf("intra=%v: valid put after rejections: %v", intra, st)
		}
		os[0].Mu.Lock()
		for tag, k := range os[0].Parts {
			if k != 1 {
				t.Errorf("intra=%v: request %d completed %d times", intra, tag, k)
			}
		}
		os[0].Mu.Unlock()
	}
}

// TestConnectTimeout: a peer that never connects makes Connect fail in time
// with a message that names what is missing.
func TestConnectTimeout(t *testing.T) {
	l0, h0, _ := dataplane.Listen(dataplane.ListenOptions{Addr: "127.0.0.1"})
	l1, h1, _ := dataplane.Listen(dataplane.ListenOptions{Addr: "127.0.0.1"})
	defer l0.Close()
	defer l1.Close()
	start := time.Now()
	_, err := dataplane.Connect(l0, []*wire.Handle{h0, h1}, 0, &meshtest.MemOwner{Done: map[uint64]abi.Result{}}, dataplane.Options{Timeout: 300 * time.Millisecond, Lanes: 1})
	if err == nil || !strings.Contains(err.Error(), "timed out") {
		t.Fatalf("connect without the peer: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("connect took %v", d)
	}
}

// TestStripedLanes sends striped puts, gets and a put with signal over three
// lanes between two meshes and checks bytes, signal and completion counts.
func TestStripedLanes(t *testing.T) {
	const size = 1<<20 + 333
	// Target memory: the signal word, the put region, then a get source
	// written before the meshes start (the race detector cannot see the
	// ordering a signal gives across sockets, so the get reads other bytes).
	owners := []*meshtest.MemOwner{{Mem: make([]byte, 2*size), Done: map[uint64]abi.Result{}}, {Mem: make([]byte, 2*size), Done: map[uint64]abi.Result{}}}
	for i := size; i < 2*size; i++ {
		owners[1].Mem[i] = byte(i * 7)
	}
	// The readers spin after traffic (two of the six may at once).
	ms := meshtest.Connect2(t, owners, dataplane.Options{Timeout: 10 * time.Second, Lanes: 3, StripeThreshold: 64 << 10, ChunkSize: 100 << 10,
		SpinWait: 500 * time.Microsecond, Spinners: 2})
	// One piece per lane (3) plus the signal; a smaller op is cut into
	// pieces no smaller than the chunk size (200 KiB / 100 KiB = 2).
	if got := ms[0].Parts(wire.MsgPutSignal, size); got != 4 {
		t.Fatalf("parts = %d, want 4", got)
	}
	if got := ms[0].Parts(wire.MsgPut, 200<<10); got != 2 {
		t.Fatalf("parts of 200 KiB = %d, want 2", got)
	}
	src := make([]byte, size)
	for i := range src {
		src[i] = byte(i * 13)
	}
	// The signal word lives in the first 8 bytes of the target registration,
	// so the payload goes from offset 8.
	n := uint64(size - 8)
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, SigMrID: 1, SigOp: abi.SignalOpInc, Tag: 7, Local: unsafe.Pointer(&src[8]), Size: n, Off: 8}}, false, 1)
	deadline := time.Now().Add(10 * time.Second)
	for atomic.LoadUint64((*uint64)(unsafe.Pointer(&owners[1].Mem[0]))) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("signal never arrived")
		}
		time.Sleep(time.Millisecond)
	}
	if !bytes.Equal(owners[1].Mem[8:size], src[8:]) {
		t.Fatal("signal visible before all striped chunks landed")
	}
	dst := make([]byte, size)
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgGet, MrID: 1, Tag: 8, Local: unsafe.Pointer(&dst[0]), Size: size, Off: size}}, false, -1)
	want := ms[0].Parts(wire.MsgGet, size)
	for {
		owners[0].Mu.Lock()
		got := owners[0].Parts[8]
		owners[0].Mu.Unlock()
		if got == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("striped get: %d of %d parts completed", got, want)
		}
		time.Sleep(time.Millisecond)
	}
	if !bytes.Equal(dst, owners[1].Mem[size:]) {
		t.Fatal("striped get returned wrong bytes")
	}
}

// TestServiceSurvivesGarbage writes random headers and payloads straight
// onto an authenticated stream, as a broken or hostile peer could: the
// target must never touch memory outside its registration, must not crash,
// and at worst drops that peer.
func TestServiceSurvivesGarbage(t *testing.T) {
	rng := uint64(0x9e3779b97f4a7c15)
	next := func() uint64 {
		rng ^= rng << 13
		rng ^= rng >> 7
		rng ^= rng << 17
		return rng
	}
	for iter := 0; iter < 40; iter++ {
		ms, owners := meshtest.Mesh2(t, false)
		var b [wire.HeaderSize + 64]byte
		for i := range b {
			b[i] = byte(next())
		}
		// Keep some headers plausible so they reach the range checks.
		b[0] = byte(1 + next()%5)
		binary.LittleEndian.PutUint32(b[4:], uint32(next()%3))
		binary.LittleEndian.PutUint64(b[24:], next()%512)
		binary.LittleEndian.PutUint64(b[56:], next()%4)
		if _, err := ms[0].Peer(1).Transport().(*tcp.Link).Lanes()[0].Out().Write(b[:]); err != nil {
			t.Fatal(err)
		}
		// Close queues a goodbye behind the garbage on the same stream and
		// returns once the target acknowledged it (so it handled the
		// garbage) or dropped the stream over it; a garbage length that
		// swallows the goodbye ends with the short close timeout.
		ms[0].Close()
		ms[1].Close()
		w := owners[1].Whole
		if !bytes.Equal(w[:64], make([]byte, 64)) || !bytes.Equal(w[320:], make([]byte, 64)) {
			t.Fatalf("iteration %d: a garbage header wrote outside the registration", iter)
		}
	}
}
