package ofi

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric/endpoint"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
	"golang.org/x/sys/unix"
)

// The libfabric side of one communicator: one RDM endpoint shared by every
// peer (host/fabric/endpoint: its slots, receive buffers and progress
// goroutine), the registrations, and what its completions mean for both
// directions (our operations finishing, and the peers' writes and messages
// landing in our memory).

// fabSigKnown: signal targets per peer whose acceptance by the peer we
// remember (Link.sigOK).
const fabSigKnown = 4

// Slot states, in the low two bits of fabSlot.state; the bits above hold
// the owning peer's rank, so FailAll claims only its own peer's slots.
const (
	slotFree   = 0
	slotPosted = 1
	slotFailed = 2 // failed by FailAll; the late completion frees it
)

type fabSlot struct {
	state atomic.Uint32
	link  *Link // written before state turns posted
	tag   uint64
	// A signal's slot is kept until both its send completed (the provider
	// is done with the context) and the target's verdict came: the request
	// fails if the target rejected the signal word. Written before the
	// post, then only under the endpoint's poll lock.
	sig bool
	// ctl: a control message (an acknowledgement, a verdict, a goodbye or
	// its acknowledgement), not an operation: a peer that leaves before
	// its send completion was reaped has lost nothing (Link.Awaiting).
	ctl bool
	got uint8 // sigSent | sigVerdict
	vst abi.Result
	seq uint64
	// A signal message's target, remembered as accepted when its verdict
	// says so (learn: an INC or ADD, which CQ data may carry later).
	learn  bool
	sigID  uint32
	sigOff uint64
}

const (
	sigSent    = 1
	sigVerdict = 2
)

// EP is the endpoint of one listener, then one of the Rails of the Mesh
// it connects (one per NIC, rails.go). It is the endpoint's Handler.
type EP struct {
	*endpoint.Endpoint
	rail int // its index among the communicator's rails (Rails)
	// bytes counts what our puts and gets moved through this endpoint
	// (logged per rail at close).
	bytes atomic.Uint64

	rank  int
	links []*Link // by rank; nil where the peer is not on this fabric
	cq    endpoint.CQLayout

	slots []fabSlot // by the endpoint's slot index

	// Under the endpoint's poll lock, as everything its Handler does:
	byeMu sync.Mutex
	byes  []fabBye // goodbyes waiting for the orderer to pass them
	// verdicts to send at the next poll; nverdicts is their number, for
	// Busy
	verdicts  []fabVerdict
	nverdicts atomic.Int32
	// links whose piggy for this rail was set since the last poll: what
	// callers' messages have not carried goes out then.
	owing   []*Link
	nowing  atomic.Int32
	spilled atomic.Bool // some link's spill holds verdicts (unowe)
	// links whose peer awaits an arrival acknowledgement from us
	// (ack.go); ackDone is popAcked's scratch
	acking  []fabAcking
	nacking atomic.Int32
	ackDone []fabAckWait
	polls   uint64 // BeforePoll calls
}

// testPollGap: test() leaves the polling to rmaProgress when that polled
// this recently (a proxy loop calls both; one empty poll per turn is a
// system call on some providers), and polls itself otherwise (NCCL's RMA
// flush path spins on test() alone).
const testPollGap = 20 * time.Microsecond

type fabBye struct {
	link *Link
	seq  uint64
}

type fabVerdict struct {
	link   *Link
	word   uint64 // seq and slot, as the signal carried them
	status abi.Result
}

// Open opens an endpoint on prov for a new listener
// (endpoint.Open: with FI_HMEM where it can).
func Open(prov, domain string) (*EP, error) {
	e := &EP{}
	var err error
	e.Endpoint, err = endpoint.Open(endpoint.Config{Provider: prov, Domain: domain, MsgMax: endpoint.MsgMax, NameMax: wire.FabNameMax, CQData: 4}, e)
	if err != nil {
		return nil, err
	}
	if TestNoInject {
		e.Info.InjectSize = 0
	}
	e.slots = make([]fabSlot, endpoint.Slots)
	e.verdicts = make([]fabVerdict, 0, endpoint.Recvs) // one per receive buffer, at most, per poll
	e.owing = make([]*Link, 0, endpoint.Recvs)
	e.acking = make([]fabAcking, 0, endpoint.Recvs)
	e.ackDone = make([]fabAckWait, 0, 64)
	return e, nil
}

