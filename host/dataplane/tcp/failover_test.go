package tcp_test

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
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// Lane failover (tcp_failover.go, SPEC.md §4).

// TestLaneFailoverMidStream resets one of four lanes while 16 MiB of puts
// and a put with signal are in flight: every put completes once with
// success, every byte lands, the signal is applied exactly once and only
// after the puts, nobody reports an error, the initiator hears of the
// failover, later operations avoid the dead lane, and the close is orderly;
// over TCP and between two ranks of one host (payloads by
// process_vm_writev, requests through shared-memory streams, whose reader
// drains the ring when its socket is reset).
func TestLaneFailoverMidStream(t *testing.T) {
	for _, intra := range []bool{false, true} {
		t.Run(fmt.Sprintf("intra=%v", intra), func(t *testing.T) { laneFailoverMidStream(t, intra) })
	}
}

func laneFailoverMidStream(t *testing.T, intra bool) {
	const (
		n     = 128
		piece = 128 << 10
		size  = 8 + n*piece
	)
	owners := []*meshtest.MemOwner{{Mem: make([]byte, 64), Done: map[uint64]abi.Result{}}, {Mem: make([]byte, size), Done: map[uint64]abi.Result{}}}
	ms := meshtest.Connect2(t, owners, dataplane.Options{Timeout: 10 * time.Second, IntraNode: intra, Lanes: 4, StripeThreshold: 1 << 40, ChunkSize: 1 << 20, CloseTimeout: 5 * time.Second})
	sig := (*uint64)(unsafe.Pointer(&owners[1].Mem[0]))
	src := make([]byte, size)
	for round := uint64(1); round <= 3; round++ {
		for i := range src {
			src[i] = byte(uint64(i)*7 + round*31)
		}
		base := round * 1000
		// The target acknowledges nothing of the lane about to die, so
		// that it dies with work in flight however fast the puts land.
		switch round {
		case 1:
			meshtest.TCPOf(t, ms[1], 0).Acks()[2].Hold().Store(true)
		case 2:
			meshtest.TCPOf(t, ms[1], 0).Acks()[3].Hold().Store(true)
		}
		for k := uint64(0); k < n; k++ {
			off := 8 + k*piece
			ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: base + k, Local: unsafe.Pointer(&src[off]), Size: piece, Off: off}}, true, int(k%4))
		}
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, SigMrID: 1, SigOp: abi.SignalOpInc, Tag: base + n}}, false, 0)
		ms[0].KickAll()
		switch round {
		case 1:
			time.Sleep(200 * time.Microsecond) // some of it on the wire, some landed
			meshtest.ResetIn(t, ms[1], 0, 2)
		case 2:
			time.Sleep(300 * time.Microsecond) // a second lane, with resent work on it
			meshtest.ResetIn(t, ms[1], 0, 3)
		}
		deadline := time.Now().Add(5 * time.Second)
		for atomic.LoadUint64(sig) < round && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if atomic.LoadUint64(sig) < round {
			p := ms[0].Peer(1)
			t.Logf("down %b dead %v", p.Down().Load(), p.Dead())
			for _, l := range p.Transport().(*tcp.Link).Lanes() {
				l.Mu().Lock()
				down, writing, queued, orphans := l.QueueState()
				t.Logf("lane %d: down %v writing %v q %d orphans %d", l.Idx(), down, writing, queued, orphans)
				l.Mu().Unlock()
				l.Amu().Lock()
				sent, puts, acked := l.AckState()
				t.Logf("   sent %d puts %d acked %d", sent, puts, acked)
				l.Amu().Unlock()
			}
			q := ms[1].Peer(0)
			t.Logf("target: next %d inDown %b", q.Order().Next(), q.Transport().(*tcp.Link).InDown().Load())
			owners[0].Mu.Lock()
			t.Logf("events %v failed %v", owners[0].LaneEvents, owners[0].Failed)
			owners[0].Mu.Unlock()
			t.FailNow()
		}
		if !bytes.Equal(owners[1].Mem[8:], src[8:]) {
			t.Fatalf("round %d: the signal is visible before every put landed (or a put landed twice)", round)
		}
		for k := uint64(0); k <= n; k++ {
			if st := meshtest.WaitDone(t, owners[0], base+k); st != abi.Success {
				t.Fatalf("round %d: op %d completed with %v", round, k, st)
			}
		}
		if got := atomic.LoadUint64(sig); got != round {
			t.Fatalf("round %d: signal word %d, want %d (applied twice?)", round, got, round)
		}
	}
	owners[0].Mu.Lock()
	for tag, c := range owners[0].Parts {
		if c != 1 {
			t.Errorf("op %d completed %d times", tag, c)
		}
	}
	failed, events := append([]error(nil), owners[0].Failed...), append([][3]int(nil), owners[0].LaneEvents...)
	owners[0].Mu.Unlock()
	owners[1].Mu.Lock()
	failed = append(failed, owners[1].Failed...)
	owners[1].Mu.Unlock()
	if len(failed) > 0 {
		t.Fatalf("errors reported although only one lane failed: %v", failed)
	}
	t.Logf("lane events (peer, lane, moved): %v", events)
	if len(events) != 2 || events[0][0] != 1 || events[0][1] != 2 || events[0][2] == 0 || events[1][1] != 3 {
		t.Fatalf("lane events %v, want rank 1 lane 2 (with operations moved), then lane 3", events)
	}
	if d := ms[0].Peer(1).Down().Load(); d != 1<<2|1<<3 {
		t.Fatalf("down lanes %#b, want lanes 2 and 3", d)
	}
	if ms[0].Peer(1).Dead() || ms[1].Peer(0).Dead() {
		t.Fatal("the peer died with three lanes left")
	}
	if err := ms[0].Close(); err != nil {
		t.Fatalf("close after a failover: %v", err)
	}
}

