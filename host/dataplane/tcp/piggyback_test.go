package tcp_test

import (
	"fmt"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// TestAggregatedBatchOneWrite: ops posted with the aggregation hint (hold)
// are not written one by one: N of them and the plain op behind them leave
// in one batch and one writev when the caller tests (Flush), and all N+1
// arrive, every byte and the signal. Held ops nobody tests are not
// stranded: the send timer bounds them. TCP and the intra-node link (whose
// small puts ride the same lane).
func TestAggregatedBatchOneWrite(t *testing.T) {
	for _, intra := range []bool{false, true} {
		t.Run(fmt.Sprintf("intra=%v", intra), func(t *testing.T) {
			const n = 40
			const size = 16
			const sigOff = 0
			os := meshtest.NewOwners(2, 4096)
			var ms []*dataplane.Mesh
			src := make([]byte, (n+1)*size)
			for i := range src {
				src[i] = byte(i*7 + 1)
			}
			put := func(i int, tag uint64, hold bool) {
				op := dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: tag, Local: unsafe.Pointer(&src[i*size]), Size: size, Off: uint64(64 + i*size)}, Route: dataplane.Route{Remote: uint64(uintptr(unsafe.Pointer(&os[1].Mem[64+i*size])))}}
				if i == n {
					op.Msg, op.SigMrID, op.SigOp, op.SigOff, op.SigValue = wire.MsgPutSignal, 1, abi.SignalOpAdd, sigOff, 1
				}
				ms[0].Post(1, &op, hold, 0)
			}
			// Part 1: the send timer never fires (no timed behaviour).
			saved, savedHold := tcp.SendDelay().Get(), tcp.HoldDelay().Get()
			meshtest.SetDelays(t, time.Hour, tcp.SendDelay(), tcp.HoldDelay())
			ms = meshtest.Connect2(t, os, dataplane.Options{Timeout: 10 * time.Second, IntraNode: intra, Lanes: 1})
			l := meshtest.TCPOf(t, ms[0], 1).Lanes()[0]
			w0, b0 := l.Writes().Load(), l.Batches().Load()
			for i := 0; i < n; i++ {
				put(i, uint64(i+1), true)
			}
			if w, b := l.Writes().Load()-w0, l.Batches().Load()-b0; w != 0 || b != 0 {
				t.Fatalf("%d held ops: %d writes and %d batches before any test, want none", n, w, b)
			}
			put(n, n+1, false)
			ms[0].Flush(1) // the caller's test()
			if w, b := l.Writes().Load()-w0, l.Batches().Load()-b0; w != 1 || b != 1 {
				t.Fatalf("%d held ops and a plain one: %d writes and %d batches, want 1 and 1", n, w, b)
			}
			meshtest.WaitWord(t, os[1], sigOff, 1, nil)
			for i := 0; i <= n; i++ {
				got, want := os[1].Mem[64+i*size:64+(i+1)*size], src[i*size:(i+1)*size]
				if string(got) != string(want) {
					t.Fatalf("put %d: target holds % x, want % x", i, got, want)
				}
			}
			for tag := uint64(1); tag <= n+1; tag++ {
				if st := meshtest.WaitDone(t, os[0], tag); st != abi.Success {
					t.Fatalf("put %d: %v", tag, st)
				}
			}
			// Part 2: held ops, then nothing at all from the caller (a
			// fresh pair: the first one's send timer is armed for an hour).
			tcp.SendDelay().Set(saved)
			tcp.HoldDelay().Set(savedHold)
			os = meshtest.NewOwners(2, 4096)
			ms = meshtest.Connect2(t, os, dataplane.Options{Timeout: 10 * time.Second, IntraNode: intra, Lanes: 1})
			for i := 0; i <= n; i++ {
				src[i*size] ^= 0xff
				put(i, uint64(100+i), true)
			}
			meshtest.WaitWord(t, os[1], sigOff, 1, nil)
			for i := 0; i <= n; i++ {
				if got, want := os[1].Mem[64+i*size], src[i*size]; got != want {
					t.Fatalf("held put %d: first byte %#x, want %#x", i, got, want)
				}
			}
		})
	}
}

