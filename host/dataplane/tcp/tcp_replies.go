package tcp

import (
	"bufio"
	"fmt"
	"io"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/spin"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// The replies to our lane: the gets it awaits and the reader of the
// stream the peer answers on.

// pushGet records a get whose request is about to leave. A writer can get
// here after the peer died and markDead already emptied the FIFO (the
// intra-node read it tried first failed because the peer is gone, and the
// get fell back to the stream): then the get fails now instead of waiting
// for a reply that never comes. dead is raised before markDead drains the
// FIFO, and both sides look under gmu, so every get is failed exactly once.
func (l *lane) pushGet(e getEntry) {
	l.gmu.Lock()
	if l.p.Dead() {
		l.gmu.Unlock()
		l.p.Fail(link.Op{Request: link.Request{Msg: wire.MsgGet, Tag: e.tag}})
		return
	}
	l.gets.Push(e)
	l.gmu.Unlock()
}

func (l *lane) popGet() (getEntry, bool) {
	l.gmu.Lock()
	defer l.gmu.Unlock()
	return l.gets.Pop()
}

func (l *lane) pendingGets() int {
	l.gmu.Lock()
	defer l.gmu.Unlock()
	return l.gets.Len()
}

// replies reads what the peer sends back on this lane: get data, written
// straight into the destination registration, put acknowledgements, and
// rejections (a nack comes before the ack that covers its put, so the
// sticky error is set before the put completes).
func (l *lane) replies() {
	p := l.p
	defer p.Mesh().WG.Done()
	br := bufio.NewReaderSize(spin.NewReader(l.out, p.Mesh().SpinWait, p.Mesh().Spinners, l.awaitingReply), readBufSize)
	var hb [wire.HeaderSize]byte
	var h wire.Header
	for {
		if _, err := io.ReadFull(br, hb[:]); err != nil {
			l.replyStreamEnded(fmt.Errorf("receive from rank %d on lane %d: %w", p.Rank(), l.idx, err))
			return
		}
		h.Decode(hb[:])
		switch h.Typ {
		case wire.MsgGetResp:
			e, ok := l.popGet()
			if !ok || e.tag != h.Tag || (h.Status == 0 && e.size != h.Size) {
				p.MarkDead(fmt.Errorf("rank %d answered a get we did not ask for (tag %#x)", p.Rank(), h.Tag))
				return
			}
			if h.Status != 0 {
				p.Mesh().Owner.PeerFailed(p.Rank(), fmt.Errorf("rank %d rejected a get of %d bytes at offset %d of registration %d: %v",
					p.Rank(), e.size, h.Off, h.MrID, abi.Result(h.Status)))
				p.Mesh().Owner.Complete(e.tag, abi.Result(h.Status))
				continue
			}
			if e.size > 0 && e.ctx != 0 {
				if err := staging.ReadToDevice(br, e.ctx, uintptr(e.dst), e.size, p.Mesh().StageChunk); err != nil {
					p.MarkDead(fmt.Errorf("receive get data from rank %d into device memory: %w", p.Rank(), err))
					p.Mesh().Owner.Complete(e.tag, abi.RemoteError)
					return
				}
			} else if e.size > 0 {
				if _, err := io.ReadFull(br, unsafe.Slice((*byte)(e.dst), e.size)); err != nil {
					if l.canFailover() {
						// The get goes again on another lane, whole.
						l.unpopGet(e)
						l.replyStreamEnded(fmt.Errorf("receive get data from rank %d on lane %d: %w", p.Rank(), l.idx, err))
						return
					}
					p.MarkDead(fmt.Errorf("receive get data from rank %d: %w", p.Rank(), err))
					p.Mesh().Owner.Complete(e.tag, abi.RemoteError)
					return
				}
			}
			p.Mesh().Owner.Complete(e.tag, abi.Success)
		case wire.MsgPutAck:
			if !l.ackPuts(h.Seq) {
				p.MarkDead(fmt.Errorf("protocol error: rank %d acknowledged %d puts on lane %d, more than it was sent", p.Rank(), h.Seq, l.idx))
				return
			}
		case wire.MsgByeAck:
			p.AckBye()
		case wire.MsgRingNo:
			if l.ix != nil {
				l.ix.RingRefused()
			}
		case wire.MsgStreamNo:
			if l.ix != nil {
				l.ix.StreamRefused()
			}
		case wire.MsgNack:
			st := Rejected(h.Status)
			p.Mesh().Owner.PeerFailed(p.Rank(), fmt.Errorf("rank %d rejected a put of %d bytes at offset %d of registration %d (signal registration %d offset %d): %v",
				p.Rank(), h.Size, h.Off, h.MrID, h.SigMrID, h.SigOff, st))
			// The nack comes before the ack that covers its put: the
			// request fails now, and the ack completes nothing for it.
			l.failPut(h.Tag, st)
		default:
			p.MarkDead(fmt.Errorf("protocol error: message type %d from rank %d", h.Typ, p.Rank()))
			return
		}
	}
}
