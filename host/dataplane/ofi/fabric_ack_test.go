package ofi_test

import (
	"encoding/binary"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/ofi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric/endpoint"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric/nics"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// fabLinks returns both directions' fabric links of a two-rank pair, or
// skips where the provider's CQ data cannot carry a signal.
func fabLinks(t *testing.T, ms []*dataplane.Mesh) [2]*ofi.Link {
	t.Helper()
	var f [2]*ofi.Link
	for r := range f {
		l, ok := ms[r].Peer(1 - r).Transport().(*ofi.Link)
		if !ok {
			t.Fatalf("rank %d does not reach rank %d over fabric", r, 1-r)
		}
		f[r] = l
	}
	if !f[0].EP().CQ().SigCQ {
		t.Skip("the provider has no 8-byte CQ data")
	}
	return f
}

// waitFabWord waits until the 8-byte word at p reads want.
func waitFabWord(t *testing.T, p unsafe.Pointer, want uint64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); atomic.LoadUint64((*uint64)(p)) != want; {
		if time.Now().After(deadline) {
			t.Fatalf("signal word %d, want %d", atomic.LoadUint64((*uint64)(p)), want)
		}
		time.Sleep(20 * time.Microsecond)
	}
}

// TestFabricAckInCQData: a ping-pong of small puts with signal in CQ data,
// with acknowledgement messages turned off: each side's write completes
// only because the other's answer carries the acknowledgement in its CQ
// data. The last one, which no answer follows, completes once messages
// are allowed again (a MsgAck). Every payload byte and both words are
// checked at every step.
func TestFabricAckInCQData(t *testing.T) {
	const size = 1 << 20
	ms, os := meshtest.FabMesh2(t, "tcp;ofi_rxm", size, 1)
	f := fabLinks(t, ms)
	src := [2]unsafe.Pointer{fabric.Alloc(128), fabric.Alloc(128)}
	defer fabric.Free(src[0])
	defer fabric.Free(src[1])
	const word = 8 // the signal word's offset on both ranks
	tags := [2]uint64{}
	put := func(r int, size, off uint64) uint64 {
		t.Helper()
		tags[r]++
		ms[r].Post(1-r, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: tags[r], Local: src[r], Size: size, Off: off, SigMrID: 1, SigOff: word, SigOp: abi.SignalOpInc}}, false, -1)
		return tags[r]
	}
	check := func(r int, size, off uint64, step int) {
		t.Helper()
		got := os[1-r].Bytes()[off : off+size]
		want := unsafe.Slice((*byte)(src[r]), size)
		for j := range got {
			if got[j] != want[j] {
				t.Fatalf("step %d, rank %d's put: byte %d is %d, want %d", step, r, j, got[j], want[j])
			}
		}
	}
	// The first signal to each word is a message (accepted by its
	// verdict); those after it may go in CQ data.
	firstSignals(t, os, word, func(r int) uint64 { return put(r, 8, 4096) })
	ofi.TestNoAckMsg.Store(true)
	defer ofi.TestNoAckMsg.Store(false)
	base := [2]uint64{f[0].CQSigs().Load(), f[1].CQSigs().Load()}
	in := [2]uint64{f[0].AcksIn().Load(), f[1].AcksIn().Load()}
	const n = 200
	var last [2]uint64
	for i := range n {
		for r := range 2 {
			sz, off := uint64(1+(i*7+r)%endpoint.InlineMax), uint64(8192+256*i)
			b := unsafe.Slice((*byte)(src[r]), 128)
			for j := range b {
				b[j] = byte(i*31 + j*3 + r)
			}
			binary.LittleEndian.PutUint64(b, uint64(i)<<8|uint64(r))
			tag := put(r, sz, off)
			waitFabWord(t, unsafe.Add(os[1-r].Mem, word), uint64(i+2))
			check(r, sz, off, i)
			stepAcked(t, os, &last, r, i, tag)
		}
	}
	for r := range 2 {
		sentInCQ(t, f[r], r, base[r], n)
		if got := f[r].AcksIn().Load() - in[r]; got != 0 {
			t.Fatalf("rank %d received %d acknowledgement messages with them off", r, got)
		}
	}
	if os[1].IsDone(last[1]) {
		t.Fatal("rank 1's last put completed with no acknowledgement sent")
	}
	ofi.TestNoAckMsg.Store(false)
	if st := os[1].Wait(t, last[1]); st != abi.Success {
		t.Fatalf("rank 1's last put: %v", st)
	}
	if f[1].AcksIn().Load() == in[1] {
		t.Fatal("rank 1's last put completed without an acknowledgement message")
	}
}