// TestResentPutsDeduplicated writes resent puts by hand on an
// authenticated stream: one whose sequence number already landed is read
// and dropped (its bytes are not written over a later put's, its signal is
// not applied again), one that never landed is applied once, and a plain
// duplicate is still a protocol violation that drops the peer.
func TestResentPutsDeduplicated(t *testing.T) {
	owners := []*meshtest.MemOwner{{Mem: make([]byte, 64), Done: map[uint64]abi.Result{}}, {Mem: make([]byte, 64), Done: map[uint64]abi.Result{}}}
	ms := meshtest.Connect2(t, owners, dataplane.Options{Timeout: 10 * time.Second, Lanes: 2, StripeThreshold: 1 << 40, ChunkSize: 1 << 20, CloseTimeout: 2 * time.Second})
	// Open lane 1 (lanes open when first used) with a get, which takes no
	// sequence number.
	var got [8]byte
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgGet, MrID: 1, Tag: 100, Local: unsafe.Pointer(&got[0]), Size: 8, Off: 8}}, false, 1)
	if st := meshtest.WaitDone(t, owners[0], 100); st != abi.Success {
		t.Fatalf("get on lane 1: %v", st)
	}
	l := ms[0].Peer(1).Transport().(*tcp.Link).Lanes()[0]
	send := func(tag, seq uint64, typ uint8, status uint16, fill byte) {
		t.Helper()
		h := wire.Header{Typ: typ, MrID: 1, Tag: tag, Off: 8, Size: 8, Status: status, Seq: seq}
		if typ == wire.MsgPutSignal {
			h.SigMrID, h.SigOp = 1, abi.SignalOpInc
		}
		var b [wire.HeaderSize + 8]byte
		h.Encode(b[:wire.HeaderSize])
		copy(b[wire.HeaderSize:], bytes.Repeat([]byte{fill}, 8))
		l.AwaitPuts([]uint64{tag}, nil) // the target acknowledges it like any put
		if _, err := l.Out().Write(b[:]); err != nil {
			t.Fatal(err)
		}
		if st := meshtest.WaitDone(t, owners[0], tag); st != abi.Success {
			t.Fatalf("put %d: %v", tag, st)
		}
	}
	word := func() uint64 { return atomic.LoadUint64((*uint64)(unsafe.Pointer(&owners[1].Mem[0]))) }
	resent := uint16(wire.StatusResent | 1<<8) // it left lane 1
	send(1, 1, wire.MsgPutSignal, 0, 'A')
	send(2, 2, wire.MsgPut, 0, 'B')
	send(3, 1, wire.MsgPutSignal, resent, 'A') // landed already: dropped
	if got := owners[1].Mem[8:16]; !bytes.Equal(got, []byte("BBBBBBBB")) || word() != 1 {
		t.Fatalf("after a duplicate resend: bytes %q (want B's), signal %d (want 1)", got, word())
	}
	send(4, 3, wire.MsgPutSignal, resent, 'C') // never landed: applied once
	send(5, 3, wire.MsgPutSignal, resent, 'C') // and not again
	if got := owners[1].Mem[8:16]; !bytes.Equal(got, []byte("CCCCCCCC")) || word() != 2 {
		t.Fatalf("after a new resend: bytes %q (want C's), signal %d (want 2)", got, word())
	}
	// The fence closed the target's end of lane 1: the initiator fails it
	// over (it had nothing to move), and the peer stays up.
	meshtest.WaitUntil(t, "lane 1 to fail over", func() bool { return ms[0].Peer(1).Down().Load() == 1<<1 })
	if ms[0].Peer(1).Dead() || ms[1].Peer(0).Dead() {
		t.Fatal("the peer died over resent puts")
	}
	// A duplicate that does not say it was resent is a protocol violation.
	h := wire.Header{Typ: wire.MsgPut, MrID: 1, Tag: 6, Off: 8, Size: 0, Seq: 2}
	var b [wire.HeaderSize]byte
	h.Encode(b[:])
	l.AwaitPuts([]uint64{6}, nil)
	if _, err := l.Out().Write(b[:]); err != nil {
		t.Fatal(err)
	}
	meshtest.WaitUntil(t, "the peer to be dropped", func() bool { return ms[1].Peer(0).Dead() })
}