// TestPiggybackedAcks is a ping-pong of puts with signal, each rank
// answering the other, so that acknowledgements ride the answers
// (wire.MsgAck) instead of travelling alone. Every request must still complete
// only once its put arrived, every byte and signal must be there, and a
// put the target rejects mid-way must fail, not be covered by an ack that
// rode the other stream before its rejection was read. With four lanes
// and local completion no lane resends, so acks ride the answers there
// too (the rejection is left out: a put completes once written), and so
// they do with failover on, on a lane that opens when first used, and
// when the answers travel on another lane than the puts (a backend that
// picks the lane by peer): an ack names the stream it acknowledges.
func TestPiggybackedAcks(t *testing.T) {
	for _, c := range piggyCases {
		t.Run(c.String(), func(t *testing.T) { piggyPingPong(t, c, 400) })
	}
}

// piggyCase is one configuration of the ping-pong of TestPiggybackedAcks.
type piggyCase struct {
	intra     bool
	lanes     int
	localComp bool
	lane      [2]int // the lane each rank posts on
}

func (c piggyCase) String() string {
	return fmt.Sprintf("intra=%v/lanes=%d/local=%v/lane=%d,%d", c.intra, c.lanes, c.localComp, c.lane[0], c.lane[1])
}

var piggyCases = []piggyCase{{false, 1, false, [2]int{}}, {true, 1, false, [2]int{}}, {false, 4, true, [2]int{}}, {true, 4, true, [2]int{}},
	{false, 4, false, [2]int{}}, {true, 4, false, [2]int{}}, {false, 4, false, [2]int{2, 2}}, {true, 4, false, [2]int{2, 2}},
	{false, 4, false, [2]int{1, 0}}, {true, 4, false, [2]int{1, 0}}}

// piggyPingPong runs iters rounds of the ping-pong of TestPiggybackedAcks
// in configuration c, then waits for every request without calling the
// plugin (no Flush): what completes then was acknowledged by the normal
// paths alone (a ride, an ack written alone, an acker's timer).
func piggyPingPong(t *testing.T, c piggyCase, iters int) {
	bad := iters / 2 // rank 0's put at this iteration names a registration rank 1 lacks
	if c.localComp {
		bad = -1
	}
	os := meshtest.NewOwners(2, 8192)
	// An ack rides the answer only when that is posted within ackDelay; a
	// loaded machine's pauses are far longer than the 50 µs default, and
	// only the ride itself is under test here.
	meshtest.SetDelays(t, 50*time.Millisecond, tcp.AckDelay())
	ms := meshtest.Connect2(t, os, dataplane.Options{Timeout: 10 * time.Second, IntraNode: c.intra, Lanes: c.lanes, LocalCompletion: c.localComp, StripeThreshold: 1 << 20})
	defer meshtest.DumpWhenStuck(t, ms)()
	for r, m := range ms {
		if a := meshtest.TCPOf(t, m, 1-r).Acks()[c.lane[1-r]]; !a.Rides() {
			t.Fatalf("rank %d: acks of lane %d do not ride the answers", r, c.lane[1-r])
		}
	}
	// Word 0: the signal; each put writes 8 bytes at 64+8*(i%64).
	srcs := [2][]byte{make([]byte, 8*iters), make([]byte, 8*iters)}
	for r := range srcs {
		for i := range srcs[r] {
			srcs[r][i] = byte(r*131 + i*3)
		}
	}
	post := func(r, i int) uint64 {
		tag := uint64(r+1)<<32 | uint64(i)
		op := dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: tag, Local: unsafe.Pointer(&srcs[r][8*i]), Size: 8, Off: uint64(64 + 8*(i%64)), SigMrID: 1, SigOp: abi.SignalOpAdd, SigValue: 1}, Route: dataplane.Route{Remote: uint64(uintptr(unsafe.Pointer(&os[1-r].Mem[64+8*(i%64)])))}}
		if r == 0 && i == bad {
			op.MrID, op.Remote = 2, 0 // the target rejects it (and applies no signal)
		}
		ms[r].Post(1-r, &op, false, c.lane[r])
		return tag
	}
	check := func(r, i int) {
		got, want := os[r].Mem[64+8*(i%64):64+8*(i%64)+8], srcs[1-r][8*i:8*i+8]
		if string(got) != string(want) {
			t.Errorf("rank %d, put %d: target holds % x, want % x", r, i, got, want)
		}
	}
	done := make(chan struct{})
	go func() { // rank 1 answers each put it sees
		defer close(done)
		seen := uint64(0)
		for i := 0; i < iters; i++ {
			if i != bad {
				seen++
				meshtest.WaitWord(t, os[1], 0, seen, func() { ms[1].Flush(0) })
				check(1, i)
			}
			post(1, i)
			ms[1].Flush(0)
		}
	}()
	for i := 0; i < iters; i++ {
		post(0, i)
		ms[0].Flush(1)
		meshtest.WaitWord(t, os[0], 0, uint64(i+1), func() { ms[0].Flush(1) })
		check(0, i)
	}
	<-done
	for r, m := range ms {
		// Most acks rode the answers (Mesh.Stats counts them); at
		// rank 1 only until the rejection, which ends that.
		want := uint64(iters)
		if r == 1 && bad >= 0 {
			want = uint64(bad)
		}
		if st := m.Stats(); st.AcksCarried < want*3/4 {
			t.Fatalf("rank %d: %d acks carried in batches, %d alone, for %d puts", r, st.AcksCarried, st.AcksAlone, iters)
		}
	}
	for r := 0; r < 2; r++ {
		for i := 0; i < iters; i++ {
			tag := uint64(r+1)<<32 | uint64(i)
			st := meshtest.WaitDone(t, os[r], tag)
			if want := abi.Success; r == 0 && i == bad {
				if st == abi.Success {
					t.Fatalf("rank 0's rejected put %d completed successfully", i)
				}
			} else if st != want {
				t.Fatalf("rank %d's put %d: %v", r, i, st)
			}
		}
	}
}

