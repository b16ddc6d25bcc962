package tcp_test

import (
	"fmt"
	"os"
	"runtime"
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

// TestStrandedAck reproduces, without luck, the race that once hung
// TestPiggybackedAcks. At the target (rank 1):
//  1. a holder of its lane's stream is between a write and letting go
//     (a hook keeps it there 200 ms);
//  2. meanwhile the initiator's put lands; the target's lanes wrote since
//     the stream last drained, so the ack is left for their next batch
//     and the acker's timer (ackBound) is armed;
//  3. the timer fires, finds the stream held and leaves the ack to the
//     holder (tcpLink.sendAcksAlone);
//  4. the holder lets go (letGo), which must re-arm the owed ack.
//
// The holder is the lane's writer goroutine (writer), or a lone ack's
// write (lone: the acker's own timer writing an earlier ack alone, which
// before letGo was the holder that forgot to re-arm). Neither rank calls
// the plugin afterwards (no Flush: a job after its last ping-pong), and
// the backstop is off, so only the re-arm can deliver the ack; the
// initiator waits for its put to complete. With the re-arm removed
// (skipRearm; RMAW_NEGATIVE_CONTROL=rearm) the put never completes.
func TestStrandedAck(t *testing.T) {
	tcp.SkipBackstop().Store(true)
	t.Cleanup(func() { tcp.SkipBackstop().Store(false) })
	if os.Getenv("RMAW_NEGATIVE_CONTROL") == "rearm" {
		// The soak's negative control (make soak-negative): the re-arm
		// removed, this test must fail.
		tcp.SkipRearm().Store(true)
		t.Cleanup(func() { tcp.SkipRearm().Store(false) })
	}
	for _, intra := range []bool{false, true} {
		for _, holder := range []string{"writer", "lone"} {
			t.Run(fmt.Sprintf("intra=%v/holder=%s", intra, holder), func(t *testing.T) {
				// A loaded machine may land the put only after the holder
				// let go: then the window was missed, and the round is
				// repeated.
				for round := 1; ; round++ {
					if strandRound(t, intra, holder == "lone", round) {
						return
					}
					if round == 5 {
						t.Fatal("5 rounds: the put never landed while the target's stream was held")
					}
				}
			})
		}
	}
}

// strandRound is one try of TestStrandedAck; it reports whether the
// acker's timer found the stream held (the window was hit). Rank 1 only
// posts gets: rank 0 then owes no ack back, its lanes stay silent, and
// nothing arrives on rank 1's incoming stream to make it drain again.
func strandRound(t *testing.T, intra, lone bool, round int) bool {
	owners := meshtest.NewOwners(2, 4096)
	src := make([]byte, 64)
	meshtest.Fill(src, round)
	copy(owners[0].Mem[64:128], src) // what rank 1 gets (before the meshes exist: no race)
	ms := meshtest.Connect2(t, owners, dataplane.Options{Timeout: 10 * time.Second, IntraNode: intra, Lanes: 2, StripeThreshold: 1 << 20})
	tl := meshtest.TCPOf(t, ms[1], 0)
	var hold atomic.Pointer[tcp.Lane]
	hook := func(l *tcp.Lane) {
		if hold.Load() == l {
			time.Sleep(200 * time.Millisecond)
		}
	}
	tcp.LetGoHook().Store(&hook)
	defer tcp.LetGoHook().Store(nil)
	held := func(l *tcp.Lane) bool {
		l.Mu().Lock()
		defer l.Mu().Unlock()
		return *l.Writing()
	}
	waitFor := func(what string, cond func() bool) {
		for deadline := time.Now().Add(10 * time.Second); !cond(); runtime.Gosched() {
			if time.Now().After(deadline) {
				t.Fatalf("never: %s", what)
			}
		}
	}
	dsts := [2][]byte{make([]byte, 64), make([]byte, 64)}
	get := func(tag uint64, lane int) {
		ms[1].Post(0, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgGet, MrID: 1, Tag: tag, Local: unsafe.Pointer(&dsts[lane][0]), Size: 64, Off: 64}}, false, lane)
	}
	put := func(tag uint64, off uint64) {
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: tag, Local: unsafe.Pointer(&src[0]), Size: 64, Off: off, SigMrID: 1, SigOp: abi.SignalOpAdd, SigOff: 0, SigValue: 1}}, false, 0)
		ms[0].Flush(1)
	}
	l0, l1 := tl.Lanes()[0], tl.Lanes()[1]
	if lone {
		// A get on lane 0 opens it (the acker writes alone on the first
		// open lane) and counts as a batch: the next put's ack is held.
		get(1, 0)
		if st := meshtest.WaitDone(t, owners[1], 1); st != abi.Success {
			t.Fatalf("rank 1's first get: %v", st)
		}
		// Put 10 lands; its ack is held, and the acker's timer writes it
		// alone on lane 0, which then holds the stream.
		hold.Store(l0)
		put(10, 128)
		waitFor("the first put's ack written alone", func() bool { _, ok := owners[0].Status(10); return ok && held(l0) })
		// A batch of lane 1 (the writer goroutine, which lets go at
		// once): the next put's ack is held for the lanes too.
		b := l1.Batches().Load()
		get(2, 1)
		waitFor("lane 1's batch", func() bool { return l1.Batches().Load() > b && !held(l1) })
	} else {
		// Lane 0's writer writes a get (the send timer wakes it: no
		// Flush) and holds the stream.
		hold.Store(l0)
		get(2, 0)
		waitFor("lane 0's writer holding its stream", func() bool { return held(l0) && l0.Batches().Load() > 0 })
	}
	// Every other ack of rank 1 delivered and its timer spent, so that no
	// timer but the one of the put below can run into the window.
	waitFor("rank 1's acks quiet", func() bool {
		for _, a := range tl.Acks() {
			a.Tmu().Lock()
			armed := *a.Armed()
			a.Tmu().Unlock()
			if armed || a.Owed() != 0 {
				return false
			}
		}
		return true
	})
	deferred := tl.AckDeferred().Load()
	// The put lands while the stream is held; from here on nobody calls
	// the plugin, and the put completes only if letting go re-armed its ack.
	put(11, 256)
	meshtest.WaitWord(t, owners[1], 0, map[bool]uint64{false: 1, true: 2}[lone], nil)
	if st := meshtest.WaitDone(t, owners[0], 11); st != abi.Success {
		t.Fatalf("put: %v", st)
	}
	hold.Store(nil)
	if st := meshtest.WaitDone(t, owners[1], 2); st != abi.Success {
		t.Fatalf("rank 1's get: %v", st)
	}
	getLane := 0
	if lone {
		getLane = 1
	}
	if string(owners[1].Mem[256:320]) != string(src) || string(dsts[getLane]) != string(src) {
		t.Fatal("the put's or the get's bytes differ")
	}
	return tl.AckDeferred().Load() > deferred
}