// TestResendNamesBadLane: a resent put that names its own lane or a lane
// the peer does not have is a protocol error.
func TestResendNamesBadLane(t *testing.T) {
	for _, from := range []uint16{0, 5} {
		owners := []*meshtest.MemOwner{{Mem: make([]byte, 64), Done: map[uint64]abi.Result{}}, {Mem: make([]byte, 64), Done: map[uint64]abi.Result{}}}
		ms := meshtest.Connect2(t, owners, dataplane.Options{Timeout: 10 * time.Second, Lanes: 2, StripeThreshold: 1 << 40, ChunkSize: 1 << 20, CloseTimeout: time.Second})
		l := ms[0].Peer(1).Transport().(*tcp.Link).Lanes()[0]
		h := wire.Header{Typ: wire.MsgPut, MrID: 1, Tag: 1, Off: 8, Size: 0, Seq: 1, Status: wire.StatusResent | from<<8}
		var b [wire.HeaderSize]byte
		h.Encode(b[:])
		l.AwaitPuts([]uint64{1}, nil)
		if _, err := l.Out().Write(b[:]); err != nil {
			t.Fatal(err)
		}
		meshtest.WaitUntil(t, "the peer to be dropped", func() bool { return ms[1].Peer(0).Dead() })
	}
}

// TestAllLanesDownPeerDead: when every lane of a peer fails, the peer is
// dead as before: every operation in flight fails with ncclRemoteError and
// the loss is reported.
func TestAllLanesDownPeerDead(t *testing.T) {
	const piece = 256 << 10
	owners := []*meshtest.MemOwner{{Mem: make([]byte, 64), Done: map[uint64]abi.Result{}}, {Mem: make([]byte, 8+16*piece), Done: map[uint64]abi.Result{}}}
	ms := meshtest.Connect2(t, owners, dataplane.Options{Timeout: 10 * time.Second, Lanes: 2, StripeThreshold: 1 << 40, ChunkSize: 1 << 20, CloseTimeout: time.Second})
	meshtest.OpenLanes(t, ms[0], 1)
	src := make([]byte, 16*piece)
	for k := 0; k < 16; k++ {
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: uint64(k + 1), Local: unsafe.Pointer(&src[k*piece]), Size: piece, Off: 8 + uint64(k*piece)}}, false, k%2)
	}
	meshtest.ResetIn(t, ms[1], 0, 0)
	meshtest.ResetIn(t, ms[1], 0, 1)
	failed := 0
	for k := 1; k <= 16; k++ {
		if st := meshtest.WaitDone(t, owners[0], uint64(k)); st != abi.Success {
			if st != abi.RemoteError {
				t.Fatalf("op %d: %v, want success or ncclRemoteError", k, st)
			}
			failed++
		}
	}
	meshtest.WaitUntil(t, "the peer to die", func() bool { return ms[0].Peer(1).Dead() })
	// Posted after the death: fails at once.
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 99, Local: unsafe.Pointer(&src[0]), Size: 8, Off: 8}}, false, 1)
	if st := meshtest.WaitDone(t, owners[0], 99); st != abi.RemoteError {
		t.Fatalf("op after the death: %v, want ncclRemoteError", st)
	}
	owners[0].Mu.Lock()
	defer owners[0].Mu.Unlock()
	lost := false
	for _, err := range owners[0].Failed {
		lost = lost || errors.Is(err, dataplane.ErrPeerGone)
	}
	if !lost {
		t.Fatalf("the loss was not reported: %v", owners[0].Failed)
	}
}