// TestNoInject, when set by a test, makes endpoints behave as if the
// provider injected nothing (shm with FI_HMEM): every message is sent
// with a completion.
var TestNoInject bool

// Fits sets how the CQ data splits between rank and sequence number for
// n ranks (endpoint.Layout); false when n ranks do not fit.
func (e *EP) Fits(n int) bool {
	c, ok := endpoint.Layout(e.Info.CQDataSize, n)
	if !ok {
		return false
	}
	if TestSeqBits != 0 {
		c.SeqBits = TestSeqBits
	}
	c.SigCQ = c.SeqBits == 48 && !TestNoSigCQ
	e.cq = c
	return true
}

// TestRefuse, when set by a test to n > 1, makes n-1 of every n writes
// and signal sends find no room (ErrAgain), as shm refuses every post to a
// peer while one write to it is in segmentation and reassembly.
var (
	TestRefuse  uint64
	TestRefused atomic.Uint64
)

func fabRefused() bool {
	return TestRefuse > 1 && TestRefused.Add(1)%TestRefuse != 0
}

// TestNoSigCQ, when set by a test, keeps every signal in a message
// (as with 4-byte CQ data).
var TestNoSigCQ bool

// TestSeqBits, when set by a test, narrows the sequence field so that
// it wraps quickly.
var TestSeqBits uint

// Discard stops the progress goroutine and closes the endpoint and every
// registration left.
func (e *EP) Discard() {
	e.Close()
	e.Release()
}

// BeforePoll sends the verdicts owed. Sent here, at the next poll, not
// while the message was handled: the caller that just saw its signal
// word change answers first, and its answer carries the verdict if it is
// a signal on this rail (owed).
func (e *EP) BeforePoll() {
	e.polls++
	if len(e.verdicts) > 0 || e.nowing.Load() > 0 || e.spilled.Load() {
		e.sendOwed()
		e.sendVerdicts()
	}
	if len(e.acking) > 0 {
		e.sendAcks()
	}
}

// AfterPoll retries what waited for room and acknowledges goodbyes.
func (e *EP) AfterPoll() {
	e.retry()
	e.checkByes()
}

// Busy reports operations of ours in flight or waiting for room, or
// verdicts waiting to be sent.
func (e *EP) Busy() bool {
	if e.nverdicts.Load() > 0 || e.nowing.Load() > 0 || e.spilled.Load() || e.nacking.Load() > 0 {
		return true
	}
	for _, l := range e.links {
		if l != nil && (l.inflight.Load() > 0 || l.backlog.Load() > 0) {
			return true
		}
	}
	return false
}

// Completion handles one completion: an operation of ours done, a peer's
// write landed (its CQ data), or a peer's message received.
func (e *EP) Completion(c *fabric.Completion) {
	ctx, flags := fabric.Ctx(c), fabric.Flags(c)
	idx, recv, ok := e.SlotOf(ctx)
	if errno := fabric.Err(c); errno != 0 {
		if ok && !recv {
			e.finish(idx, abi.RemoteError, fmt.Errorf("fabric: %s", fabric.Strerror(errno)))
		}
		// A receive fails when the endpoint closes (canceled), or when a
		// peer sent a message larger than endpoint.MsgMax (truncated): that
		// buffer goes back, or such peers would use them all up.
		if ok && recv && errno != fabCanceled {
			fabRecvWarn.Warn(abi.SubsysNet, "NET/wasm: fabric: a control message failed to arrive: %s", fabric.Strerror(errno))
			e.Repost(idx)
		}
		return
	}
	if flags&fabric.FlagRemoteCQData != 0 && flags&fabric.FlagRemoteWrite != 0 {
		d := e.cq.Parse(fabric.Data(c))
		if l := e.link(d.Rank); l != nil {
			l.heard.Add(1)
			e.wrote(l, d)
		}
		if ok && recv {
			e.Repost(idx)
		}
		return
	}
	if ok && recv {
		e.message(unsafe.Add(e.RecvArea(idx), fabric.ContextSize), fabric.Len(c))
		e.Repost(idx)
		return
	}
	if ok {
		e.finish(idx, abi.Success, nil)
	}
}

