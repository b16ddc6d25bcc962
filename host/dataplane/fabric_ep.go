package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/spin"
	"golang.org/x/sys/unix"
)

// The libfabric side of one communicator: one RDM endpoint shared by every
// peer, a pool of operation contexts and receive buffers in C memory, the
// registrations, and the progress goroutine that reaps the completion
// queue for both directions (our operations finishing, and the peers'
// writes and messages landing in our memory).

const (
	fabSlots   = 4096 // operations in flight on one endpoint
	fabRecvs   = 256  // receive buffers for signal and goodbye messages
	fabMsgSize = 32   // one control message
	// A signal travels as a fabMsgPutSignal message: the control message,
	// 24 bytes (the target range of an inline payload, and an owed
	// verdict), then at most fabInlineMax bytes of payload. Slots and receive
	// buffers hold the largest message.
	fabPutSigHdr = fabMsgSize + 24
	fabInlineMax = 80
	fabMsgMax    = fabPutSigHdr + fabInlineMax
	fabSlotSize  = fabric.ContextSize + fabMsgMax
	// The CQ data of a write carries the sender's rank in its high bits
	// (the target learns who wrote without FI_SOURCE) and the low bits of
	// the sequence number below: with 8 bytes of CQ data 16 and 48 bits;
	// with 4 (verbs, efa) as few rank bits as the communicator needs and
	// at least fabMinSeqBits for the number (see orderer.unwrap).
	fabMinSeqBits = 16
	// A small put with signal whose signal fits travels as one write whose
	// 8-byte CQ data carries it (fabricLink.cqSignal): the rank's 16 bits,
	// then fabSigFlag, then the low fabSigSeqBits of the sequence number, a
	// signal registration id below 2^fabSigIDBits and the word's index
	// (offset / 8) below 2^fabSigWordBits; the add is 1. A plain write
	// keeps fabSigFlag clear (47 bits of number).
	fabSigSeqBits  = 16
	fabSigIDBits   = 12
	fabSigWordBits = 19
	fabSigFlag     = 1 << 47
	// fabSigKnown: signal targets per peer whose acceptance by the peer we
	// remember (fabricLink.sigOK).
	fabSigKnown = 4
	// fabNoSlot in a verdict's slot field: a rejection of a signal that
	// came in CQ data, which no slot awaits.
	fabNoSlot = 1<<16 - 1
	// fabNapsBeforeWait: empty polls (about 2000 yields, then ~10 ms of
	// naps) before an idle progress goroutine sleeps on the CQ's wait fd.
	fabNapsBeforeWait = 2000 + 64 + 50
)

// fabWaitMs bounds one sleep on the CQ's wait fd. The wake-ups come from
// the fd; the bound only limits the harm of a provider that misses one.
// A test raises it to prove the fd alone wakes the target.
var fabWaitMs atomic.Int32

func init() { fabWaitMs.Store(100) }

// Control messages (fabMsgSize bytes, little endian):
//
//	0 type u8 | 1 sigOp u8 | 2 rank u16 | 4 sigMrID u32 | 8 seq u48, slot u16
//	16 sigOff u64 | 24 sigValue u64
//
// A fabMsgPutSignal message continues with
//
//	32 mrID u32 | 36 size u32 (0..fabInlineMax) | 40 offset u64
//	48 owed verdict u64 | 56 payload
//
// size 0: the payload was written apart (or there is none). The owed
// verdict (0: none) answers a signal the receiver sent us on this rail,
// as a verdict message would (seq and slot; status 0).
//
// slot (a signal's: the sender's operation slot) comes back in the signal's
// verdict, which reuses the layout: 1 holds the status (0: applied or
// queued in order; else the ncclResult_t of the rejection) and 8 the same
// seq and slot. Sequence numbers are 48 bits, as in 8-byte CQ data.
const (
	fabMsgSignal  = 1 // apply a signal once every earlier sequence number landed
	fabMsgBye     = 2 // the sender's last message on one of its lanes
	fabMsgByeAck  = 3 // everything before that goodbye was applied
	fabMsgVerdict = 4 // the target checked a signal's word: the request may complete
	// a signal, with its put's payload inline when small: copied in,
	// then applied as a signal (one sequence number for both)
	fabMsgPutSignal = 5
	fabSeqMask      = 1<<48 - 1
)

