package intranode_test

import (
	"bytes"
	"maps"
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

// gatedOwner is a sharedOwner whose signal registration (2) cannot be
// resolved while gate is closed: the target's service stops at the signal
// of a put+signal, before it applies or acknowledges it.
type gatedOwner struct {
	sharedOwner
	closed atomic.Bool
	gate   chan struct{}
}

func (o *gatedOwner) Resolve(id uint32) (unsafe.Pointer, uint64, uintptr, dataplane.Pin, bool) {
	if id == 2 && o.closed.Load() {
		<-o.gate
	}
	return o.sharedOwner.Resolve(id)
}

// heldPair connects two ranks over the intra-node path, each with size
// bytes of the stand-in device's memory, rank 1's signal registration held
// (gatedOwner) until open is called, with lanes lanes and placed
// completions on or off.
func heldPair(t *testing.T, size uintptr, placed bool, lanes int) (*meshtest.StreamSelfDevice, []*meshtest.DevOwner, []*dataplane.Mesh, func()) {
	d := meshtest.QueuedDevice(t, int(2*size))
	os, owners := devOwners(d, size)
	gated := &gatedOwner{sharedOwner: sharedOwner{os[1]}, gate: make(chan struct{})}
	owners[1] = gated
	ms := meshtest.ConnectOwners(t, owners, dataplane.Options{Timeout: 10 * time.Second, IntraNode: true, Lanes: lanes, StripeThreshold: 1 << 40,
		ChunkSize: 64 << 10, CloseTimeout: 2 * time.Second, StageChunk: 4 << 10, PlacedCompletion: placed})
	gated.closed.Store(true)
	opened := false
	return d, os, ms, func() {
		if !opened {
			opened = true
			gated.closed.Store(false)
			close(gated.gate)
		}
	}
}

// TestPlacedCompletion: a put+signal whose payload the device copy placed
// straight into the peer's mapped memory completes, with PlacedCompletion
// on, once that copy executed and its header was written, while the
// target cannot yet apply or acknowledge its signal; the bytes are in the
// target's memory then, and the signal follows once the target goes on.
// With it off, the request waits for the acknowledgement. A signal alone
// always waits for it.
// Each request completes as many times in both modes (the lane's ack
// completes nothing of a placed put twice), with one lane and with four.
func TestPlacedCompletion(t *testing.T) {
	parts := map[string]map[uint64]int{}
	for _, c := range []struct {
		name   string
		placed bool
		lanes  int
	}{{"acked", false, 1}, {"placed", true, 1}, {"placed-4-lanes", true, 4}} {
		t.Run(c.name, func(t *testing.T) { parts[c.name] = placedCompletion(t, c.placed, c.lanes) })
	}
	for name, p := range parts {
		for _, tag := range []uint64{10, 11, 12} {
			if p[tag] != parts["acked"][tag] {
				t.Errorf("%s: request %d completed %d times, %d when acknowledged", name, tag, p[tag], parts["acked"][tag])
			}
		}
	}
}

func placedCompletion(t *testing.T, placed bool, lanes int) map[uint64]int {
	const size = 1 << 20
	d, os, ms, open := heldPair(t, size, placed, lanes)
	defer open()
	src := d.At(os[0].Dev, size)
	target := os[1].Dev // rank 1's device memory, "mapped" here: one process
	sig := (*uint64)(unsafe.Pointer(&os[1].Host[0]))

	// Two put+signals, then a signal alone, all held at the target.
	for k, n := range []uint64{8, 40 << 10} {
		meshtest.Fill(src[uint64(k)*(64<<10):uint64(k)*(64<<10)+n], 20+k)
		off := uint64(k) * (64 << 10)
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: uint64(10 + k), Local: meshtest.AddrPtr(uint64(os[0].Dev) + off), LocalCtx: 1, Size: n, Off: off, SigMrID: 2, SigOp: abi.SignalOpAdd, SigValue: 1}, Route: dataplane.Route{Mapped: uint64(target) + off, MapCtx: 1}}, false, -1)
	}
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, Tag: 12, SigMrID: 2, SigOp: abi.SignalOpAdd, SigValue: 1}}, false, -1)

	if placed {
		for k, n := range []uint64{8, 40 << 10} {
			off := uint64(k) * (64 << 10)
			if st := meshtest.WaitDone(t, &os[0].MemOwner, uint64(10+k)); st != abi.Success {
				t.Fatalf("put+signal of %d bytes: %v", n, st)
			}
			// Completed: its bytes are in the target's memory already.
			if !bytes.Equal(d.Peek(target+uintptr(off), n), src[off:off+n]) {
				t.Fatalf("put+signal of %d bytes completed before its bytes were placed", n)
			}
		}
	} else {
		// Without the ack nothing completes: wait until the bytes are
		// there, then look once more.
		for k, n := range []uint64{8, 40 << 10} {
			off := uint64(k) * (64 << 10)
			meshtest.WaitUntil(t, "the bytes to be placed", func() bool { return bytes.Equal(d.Peek(target+uintptr(off), n), src[off:off+n]) })
		}
		time.Sleep(10 * time.Millisecond)
		for _, tag := range []uint64{10, 11} {
			if _, done := os[0].Status(tag); done {
				t.Fatalf("put+signal %d completed before the target acknowledged it", tag)
			}
		}
	}
	if _, done := os[0].Status(12); done {
		t.Fatal("a signal alone completed before the target acknowledged it")
	}
	if v := atomic.LoadUint64(sig); v != 0 {
		t.Fatalf("signal %d while the target was held", v)
	}
	open()
	for _, tag := range []uint64{10, 11, 12} {
		if st := meshtest.WaitDone(t, &os[0].MemOwner, tag); st != abi.Success {
			t.Fatalf("request %d: %v", tag, st)
		}
	}
	meshtest.WaitUntil(t, "the three signals", func() bool { return atomic.LoadUint64(sig) == 3 })
	for _, m := range ms {
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
	}
	os[0].Mu.Lock()
	defer os[0].Mu.Unlock()
	if len(os[0].Failed) > 0 || len(os[1].Failed) > 0 {
		t.Fatalf("failures: %v %v", os[0].Failed, os[1].Failed)
	}
	return maps.Clone(os[0].Parts)
}