// wrote lands a peer's write whose CQ data is d: a number, or a number
// and the signal it carries, which the orderer applies once every
// earlier number landed. The payload is in place before the provider
// reports the CQ data.
func (e *EP) wrote(l *Link, d endpoint.CQData) {
	p := l.Peer()
	seq := p.Order().Unwrap(d.Seq, d.Bits)
	if !d.Sig {
		if err := p.Landed(seq, link.Signal{}, 0); err != nil {
			go p.MarkDead(err)
		}
		return
	}
	e.acked(l, d.Ack)
	e.wantAck(l, seq) // the sender completes the write on our acknowledgement
	sig, add, status := p.SignalTarget(d.SigID, d.SigOff, abi.SignalOpInc, 1)
	if err := p.Landed(seq, sig, add); err != nil {
		go p.MarkDead(err)
		return
	}
	if status != abi.Success {
		// The sender only puts a target it saw accepted here into CQ data,
		// so this is a registration dropped since: its request completed
		// on arrival; the rejection reaches its sticky error (and WARN).
		e.queueVerdict(l, seq|endpoint.NoSlot<<48, status)
	}
}

func (e *EP) link(rank int) *Link {
	if rank < 0 || rank >= len(e.links) {
		return nil
	}
	return e.links[rank]
}

// finish completes the operation in slot idx and frees the slot.
func (e *EP) finish(idx uint32, status abi.Result, err error) {
	s := &e.slots[idx]
	v := s.state.Load()
	if v&3 == slotPosted && s.seq != 0 && !s.sig {
		// Completion means delivery: the target has this number, so
		// later ones may be posted (seqorder.Window). A signal awaiting a
		// verdict is sent without delivery completion: its verdict says
		// the target has the number (verdict).
		s.link.win.Complete(s.seq)
	}
	if s.sig && v&3 == slotPosted {
		// The signal's send is done; its request waits for the verdict.
		s.got |= sigSent
		if status != abi.Success && s.vst == abi.Success {
			s.vst = status
		}
		if s.got&sigVerdict == 0 && status == abi.Success {
			return
		}
		// Verdict in, or the send failed (no verdict will come then).
		s.got |= sigVerdict
		status = s.vst
	}
	if s.link != nil {
		s.link.heard.Add(1)
	}
	switch {
	case v&3 == slotPosted && s.state.CompareAndSwap(v, slotFree):
		l, tag := s.link, s.tag
		s.link, s.sig, s.got, s.vst = nil, false, 0, abi.Success
		l.done(s)
		e.Put(idx)
		if err != nil {
			logx.Warn(abi.SubsysNet, "NET/wasm: operation to rank %d: %v", l.Peer().Rank(), err)
			l.Peer().Mesh().Owner.PeerFailed(l.Peer().Rank(), fmt.Errorf("%w: operation to rank %d failed: %v", link.ErrPeerGone, l.Peer().Rank(), err))
		}
		if tag != 0 {
			l.Peer().Mesh().Owner.Complete(tag, status)
		}
	case v&3 == slotFailed && s.state.CompareAndSwap(v, slotFree):
		s.link, s.sig, s.got, s.vst = nil, false, 0, abi.Success
		e.Put(idx)
	}
}