// Slot states, in the low two bits of fabSlot.state; the bits above hold
// the owning peer's rank, so failAll claims only its own peer's slots.
const (
	slotFree   = 0
	slotPosted = 1
	slotFailed = 2 // failed by failAll; the late completion frees it
)

type fabSlot struct {
	state atomic.Uint32
	link  *fabricLink // written before state turns posted
	tag   uint64
	// A signal's slot is kept until both its send completed (the provider
	// is done with the context) and the target's verdict came: the request
	// fails if the target rejected the signal word. Written before the
	// post, then only under the endpoint's pollMu.
	sig bool
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

// fabEP is the endpoint of one listener, then of the Mesh it connects; a
// Mesh with several rails has one per NIC (fabric_rails.go).
type fabEP struct {
	ep   *fabric.Endpoint
	info fabric.Info
	name []byte
	hash uint32 // of the provider name: peers must use the same
	rail int    // its index among the Mesh's rails
	// bytes counts what our puts and gets moved through this endpoint
	// (logged per rail at close).
	bytes atomic.Uint64

	m       *Mesh
	rank    int
	links   []*fabricLink // by rank; nil where the peer is not on this fabric
	seqBits uint          // low bits of the CQ data holding the sequence number
	// sigCQ: 8-byte CQ data at full width, so a small put with signal may
	// carry its signal there (fabSigFlag); plain writes then use one bit
	// less of number.
	sigCQ bool

	mem   unsafe.Pointer // C: fabSlots slot areas, then fabRecvs receive areas
	slots []fabSlot
	free  chan uint32
	memMR fabric.MR // all of mem, under FI_MR_LOCAL (messages and receives)

	regMu  sync.Mutex
	closed bool                        // under regMu: the endpoint is gone
	local  atomic.Pointer[[]fabric.MR] // our registrations by id

	pollMu sync.Mutex // one poller at a time; it owns comps
	comps  *fabric.Comps
	gone   bool // under pollMu: the endpoint is closed
	byeMu  sync.Mutex
	byes   []fabBye // goodbyes waiting for the orderer to pass them
	// verdicts to send at the next poll (under pollMu); nverdicts is
	// their number, for busy()
	verdicts  []fabVerdict
	nverdicts atomic.Int32
	// links whose piggy for this rail was set since the last poll (under
	// pollMu): what callers' messages have not carried goes out then.
	owing   []*fabricLink
	nowing  atomic.Int32
	spilled atomic.Bool // some link's spill holds verdicts (unowe)

	quit     chan struct{}
	done     chan struct{} // closed when progress ends (once started)
	started  bool
	wake     chan struct{} // a submit ends the progress goroutine's nap
	sleeping atomic.Bool
	inWait   atomic.Bool // asleep on the CQ's wait fd, not in a nap
	canWait  atomic.Bool // the CQ has a wait fd the provider honours
	// After traffic the progress goroutine keeps polling for spinNs before
	// it naps (Options.SpinWait, one of Options.Spinners slots, shared with
	// the TCP readers), so an answer that follows at once is reaped
	// without a timer's wake-up.
	spinNs    atomic.Int64
	spinSlots atomic.Int32
	// callerAt is when a caller's thread last polled through Mesh.Progress
	// (rmaProgress), as Now(). While callers poll,
	// the progress goroutine naps instead of competing for the CQ: the
	// caller reaps the peers' writes and signals where it waits, as a raw
	// libfabric program polls its own CQ, without a thread hand-off.
	callerAt atomic.Int64
}

// callerGrace is how long after a caller's poll the progress goroutine
// leaves the CQ to callers. NCCL's proxies call rmaProgress in a loop;
// when they stop, the goroutine resumes within this bound.
const callerGrace = 200 * time.Microsecond

// testPollGap: test() leaves the polling to rmaProgress when that polled
// this recently (a proxy loop calls both; one empty poll per turn is a
// system call on some providers), and polls itself otherwise (NCCL's RMA
// flush path spins on test() alone).
const testPollGap = 20 * time.Microsecond

// callerPoll reaps completions from a caller's thread (rmaProgress). It
// does not wait when another thread is polling.
func (e *fabEP) callerPoll() {
	e.callerAt.Store(Now())
	e.poll()
}

// callerRecent is how much of the callers' grace is left (0: none).
func (e *fabEP) callerRecent() time.Duration {
	return e.callerLeft(callerGrace)
}

// callerLeft is how much of d since the last caller's poll is left.
func (e *fabEP) callerLeft(d time.Duration) time.Duration {
	at := e.callerAt.Load()
	if at == 0 {
		return 0
	}
	return max(d-time.Duration(Now()-at), 0)
}

type fabBye struct {
	link *fabricLink
	seq  uint64
}

type fabVerdict struct {
	link   *fabricLink
	word   uint64 // seq and slot, as the signal carried them
	status abi.Result
}

func providerHash(prov string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(prov))
	return h.Sum32() | 1 // never 0: 0 means "no fabric" in the handle
}