// TestAskAcks: a target whose lane wrote to us since it last drained
// holds its acks for its next batch (here for an hour); our put then
// completes only once we ask for them (AskAcks, what iflush does): the
// ask reaches the target, which acknowledges at once.
func TestAskAcks(t *testing.T) {
	for _, intra := range []bool{false, true} {
		t.Run(fmt.Sprintf("intra=%v", intra), func(t *testing.T) {
			meshtest.SetDelays(t, time.Hour, tcp.AckDelay(), tcp.AckBound())
			ms, os, src := heldAckPair(t, intra, 9)
			ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: 2, Local: unsafe.Pointer(&src[0]), Size: 64, Off: 128, SigMrID: 1, SigOp: abi.SignalOpAdd, SigOff: 0, SigValue: 1}}, false, 0)
			ms[0].Flush(1)
			meshtest.WaitWord(t, os[1], 0, 1, nil)
			// Landed, and its ack held: our test() calls do not bring it.
			for deadline := time.Now().Add(100 * time.Millisecond); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
				ms[0].Flush(1)
				ms[1].Flush(0)
				if _, ok := os[0].Status(2); ok {
					t.Fatal("the put completed although the target held its ack")
				}
			}
			ms[0].AskAcks(1)
			flushUntilDone(t, ms, os[0], 2, "after asking for its ack") // the caller's test(): asks once askAfter passed, reads the ack
			if n := ms[1].Peer(0).AskedAcks().Load(); n != 1 {
				t.Fatalf("the target answered %d asks, want 1", n)
			}
			if string(os[1].Mem[128:192]) != string(src) {
				t.Fatal("the put's bytes differ")
			}
		})
	}
}

// TestAskAcksAtOnce: GIN rounds, each side's put followed by its flush,
// against a target that holds its acks until asked: after a few rounds
// the flush asks without waiting first (askPacer; only waiting with
// FlushAskAtOnce off), and every round's put completes with its bytes and
// signal.
func TestAskAcksAtOnce(t *testing.T) {
	meshtest.SetDelays(t, time.Hour, tcp.AckDelay(), tcp.AckBound())
	for _, adapt := range []bool{true, false} {
		t.Run(fmt.Sprintf("adapt=%v", adapt), func(t *testing.T) { askAcksRounds(t, adapt) })
	}
}

// ginRound posts round i's two puts: rank 1's (tag back) first, so that
// rank 1 holds its acks for a batch of its own as in a GIN round, then
// rank 0's put+signal (tag), and waits for its signal.
func ginRound(t *testing.T, ms []*dataplane.Mesh, os []*meshtest.MemOwner, src []byte, i int) (tag, back uint64) {
	t.Helper()
	tag, back = uint64(100+i), uint64(200+i)
	ms[1].Post(0, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: back, Local: unsafe.Pointer(&src[0]), Size: 64, Off: 256}}, false, 0)
	ms[1].Flush(0)
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: tag, Local: unsafe.Pointer(&src[0]), Size: 64, Off: 128, SigMrID: 1, SigOp: abi.SignalOpAdd, SigOff: 0, SigValue: 1}}, false, 0)
	ms[0].Flush(1)
	meshtest.WaitWord(t, os[1], 0, uint64(i+1), nil)
	return tag, back
}