// verdict is the target's answer to our signal in slot idx (under the poll lock).
// A verdict that matches no signal of ours awaiting one (a stale or forged
// slot) changes nothing but a rejection's sticky error.
func (e *EP) verdict(l *Link, word uint64, status abi.Result) {
	if status != abi.Success {
		how := ""
		if word>>48 == endpoint.NoSlot {
			how = " carried in CQ data (its request completed on arrival)"
		}
		l.Peer().Mesh().Owner.PeerFailed(l.Peer().Rank(), fmt.Errorf("rank %d rejected a signal%s (sequence number %d): %v", l.Peer().Rank(), how, word&endpoint.SeqMask, status))
	}
	idx := uint32(word >> 48)
	if idx >= endpoint.Slots {
		return
	}
	s := &e.slots[idx]
	if s.state.Load()&3 != slotPosted || !s.sig || s.link != l || s.seq != word&endpoint.SeqMask || s.got&sigVerdict != 0 {
		return
	}
	s.got |= sigVerdict
	s.link.win.Complete(s.seq)
	if status != abi.Success && s.vst == abi.Success {
		s.vst = status
	}
	if status == abi.Success && s.learn {
		l.learnSignal(s.sigID, s.sigOff)
	}
	if s.got&sigSent != 0 {
		e.finish(idx, s.vst, nil)
	}
}

// queueVerdict queues a verdict for the next poll (under the poll lock): a
// success as l's owed verdict on this rail, which our next signal to l
// may carry, when none is owed yet.
func (e *EP) queueVerdict(l *Link, word uint64, status abi.Result) {
	if status == abi.Success && l.piggy[e.rail].CompareAndSwap(0, word) {
		e.owing = append(e.owing, l)
		e.nowing.Store(int32(len(e.owing)))
		return
	}
	e.verdicts = append(e.verdicts, fabVerdict{l, word, status})
	e.nverdicts.Store(int32(len(e.verdicts)))
}

// sendOwed moves the verdicts no message carried to the verdict queue
// (under the poll lock).
func (e *EP) sendOwed() {
	take := func(l *Link) {
		if w := l.piggy[e.rail].Swap(0); w != 0 {
			e.verdicts = append(e.verdicts, fabVerdict{l, w, abi.Success})
		}
	}
	for _, l := range e.owing {
		take(l)
	}
	e.owing = e.owing[:0]
	e.nowing.Store(0)
	if e.spilled.Swap(false) {
		for _, l := range e.links {
			if l == nil || e.rail >= len(l.piggy) {
				continue
			}
			take(l)
			l.vmu.Lock()
			e.verdicts = append(e.verdicts, l.spill...)
			l.spill = l.spill[:0]
			l.vmu.Unlock()
		}
	}
}

// sendVerdicts sends the queued verdicts; those that find no room wait
// for the next poll (under the poll lock).
func (e *EP) sendVerdicts() {
	k := 0
	for _, v := range e.verdicts {
		if !v.link.Peer().Dead() && !v.link.sendVerdict(e.rail, v.word, v.status) {
			e.verdicts[k] = v
			k++
		}
	}
	e.verdicts = e.verdicts[:k]
	e.nverdicts.Store(int32(k))
}

// fabCanceled is FI_ECANCELED (= ECANCELED): an operation flushed by
// closing the endpoint.
const fabCanceled = int(unix.ECANCELED)

// fabRecvWarn rate-limits the lines about failed receives.
var fabRecvWarn logx.Limited