// TestAckBackstop: the target's normal paths lose an ack (its acker's
// timer is dead, and the target never calls the plugin), and the
// initiator keeps testing its put as NCCL's proxy does. The liveness
// backstop asks for the ack once the put waited past its bound, the
// target answers at once, the put completes, and the mesh counts one ask
// answered (Stats.AcksRescued). With the backstop off the put would wait
// for ever.
func TestAckBackstop(t *testing.T) {
	for _, intra := range []bool{false, true} {
		t.Run(fmt.Sprintf("intra=%v", intra), func(t *testing.T) {
			ms, os, src := heldAckPair(t, intra, 3)
			// The acker's timer is lost: armed as far as arm can tell, and
			// stopped. No test() runs at rank 1 either.
			a := meshtest.TCPOf(t, ms[1], 0).Acks()[0]
			a.Tmu().Lock()
			*a.Armed() = true
			a.Timer().Stop()
			a.Tmu().Unlock()
			ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: 2, Local: unsafe.Pointer(&src[0]), Size: 64, Off: 128, SigMrID: 1, SigOp: abi.SignalOpAdd, SigOff: 0, SigValue: 1}}, false, 0)
			ms[0].Flush(1)
			meshtest.WaitWord(t, os[1], 0, 1, nil)
			flushUntilDone(t, ms, os[0], 2, "(the backstop did not deliver its ack)")
			st := ms[0].Stats()
			if st.BackstopAsks == 0 || st.AcksRescued != 1 {
				t.Fatalf("backstop asks %d, acks rescued %d; want at least 1 and 1", st.BackstopAsks, st.AcksRescued)
			}
			// (The target's count of asks is not checked: the ask's arrival
			// wakes its reader, whose drain may send the ack before it reads
			// the ask.)
			if string(os[1].Mem[128:192]) != string(src) {
				t.Fatal("the put's bytes differ")
			}
		})
	}
}

