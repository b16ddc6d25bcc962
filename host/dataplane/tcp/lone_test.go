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

// TestLoneSignalLeavesAtOnce: a put with signal posted to an idle lane
// with nothing in flight is written on the poster's thread before Post
// returns (tcpLink.post), and lands without anyone testing; a plain put,
// and a signal posted behind queued work, wait for the caller's next test
// (Flush) and leave with what is queued, in one writev. The send timer
// is off (an hour), so only the poster or a Flush can write. With
// several lanes the same holds: the op is numbered under the peer's lock
// and written after it (peer.number).
func TestLoneSignalLeavesAtOnce(t *testing.T) {
	for _, lanes := range []int{1, 4} {
		t.Run(fmt.Sprintf("lanes=%d", lanes), func(t *testing.T) { testLoneSignal(t, lanes) })
	}
}

func testLoneSignal(t *testing.T, lanes int) {
	const size = 8
	const sigOff = 0
	os := meshtest.NewOwners(2, 4096)
	src := make([]byte, 4*size)
	for i := range src {
		src[i] = byte(i*3 + 1)
	}
	meshtest.SetDelays(t, time.Hour, tcp.SendDelay(), tcp.HoldDelay())
	ms := meshtest.Connect2(t, os, dataplane.Options{Timeout: 10 * time.Second, Lanes: lanes, StripeThreshold: 1 << 20})
	l := meshtest.TCPOf(t, ms[0], 1).Lanes()[0]
	post := func(i int, signal, hold bool) {
		op := dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: uint64(i + 1), Local: unsafe.Pointer(&src[i*size]), Size: size, Off: uint64(64 + i*size)}, Route: dataplane.Route{Remote: uint64(uintptr(unsafe.Pointer(&os[1].Mem[64+i*size])))}}
		if signal {
			op.Msg, op.SigMrID, op.SigOp, op.SigOff, op.SigValue = wire.MsgPutSignal, 1, abi.SignalOpAdd, sigOff, 1
		}
		ms[0].Post(1, &op, hold, 0)
	}
	done := func(tags ...uint64) {
		t.Helper()
		for _, tag := range tags {
			if st := meshtest.WaitDone(t, os[0], tag); st != abi.Success {
				t.Fatalf("put %d: %v", tag, st)
			}
		}
	}

	// writes checks how many writes the lane made since w0.
	writes := func(w0 uint64, want uint64, what string) {
		t.Helper()
		if w := l.Writes().Load() - w0; w != want {
			t.Fatalf("%s: %d writes, want %d", what, w, want)
		}
	}

	// A plain put: queued until the caller tests.
	w0 := l.Writes().Load()
	post(0, false, false)
	writes(w0, 0, "a plain put before any test")
	ms[0].Flush(1)
	writes(w0, 1, "a plain put after a test")
	done(1) // acknowledged: nothing in flight any more

	// A lone put with signal: written by Post itself, lands untested.
	time.Sleep(2 * tcp.LoneGap)
	w0 = l.Writes().Load()
	post(1, true, false)
	writes(w0, 1, "a lone put with signal when Post returned")
	meshtest.WaitWord(t, os[1], sigOff, 1, nil)
	done(2)

	// A put with signal behind a held put: both wait for the test, then
	// leave together.
	time.Sleep(2 * tcp.LoneGap)
	w0 = l.Writes().Load()
	post(2, false, true)
	post(3, true, false)
	writes(w0, 0, "a put with signal behind queued work, before any test")
	ms[0].Flush(1)
	writes(w0, 1, "a held put and a put with signal after a test")
	meshtest.WaitWord(t, os[1], sigOff, 2, nil)
	done(3, 4)
	for i := 0; i < 4; i++ {
		if got, want := os[1].Mem[64+i*size:64+(i+1)*size], src[i*size:(i+1)*size]; string(got) != string(want) {
			t.Fatalf("put %d: target holds % x, want % x", i, got, want)
		}
	}
}
