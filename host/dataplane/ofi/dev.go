package ofi

import (
	"sync"
	"sync/atomic"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// Device memory over the fabric transport. Where the provider cannot
// reach GPU memory (no FI_HMEM, or a registration it did not take), an
// operation whose local buffer or target registration is device memory
// rides the link's TCP lanes instead, where host/devmem's staging path
// copies it through pinned host memory on both sides (host/devmem/staging). It
// keeps its place in the peer's order: a staged put (or put with signal,
// payload and signal in one message) takes the next fabric sequence
// number at submit and carries it in its TCP header, so the target's
// orderer, which the fabric writes feed too, applies every signal after
// every earlier operation landed, whichever path it took. Such a put also
// counts in the number window until its TCP acknowledgement says it
// landed: the window's guarantee (the target's first missing number is
// never below our oldest incomplete one) covers it like any write.
// Gets have no number; they complete on their TCP answer.

// stagedRec is a numbered put handed to a TCP lane: the lane's n-th put.
type stagedRec struct{ n, seq uint64 }

// fabStaged is a fabric link's bookkeeping of its staged puts.
type fabStaged struct {
	smu     sync.Mutex
	sput    []uint64      // per TCP lane: puts handed to it so far
	srecs   [][]stagedRec // per TCP lane: numbered puts not yet acknowledged
	staging atomic.Int32  // records in srecs
}

// staged reports whether op moves over the TCP lanes: a payload to or from
// device memory the provider does not reach (our registration of the
// local buffer, or the peer's of the target, was not made with FI_HMEM).
func (f *Link) staged(op *link.Op) bool {
	if op.Size == 0 || (op.Msg != wire.MsgPut && op.Msg != wire.MsgPutSignal && op.Msg != wire.MsgGet) {
		return false
	}
	if op.LocalCtx != 0 && !f.e.Regs.DevDirect(op.LocalMr) {
		return true
	}
	dev, direct := f.remoteDev(op.MrID)
	return dev && !direct
}

// remoteDev reports whether the peer's registration id is device memory,
// and whether its provider registered it (direct).
func (f *Link) remoteDev(id uint32) (dev, direct bool) {
	t := *f.remote.Load()
	if int(id) >= len(t) {
		return false, false
	}
	return t[id].dev, t[id].direct
}

// postStaged hands a staged operation to its TCP lane, in order (the
// caller posts pend's operations in order, and submit's numbers are
// taken in the caller's order).
func (f *Link) postStaged(pd *fabPend) error {
	op := pd.op
	put := op.Msg != wire.MsgGet
	if put && !f.win.Fits(pd.seq) {
		return fabric.ErrAgain
	}
	lane := pd.lane % f.LaneCount()
	f.smu.Lock()
	defer f.smu.Unlock()
	if f.sput == nil {
		f.sput, f.srecs = make([]uint64, f.LaneCount()), make([][]stagedRec, f.LaneCount())
	}
	op.Seq = 0
	if put {
		op.Seq = pd.seq
		f.sput[lane]++
		f.srecs[lane] = append(f.srecs[lane], stagedRec{n: f.sput[lane], seq: pd.seq})
		f.staging.Add(1)
	}
	f.Link.Submit(lane, op, false)
	return nil
}

// reapStaged moves the window past staged puts their lane's cumulative
// acknowledgements cover. A lane calls it when acks arrive, before their
// requests complete, and pollers call it too; one at a time does work.
func (f *Link) reapStaged() {
	if f.staging.Load() == 0 || !f.smu.TryLock() {
		return
	}
	defer f.smu.Unlock()
	for i, recs := range f.srecs {
		if len(recs) == 0 {
			continue
		}
		acked := f.Acked(i)
		k := 0
		for k < len(recs) && recs[k].n <= acked {
			f.win.Complete(recs[k].seq)
			k++
		}
		if k > 0 {
			f.srecs[i] = append(recs[:0], recs[k:]...)
			f.staging.Add(-int32(k))
		}
	}
}

// dropStaged forgets the records (the peer is dead).
func (f *Link) dropStaged() {
	f.smu.Lock()
	for i := range f.srecs {
		f.srecs[i] = f.srecs[i][:0]
	}
	f.staging.Store(0)
	f.smu.Unlock()
}