// openFabric opens an endpoint on prov for a new listener: with FI_HMEM
// where a device runtime is loaded and the provider offers it with enough
// CQ data (never shm, below), else without.
func openFabric(prov, domain string) (*fabEP, error) {
	if devmem.Get() == nil || prov == "shm" {
		// No device runtime, no device memory to register: FI_HMEM would
		// only cost (shm with it injects nothing). shm with FI_HMEM
		// registered CUDA memory on the H200 (libfabric 1.22 built with
		// CUDA) but its transfers of it never completed, so its device
		// memory is staged.
		return openFabricMode(prov, domain, false)
	}
	if e, err := openFabricMode(prov, domain, true); err == nil {
		return e, nil
	} else if !errors.Is(err, errNoHMEM) {
		logx.Trace(abi.SubsysNet, "NET/wasm: fabric %s: with FI_HMEM: %v; opening without (device memory is staged)", prov, err)
	}
	return openFabricMode(prov, domain, false)
}

var errNoHMEM = errors.New("no FI_HMEM")

// fabTestNoInject, when set by a test, makes endpoints behave as if the
// provider injected nothing (shm with FI_HMEM): every message is sent
// with a completion.
var fabTestNoInject bool

func openFabricMode(prov, domain string, hmem bool) (*fabEP, error) {
	ep, err := fabric.OpenHMEM(prov, domain, hmem)
	if err != nil {
		if hmem {
			return nil, fmt.Errorf("%w: %v", errNoHMEM, err)
		}
		return nil, err
	}
	e := &fabEP{ep: ep, info: ep.Info, hash: providerHash(prov), quit: make(chan struct{}), done: make(chan struct{}), wake: make(chan struct{}, 1)}
	fail := func(err error) (*fabEP, error) {
		ep.Close()
		return nil, err
	}
	if e.info.CQDataSize < 4 {
		return fail(fmt.Errorf("provider %s offers %d bytes of CQ data; this transport needs 4", prov, e.info.CQDataSize))
	}
	if fabTestNoInject {
		e.info.InjectSize = 0
	}
	if e.name, err = ep.Name(); err != nil {
		return fail(err)
	}
	if len(e.name) > fabNameMax {
		return fail(fmt.Errorf("provider %s endpoint name is %d bytes; the listen handle holds %d", prov, len(e.name), fabNameMax))
	}
	e.mem = fabric.Alloc((fabSlots + fabRecvs) * fabSlotSize)
	e.slots = make([]fabSlot, fabSlots)
	e.free = make(chan uint32, fabSlots)
	for i := uint32(0); i < fabSlots; i++ {
		e.free <- i
	}
	if e.info.MRMode&fabric.MRLocal != 0 {
		if e.memMR, err = ep.Register(e.mem, (fabSlots+fabRecvs)*fabSlotSize, 1<<62); err != nil {
			fabric.Free(e.mem)
			return fail(err)
		}
	}
	e.comps = fabric.NewComps(64)
	e.verdicts = make([]fabVerdict, 0, fabRecvs) // one per receive buffer, at most, per poll
	e.owing = make([]*fabricLink, 0, fabRecvs)
	e.canWait.Store(ep.CanWait())
	empty := []fabric.MR{}
	e.local.Store(&empty)
	return e, nil
}

// layout sets how the CQ data splits between rank and sequence number for
// n ranks; false when n ranks do not fit. Every rank computes the same.
func (e *fabEP) layout(n int) bool {
	total, rankBits := uint(64), uint(16)
	if e.info.CQDataSize < 8 {
		total, rankBits = 32, uint(bits.Len(uint(n-1)))
	}
	if uint(bits.Len(uint(n-1))) > rankBits || total-rankBits < fabMinSeqBits {
		return false
	}
	e.seqBits = total - rankBits
	if fabTestSeqBits != 0 {
		e.seqBits = fabTestSeqBits
	}
	e.sigCQ = e.seqBits == 48 && !fabTestNoSigCQ
	return true
}