// TestAckLaneFailover: with four lanes, the acks of rank 0's puts ride
// rank 1's lanes back (piggybacked). Rank 1's lane 0 fails (a reset)
// while rank 1 holds acks of puts that landed: rank 1 repeats the whole
// count on a live lane (tcpLink.rehomeAcks, its timer when nothing else
// is written), so every put still completes, once, with success, nobody
// reports an error, the peer lives, and later puts complete too.
func TestAckLaneFailover(t *testing.T) {
	for _, intra := range []bool{false, true} {
		t.Run(fmt.Sprintf("intra=%v", intra), func(t *testing.T) { ackLaneFailover(t, intra) })
	}
}

// fourLanes connects two ranks with four lanes each way, every lane open
// (a failed lane has lanes to fail over to), small operations unstriped.
func fourLanes(t *testing.T, intra bool) ([]*meshtest.MemOwner, []*dataplane.Mesh) {
	os := meshtest.NewOwners(2, 8192)
	ms := meshtest.Connect2(t, os, dataplane.Options{Timeout: 10 * time.Second, IntraNode: intra, Lanes: 4, StripeThreshold: 1 << 20, CloseTimeout: 5 * time.Second})
	meshtest.OpenLanes(t, ms[0], 1)
	meshtest.OpenLanes(t, ms[1], 0)
	return os, ms
}

func ackLaneFailover(t *testing.T, intra bool) {
	const n, size = 16, 64
	os, ms := fourLanes(t, intra)
	defer meshtest.DumpWhenStuck(t, ms)()
	a := meshtest.TCPOf(t, ms[1], 0).Acks()[0]
	if !a.Rides() {
		t.Fatal("acks of rank 0's lane 0 do not ride rank 1's lanes")
	}
	src := make([]byte, 2*n*size)
	for i := range src {
		src[i] = byte(i*5 + 3)
	}
	put := func(i int) {
		op := dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: uint64(100 + i), Local: unsafe.Pointer(&src[i*size]), Size: size, Off: uint64(64 + i*size), SigMrID: 1, SigOp: abi.SignalOpAdd, SigValue: 1}, Route: dataplane.Route{Remote: uint64(uintptr(unsafe.Pointer(&os[1].Mem[64+i*size])))}}
		ms[0].Post(1, &op, false, 0)
		ms[0].Flush(1)
	}
	a.Hold().Store(true) // rank 1 acknowledges nothing until its lane 0 died
	for i := 0; i < n; i++ {
		put(i)
	}
	meshtest.WaitWord(t, os[1], 0, n, func() { ms[1].Flush(0) })
	for i := 0; i < n; i++ {
		if _, ok := os[0].Status(uint64(100 + i)); ok {
			t.Fatalf("put %d completed before rank 1 acknowledged it", i)
		}
	}
	// The count rode a batch of rank 1's lane 0 that dies with the lane:
	// claimed (sent) but never read by rank 0. (The signals apply as the
	// puts land; the count is published when the reader drains, which on
	// a loaded machine may come a little after the last signal.)
	meshtest.WaitUntil(t, "rank 1 to publish every landed put", func() bool { return a.Pub().Load() == n })
	if !a.Claim(n) {
		t.Fatalf("rank 1's count of %d landed puts was already sent", n)
	}
	a.Hold().Store(false)
	meshtest.ResetIn(t, ms[0], 1, 0) // rank 1's lane 0 to rank 0: both ends see it break
	meshtest.WaitUntil(t, "rank 1's lane 0 to fail over", func() bool { return ms[1].Peer(0).Down().Load()&1 != 0 })
	// Nothing more arrives on the stream, and nobody calls rank 1: the
	// whole count leaves by itself, on a live lane.
	for i := 0; i < n; i++ {
		if st := meshtest.WaitDone(t, os[0], uint64(100+i)); st != abi.Success {
			t.Fatalf("put %d: %v", i, st)
		}
	}
	for i := n; i < 2*n; i++ {
		put(i) // after the failover, on rank 0's lane 0, which lives
	}
	meshtest.WaitWord(t, os[1], 0, 2*n, func() { ms[1].Flush(0) })
	for i := n; i < 2*n; i++ {
		if st := meshtest.WaitDone(t, os[0], uint64(100+i)); st != abi.Success {
			t.Fatalf("put %d: %v", i, st)
		}
	}
	if !bytes.Equal(os[1].Mem[64:64+2*n*size], src) {
		t.Fatal("a put's bytes did not land")
	}
	for r, o := range os {
		o.Mu.Lock()
		failed := append([]error(nil), o.Failed...)
		o.Mu.Unlock()
		if len(failed) > 0 {
			t.Fatalf("rank %d reported errors although one lane failed: %v", r, failed)
		}
	}
	if d := ms[1].Peer(0).Down().Load(); d != 1 {
		t.Fatalf("rank 1's down lanes %#b, want lane 0", d)
	}
	if ms[0].Peer(1).Dead() || ms[1].Peer(0).Dead() {
		t.Fatal("the peer died with three lanes left")
	}
	for _, m := range ms {
		if err := m.Close(); err != nil {
			t.Fatalf("close after a failover: %v", err)
		}
	}
}