// message applies a control message from a peer.
func (e *EP) message(b unsafe.Pointer, n uint64) {
	if n < endpoint.MsgSize || n > endpoint.MsgMax {
		return
	}
	m := unsafe.Slice((*byte)(b), n)
	h := endpoint.ParseMsg(m)
	l := e.link(int(h.Rank))
	if l == nil || e.rail >= len(l.rails) {
		return
	}
	l.heard.Add(1)
	p := l.Peer()
	seq := h.Word & endpoint.SeqMask
	switch h.Type {
	case endpoint.MsgSignal:
		sig, add, status := p.SignalTarget(h.SigMrID, h.SigOff, h.Op, h.SigValue)
		if err := p.Landed(seq, sig, add); err != nil {
			go p.MarkDead(err)
			return
		}
		// The initiator's request completes on this verdict: with the
		// rejection's code when the word is not a valid signal target.
		e.queueVerdict(l, h.Word, status)
	case endpoint.MsgPutSignal:
		status, err := inlinePut(p, &h, m)
		if err != nil {
			logx.Warn(abi.SubsysNet, "NET/wasm: protocol violation by rank %d: %v; dropping its connections", p.Rank(), err)
			go p.MarkDead(err)
			return
		}
		var sig link.Signal
		var add uint64
		if status == abi.Success {
			sig, add, status = p.SignalTarget(h.SigMrID, h.SigOff, h.Op, h.SigValue)
		}
		if err := p.Landed(seq, sig, add); err != nil {
			go p.MarkDead(err)
			return
		}
		e.queueVerdict(l, h.Word, status)
		if h.Owed != 0 {
			e.verdict(l, h.Owed, abi.Success)
		}
	case endpoint.MsgVerdict:
		e.verdict(l, h.Word, rejectedOrOK(h.Op))
	case endpoint.MsgAck:
		l.acksIn.Add(1)
		e.acked(l, h.Word&endpoint.SeqMask)
	case endpoint.MsgBye:
		p.SeeBye()
		if err := p.Landed(seq, link.Signal{}, 0); err != nil {
			go p.MarkDead(err)
			return
		}
		e.byeMu.Lock()
		e.byes = append(e.byes, fabBye{l, seq})
		e.byeMu.Unlock()
	case endpoint.MsgByeAck:
		p.AckBye()
	}
}

// inlinePut copies the payload of a MsgPutSignal message m (h) into our
// registration. status is what its verdict reports (a range outside the
// registration, or device memory, which senders never inline, is
// rejected); err is a malformed message, which drops the peer.
func inlinePut(p link.Peer, h *endpoint.Msg, m []byte) (abi.Result, error) {
	if len(m) < endpoint.PutSigHdr {
		return 0, fmt.Errorf("inline put of %d bytes is shorter than its %d-byte header", len(m), endpoint.PutSigHdr)
	}
	id, size, off := h.MrID, uint64(h.Size), h.Off
	if size > endpoint.InlineMax || uint64(len(m)) != endpoint.PutSigHdr+size {
		return 0, fmt.Errorf("inline put declares %d bytes in a %d-byte message", size, len(m))
	}
	if size == 0 {
		return abi.Success, nil // a signal alone, or its payload was written
	}
	base, rsize, ctx, pin, ok := p.Mesh().Owner.Resolve(id)
	defer pin.Release()
	if !ok || !link.Span(off, size, rsize) || ctx != 0 {
		return abi.InvalidArgument, nil
	}
	copy(unsafe.Slice((*byte)(unsafe.Add(base, off)), size), m[endpoint.PutSigHdr:])
	return abi.Success, nil
}

// checkByes acknowledges every goodbye whose predecessors all landed.
func (e *EP) checkByes() {
	e.byeMu.Lock()
	defer e.byeMu.Unlock()
	k := 0
	for _, b := range e.byes {
		// Acknowledgements the peer awaits go first (ack.go).
		if !b.link.Peer().Order().Passed(b.seq) || !b.link.flushAck(e.rail) || !b.link.control(e.rail, endpoint.MsgByeAck, 0) {
			e.byes[k] = b
			k++
		}
	}
	e.byes = e.byes[:k]
}

// retry posts what found no room earlier, after moving the links' windows
// past staged puts that landed.
func (e *EP) retry() {
	for _, l := range e.links {
		if l == nil {
			continue
		}
		if l.staging.Load() > 0 {
			l.reapStaged()
		}
		if l.backlog.Load() > 0 {
			l.retry()
		}
		if e.rail < len(l.ackWait) && l.ackWait[e.rail].n.Load() > 0 {
			e.popAcked(l) // acknowledged on another rail
		}
	}
}