func askAcksRounds(t *testing.T, adapt bool) {
	ms, os, src := heldAckPairOpt(t, dataplane.Options{Timeout: 10 * time.Second, IntraNode: true, Lanes: 1, FlushAskAtOnce: adapt}, 11)
	const rounds = 12
	for i := 0; i < rounds; i++ {
		tag, back := ginRound(t, ms, os, src, i)
		ms[0].AskAcks(1)
		flushUntilDone(t, ms, os[0], tag, fmt.Sprintf("in round %d", i))
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Microsecond) {
			ms[1].AskAcks(0)
			ms[1].Flush(0)
			ms[0].Flush(1)
			if st, ok := os[1].Status(back); ok {
				if st != abi.Success {
					t.Fatalf("round %d: rank 1's put: %v", i, st)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: rank 1's put never completed", i)
			}
		}
		if string(os[1].Mem[128:192]) != string(src) || string(os[0].Mem[256:320]) != string(src) {
			t.Fatalf("round %d: the puts' bytes differ", i)
		}
	}
	st := ms[0].Stats()
	if st.FlushAsks == 0 || (st.FlushAsksAtOnce == 0) == adapt {
		t.Fatalf("adapting %v: rank 0's flushes asked %d times, %d without waiting, after %d held rounds", adapt, st.FlushAsks, st.FlushAsksAtOnce, rounds)
	}
}

// TestAckHoldAdapts: GIN rounds waited for as NCCL's device flush waits
// (test() until the puts completed, no iflush, so nobody asks). Each
// round the target writes to us before our put lands, so it holds the
// ack for a batch of its own, which comes only after the round: every
// hold is in vain, and the ack leaves after ackDelay. Adapting
// (Options.AckHoldAdapt), the target stops holding after
// waitpolicy.MissesMax such holds and acknowledges at once; not
// adapting, it holds every time. Every byte and signal is checked.
func TestAckHoldAdapts(t *testing.T) {
	meshtest.SetDelays(t, 2*time.Millisecond, tcp.AckDelay())
	meshtest.SetDelays(t, time.Second, tcp.AckBound())
	for _, adapt := range []bool{true, false} {
		t.Run(fmt.Sprintf("adapt=%v", adapt), func(t *testing.T) { ackHoldRounds(t, adapt) })
	}
}

func ackHoldRounds(t *testing.T, adapt bool) {
	ms, os, src := heldAckPairOpt(t, dataplane.Options{Timeout: 10 * time.Second, IntraNode: true, Lanes: 1, AckHoldAdapt: adapt}, 13)
	const rounds = 16
	for i := 0; i < rounds; i++ {
		tag, back := ginRound(t, ms, os, src, i)
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Microsecond) {
			ms[0].Flush(1)
			ms[1].Flush(0)
			st0, ok0 := os[0].Status(tag)
			st1, ok1 := os[1].Status(back)
			if ok0 && ok1 {
				if st0 != abi.Success || st1 != abi.Success {
					t.Fatalf("round %d: puts: %v, %v", i, st0, st1)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the puts never completed (%v, %v)", i, ok0, ok1)
			}
		}
		if string(os[1].Mem[128:192]) != string(src) || string(os[0].Mem[256:320]) != string(src) {
			t.Fatalf("round %d: the puts' bytes differ", i)
		}
	}
	st := ms[1].Stats()
	// Adapting, rounds after the first waitpolicy.MissesMax acknowledge at once (a
	// batch of rank 1's delayed by a loaded machine may carry one hold's
	// ack, which turns holding back on for a few rounds: so at least one).
	if adapt && st.AcksAtOnce == 0 || !adapt && st.AcksAtOnce != 0 {
		t.Fatalf("adapting %v: rank 1 acknowledged at once %d times in %d rounds whose holds never paid (%d carried, %d alone)",
			adapt, st.AcksAtOnce, rounds, st.AcksCarried, st.AcksAlone)
	}
}