// fabTestRefuse, when set by a test to n > 1, makes n-1 of every n writes
// and signal sends find no room (ErrAgain), as shm refuses every post to a
// peer while one write to it is in segmentation and reassembly.
var (
	fabTestRefuse  uint64
	fabTestRefused atomic.Uint64
)

func fabRefused() bool {
	return fabTestRefuse > 1 && fabTestRefused.Add(1)%fabTestRefuse != 0
}

// fabTestNoSigCQ, when set by a test, keeps every signal in a message
// (as with 4-byte CQ data).
var fabTestNoSigCQ bool

// fabTestSeqBits, when set by a test, narrows the sequence field so that
// it wraps quickly.
var fabTestSeqBits uint

func (e *fabEP) slotArea(i uint32) unsafe.Pointer { return unsafe.Add(e.mem, uintptr(i)*fabSlotSize) }
func (e *fabEP) recvArea(i uint32) unsafe.Pointer {
	return unsafe.Add(e.mem, uintptr(fabSlots+i)*fabSlotSize)
}

// slotOf maps a completion's context back to an operation slot or a
// receive buffer.
func (e *fabEP) slotOf(ctx unsafe.Pointer) (idx uint32, recv, ok bool) {
	d := uintptr(ctx) - uintptr(e.mem)
	if uintptr(ctx) < uintptr(e.mem) || d >= (fabSlots+fabRecvs)*fabSlotSize || d%fabSlotSize != 0 {
		return 0, false, false
	}
	i := uint32(d / fabSlotSize)
	if i >= fabSlots {
		return i - fabSlots, true, true
	}
	return i, false, true
}

func (e *fabEP) postRecv(i uint32) error {
	a := e.recvArea(i)
	return e.ep.Recv(unsafe.Add(a, fabric.ContextSize), fabMsgMax, e.memMR.Desc, a)
}

// start posts the receive buffers and launches the progress goroutine.
func (e *fabEP) start() error {
	for i := uint32(0); i < fabRecvs; i++ {
		if err := e.postRecv(i); err != nil {
			return err
		}
	}
	e.started = true
	go e.progress()
	return nil
}

// register makes a registration reachable by the peers' RMA.
func (e *fabEP) register(id uint32, base unsafe.Pointer, size uint64) (uint64, error) {
	return e.registerMR(id, fabric.MRRequest{Base: base, Len: size, DMABUFFd: -1})
}

// registerMR is register for any request (device memory under FI_HMEM).
func (e *fabEP) registerMR(id uint32, r fabric.MRRequest) (uint64, error) {
	e.regMu.Lock()
	defer e.regMu.Unlock()
	if e.closed {
		return 0, fmt.Errorf("fabric endpoint closed")
	}
	r.Len, r.WantKey = max(r.Len, 1), uint64(id)
	mr, err := e.ep.RegisterMR(r)
	if err != nil {
		return 0, err
	}
	old := *e.local.Load()
	n := max(len(old), int(id)+1)
	tab := make([]fabric.MR, n)
	copy(tab, old)
	tab[id] = mr
	e.local.Store(&tab)
	return mr.Key, nil
}

func (e *fabEP) deregister(id uint32) {
	e.regMu.Lock()
	defer e.regMu.Unlock()
	old := *e.local.Load()
	if e.closed || int(id) >= len(old) || old[id] == (fabric.MR{}) {
		return
	}
	e.ep.Deregister(old[id])
	tab := append([]fabric.MR(nil), old...)
	tab[id] = fabric.MR{}
	e.local.Store(&tab)
}

// key is registration id's remote key on this endpoint (0 if none).
func (e *fabEP) key(id uint32) uint64 {
	if t := *e.local.Load(); int(id) < len(t) {
		return t[id].Key
	}
	return 0
}

// desc is the local descriptor of registration id (nil where the
// provider does not need one).
// Under FI_MR_HMEM device buffers need theirs whatever FI_MR_LOCAL says.
func (e *fabEP) desc(id uint32) unsafe.Pointer {
	if t := *e.local.Load(); int(id) < len(t) && (e.info.MRMode&fabric.MRLocal != 0 || (e.info.MRMode&fabric.MRHMEM != 0 && t[id].Dev)) {
		return t[id].Desc
	}
	return nil
}