// heldAckPair connects two ranks over one lane and has rank 1 put to rank
// 0 first, so that rank 1's lane wrote when a put of ours lands there:
// it holds that put's ack for its next batch (acker.drained). It returns
// the meshes, their memory and the source buffer (64 bytes of seed).
func heldAckPair(t *testing.T, intra bool, seed int) ([]*dataplane.Mesh, []*meshtest.MemOwner, []byte) {
	t.Helper()
	return heldAckPairOpt(t, dataplane.Options{Timeout: 10 * time.Second, IntraNode: intra, Lanes: 1}, seed)
}

// heldAckPairOpt is heldAckPair with the meshes' options.
func heldAckPairOpt(t *testing.T, opt dataplane.Options, seed int) ([]*dataplane.Mesh, []*meshtest.MemOwner, []byte) {
	t.Helper()
	os := meshtest.NewOwners(2, 4096)
	ms := meshtest.Connect2(t, os, opt)
	src := make([]byte, 64)
	meshtest.Fill(src, seed)
	ms[1].Post(0, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 1, Local: unsafe.Pointer(&src[0]), Size: 64, Off: 64}}, false, 0)
	ms[1].Flush(0)
	if st := meshtest.WaitDone(t, os[1], 1); st != abi.Success {
		t.Fatalf("rank 1's put: %v", st)
	}
	return ms, os, src
}

// flushUntilDone calls rank 0's test() (Flush to peer 1) until tag
// completes, as NCCL's proxy does; what names the wait in the failure.
func flushUntilDone(t *testing.T, ms []*dataplane.Mesh, o *meshtest.MemOwner, tag uint64, what string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Microsecond) {
		ms[0].Flush(1)
		if st, ok := o.Status(tag); ok {
			if st != abi.Success {
				t.Fatalf("put: %v", st)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the put never completed %s", what)
		}
	}
}

// TestBackstopGivesUp: a target that answers nothing (here its acks are
// held for good) is not asked for ever. The backstop asks backstopAsks
// times, each after twice the wait of the one before, then stops: a peer
// that answers none of them is stopped or unreachable, and the peer
// watchdog must see its streams go quiet, which endless asks (bytes the
// stopped peer's kernel still acknowledges) would prevent.
func TestBackstopGivesUp(t *testing.T) {
	ms, os, src := heldAckPair(t, false, 5)
	a := meshtest.TCPOf(t, ms[1], 0).Acks()[0]
	a.Hold().Store(true)
	defer a.Hold().Store(false)
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: 2, Local: unsafe.Pointer(&src[0]), Size: 64, Off: 128, SigMrID: 1, SigOp: abi.SignalOpAdd, SigOff: 0, SigValue: 1}}, false, 0)
	ms[0].Flush(1)
	meshtest.WaitWord(t, os[1], 0, 1, nil)
	l := meshtest.TCPOf(t, ms[0], 1).Lanes()[0]
	meshtest.WaitUntil(t, "the backstop's last ask", func() bool {
		ms[0].Flush(1) // the proxy's test()
		return l.BsAsks().Load() >= tcp.BackstopAsks
	})
	// As long again as the three asks took, and more: no fourth.
	for deadline := time.Now().Add(8 * time.Duration(l.BackstopBound())); time.Now().Before(deadline); time.Sleep(100 * time.Microsecond) {
		ms[0].Flush(1)
	}
	if n := l.BsAsks().Load(); n != tcp.BackstopAsks {
		t.Fatalf("the backstop asked %d times, want %d", n, tcp.BackstopAsks)
	}
	if _, ok := os[0].Status(2); ok {
		t.Fatal("the put completed although the target acknowledged nothing")
	}
}
