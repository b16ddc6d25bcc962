package tcp_test

import (
	"bytes"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/codec/codectest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// TestPlanChunk: a per-op chunk stripes an op over the lanes in pieces of
// that size, whatever the connection's threshold, bounded in count, and the
// signal still follows every piece.
func TestPlanChunk(t *testing.T) {
	const size = 100000
	owners := []*meshtest.MemOwner{{Mem: make([]byte, 64), Done: map[uint64]abi.Result{}}, {Mem: make([]byte, size+8), Done: map[uint64]abi.Result{}}}
	ms := meshtest.Connect2(t, owners, dataplane.Options{Timeout: 10 * time.Second, Lanes: 3, StripeThreshold: 1 << 30, ChunkSize: 64 << 10})
	m := ms[0]
	for _, c := range []struct {
		kind        uint8
		size, chunk uint64
		want        int
	}{
		{wire.MsgPut, size, 0, 1},            // below the connection's threshold
		{wire.MsgPut, size, 8192, 13},        // ceil(100000/8192)
		{wire.MsgPutSignal, size, 8192, 14},  // + the signal
		{wire.MsgGet, size, 100, 25},         // raised to 4096
		{wire.MsgPut, 8192, 8192, 1},         // fits in one chunk
		{wire.MsgPut, 1 << 30, 4096, 1024},   // at most MaxPiecesPerOp
		{wire.MsgPutSignal, 0, 4096, 1},      // a bare signal
		{wire.MsgPut, 1<<30 + 1, 4096, 1024}, // size/1024 rounds up
	} {
		if got := m.OpParts(1, &dataplane.Op{Request: dataplane.Request{Msg: c.kind, Size: c.size}, Plan: dataplane.Plan{Chunk: c.chunk}}); got != c.want {
			t.Errorf("kind %d size %d chunk %d: %d parts, want %d", c.kind, c.size, c.chunk, got, c.want)
		}
	}
	src := randomData(size, 5)
	op := dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, SigMrID: 1, SigOp: abi.SignalOpInc, Tag: 9, Local: unsafe.Pointer(&src[0]), Size: size, Off: 8}, Plan: dataplane.Plan{Chunk: 8192}}
	want := m.OpParts(1, &op)
	m.Post(1, &op, false, 2)
	deadline := time.Now().Add(10 * time.Second)
	for atomic.LoadUint64((*uint64)(unsafe.Pointer(&owners[1].Mem[0]))) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("signal never arrived")
		}
		time.Sleep(100 * time.Microsecond)
	}
	if !bytes.Equal(owners[1].Mem[8:], src) {
		t.Fatal("signal visible before every piece landed")
	}
	for {
		owners[0].Mu.Lock()
		got := owners[0].Parts[9]
		owners[0].Mu.Unlock()
		if got == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d parts completed", got, want)
		}
		time.Sleep(100 * time.Microsecond)
	}
	used := 0
	for _, l := range m.Peer(1).Transport().(*tcp.Link).Lanes() {
		if l.PendingPuts() == 0 && m.PeerSeq(1) > 0 {
			used++
		}
	}
	if used != 3 {
		t.Fatalf("pieces used %d lanes, want 3", used)
	}
}

// TestPacing: a paced op leaves no earlier than its time, Post returns at
// once, ops behind it on its lane wait with it (order), and other lanes
// do not.
func TestPacing(t *testing.T) {
	owners := []*meshtest.MemOwner{{Mem: make([]byte, 64), Done: map[uint64]abi.Result{}}, {Mem: make([]byte, 4096), Done: map[uint64]abi.Result{}}}
	ms := meshtest.Connect2(t, owners, dataplane.Options{Timeout: 10 * time.Second, Lanes: 2, StripeThreshold: 1 << 30, ChunkSize: 64 << 10})
	src := codectest.CompressibleData(64, 1)
	// Long enough that a Post blocking on the pacing could not go unseen
	// on a loaded machine.
	const delay = 1500 * time.Millisecond
	start := time.Now()
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 1, Local: unsafe.Pointer(&src[0]), Size: 64, Off: 64}, Plan: dataplane.Plan{NotBefore: dataplane.Now() + int64(delay)}}, false, 0)
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, SigMrID: 1, SigOp: abi.SignalOpInc, Tag: 2}}, false, 0)
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 3, Local: unsafe.Pointer(&src[0]), Size: 64, Off: 1024}}, false, 1)
	if el := time.Since(start); el >= delay {
		t.Fatalf("posting a paced op blocked for %v (its delay)", el)
	}
	if st := meshtest.WaitDone(t, owners[0], 3); st != abi.Success {
		t.Fatal(st)
	}
	// Only while its time has not come can the paced op be known to wait
	// (a paused machine may reach this line later).
	if _, done := owners[0].Status(1); done && time.Since(start) < delay {
		t.Fatal("the paced op completed before its time, before an op on another lane posted after it")
	}
	ms[0].Flush(1) // a test() must not send it early either
	meshtest.WaitDone(t, owners[0], 1)
	if el := time.Since(start); el < delay {
		t.Fatalf("the paced op completed after %v, before its %v", el, delay)
	}
	meshtest.WaitDone(t, owners[0], 2)
	if got := atomic.LoadUint64((*uint64)(unsafe.Pointer(&owners[1].Mem[0]))); got != 1 {
		t.Fatalf("signal %d", got)
	}
	if !bytes.Equal(owners[1].Mem[64:128], src) {
		t.Fatal("paced payload wrong")
	}
}