// devDirect reports whether registration id is device memory registered
// with the provider (FI_HMEM): RDMA reaches it, no staging.
func (e *fabEP) devDirect(id uint32) bool {
	t := *e.local.Load()
	return int(id) < len(t) && t[id].Dev
}

// close stops the progress goroutine and closes the endpoint and every
// registration left.
func (e *fabEP) close() {
	select {
	case <-e.quit:
		return
	default:
	}
	close(e.quit)
	if e.started {
		if e.canWait.Load() {
			e.ep.Signal()
		}
		<-e.done
	}
	// Reap what is left (peers' departures among it): closing an rxm
	// endpoint with such events unread crashed libfabric 1.17.
	for i := 0; i < 100; i++ {
		e.poll()
	}
	e.pollMu.Lock()
	e.gone = true
	e.pollMu.Unlock()
	e.regMu.Lock()
	e.closed = true
	for _, mr := range *e.local.Load() {
		e.ep.Deregister(mr)
	}
	e.regMu.Unlock()
	e.ep.Deregister(e.memMR)
	e.ep.Close()
	fabric.Free(e.mem)
	e.comps.Free() // no poll runs: gone is set
}

// progress reaps completions until close. An empty poll costs a system
// call on some providers (tcp;ofi_rxm), so an idle endpoint backs off to
// sleeping; with operations in flight it only yields.
func (e *fabEP) progress() {
	defer close(e.done)
	empty := 0
	nap := time.NewTimer(time.Hour)
	defer nap.Stop()
	spinning := false
	var last time.Time // the last poll that reaped something
	defer func() {
		if spinning {
			spin.Release()
		}
	}()
	for {
		select {
		case <-e.quit:
			return
		default:
		}
		if d := e.callerRecent(); d > 0 {
			// A caller drives the CQ (callerPoll); look again when its
			// grace ends. Not sleeping as far as nudge knows: a submit
			// needs no wake-up (a system call and a thread switch in
			// the caller's path) while the caller polls anyway.
			if spinning {
				spin.Release()
				spinning = false
			}
			nap.Reset(d)
			select {
			case <-nap.C:
			case <-e.quit:
			}
			continue
		}
		n, polled := e.poll()
		if !polled {
			runtime.Gosched() // a caller's thread is polling
			continue
		}
		if n > 0 {
			empty = 0
			if e.spinNs.Load() > 0 {
				last = time.Now()
			}
			continue
		}
		empty++
		if e.busy() && empty < 2000 {
			runtime.Gosched()
			continue
		}
		// Within the spin window after the last traffic (however long the
		// busy polling above ran), keep polling in a spin slot.
		if ns := e.spinNs.Load(); ns > 0 && time.Since(last) < time.Duration(ns) &&
			(spinning || spin.Acquire(e.spinSlots.Load())) {
			spinning = true
			runtime.Gosched()
			continue
		}
		if spinning {
			spin.Release()
			spinning = false
		}
		if e.canWait.Load() && (empty > fabNapsBeforeWait || !e.busy()) {
			// Idle for a while, or with nothing of ours in flight: sleep
			// on the CQ's wait fd (the peers' writes and messages wake
			// it, so does a submit through Signal), unless a submit
			// slipped in after busy() above. A target does not nap: with
			// manual progress a peer's large write moves only while we
			// poll, and the fd wakes us as soon as its bytes come, where
			// a nap would stall them (fi_trywait returns at once while
			// data is pending). Our own operations in flight nap first:
			// their completions come in bursts, and a nap's poll costs
			// less than a wake-up from poll().
			e.sleeping.Store(true)
			if !e.busy() {
				e.inWait.Store(true)
				err := e.ep.Wait(int(fabWaitMs.Load()))
				e.inWait.Store(false)
				if err != nil {
					e.canWait.Store(false)
					logx.Trace(abi.SubsysNet, "NET/wasm: fabric: %s cannot wait on its CQ (%v); polling with naps", e.info.Provider, err)
				}
			}
			e.sleeping.Store(false)
			continue
		}
		// Idle: nap 10 µs, doubling up to 200 µs, unless a submit wakes
		// us. The peers' writes cannot wake a nap: they wait for the next
		// poll.
		nap.Reset(time.Duration(10<<min(max(empty-2000, 0)/16, 4)) * time.Microsecond)
		e.sleeping.Store(true)
		select {
		case <-nap.C:
		case <-e.wake:
			empty = 0
		case <-e.quit:
		}
		e.sleeping.Store(false)
	}
}