// TestLateAckOfMovedLane: rank 0's lane 0 fails with puts landed at rank
// 1 and not yet acknowledged; rank 0 sends them again on another lane
// (rank 1 drops the copies). Rank 1's acks of the old stream, which ride
// its own lane 0 (alive), reach rank 0 after that: they are void, not a
// protocol error, and every put completes once, with success.
func TestLateAckOfMovedLane(t *testing.T) {
	for _, intra := range []bool{false, true} {
		t.Run(fmt.Sprintf("intra=%v", intra), func(t *testing.T) { lateAckOfMovedLane(t, intra) })
	}
}

func lateAckOfMovedLane(t *testing.T, intra bool) {
	const n, size = 16, 64
	os, ms := fourLanes(t, intra)
	defer meshtest.DumpWhenStuck(t, ms)()
	a := meshtest.TCPOf(t, ms[1], 0).Acks()[0]
	src := make([]byte, n*size)
	for i := range src {
		src[i] = byte(i*11 + 7)
	}
	a.Hold().Store(true)
	for i := 0; i < n; i++ {
		op := dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: uint64(200 + i), Local: unsafe.Pointer(&src[i*size]), Size: size, Off: uint64(64 + i*size), SigMrID: 1, SigOp: abi.SignalOpAdd, SigValue: 1}, Route: dataplane.Route{Remote: uint64(uintptr(unsafe.Pointer(&os[1].Mem[64+i*size])))}}
		ms[0].Post(1, &op, false, 0)
		ms[0].Flush(1)
	}
	meshtest.WaitWord(t, os[1], 0, n, func() { ms[1].Flush(0) })
	meshtest.ResetIn(t, ms[1], 0, 0) // rank 0's lane 0 to rank 1
	meshtest.WaitUntil(t, "rank 0's lane 0 to fail over", func() bool {
		l := meshtest.TCPOf(t, ms[0], 1).Lanes()[0]
		l.Amu().Lock()
		defer l.Amu().Unlock()
		return l.Moved()
	})
	a.Hold().Store(false)
	// Rank 1 writes to rank 0 on its lane 0: the batch carries the ack of
	// the old stream's puts.
	back := make([]byte, 8)
	op := dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 300, Local: unsafe.Pointer(&back[0]), Size: 8, Off: 4096}, Route: dataplane.Route{Remote: uint64(uintptr(unsafe.Pointer(&os[0].Mem[4096])))}}
	ms[1].Post(0, &op, false, 0)
	ms[1].Flush(0)
	if st := meshtest.WaitDone(t, os[1], 300); st != abi.Success {
		t.Fatalf("rank 1's put: %v", st)
	}
	for i := 0; i < n; i++ {
		if st := meshtest.WaitDone(t, os[0], uint64(200+i)); st != abi.Success {
			t.Fatalf("put %d: %v", i, st)
		}
	}
	if got := atomic.LoadUint64((*uint64)(unsafe.Pointer(&os[1].Mem[0]))); got != n {
		t.Fatalf("signal word %d, want %d (a resent put applied twice?)", got, n)
	}
	if !bytes.Equal(os[1].Mem[64:64+n*size], src) {
		t.Fatal("a put's bytes did not land")
	}
	os[0].Mu.Lock()
	failed := append([]error(nil), os[0].Failed...)
	for tag, c := range os[0].Parts {
		if c != 1 {
			t.Errorf("op %d completed %d times", tag, c)
		}
	}
	os[0].Mu.Unlock()
	if len(failed) > 0 || ms[0].Peer(1).Dead() {
		t.Fatalf("rank 0 failed the peer on the late ack: %v", failed)
	}
	for _, m := range ms {
		if err := m.Close(); err != nil {
			t.Fatalf("close after a failover: %v", err)
		}
	}
}