// TestFabricAckAfterArrival: a put with signal in CQ data completes only
// once the target has landed it, not when its send completed: with the
// target's poll lock held (nothing lands there), the initiator reaps its
// send's completion and the request stays open; released, it completes,
// its bytes and signal in place.
func TestFabricAckAfterArrival(t *testing.T) {
	const size = 1 << 16
	ms, os := meshtest.FabMesh2(t, "tcp;ofi_rxm", size, 1)
	f := fabLinks(t, ms)[0]
	src := fabric.Alloc(64)
	defer fabric.Free(src)
	sb := unsafe.Slice((*byte)(src), 64)
	post := func(tag, off uint64) {
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: tag, Local: src, Size: 40, Off: off, SigMrID: 1, SigOff: 0, SigOp: abi.SignalOpInc}}, false, -1)
	}
	post(1, 1024) // the word's first signal: a message
	if st := os[0].Wait(t, 1); st != abi.Success {
		t.Fatalf("first signal: %v", st)
	}
	waitFabWord(t, os[1].Mem, 1)
	for i := range sb {
		sb[i] = byte(0xa0 + i)
	}
	e0, e1 := ms[0].Fab().EP(0), ms[1].Fab().EP(0)
	e1.LockPoll()
	locked := true
	defer func() {
		if locked {
			e1.UnlockPoll()
		}
	}()
	before := f.CQSigs().Load()
	post(2, 2048)
	if f.CQSigs().Load() != before+1 {
		t.Fatal("the put with signal did not go in CQ data")
	}
	// Wait for the send's completion: the slot of our put keeps sigSent.
	for deadline := time.Now().Add(10 * time.Second); ; {
		e0.LockPoll()
		sent := e0.SignalSent(f, 2)
		e0.UnlockPoll()
		if sent {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the write's send never completed")
		}
		time.Sleep(100 * time.Microsecond)
	}
	if os[0].IsDone(2) {
		t.Fatal("the put with signal completed before the target landed it")
	}
	if w := atomic.LoadUint64((*uint64)(os[1].Mem)); w != 1 {
		t.Fatalf("the signal applied (%d) while the target's poll lock was held", w)
	}
	e1.UnlockPoll()
	locked = false
	if st := os[0].Wait(t, 2); st != abi.Success {
		t.Fatalf("put with signal: %v", st)
	}
	if w := atomic.LoadUint64((*uint64)(os[1].Mem)); w != 2 {
		t.Fatalf("signal word %d after completion, want 2", w)
	}
	got := os[1].Bytes()[2048 : 2048+40]
	for i := range got {
		if got[i] != sb[i] {
			t.Fatalf("byte %d is %d after completion, want %d", i, got[i], sb[i])
		}
	}
}

// TestFabricAckForged: an acknowledgement of more numbers than we ever
// sent is a protocol violation: the receiver drops the sender.
func TestFabricAckForged(t *testing.T) {
	ms, _ := meshtest.FabMesh2(t, "tcp;ofi_rxm", 1<<16, 1)
	e := ms[0].Fab().EP(0)
	dest := e.Links()[1].Rails()[0].Addr()
	buf := fabric.Alloc(endpoint.MsgSize)
	defer fabric.Free(buf)
	h := endpoint.Msg{Type: endpoint.MsgAck, Rank: 0, Word: 1000}
	h.Put(unsafe.Slice((*byte)(buf), endpoint.MsgSize))
	meshtest.InjectForged(t, e, buf, endpoint.MsgSize, dest)
	meshtest.AwaitDropped(t, ms[1].Peer(0), "an acknowledgement of numbers never sent did not drop its sender")
}

// TestFabricAckBeforeGoodbye: a target that closes right after a put with
// signal in CQ data landed acknowledges it before its goodbye, so the
// initiator's request succeeds rather than failing with the pair. Poll
// acknowledgements are off: only the goodbye's can complete it.
func TestFabricAckBeforeGoodbye(t *testing.T) {
	ms, os := meshtest.FabMesh2(t, "tcp;ofi_rxm", 1<<16, 1)
	f := fabLinks(t, ms)[0]
	src := fabric.Alloc(64)
	defer fabric.Free(src)
	binary.LittleEndian.PutUint64(unsafe.Slice((*byte)(src), 64), 0x5eed)
	post := func(tag, off uint64) {
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: tag, Local: src, Size: 8, Off: off, SigMrID: 1, SigOff: 0, SigOp: abi.SignalOpInc}}, false, -1)
	}
	post(1, 1024)
	if st := os[0].Wait(t, 1); st != abi.Success {
		t.Fatalf("first signal: %v", st)
	}
	ofi.TestNoAckMsg.Store(true)
	defer ofi.TestNoAckMsg.Store(false)
	before := f.CQSigs().Load()
	post(2, 2048)
	if f.CQSigs().Load() != before+1 {
		t.Fatal("the put with signal did not go in CQ data")
	}
	waitFabWord(t, os[1].Mem, 2)
	if os[0].IsDone(2) {
		t.Fatal("the put completed with no acknowledgement sent")
	}
	if err := ms[1].Close(); err != nil {
		t.Fatalf("target close: %v", err)
	}
	if st := os[0].Wait(t, 2); st != abi.Success {
		t.Fatalf("put with signal before the target's goodbye: %v", st)
	}
	if v := binary.LittleEndian.Uint64(os[1].Bytes()[2048:]); v != 0x5eed {
		t.Fatalf("payload %#x", v)
	}
}

