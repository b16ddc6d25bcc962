package ofi

import (
	"fmt"
	"math/bits"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric/endpoint"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/procid"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/seqorder"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

const Name = "fabric"

// fabSeqWindow is the most sequence numbers a fabric link lets run ahead
// of its oldest one that may still be in flight (seqorder.Window).
const fabSeqWindow = 1 << 16

// Link is the libfabric transport to one peer. Puts are RMA writes
// carrying our rank and a sequence number as remote CQ data; a signal is a
// small message after its payload with a later sequence number, which the
// target applies once every earlier number landed (the orderer); gets are
// RMA reads; a goodbye is a message with a sequence number, acknowledged
// once everything before it was applied. Registrations (their keys ride
// the MsgReg header) and the liveness of the peer stay on the embedded TCP
// link: its streams ending is how a dead peer is noticed.
//
// With several rails (one endpoint per NIC, rails.go) lane l
// posts on rail l mod len(rails), paired with the peer's rail of the same
// index; the sequence numbers, the window and the orderer stay per peer,
// so a signal is still applied only after every earlier write of that
// peer landed, on whichever rail.
type Link struct {
	*tcp.Link
	e     *EP       // rail 0's endpoint (the listener's)
	rails []fabRail // at least one

	seq      atomic.Uint64 // our sequence numbers to this peer
	inflight atomic.Int64  // operations and control messages posted, not completed
	ctlLive  atomic.Int64  // of which control messages (fabSlot.ctl)
	posting  atomic.Int32  // submits between their dead check and their post
	backlog  atomic.Int32  // operations waiting for room (pend)
	// heard counts completions that involve this peer (our operations
	// to it finishing, its writes and messages landing): the watchdog's
	// measure of progress over the fabric.
	heard atomic.Uint64
	// piggy[r] is a verdict we owe the peer for a signal it sent on rail
	// r (its word; 0: none), which our next signal message on that rail
	// carries instead of a verdict message of its own (EP.verdict);
	// the poller sends what is left at its next poll. spill holds words
	// taken for a message whose post then failed.
	piggy []atomic.Uint64
	vmu   sync.Mutex
	spill []fabVerdict

	pmu  sync.Mutex
	pend []fabPend

	regMu  sync.Mutex
	remote atomic.Pointer[[]fabRemote] // the peer's registrations by id

	win *seqorder.Window // how far our numbers may run ahead

	// sigOK holds signal targets the peer accepted (a verdict of success
	// for a signal message): (id+1)<<32 | the offset past the highest word
	// accepted, 0 when empty. A put with signal to one of them may carry
	// its signal in CQ data (cqSignal), which has no verdict.
	sigOK   [fabSigKnown]atomic.Uint64
	sigNext atomic.Uint32
	cqSigs  atomic.Uint64 // puts with signal sent as one write (tests)

	// Arrival acknowledgements of puts with signal in CQ data
	// (ack.go). As initiator: how many of our numbers the peer
	// acknowledged, and by rail our writes awaiting that. As target: the
	// peer's highest number awaiting our acknowledgement, how many of its
	// numbers our acknowledgements covered, and whether an endpoint's
	// acking list holds the link.
	acked   atomic.Uint64
	ackWait []fabAckQ
	ackWant atomic.Uint64
	ackSent atomic.Uint64
	acking  atomic.Bool
	acksIn  atomic.Uint64 // acknowledgements that came in a MsgAck (tests)

	pid procid.Watch // the shm peer's process (pid.go)

	fabStaged // device memory sent over the TCP lanes (dev.go)
}

// fabRail is one of the link's rails: our endpoint on one NIC and the
// peer's endpoint of the same rail index in its address vector.
type fabRail struct {
	e    *EP
	addr uint64
}

// fabRemote is a peer's registration: its address and one key per rail
// (keys differ per domain under FI_MR_PROV_KEY); set has bit r once rail
// r's key arrived.
type fabRemote struct {
	base uint64
	keys [abi.MaxLanes]uint64
	set  uint8
	dev  bool // device memory: operations on it are staged over TCP (dev.go)
	// direct: device memory the peer registered with its provider
	// (FI_HMEM): RDMA reaches it.
	direct bool
}

// fabPend is an operation that found no room, with the sequence numbers it
// was given at submit (ordering does not depend on when it is posted).
type fabPend struct {
	op          link.Op
	seq, sigSeq uint64
	lane, rail  int
	sigOnly     bool // the payload was posted; only the signal is left
	staged      bool // device memory: sent on the TCP lane (dev.go)
	inline      bool // a small put with signal: one message, payload inline
	cqsig       bool // a small put with signal: one write, the signal in its CQ data
}

// WholeOp: with one rail every lane posts on the same endpoint, so an op
// is cut only when the backend's plan asked for a chunk size or it is
// staged over the TCP lanes (device memory).
func (f *Link) WholeOp(op link.Op) bool {
	return len(f.rails) == 1 && op.Chunk == 0 && !f.staged(&op)
}

// SignalApart: the write and the signal message complete apart, unless the
// op is staged over TCP or inline (one message either way).
func (f *Link) SignalApart(op link.Op) bool {
	return op.Msg == wire.MsgPutSignal && op.Size > 0 && !f.staged(&op) && !f.inlined(&op)
}

// inlined reports whether a put with signal travels as one control
// message carrying its payload (endpoint.MsgPutSignal): at most endpoint.InlineMax
// bytes, host memory at both ends. One send instead of a write and a
// message, and one sequence number; the verdict, sent after the copy,
// says the bytes arrived.
func (f *Link) inlined(op *link.Op) bool {
	if op.Msg != wire.MsgPutSignal || op.Size == 0 || op.Size > endpoint.InlineMax || op.LocalCtx != 0 {
		return false
	}
	dev, _ := f.remoteDev(op.MrID)
	return !dev
}

// cqSignal reports whether op, a put with signal that would be inlined,
// travels as one write whose CQ data carries the signal: 8-byte CQ data,
// an add of 1 to a word the encoding reaches, of a target the peer has
// accepted before (so a rejection, which has no verdict to ride on here,
// means only that the registration went since), and a known key.
func (f *Link) cqSignal(op *link.Op, rail int) bool {
	if !f.e.cq.SigCQ || f.Peer().Mesh().LocalCompletion {
		return false
	}
	if op.SigOp != abi.SignalOpInc && (op.SigOp != abi.SignalOpAdd || op.SigValue != 1) {
		return false
	}
	if !endpoint.SigFits(op.SigMrID, op.SigOff) || !f.sigKnown(op.SigMrID, op.SigOff) {
		return false
	}
	_, _, ok := f.target(op.MrID, op.Off, rail)
	return ok
}

func (f *Link) sigKnown(id uint32, off uint64) bool {
	for i := range f.sigOK {
		if v := f.sigOK[i].Load(); v>>32 == uint64(id)+1 && off+8 <= v&(1<<32-1) {
			return true
		}
	}
	return false
}

// learnSignal remembers that the peer accepted signal word off of
// registration id: every aligned word below it is in range too.
func (f *Link) learnSignal(id uint32, off uint64) {
	if !endpoint.SigFits(id, off) {
		return
	}
	want := (uint64(id)+1)<<32 | (off + 8)
	for i := range f.sigOK {
		for {
			v := f.sigOK[i].Load()
			if v>>32 != uint64(id)+1 {
				break
			}
			if v >= want || f.sigOK[i].CompareAndSwap(v, want) {
				return
			}
		}
	}
	f.sigOK[f.sigNext.Add(1)%fabSigKnown].Store(want)
}

// forgetSignals drops what sigOK holds for registration id (the peer
// registered under that id again).
func (f *Link) forgetSignals(id uint32) {
	for i := range f.sigOK {
		if v := f.sigOK[i].Load(); v>>32 == uint64(id)+1 {
			f.sigOK[i].CompareAndSwap(v, 0)
		}
	}
}

func newLink(p link.Peer, outs, ins []*net.TCPConn, rails []fabRail) *Link {
	e := rails[0].e
	f := &Link{Link: tcp.NewLink(p, outs, ins), e: e, rails: rails, piggy: make([]atomic.Uint64, len(rails)), ackWait: make([]fabAckQ, len(rails))}
	// At most 2^seqBits numbers (the CQ data field) and the orderer's
	// window past the target's first missing number.
	size := uint64(fabSeqWindow)
	if e.cq.SeqBits < 63 {
		size = min(size, 1<<e.cq.SeqBits)
	}
	if e.cq.SigCQ {
		size = min(size, 1<<endpoint.SigSeqBits) // the number field of a signal in CQ data
	}
	if p.Mesh().OrderWindow > 0 {
		size = min(size, uint64(1)<<(63-bits.LeadingZeros64(p.Mesh().OrderWindow))) // a power of two at most the window
	}
	f.win = seqorder.NewWindow(size)
	empty := []fabRemote{}
	f.remote.Store(&empty)
	f.Link.Hear(f.peerRegistered, f.reapStaged)
	// The streams beside an endpoint carry fabric-numbered work whose
	// window has its own rules: a broken one fails the peer.
	f.Link.NoFailover()
	return f
}

// peerRegistered records the address and rail's key of a peer's
// registration (the TCP service calls it for MsgReg, before the owner
// hears of it). The peer sends the keys of rails 1.. before rail 0's, and
// the owner hears of the registration with rail 0's: by then every rail's
// key is here. A rail we do not share with the peer is ignored.
func (f *Link) peerRegistered(rail uint8, id uint32, base, key uint64, dev, direct bool) {
	if int(rail) >= len(f.rails) {
		return
	}
	f.forgetSignals(id)
	f.regMu.Lock()
	defer f.regMu.Unlock()
	old := *f.remote.Load()
	tab := make([]fabRemote, max(len(old), int(id)+1))
	copy(tab, old)
	r := &tab[id]
	if rail != 0 && r.base != base {
		*r = fabRemote{} // a new registration under a reused id
	}
	r.base = base
	r.keys[rail] = key
	r.set |= 1 << rail
	if rail == 0 {
		r.dev, r.direct = dev, dev && direct
	}
	f.remote.Store(&tab)
}

// target is the remote address and rail's key of off in the peer's
// registration id.
func (f *Link) target(id uint32, off uint64, rail int) (uint64, uint64, bool) {
	t := *f.remote.Load()
	if int(id) >= len(t) || t[id].set&(1<<rail) == 0 {
		return 0, 0, false
	}
	r := &t[id]
	if f.e.Info.MRMode&fabric.MRVirtAddr != 0 {
		off += r.base
	}
	return off, r.keys[rail], true
}

func (f *Link) Props() link.Props {
	// With FI_HMEM the NIC writes device memory itself, and nothing here
	// flushes those writes before the signal behind them (SPEC.md §4).
	return link.Props{Name: Name, InlineMax: 1 << 62, Lanes: f.LaneCount(), LateVisible: f.e.Info.HMEM}
}

// SubmitCaller is submit: the libfabric link sends from its own goroutines.
func (f *Link) SubmitCaller(lane int, op link.Op, hold bool) bool {
	f.Submit(lane, op, hold)
	return false
}

func (f *Link) WriteLone(int) {}

func (f *Link) Submit(lane int, op link.Op, hold bool) {
	if op.Msg == wire.MsgReg {
		// The keys of rails 1.. first (SigOp names the rail), then rail
		// 0's, which tells the peer's owner (peerRegistered). Context 1:
		// device memory the provider registered (FI_HMEM), reachable by
		// RDMA.
		if op.Dev && f.e.Regs.DevDirect(op.MrID) {
			op.Context = 1
		}
		for r := 1; r < len(f.rails); r++ {
			k := op
			k.SigOp, k.SigValue = uint8(r), f.rails[r].e.Regs.Key(op.MrID)
			f.Link.Submit(0, k, hold)
		}
		f.Link.Submit(0, op, hold)
		return
	}
	f.posting.Add(1)
	if f.Peer().Dead() {
		f.posting.Add(-1)
		f.Peer().Fail(op)
		return
	}
	// Numbered here, in the caller's order: the target orders by these.
	var pd fabPend
	pd.op = op
	if lane > 0 {
		pd.lane, pd.rail = lane, lane%len(f.rails)
	}
	// Device memory the provider cannot reach goes over the TCP lanes,
	// staged (dev.go): one number for a put with signal there.
	pd.staged = f.staged(&op)
	switch op.Msg {
	case wire.MsgPut, wire.MsgBye:
		pd.seq = f.seq.Add(1)
	case wire.MsgPutSignal:
		if pd.staged {
			pd.seq = f.seq.Add(1)
			break
		}
		if pd.inline = f.inlined(&op); pd.inline {
			if f.cqSignal(&op, pd.rail) {
				pd.inline, pd.cqsig = false, true
				pd.seq = f.seq.Add(1)
				break
			}
			pd.sigSeq = f.seq.Add(1)
			break
		}
		if op.Size > 0 {
			pd.seq = f.seq.Add(1)
		} else {
			pd.sigOnly = true
		}
		pd.sigSeq = f.seq.Add(1)
	}
	err := f.post(&pd)
	if err == fabric.ErrAgain {
		f.queue(pd)
		err = nil
	}
	f.posting.Add(-1)
	f.rails[pd.rail].e.Nudge()
	if err != nil {
		f.Peer().FailCause(pd.op, err)
		go f.Peer().MarkDead(err)
	}
}

// post tries once; ErrAgain leaves pd as what is still to post, for the
// retry.
func (f *Link) post(pd *fabPend) error {
	op := &pd.op
	if pd.staged {
		return f.postStaged(pd)
	}
	rl := &f.rails[pd.rail]
	e := rl.e
	switch {
	case op.Msg == wire.MsgBye:
		if !f.win.Fits(pd.seq) || !f.flushAck(pd.rail) {
			return fabric.ErrAgain
		}
		if err := f.msg(pd.rail, endpoint.MsgBye, pd.seq, op, false, false); err != nil {
			return err
		}
		f.win.Complete(pd.seq) // injected: no completion will say so
		return nil
	case op.Msg == wire.MsgPutSignal && pd.sigOnly:
		return f.msg(pd.rail, endpoint.MsgPutSignal, pd.sigSeq, op, true, false)
	case pd.inline:
		if err := f.msg(pd.rail, endpoint.MsgPutSignal, pd.sigSeq, op, true, true); err != nil {
			return err
		}
		e.bytes.Add(op.Size)
		return nil
	}
	// The messages above check in msg.
	if err := f.peerGone(); err != nil {
		return err
	}
	raddr, key, ok := f.target(op.MrID, op.Off, pd.rail)
	if !ok {
		return fmt.Errorf("rank %d registration %d has no fabric key for rail %d", f.Peer().Rank(), op.MrID, pd.rail)
	}
	if op.Msg != wire.MsgGet && !f.win.Fits(pd.seq) {
		return fabric.ErrAgain
	}
	idx, ok := f.slot(e, op.Tag, false)
	if !ok {
		return fabric.ErrAgain
	}
	e.slots[idx].seq = pd.seq
	ctx := e.SlotArea(idx)
	var err error
	if op.Msg != wire.MsgGet && fabRefused() {
		f.unslot(e, idx)
		return fabric.ErrAgain
	}
	switch {
	case op.Msg == wire.MsgGet:
		err = e.FI.Read(op.Local, op.Size, e.Regs.Desc(op.LocalMr), rl.addr, raddr, key, ctx)
	case pd.cqsig:
		// Completes on the peer's acknowledgement (ack.go).
		err = f.postAcked(pd, rl, idx, raddr, key)
	default:
		// Delivery complete unless local completion was asked for: a put
		// completes when its bytes arrived, as over TCP (SPEC.md §3).
		data := e.cq.Data(e.rank, pd.seq)
		err = e.FI.WriteMsg(op.Local, op.Size, e.Regs.Desc(op.LocalMr), data, rl.addr, raddr, key, ctx, !f.Peer().Mesh().LocalCompletion)
	}
	if err != nil {
		f.unslot(e, idx)
		return err
	}
	e.bytes.Add(op.Size)
	if pd.cqsig {
		f.cqSigs.Add(1)
		return nil
	}
	if op.Msg == wire.MsgPutSignal {
		// The payload is posted; the signal follows as a message whose
		// completion is the request's second part (Mesh.PeerParts). If it
		// finds no room, ErrAgain leaves pd as the signal alone, numbered
		// already, for the caller to queue or keep queued. (It must not
		// queue it here: retry calls post holding pmu. shm refuses every
		// send to a peer while a write to it is in segmentation and
		// reassembly, so this came up at once there.)
		pd.sigOnly = true
		return f.msg(pd.rail, endpoint.MsgPutSignal, pd.sigSeq, op, true, false)
	}
	return nil
}

// slot takes a context of endpoint e for an operation completing request
// tag, or for a control message (ctl).
func (f *Link) slot(e *EP, tag uint64, ctl bool) (uint32, bool) {
	idx, ok := e.Take()
	if !ok {
		return 0, false
	}
	s := &e.slots[idx]
	s.link, s.tag, s.seq, s.ctl = f, tag, 0, ctl
	s.sig, s.got, s.vst, s.learn = false, 0, abi.Success, false // a signal's unslot leaves them
	f.inflight.Add(1)
	if ctl {
		f.ctlLive.Add(1)
	}
	s.state.Store(slotPosted | uint32(f.Peer().Rank())<<2)
	return idx, true
}

// done counts slot s of this link as no longer in flight.
func (f *Link) done(s *fabSlot) {
	if s.ctl {
		f.ctlLive.Add(-1)
	}
	f.inflight.Add(-1)
}

func (f *Link) unslot(e *EP, idx uint32) {
	s := &e.slots[idx]
	s.state.Store(slotFree)
	s.link = nil
	f.done(s)
	e.Put(idx)
}

// msg sends a control message built in C memory (a slot's message area,
// so nothing escapes to the Go heap). A signal (endpoint.MsgPutSignal, with op's
// payload when inline) completes op's request on its verdict; a goodbye
// or its acknowledgement is injected and needs none.
func (f *Link) msg(rail int, typ uint8, seq uint64, op *link.Op, complete, inline bool) error {
	tag := uint64(0)
	if complete {
		tag = op.Tag
	}
	if err := f.peerGone(); err != nil {
		return err
	}
	sig := typ == endpoint.MsgSignal || typ == endpoint.MsgPutSignal
	if sig && (!f.win.Fits(seq) || fabRefused()) {
		return fabric.ErrAgain
	}
	rl := &f.rails[rail]
	e := rl.e
	idx, ok := f.slot(e, tag, !complete)
	if !ok {
		return fabric.ErrAgain
	}
	word := seq & endpoint.SeqMask
	e.slots[idx].seq = word
	n, size := uint64(endpoint.MsgSize), uint64(0)
	if typ == endpoint.MsgPutSignal {
		if inline {
			size = op.Size
		}
		n = endpoint.PutSigHdr + size
	}
	verdict := complete && sig && !f.Peer().Mesh().LocalCompletion
	inject := verdict && n <= e.Info.InjectSize
	if verdict {
		// Kept until the target's verdict too (EP.verdict, which comes
		// back on this rail); set before the post, so before any poller
		// can see the completion. Injected, the send is done once posted:
		// only the verdict is awaited.
		s := &e.slots[idx]
		s.sig, s.got, s.vst = true, 0, abi.Success
		s.learn, s.sigID, s.sigOff = op.SigOp == abi.SignalOpInc || op.SigOp == abi.SignalOpAdd, op.SigMrID, op.SigOff
		if inject {
			s.got = sigSent
		}
		word |= uint64(idx) << 48
	}
	b := e.SlotMsg(idx, n)
	h := endpoint.Msg{Type: typ, Rank: uint16(e.rank), Word: word}
	if sig {
		h.Op, h.SigMrID, h.SigOff, h.SigValue = op.SigOp, op.SigMrID, op.SigOff, op.SigValue
	}
	var owed uint64 // a verdict this message carries
	if typ == endpoint.MsgPutSignal {
		owed = f.piggy[rail].Swap(0)
		h.MrID, h.Size, h.Off, h.Owed = op.MrID, uint32(size), op.Off, owed
		copy(b[endpoint.PutSigHdr:], unsafe.Slice((*byte)(op.Local), size))
	}
	h.Put(b)
	var err error
	switch {
	case complete && !inject:
		// A verdict, when one comes, says the message arrived: no
		// delivery completion is needed for it.
		err = e.FI.SendMsg(unsafe.Pointer(&b[0]), n, e.MemDesc(), rl.addr, e.SlotArea(idx), !f.Peer().Mesh().LocalCompletion && !verdict)
		if err != nil {
			f.unslot(e, idx)
		}
	case complete: // injected: the slot waits for the verdict
		if err = e.FI.Inject(unsafe.Pointer(&b[0]), n, rl.addr); err != nil {
			f.unslot(e, idx)
		}
	default: // the window is the caller's business (an injected goodbye)
		err = f.sendFree(rl, idx, b)
	}
	if err != nil && owed != 0 {
		f.unowe(rail, owed)
	}
	return err
}

// sendFree sends message b, built in slot idx's area, that completes
// nothing: injected where the provider injects that much (the slot is
// free at once), else with a completion that frees the slot (shm with
// FI_HMEM injects nothing).
func (f *Link) sendFree(rl *fabRail, idx uint32, b []byte) error {
	e := rl.e
	n := uint64(len(b))
	if n <= e.Info.InjectSize {
		err := e.FI.Inject(unsafe.Pointer(&b[0]), n, rl.addr)
		f.unslot(e, idx)
		return err
	}
	e.slots[idx].seq = 0 // its completion completes no number
	err := e.FI.SendMsg(unsafe.Pointer(&b[0]), n, e.MemDesc(), rl.addr, e.SlotArea(idx), false)
	if err != nil {
		f.unslot(e, idx)
	}
	return err
}

// unowe puts back a verdict taken for a message that was not sent. This
// may run under the poller's lock (retry), so it takes only vmu.
func (f *Link) unowe(rail int, word uint64) {
	// The next poll looks at every link's piggy and spill (rare: a post
	// failed with a verdict on board).
	if f.piggy[rail].CompareAndSwap(0, word) {
		f.rails[rail].e.spilled.Store(true)
		return
	}
	f.vmu.Lock()
	f.spill = append(f.spill, fabVerdict{f, word, abi.Success})
	f.vmu.Unlock()
	f.rails[rail].e.spilled.Store(true)
}

// sendVerdict tells the peer whether its signal (word: seq and slot, as it
// sent them on rail) targets a valid word; false means no room yet.
func (f *Link) sendVerdict(rail int, word uint64, status abi.Result) bool {
	return f.sendSmall(rail, endpoint.Msg{Type: endpoint.MsgVerdict, Op: uint8(status), Word: word}, "verdict")
}

// sendSmall sends a one-slot message of ours (a verdict, an
// acknowledgement) on rail, with our rank filled in; false means no room
// yet. A peer already gone needs none: it is failed instead.
func (f *Link) sendSmall(rail int, h endpoint.Msg, what string) bool {
	if err := f.peerGone(); err != nil {
		go f.Peer().MarkDead(err)
		return true // nobody to tell
	}
	rl := &f.rails[rail]
	e := rl.e
	idx, ok := f.slot(e, 0, true)
	if !ok {
		return false
	}
	b := e.SlotMsg(idx, endpoint.MsgSize)
	h.Rank = uint16(e.rank)
	h.Put(b)
	err := f.sendFree(rl, idx, b)
	if err != nil && err != fabric.ErrAgain {
		logx.Warn(abi.SubsysNet, "NET/wasm: fabric: %s to rank %d: %v", what, f.Peer().Rank(), err)
	}
	return err != fabric.ErrAgain
}

// rejectedOrOK reads a verdict's status byte.
func rejectedOrOK(b uint8) abi.Result {
	if b == 0 {
		return abi.Success
	}
	return tcp.Rejected(uint16(b))
}

// control sends a message that is not an operation (the goodbye's
// acknowledgement) on rail; false means no room yet.
func (f *Link) control(rail int, typ uint8, seq uint64) bool {
	err := f.msg(rail, typ, seq, nil, false, false)
	return err != fabric.ErrAgain
}

func (f *Link) queue(pd fabPend) {
	f.pmu.Lock()
	f.pend = append(f.pend, pd)
	f.backlog.Add(1)
	f.pmu.Unlock()
}

// retry posts queued operations in order until one finds no room.
func (f *Link) retry() {
	f.pmu.Lock()
	defer f.pmu.Unlock()
	k := 0
	for k < len(f.pend) {
		if f.Peer().Dead() {
			break
		}
		pd := &f.pend[k]
		err := f.post(pd)
		if err == fabric.ErrAgain {
			break // pd may have moved on (a put with signal whose payload went)
		}
		k++
		f.backlog.Add(-1)
		if err != nil {
			f.Peer().FailCause(pd.op, err)
			go f.Peer().MarkDead(err)
		}
	}
	f.pend = append(f.pend[:0], f.pend[k:]...)
}

// Flush progresses the endpoint from the caller's thread (test() calls
// it while it waits): with manual progress that is where the work is, and
// on few cores a spinning caller would otherwise only take the CPU from
// the progress goroutine.
func (f *Link) Flush() {
	f.Link.Flush()
	if f.inflight.Load() > 0 || f.backlog.Load() > 0 {
		for i := range f.rails {
			if e := f.rails[i].e; e.CallerLeft(testPollGap) == 0 {
				e.Poll()
			}
		}
	}
}

// Turn: Mesh.Progress polled the rails just before, so only the TCP
// lanes are left.
func (f *Link) Turn() { f.Link.Turn() }

// AddStats counts the peer as a fabric peer, and the acknowledgements of
// the TCP lanes beside its endpoint (compression is counted for plain TCP
// links only).
func (f *Link) AddStats(st *link.Stats) {
	st.FabricPeers++
	f.Link.AddAcks(st)
}

func (f *Link) Idle() bool {
	return f.inflight.Load() == 0 && f.backlog.Load() == 0 && f.Link.Idle()
}

// Awaiting counts operations, not control messages: an acknowledgement
// whose send completion was not yet reaped when the peer left (it went
// right after our goodbye acknowledgement) is no lost operation.
func (f *Link) Awaiting() int {
	return int(f.inflight.Load()-f.ctlLive.Load()) + int(f.backlog.Load())
}

// FailAll fails what was posted or queued; stop already raised the dead
// flag, so it waits only for submits that passed their check before.
func (f *Link) FailAll() {
	for f.posting.Load() > 0 {
		runtime.Gosched()
	}
	f.Link.FailAll()
	f.pmu.Lock()
	pend := f.pend
	f.pend = nil
	f.backlog.Add(-int32(len(pend)))
	f.pmu.Unlock()
	for i := range pend {
		f.Peer().Fail(pend[i].op)
	}
	f.dropStaged()
	for i := range f.rails {
		// Writes the peer acknowledged (on another rail, whose poller had
		// not got to them) complete rather than fail.
		e := f.rails[i].e
		e.LockPoll()
		e.popAcked(f)
		e.UnlockPoll()
		f.failSlots(e)
		f.ackWait[i].clear() // failSlots failed their slots
	}
}

// failSlots fails this peer's operations posted on endpoint e. Under
// the poll lock: a signal's slot whose send completed waits only for the
// verdict, which will not come; nobody else frees it.
func (f *Link) failSlots(e *EP) {
	mine := slotPosted | uint32(f.Peer().Rank())<<2
	e.LockPoll()
	defer e.UnlockPoll()
	for i := range e.slots {
		s := &e.slots[i]
		if s.state.CompareAndSwap(mine, slotFailed|uint32(f.Peer().Rank())<<2) {
			f.done(s)
			if s.tag != 0 {
				f.Peer().Mesh().Owner.Complete(s.tag, abi.RemoteError)
			}
			if s.sig && s.got&sigSent != 0 {
				s.link, s.sig, s.got, s.vst = nil, false, 0, abi.Success
				s.state.Store(slotFree)
				e.Put(uint32(i))
			}
		}
	}
}

// Progress over libfabric: completions involving the peer (Link.heard),
// plus what its TCP streams moved (registrations, staged device memory).
// A provider can lose a connection without telling us (a hostile message
// longer than a receive buffer breaks the tcp provider's stream, a
// verbs queue pair goes to its error state), so a silent peer with
// operations outstanding fails here rather than hanging them.
func (f *Link) Progress() (uint64, bool) {
	n, _ := f.Link.Progress()
	return n + f.heard.Load(), true
}
