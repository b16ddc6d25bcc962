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

// reuseOwner is a meshtest.MemOwner whose caller reuses a request's source the
// moment the request completes, ok or not: it poisons src then.
type reuseOwner struct {
	*meshtest.MemOwner
	src []byte
}

func (o *reuseOwner) Complete(tag uint64, st abi.Result) {
	for i := range o.src {
		o.src[i] = poisonByte
	}
	o.MemOwner.Complete(tag, st)
}

// TestPutFailedAtDeathNotWritten: markDead raises the dead flag (Stop)
// before it closes the streams, and a writer that records its batch's
// puts in that window fails them at once (awaitPuts: FailAll may already
// have emptied the FIFO). Their requests complete then, and the caller
// may reuse their sources: the batch must not be written after that, or
// the target lands bytes read after the completion (the poison here).
// The window is held open by raising the flag alone while lane 0's stream
// is held, then letting the writer take the put.
func TestPutFailedAtDeathNotWritten(t *testing.T) {
	owners := meshtest.NewOwners(2, 4096)
	src := make([]byte, 512)
	for i := range src {
		src[i] = scalePattern(0, 1, i)
	}
	o0 := &reuseOwner{MemOwner: owners[0], src: src}
	ms := meshtest.ConnectOwners(t, []dataplane.Owner{o0, owners[1]}, dataplane.Options{Timeout: 10 * time.Second, Lanes: 1, CloseTimeout: time.Second})
	l := meshtest.TCPOf(t, ms[0], 1).Lanes()[0]
	meshtest.HoldWriter(t, l)
	const tag = 5
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, SigMrID: 1, SigOp: abi.SignalOpInc, Tag: tag, Local: unsafe.Pointer(&src[0]), Size: uint64(len(src)), Off: 8}}, false, 0)
	writes := l.Writes().Load()
	// Stop's first step alone: the flag, the streams still open.
	ms[0].Peer(1).RaiseDead()
	meshtest.ReleaseWriter(l, meshtest.TCPOf(t, ms[0], 1))
	if st := meshtest.WaitDone(t, owners[0], tag); st != abi.RemoteError {
		t.Fatalf("the put to a dead peer completed with %v, want ncclRemoteError", st)
	}
	meshtest.WaitUntil(t, "the writer to let the stream go", func() bool {
		l.Mu().Lock()
		defer l.Mu().Unlock()
		_, writing, queued, _ := l.QueueState()
		return !writing && queued == 0
	})
	if n := l.Writes().Load() - writes; n != 0 {
		word := (*uint64)(unsafe.Pointer(&owners[1].Mem[0]))
		meshtest.WaitUntil(t, "the signal at the target", func() bool { return atomic.LoadUint64(word) == 1 })
		if owners[1].Mem[8] == poisonByte {
			t.Fatal("the put failed, its source was reused, and then it was written: the target landed the poison")
		}
		t.Fatalf("the batch of a put failed at once was written (%d writes)", n)
	}
}