// nudge wakes the progress goroutine when it naps: our operation needs
// polling to progress (manual progress) and to complete.
func (e *fabEP) nudge() {
	if e.sleeping.Load() {
		if e.canWait.Load() {
			e.ep.Signal()
		}
		select {
		case e.wake <- struct{}{}:
		default:
		}
	}
}

// poll reaps one batch of completions, then retries what waited for room
// and acknowledges goodbyes. One thread polls at a time (callers' test()
// through flush, or the progress goroutine); ok is false when another was.
func (e *fabEP) poll() (n int, ok bool) {
	if !e.pollMu.TryLock() {
		return 0, false
	}
	defer e.pollMu.Unlock()
	if e.gone {
		return 0, true
	}
	if len(e.verdicts) > 0 || e.nowing.Load() > 0 || e.spilled.Load() {
		// Sent here, at the next poll, not while the message was
		// handled: the caller that just saw its signal word change
		// answers first, and its answer carries the verdict if it is a
		// signal on this rail (owed).
		e.sendOwed()
		e.sendVerdicts()
	}
	n, err := e.ep.Poll(e.comps)
	if err != nil {
		logx.Warn(abi.SubsysNet, "NET/wasm: fabric: %v", err)
	}
	for i := 0; i < n; i++ {
		e.handle(e.comps.At(i))
	}
	e.retry()
	e.checkByes()
	return n, true
}

// busy reports operations of ours in flight or waiting for room, or
// verdicts waiting to be sent.
func (e *fabEP) busy() bool {
	if e.nverdicts.Load() > 0 || e.nowing.Load() > 0 || e.spilled.Load() {
		return true
	}
	for _, l := range e.links {
		if l != nil && (l.inflight.Load() > 0 || l.backlog.Load() > 0) {
			return true
		}
	}
	return false
}

func (e *fabEP) handle(c *fabric.Completion) {
	ctx, flags := fabric.Ctx(c), fabric.Flags(c)
	idx, recv, ok := e.slotOf(ctx)
	if errno := fabric.Err(c); errno != 0 {
		if ok && !recv {
			e.finish(idx, abi.RemoteError, fmt.Errorf("fabric: %s", fabric.Strerror(errno)))
		}
		// A receive fails when the endpoint closes (canceled), or when a
		// peer sent a message larger than fabMsgMax (truncated): that
		// buffer goes back, or such peers would use them all up.
		if ok && recv && errno != fabCanceled {
			fabRecvWarn.Warn(abi.SubsysNet, "NET/wasm: fabric: a control message failed to arrive: %s", fabric.Strerror(errno))
			e.repost(idx)
		}
		return
	}
	if flags&fabric.FlagRemoteCQData != 0 && flags&fabric.FlagRemoteWrite != 0 {
		data := fabric.Data(c)
		if l := e.link(int(data >> e.seqBits)); l != nil {
			l.heard.Add(1)
			e.wrote(l, data&(1<<e.seqBits-1))
		}
		if ok && recv {
			e.repost(idx)
		}
		return
	}
	if ok && recv {
		e.message(unsafe.Add(e.recvArea(idx), fabric.ContextSize), fabric.Len(c))
		e.repost(idx)
		return
	}
	if ok {
		e.finish(idx, abi.Success, nil)
	}
}

// wrote lands a peer's write whose CQ data (rank taken off) is w: a
// number, or with fabSigFlag a number and the signal it carries, which
// the orderer applies once every earlier number landed. The payload is
// in place before the provider reports the CQ data.
func (e *fabEP) wrote(l *fabricLink, w uint64) {
	p := l.p
	if !e.sigCQ {
		if err := p.landed(p.order.unwrap(w, e.seqBits), sigRef{}, 0); err != nil {
			go p.markDead(err)
		}
		return
	}
	if w&fabSigFlag == 0 {
		if err := p.landed(p.order.unwrap(w, e.seqBits-1), sigRef{}, 0); err != nil {
			go p.markDead(err)
		}
		return
	}
	seq := p.order.unwrap(w&(1<<fabSigSeqBits-1), fabSigSeqBits)
	id := uint32(w>>fabSigSeqBits) & (1<<fabSigIDBits - 1)
	off := (w >> (fabSigSeqBits + fabSigIDBits) & (1<<fabSigWordBits - 1)) * 8
	sig, add, status := p.signalTarget(id, off, abi.SignalOpInc, 1)
	if err := p.landed(seq, sig, add); err != nil {
		go p.markDead(err)
		return
	}
	if status != abi.Success {
		// The sender only puts a target it saw accepted here into CQ data,
		// so this is a registration dropped since: its request completed
		// on arrival; the rejection reaches its sticky error (and WARN).
		e.queueVerdict(l, seq|fabNoSlot<<48, status)
	}
}