// TestPlacedFailover: with placed completions and four lanes, put+signals
// placed in the peer's mapped memory complete while the target holds
// them all unacknowledged; then one of the lanes breaks and fails over.
// Its puts go again (header only: their payload is there) and the target
// takes each once: every request completed exactly once, every byte
// there, every signal applied once, nothing reported failed.
func TestPlacedFailover(t *testing.T) {
	const (
		size = 1 << 20
		n    = 16
		step = 16 << 10
	)
	d, os, ms, open := heldPair(t, size, true, 4)
	defer open()
	meshtest.OpenLanes(t, ms[0], 1)
	src := d.At(os[0].Dev, size)
	target := os[1].Dev
	sig := (*uint64)(unsafe.Pointer(&os[1].Host[0]))

	for k := range uint64(n) {
		off, m := k*step, 8+k*1000
		meshtest.Fill(src[off:off+m], int(30+k))
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: 100 + k, Local: meshtest.AddrPtr(uint64(os[0].Dev) + off), LocalCtx: 1, Size: m, Off: off, SigMrID: 2, SigOp: abi.SignalOpAdd, SigValue: 1}, Route: dataplane.Route{Mapped: uint64(target) + off, MapCtx: 1}}, false, int(k%4))
	}
	for k := range uint64(n) {
		if st := meshtest.WaitDone(t, &os[0].MemOwner, 100+k); st != abi.Success {
			t.Fatalf("put+signal %d: %v", k, st)
		}
	}
	if v := atomic.LoadUint64(sig); v != 0 {
		t.Fatalf("signal %d while the target was held", v)
	}
	// Lane 2 breaks with its puts unacknowledged (and maybe unread).
	meshtest.ResetIn(t, ms[1], 0, 2)
	open()
	meshtest.WaitUntil(t, "every signal", func() bool { return atomic.LoadUint64(sig) >= n })
	meshtest.WaitUntil(t, "the lane's failover", func() bool { return ms[0].Peer(1).Down().Load()&(1<<2) != 0 })
	// A resend applied twice would show now or never: a put on each lane
	// after the failover, its signal last.
	for k := range uint64(4) {
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: 200 + k, Local: meshtest.AddrPtr(uint64(os[0].Dev)), LocalCtx: 1, Size: 8, Off: 0, SigMrID: 2, SigOp: abi.SignalOpAdd, SigValue: 1}, Route: dataplane.Route{Mapped: uint64(target), MapCtx: 1}}, false, int(k))
	}
	for k := range uint64(4) {
		if st := meshtest.WaitDone(t, &os[0].MemOwner, 200+k); st != abi.Success {
			t.Fatalf("put+signal after the failover, lane %d: %v", k, st)
		}
	}
	meshtest.WaitUntil(t, "every signal after the failover", func() bool { return atomic.LoadUint64(sig) >= n+4 })
	for _, m := range ms {
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if v := atomic.LoadUint64(sig); v != n+4 {
		t.Fatalf("signal word %d, want %d (a resent signal applied twice?)", v, n+4)
	}
	for k := uint64(1); k < n; k++ { // put 0's bytes were written again after the failover
		off, m := k*step, 8+k*1000
		if !bytes.Equal(d.Peek(target+uintptr(off), m), src[off:off+m]) {
			t.Fatalf("put %d's bytes differ at the target", k)
		}
	}
	os[0].Mu.Lock()
	defer os[0].Mu.Unlock()
	for tag, c := range os[0].Parts {
		if c != 1 {
			t.Errorf("request %d completed %d times", tag, c)
		}
	}
	if len(os[0].Parts) != n+4 {
		t.Errorf("%d requests completed, want %d", len(os[0].Parts), n+4)
	}
	if len(os[0].Failed) > 0 || len(os[1].Failed) > 0 {
		t.Fatalf("failures although only one lane broke: %v %v", os[0].Failed, os[1].Failed)
	}
}

