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

// TestSignalPartBeforeItsPiece: with several lanes and Options' zero
// StripeThreshold (every put is striped, as in the scale simulation), a
// small put with signal is two parts: its payload, a piece on the lane the
// round robin names (lane 0 for a peer's first op), and its signal, a
// message of its own on the lane asked for. Each completes on its own
// lane's ack, and the signal's message is acknowledged once it landed,
// while the target's orderer holds the signal itself until the piece
// lands. So the request's first completion can come while the payload
// has not left: the source is read only when its lane writes the piece.
// Here lane 0's stream is held (as a writer holds it) until the signal's
// part completed. A caller that takes that first completion for the
// request's and reuses the source sends the new bytes: this is how
// TestScale1024 once found its helper's poison at rank 0 ("the payload
// was read after completion") and once the pattern of the helper's next
// peer (its helpers reuse one source), because TestScaleHelper waited
// for the first completion of its tag. The request is done, and its
// source free, after Mesh.OpParts completions (meshtest.MemOwner.requestDone), as
// the runtime counts them.
func TestSignalPartBeforeItsPiece(t *testing.T) {
	owners := meshtest.NewOwners(2, scaleSlot)
	ms := meshtest.Connect2(t, owners, dataplane.Options{Timeout: 10 * time.Second, Lanes: 4, CloseTimeout: 5 * time.Second})
	src := make([]byte, scaleSlot)
	for i := range src {
		src[i] = scalePattern(0, 1, i)
	}
	const tag = 7
	op := &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, SigMrID: 1, SigOp: abi.SignalOpInc, Tag: tag, Local: unsafe.Pointer(&src[8]), Size: scalePayload, Off: 8}}
	parts := ms[0].OpParts(1, op)
	if parts != 2 {
		t.Fatalf("a put with signal of %d bytes over 4 lanes has %d parts, want 2 (a piece and the signal)", scalePayload, parts)
	}
	// Hold lane 0's stream: its writer leaves the piece in the queue.
	l0 := meshtest.TCPOf(t, ms[0], 1).Lanes()[0]
	meshtest.HoldWriter(t, l0)
	ms[0].Post(1, op, false, 1) // the signal on lane 1, which opens for it
	meshtest.WaitUntil(t, "the completion of the signal's part", func() bool {
		owners[0].Mu.Lock()
		defer owners[0].Mu.Unlock()
		return owners[0].Parts[tag] == 1
	})
	l0.Mu().Lock()
	_, _, queued, _ := l0.QueueState()
	l0.Mu().Unlock()
	if queued != 1 {
		t.Fatalf("lane 0 holds %d ops queued at the first completion, want the piece", queued)
	}
	reused := false
	if _, done := owners[0].RequestDone(tag, parts); done {
		// The request looks Done: the caller reuses its source at once,
		// as TestScaleHelper poisons it.
		for i := range src {
			src[i] = poisonByte
		}
		reused = true
	}
	meshtest.ReleaseWriter(l0, meshtest.TCPOf(t, ms[0], 1)) // as a holder that lets go with work queued
	word := (*uint64)(unsafe.Pointer(&owners[1].Mem[0]))
	meshtest.WaitUntil(t, "the signal at the target", func() bool { return atomic.LoadUint64(word) == 1 })
	for i := 8; i < scaleSlot; i++ {
		if got := owners[1].Mem[i]; got != scalePattern(0, 1, i) {
			if reused && got == poisonByte {
				t.Fatalf("byte %d landed as the poison written over the source once the request looked Done: the payload was read after that (the first of %d completions)", i, parts)
			}
			t.Fatalf("byte %d landed as %d, want %d", i, got, scalePattern(0, 1, i))
		}
	}
	if reused {
		t.Fatal("the request looked done with its payload still queued")
	}
	if st := meshtest.WaitRequestWithin(t, owners[0], tag, parts, 10*time.Second); st != abi.Success {
		t.Fatalf("the put: %v", st)
	}
}