func (e *fabEP) repost(i uint32) {
	for {
		err := e.postRecv(i)
		if err != fabric.ErrAgain {
			if err != nil {
				logx.Warn(abi.SubsysNet, "NET/wasm: fabric: repost receive: %v", err)
			}
			return
		}
		e.ep.Progress(e.comps) // nothing reaped; lets the provider progress
	}
}

func (e *fabEP) link(rank int) *fabricLink {
	if rank < 0 || rank >= len(e.links) {
		return nil
	}
	return e.links[rank]
}

// finish completes the operation in slot idx and frees the slot.
func (e *fabEP) finish(idx uint32, status abi.Result, err error) {
	s := &e.slots[idx]
	v := s.state.Load()
	if v&3 == slotPosted && s.seq != 0 && !s.sig {
		// Completion means delivery: the target has this number, so
		// later ones may be posted (seqWindow). A signal awaiting a
		// verdict is sent without delivery completion: its verdict says
		// the target has the number (verdict).
		s.link.win.complete(s.seq)
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
		e.free <- idx
		l.inflight.Add(-1)
		if err != nil {
			logx.Warn(abi.SubsysNet, "NET/wasm: operation to rank %d: %v", l.p.rank, err)
			l.p.m.owner.PeerFailed(l.p.rank, fmt.Errorf("%w: operation to rank %d failed: %v", ErrPeerGone, l.p.rank, err))
		}
		if tag != 0 {
			l.p.m.owner.Complete(tag, status)
		}
	case v&3 == slotFailed && s.state.CompareAndSwap(v, slotFree):
		s.link, s.sig, s.got, s.vst = nil, false, 0, abi.Success
		e.free <- idx
	}
}

