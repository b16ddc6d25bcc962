package dataplane_test

import (
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// TestDirectRoute: with Options.DirectSignal
// (NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL), operations the caller marked
// for the device agent's own signal add (Route.Direct) go on lane 0
// whatever lane was asked for, so that one writer hands them to the agent
// in post order; the first put to the peer that is not marked ends the
// path, and a marked operation after it goes where it was asked, unmarked
// (the target applies its signal). Every signal lands once, every byte.
// Over TCP (no intra-node side) the marks change only the lane.
func TestDirectRoute(t *testing.T) {
	const size = 1 << 16
	owners := meshtest.NewOwners(2, size)
	ms := meshtest.Connect2(t, owners, dataplane.Options{Timeout: 10 * time.Second, Lanes: 4, CloseTimeout: 5 * time.Second,
		StripeThreshold: 1 << 20, DirectSignal: true})
	k := meshtest.TCPOf(t, ms[0], 1)
	lanes := k.Lanes()
	for _, l := range lanes {
		meshtest.HoldWriter(t, l)
	}
	src := make([]byte, 3*64)
	for i := range src {
		src[i] = byte(i*7 + 3)
	}
	queued := func() [4]int {
		var n [4]int
		for i, l := range lanes {
			l.Mu().Lock()
			_, _, n[i], _ = l.QueueState()
			l.Mu().Unlock()
		}
		return n
	}
	post := func(tag uint64, msg uint8, direct bool, lane int, off int) *dataplane.Op {
		op := &dataplane.Op{Request: dataplane.Request{Msg: msg, MrID: 1, Tag: tag, Local: unsafe.Pointer(&src[off]), Size: 64, Off: uint64(64 + off)}}
		if msg == wire.MsgPutSignal {
			op.SigMrID, op.SigOp = 1, abi.SignalOpInc
		}
		op.Direct = direct
		ms[0].Post(1, op, false, lane)
		return op
	}
	post(1, wire.MsgPutSignal, true, 2, 0)
	if n := queued(); n != [4]int{1, 0, 0, 0} {
		t.Fatalf("a marked put+signal asked for lane 2: lanes hold %v ops, want it on lane 0", n)
	}
	post(2, wire.MsgPut, false, 1, 64) // a put the agent does not carry: ends the path
	post(3, wire.MsgPutSignal, true, 3, 128)
	if n := queued(); n != [4]int{1, 1, 0, 1} {
		t.Fatalf("after an unmarked put, a marked put+signal asked for lane 3: lanes hold %v ops, want it on lane 3", n)
	}
	for _, l := range lanes {
		meshtest.ReleaseWriter(l, k)
	}
	for tag := uint64(1); tag <= 3; tag++ {
		if st := meshtest.WaitRequestWithin(t, owners[0], tag, 1, 10*time.Second); st != abi.Success {
			t.Fatalf("op %d: %v", tag, st)
		}
	}
	word := (*uint64)(unsafe.Pointer(&owners[1].Mem[0]))
	meshtest.WaitUntil(t, "both signals at the target", func() bool { return atomic.LoadUint64(word) == 2 })
	for i := range src {
		if got := owners[1].Mem[64+i]; got != src[i] {
			t.Fatalf("byte %d landed as %d, want %d", i, got, src[i])
		}
	}
}