// TestPlacedBound: a lane lets at most placedMax puts complete before
// their acks while earlier ones still await theirs; past it, a placed
// put waits for its ack like any other, so a target that never
// acknowledges holds the caller's requests, not the sender's memory.
func TestPlacedBound(t *testing.T) {
	const size, n, max = 1 << 20, 5, 2
	defer tcp.SetPlacedMax(max)()
	d, os, ms, open := heldPair(t, size, true, 1)
	defer open()
	src := d.At(os[0].Dev, size)
	target := os[1].Dev
	sig := (*uint64)(unsafe.Pointer(&os[1].Host[0]))
	l := meshtest.TCPOf(t, ms[0], 1).Lanes()[0]
	for k := range uint64(n) {
		off := k * 4096
		meshtest.Fill(src[off:off+64], int(40+k))
		// One at a time, each in the lane's FIFO before the next is
		// posted, so that the bound is looked at for every one.
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: 300 + k, Local: meshtest.AddrPtr(uint64(os[0].Dev) + off), LocalCtx: 1, Size: 64, Off: off, SigMrID: 2, SigOp: abi.SignalOpAdd, SigValue: 1}, Route: dataplane.Route{Mapped: uint64(target) + off, MapCtx: 1}}, false, 0)
		meshtest.WaitUntil(t, "the put in the lane's FIFO", func() bool { return l.PendingPuts() == int(k+1) })
	}
	for k := range uint64(max) {
		if st := meshtest.WaitDone(t, &os[0].MemOwner, 300+k); st != abi.Success {
			t.Fatalf("put+signal %d: %v", k, st)
		}
	}
	time.Sleep(10 * time.Millisecond)
	for k := uint64(max); k < n; k++ {
		if _, done := os[0].Status(300 + k); done {
			t.Fatalf("put+signal %d completed unacknowledged with %d puts awaiting acks (bound %d)", k, k, max)
		}
	}
	open()
	for k := range uint64(n) {
		if st := meshtest.WaitDone(t, &os[0].MemOwner, 300+k); st != abi.Success {
			t.Fatalf("put+signal %d after the target went on: %v", k, st)
		}
	}
	meshtest.WaitUntil(t, "every signal", func() bool { return atomic.LoadUint64(sig) == n })
	for _, m := range ms {
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
	}
	os[0].Mu.Lock()
	defer os[0].Mu.Unlock()
	for tag, c := range os[0].Parts {
		if c != 1 {
			t.Errorf("request %d completed %d times", tag, c)
		}
	}
}