// verdict is the target's answer to our signal in slot idx (under pollMu).
// A verdict that matches no signal of ours awaiting one (a stale or forged
// slot) changes nothing but a rejection's sticky error.
func (e *fabEP) verdict(l *fabricLink, word uint64, status abi.Result) {
	if status != abi.Success {
		how := ""
		if word>>48 == fabNoSlot {
			how = " carried in CQ data (its request completed on arrival)"
		}
		l.p.m.owner.PeerFailed(l.p.rank, fmt.Errorf("rank %d rejected a signal%s (sequence number %d): %v", l.p.rank, how, word&fabSeqMask, status))
	}
	idx := uint32(word >> 48)
	if idx >= fabSlots {
		return
	}
	s := &e.slots[idx]
	if s.state.Load()&3 != slotPosted || !s.sig || s.link != l || s.seq != word&fabSeqMask || s.got&sigVerdict != 0 {
		return
	}
	s.got |= sigVerdict
	s.link.win.complete(s.seq)
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

// queueVerdict queues a verdict for the next poll (under pollMu): a
// success as l's owed verdict on this rail, which our next signal to l
// may carry, when none is owed yet.
func (e *fabEP) queueVerdict(l *fabricLink, word uint64, status abi.Result) {
	if status == abi.Success && l.piggy[e.rail].CompareAndSwap(0, word) {
		e.owing = append(e.owing, l)
		e.nowing.Store(int32(len(e.owing)))
		return
	}
	e.verdicts = append(e.verdicts, fabVerdict{l, word, status})
	e.nverdicts.Store(int32(len(e.verdicts)))
}

// sendOwed moves the verdicts no message carried to the verdict queue
// (under pollMu).
func (e *fabEP) sendOwed() {
	take := func(l *fabricLink) {
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
// for the next poll (under pollMu).
func (e *fabEP) sendVerdicts() {
	k := 0
	for _, v := range e.verdicts {
		if !v.link.p.dead.Load() && !v.link.sendVerdict(e.rail, v.word, v.status) {
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
func (e *fabEP) message(b unsafe.Pointer, n uint64) {
	if n < fabMsgSize || n > fabMsgMax {
		return
	}
	m := unsafe.Slice((*byte)(b), n)
	l := e.link(int(binary.LittleEndian.Uint16(m[2:])))
	if l == nil || e.rail >= len(l.rails) {
		return
	}
	l.heard.Add(1)
	p := l.p
	word := binary.LittleEndian.Uint64(m[8:])
	seq := word & fabSeqMask
	switch m[0] {
	case fabMsgSignal:
		sig, add, status := p.signalTarget(binary.LittleEndian.Uint32(m[4:]), binary.LittleEndian.Uint64(m[16:]), m[1], binary.LittleEndian.Uint64(m[24:]))
		if err := p.landed(seq, sig, add); err != nil {
			go p.markDead(err)
			return
		}
		// The initiator's request completes on this verdict: with the
		// rejection's code when the word is not a valid signal target.
		e.queueVerdict(l, word, status)
	case fabMsgPutSignal:
		status, err := p.inlinePut(m)
		if err != nil {
			logx.Warn(abi.SubsysNet, "NET/wasm: protocol violation by rank %d: %v; dropping its connections", p.rank, err)
			go p.markDead(err)
			return
		}
		var sig sigRef
		var add uint64
		if status == abi.Success {
			sig, add, status = p.signalTarget(binary.LittleEndian.Uint32(m[4:]), binary.LittleEndian.Uint64(m[16:]), m[1], binary.LittleEndian.Uint64(m[24:]))
		}
		if err := p.landed(seq, sig, add); err != nil {
			go p.markDead(err)
			return
		}
		e.queueVerdict(l, word, status)
		if owed := binary.LittleEndian.Uint64(m[48:]); owed != 0 {
			e.verdict(l, owed, abi.Success)
		}
	case fabMsgVerdict:
		e.verdict(l, word, rejectedOrOK(m[1]))
	case fabMsgBye:
		p.peerBye.Store(true)
		if err := p.landed(seq, sigRef{}, 0); err != nil {
			go p.markDead(err)
			return
		}
		e.byeMu.Lock()
		e.byes = append(e.byes, fabBye{l, seq})
		e.byeMu.Unlock()
	case fabMsgByeAck:
		p.ackBye()
	}
}

// inlinePut copies the payload of a fabMsgPutSignal message m into our
// registration. status is what its verdict reports (a range outside the
// registration, or device memory, which senders never inline, is
// rejected); err is a malformed message, which drops the peer.
func (p *peer) inlinePut(m []byte) (abi.Result, error) {
	if len(m) < fabPutSigHdr {
		return 0, fmt.Errorf("inline put of %d bytes is shorter than its %d-byte header", len(m), fabPutSigHdr)
	}
	id, size, off := binary.LittleEndian.Uint32(m[32:]), uint64(binary.LittleEndian.Uint32(m[36:])), binary.LittleEndian.Uint64(m[40:])
	if size > fabInlineMax || uint64(len(m)) != fabPutSigHdr+size {
		return 0, fmt.Errorf("inline put declares %d bytes in a %d-byte message", size, len(m))
	}
	if size == 0 {
		return abi.Success, nil // a signal alone, or its payload was written
	}
	base, rsize, ctx, pin, ok := p.m.owner.Resolve(id)
	defer pin.Release()
	if !ok || !Span(off, size, rsize) || ctx != 0 {
		return abi.InvalidArgument, nil
	}
	copy(unsafe.Slice((*byte)(unsafe.Add(base, off)), size), m[fabPutSigHdr:])
	return abi.Success, nil
}

// checkByes acknowledges every goodbye whose predecessors all landed.
func (e *fabEP) checkByes() {
	e.byeMu.Lock()
	defer e.byeMu.Unlock()
	k := 0
	for _, b := range e.byes {
		if !b.link.p.order.passed(b.seq) || !b.link.control(e.rail, fabMsgByeAck, 0) {
			e.byes[k] = b
			k++
		}
	}
	e.byes = e.byes[:k]
}

// retry posts what found no room earlier, after moving the links' windows
// past staged puts that landed.
func (e *fabEP) retry() {
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
	}
}