// TestFabricAckRails: with two rails, each side's puts with signal in CQ
// data alternate rails and the answer to each goes on the other rail, so
// every acknowledgement arrives on a rail other than its write's: that
// rail's poller completes it. Acknowledgement messages are off during the
// exchange; every byte and signal is checked; then rank 1 closes and
// rank 0's last put still succeeds (acknowledged before the goodbye).
func TestFabricAckRails(t *testing.T) {
	prov := meshtest.FabricProvider(t, "tcp;ofi_rxm")
	ns := nics.List(prov)
	if len(ns) < 1 {
		t.Skipf("%s offers no domain here", prov)
	}
	dom := ns[0].Domain
	ms, os := meshtest.FabMesh2Rails(t, prov, 1<<20, 2, [2]bool{}, dom, [2][]string{{dom}, {dom}})
	f := fabLinks(t, ms)
	if len(f[0].Rails()) != 2 || len(f[1].Rails()) != 2 {
		t.Fatalf("rails %d and %d, want 2", len(f[0].Rails()), len(f[1].Rails()))
	}
	src := [2]unsafe.Pointer{fabric.Alloc(64), fabric.Alloc(64)}
	defer fabric.Free(src[0])
	defer fabric.Free(src[1])
	const word = 16
	tags := [2]uint64{}
	put := func(r, lane int, off uint64) uint64 {
		tags[r]++
		ms[r].Post(1-r, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: tags[r], Local: src[r], Size: 24, Off: off, SigMrID: 1, SigOff: word, SigOp: abi.SignalOpInc}}, false, lane)
		return tags[r]
	}
	firstSignals(t, os, word, func(r int) uint64 { return put(r, 0, 4096) })
	ofi.TestNoAckMsg.Store(true)
	defer ofi.TestNoAckMsg.Store(false)
	base := [2]uint64{f[0].CQSigs().Load(), f[1].CQSigs().Load()}
	const n = 100
	var last [2]uint64
	for i := range n {
		for r := range 2 {
			b := unsafe.Slice((*byte)(src[r]), 24)
			for j := range b {
				b[j] = byte(i*7 + j + 100*r)
			}
			off := uint64(8192 + 64*i)
			tag := put(r, (i+r)%2, off)
			waitFabWord(t, unsafe.Add(os[1-r].Mem, word), uint64(i+2))
			got := os[1-r].Bytes()[off : off+24]
			for j := range got {
				if got[j] != b[j] {
					t.Fatalf("step %d, rank %d: byte %d is %d, want %d", i, r, j, got[j], b[j])
				}
			}
			stepAcked(t, os, &last, r, i, tag)
		}
	}
	for r := range 2 {
		sentInCQ(t, f[r], r, base[r], n)
	}
	if err := ms[1].Close(); err != nil {
		t.Fatalf("rank 1 close: %v", err)
	}
	if st := os[0].Wait(t, last[0]); st != abi.Success {
		t.Fatalf("rank 0's last put: %v", st)
	}
}

// stepAcked: rank r's put tag, step i of a ping-pong, carried the
// acknowledgement of the other rank's previous put, which completes now;
// tag becomes r's last.
func stepAcked(t *testing.T, os []*meshtest.FabOwner, last *[2]uint64, r, i int, tag uint64) {
	t.Helper()
	if prev := last[1-r]; prev != 0 {
		if st := os[1-r].Wait(t, prev); st != abi.Success {
			t.Fatalf("step %d: rank %d's put: %v", i, 1-r, st)
		}
	}
	last[r] = tag
}

// sentInCQ checks that link f of rank r sent n puts with their signal in
// CQ data since its count was base.
func sentInCQ(t *testing.T, f *ofi.Link, r int, base, n uint64) {
	t.Helper()
	if got := f.CQSigs().Load() - base; got != n {
		t.Fatalf("rank %d sent %d of %d puts with signal in CQ data", r, got, n)
	}
}

// firstSignals sends each rank's first signal to the other's word (a
// message, accepted by its verdict: only later ones may ride CQ data) with
// put, which returns the request's tag, and waits until both landed.
func firstSignals(t *testing.T, os []*meshtest.FabOwner, word int, put func(r int) uint64) {
	t.Helper()
	for r := range 2 {
		if st := os[r].Wait(t, put(r)); st != abi.Success {
			t.Fatalf("rank %d's first signal: %v", r, st)
		}
		waitFabWord(t, unsafe.Add(os[1-r].Mem, word), 1)
	}
}
