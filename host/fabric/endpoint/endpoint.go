// Package endpoint runs one libfabric RDM endpoint for the data plane
// (host/dataplane's fabric transport): it opens the endpoint, with FI_HMEM
// where a device runtime is loaded and the provider takes it; keeps a pool
// of operation slots and a set of receive buffers in C memory, where
// libfabric may keep pointers to them; and runs the progress goroutine
// that reaps the completion queue, backing off from yielding to naps and
// then to a sleep on the CQ's wait fd, and that leaves the CQ to callers'
// threads while they poll it themselves (rmaProgress).
//
// What a completion means (an operation done, a peer's write or message
// landed) is the owner's business: completions go to its Handler, under
// the poll lock, one poller at a time.
package endpoint

import (
	"errors"
	"fmt"
	"hash/fnv"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/nap"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/spin"
)

const (
	// Slots is how many operations may be in flight on one endpoint.
	Slots = 4096
	// Recvs is how many receive buffers stay posted for messages.
	Recvs = 256
	// napsBeforeWait: empty polls (about 2000 yields, then ~10 ms of
	// naps) before an idle progress goroutine sleeps on the CQ's wait fd.
	napsBeforeWait = 2000 + 64 + 50
	// CallerGrace is how long after a caller's poll (CallerPoll) the
	// progress goroutine leaves the CQ to callers. NCCL's proxies call
	// rmaProgress in a loop; when they stop, the goroutine resumes within
	// this bound.
	CallerGrace = 200 * time.Microsecond
)

// waitMs bounds one sleep on the CQ's wait fd. The wake-ups come from
// the fd; the bound only limits the harm of a provider that misses one.
var waitMs atomic.Int32

func init() { waitMs.Store(100) }

// SetWaitBound sets the bound, in milliseconds, of one sleep on the CQ's
// wait fd and returns the previous one. A test raises it to prove that
// the fd alone wakes the target.
func SetWaitBound(ms int32) int32 { return waitMs.Swap(ms) }

// epoch is the origin of the callers' poll times.
var epoch = time.Now()

func now() int64 { return int64(time.Since(epoch)) }

// Handler is what the owner of an Endpoint does with its completions.
// Every method but Busy runs under the poll lock.
type Handler interface {
	// BeforePoll runs before the completion queue is read (answers
	// owed to the peers go out then).
	BeforePoll()
	// Completion handles one completion (SlotOf names its slot).
	Completion(c *fabric.Completion)
	// AfterPoll runs after each batch of completions (what waited for
	// room is retried then).
	AfterPoll()
	// Busy reports work of the owner's in flight or waiting: the
	// progress goroutine keeps polling rather than sleeping while it is.
	Busy() bool
}

// Config says what endpoint to open and what its owner needs of it.
type Config struct {
	Provider, Domain string
	// MsgMax is the largest message a slot's message area or a receive
	// buffer holds (after fabric.ContextSize bytes of context).
	MsgMax uint64
	// NameMax is the longest endpoint name the owner can publish.
	NameMax int
	// CQData is the fewest bytes of remote CQ data the owner needs.
	CQData uint64
}

// Endpoint is one open RDM endpoint with its slots, receive buffers and
// progress goroutine.
type Endpoint struct {
	FI   *fabric.Endpoint
	Info fabric.Info
	Name []byte // the endpoint's address, as peers insert it
	Hash uint32 // of the provider name (ProviderHash)
	// Regs is the owner's memory registered with the endpoint's domain.
	Regs *Regs

	h        Handler
	slotSize uintptr
	mem      unsafe.Pointer // C: Slots slot areas, then Recvs receive areas
	memMR    fabric.MR      // all of mem, under FI_MR_LOCAL
	free     chan uint32

	pollMu sync.Mutex // one poller at a time
	comps  *fabric.Comps
	gone   bool // under pollMu: the endpoint is closed

	quit     chan struct{}
	done     chan struct{} // closed when progress ends (once started)
	started  bool
	wake     chan struct{} // a submit ends the progress goroutine's nap
	sleeping atomic.Bool
	inWait   atomic.Bool // asleep on the CQ's wait fd, not in a nap
	canWait  atomic.Bool // the CQ has a wait fd the provider honours
	// After traffic the progress goroutine keeps polling for spinNs before
	// it naps, in one of spinSlots spinner slots (host/spin), so an answer
	// that follows at once is reaped without a timer's wake-up.
	spinNs    atomic.Int64
	spinSlots atomic.Int32
	// callerAt is when a caller's thread last polled (CallerPoll), as
	// now(). While callers poll, the progress goroutine naps instead of
	// competing for the CQ: the caller reaps the peers' writes and
	// messages where it waits, as a raw libfabric program polls its own
	// CQ, without a thread hand-off.
	callerAt atomic.Int64
}

// ProviderHash is what the listen handle carries of a provider's name:
// peers must use the same provider. Never 0, which means "no fabric".
func ProviderHash(prov string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(prov))
	return h.Sum32() | 1
}

// Open opens an endpoint as c asks, with FI_HMEM where a device runtime
// is loaded and the provider offers it with enough CQ data (never shm,
// below), else without. h receives its completions once Start runs.
func Open(c Config, h Handler) (*Endpoint, error) {
	if devmem.Get() == nil || c.Provider == "shm" {
		// No device runtime, no device memory to register: FI_HMEM would
		// only cost (shm with it injects nothing). shm with FI_HMEM
		// registered CUDA memory on the H200 (libfabric 1.22 built with
		// CUDA) but its transfers of it never completed, so its device
		// memory is staged.
		return open(c, false, h)
	}
	if e, err := open(c, true, h); err == nil {
		return e, nil
	} else if !errors.Is(err, errNoHMEM) {
		logx.Trace(abi.SubsysNet, "NET/wasm: fabric %s: with FI_HMEM: %v; opening without (device memory is staged)", c.Provider, err)
	}
	return open(c, false, h)
}

var errNoHMEM = errors.New("no FI_HMEM")

func open(c Config, hmem bool, h Handler) (*Endpoint, error) {
	prov := c.Provider
	ep, err := fabric.OpenHMEM(prov, c.Domain, hmem)
	if err != nil {
		if hmem {
			return nil, fmt.Errorf("%w: %v", errNoHMEM, err)
		}
		return nil, err
	}
	e := &Endpoint{FI: ep, Info: ep.Info, Hash: ProviderHash(prov), h: h, slotSize: uintptr(fabric.ContextSize + c.MsgMax),
		quit: make(chan struct{}), done: make(chan struct{}), wake: make(chan struct{}, 1)}
	fail := func(err error) (*Endpoint, error) {
		ep.Close()
		return nil, err
	}
	if e.Info.CQDataSize < c.CQData {
		return fail(fmt.Errorf("provider %s offers %d bytes of CQ data; this transport needs %d", prov, e.Info.CQDataSize, c.CQData))
	}
	if e.Name, err = ep.Name(); err != nil {
		return fail(err)
	}
	if len(e.Name) > c.NameMax {
		return fail(fmt.Errorf("provider %s endpoint name is %d bytes; the listen handle holds %d", prov, len(e.Name), c.NameMax))
	}
	size := uint64(Slots+Recvs) * uint64(e.slotSize)
	e.mem = fabric.Alloc(size)
	e.free = make(chan uint32, Slots)
	for i := uint32(0); i < Slots; i++ {
		e.free <- i
	}
	if e.Info.MRMode&fabric.MRLocal != 0 {
		if e.memMR, err = ep.Register(e.mem, size, 1<<62); err != nil {
			fabric.Free(e.mem)
			return fail(err)
		}
	}
	e.comps = fabric.NewComps(64)
	e.canWait.Store(ep.CanWait())
	e.Regs = NewRegs(ep, e.Info.MRMode, nil)
	return e, nil
}

// SetSpin sets how long the progress goroutine keeps polling after
// traffic before it naps, and the spinner slots it competes for
// (host/spin); 0 turns spinning off.
func (e *Endpoint) SetSpin(d time.Duration, slots int32) {
	e.spinSlots.Store(slots)
	e.spinNs.Store(int64(d))
}

// Spin is what SetSpin set.
func (e *Endpoint) Spin() (time.Duration, int32) {
	return time.Duration(e.spinNs.Load()), e.spinSlots.Load()
}

// Take takes a free operation slot; false when all are in use.
func (e *Endpoint) Take() (uint32, bool) {
	select {
	case idx := <-e.free:
		return idx, true
	default:
		return 0, false
	}
}

// Put frees slot idx.
func (e *Endpoint) Put(idx uint32) { e.free <- idx }

// SlotArea is slot i's area: fabric.ContextSize bytes of operation
// context, then room for a message of Config.MsgMax bytes.
func (e *Endpoint) SlotArea(i uint32) unsafe.Pointer {
	return unsafe.Add(e.mem, uintptr(i)*e.slotSize)
}

// SlotMsg is slot i's message area, n bytes long.
func (e *Endpoint) SlotMsg(i uint32, n uint64) []byte {
	return unsafe.Slice((*byte)(unsafe.Add(e.SlotArea(i), fabric.ContextSize)), n)
}

// RecvArea is receive buffer i's area, laid out as a slot's.
func (e *Endpoint) RecvArea(i uint32) unsafe.Pointer {
	return unsafe.Add(e.mem, uintptr(Slots+i)*e.slotSize)
}

// MemDesc is the local descriptor of the slots' memory (nil where the
// provider needs none), for messages sent from a slot's area.
func (e *Endpoint) MemDesc() unsafe.Pointer { return e.memMR.Desc }

// SlotOf maps a completion's context back to an operation slot or, with
// recv, a receive buffer; ok is false when it names neither.
func (e *Endpoint) SlotOf(ctx unsafe.Pointer) (idx uint32, recv, ok bool) {
	d := uintptr(ctx) - uintptr(e.mem)
	if uintptr(ctx) < uintptr(e.mem) || d >= (Slots+Recvs)*e.slotSize || d%e.slotSize != 0 {
		return 0, false, false
	}
	i := uint32(d / e.slotSize)
	if i >= Slots {
		return i - Slots, true, true
	}
	return i, false, true
}

func (e *Endpoint) postRecv(i uint32) error {
	a := e.RecvArea(i)
	return e.FI.Recv(unsafe.Add(a, fabric.ContextSize), uint64(e.slotSize)-fabric.ContextSize, e.memMR.Desc, a)
}

// Repost posts receive buffer i again, once its message was handled.
func (e *Endpoint) Repost(i uint32) {
	for {
		err := e.postRecv(i)
		if err != fabric.ErrAgain {
			if err != nil {
				logx.Warn(abi.SubsysNet, "NET/wasm: fabric: repost receive: %v", err)
			}
			return
		}
		e.FI.Progress(e.comps) // nothing reaped; lets the provider progress
	}
}

// Start posts the receive buffers and launches the progress goroutine.
func (e *Endpoint) Start() error {
	for i := uint32(0); i < Recvs; i++ {
		if err := e.postRecv(i); err != nil {
			return err
		}
	}
	e.started = true
	go e.progress()
	return nil
}

// LockPoll takes the poll lock: no completion is handled until UnlockPoll.
func (e *Endpoint) LockPoll() { e.pollMu.Lock() }

// UnlockPoll releases the poll lock.
func (e *Endpoint) UnlockPoll() { e.pollMu.Unlock() }

// CanWait reports whether the progress goroutine may sleep on the CQ's
// wait fd (the provider honours one).
func (e *Endpoint) CanWait() bool { return e.canWait.Load() }

// InWait reports whether the progress goroutine sleeps on the wait fd now.
func (e *Endpoint) InWait() bool { return e.inWait.Load() }

// CallerPoll reaps completions from a caller's thread (rmaProgress). It
// does not wait when another thread is polling.
func (e *Endpoint) CallerPoll() {
	e.callerAt.Store(now())
	e.Poll()
}

// CallerLeft is how much of d since the last caller's poll is left (0:
// none).
func (e *Endpoint) CallerLeft(d time.Duration) time.Duration {
	at := e.callerAt.Load()
	if at == 0 {
		return 0
	}
	return max(d-time.Duration(now()-at), 0)
}

// Close stops the progress goroutine and reaps what is left; Release
// then frees the endpoint.
func (e *Endpoint) Close() {
	select {
	case <-e.quit:
		return
	default:
	}
	close(e.quit)
	if e.started {
		if e.canWait.Load() {
			e.FI.Signal()
		}
		<-e.done
	}
	// Reap what is left (peers' departures among it): closing an rxm
	// endpoint with such events unread crashed libfabric 1.17.
	for i := 0; i < 100; i++ {
		e.Poll()
	}
	e.pollMu.Lock()
	e.gone = true
	e.pollMu.Unlock()
}

// Release deregisters what Regs holds and frees the endpoint and its
// memory, after Close.
func (e *Endpoint) Release() {
	e.Regs.close()
	e.FI.Deregister(e.memMR)
	e.FI.Close()
	fabric.Free(e.mem)
	e.comps.Free() // no poll runs: gone is set
}

// progress reaps completions until close. An empty poll costs a system
// call on some providers (tcp;ofi_rxm), so an idle endpoint backs off to
// sleeping; with operations in flight it only yields.
func (e *Endpoint) progress() {
	defer close(e.done)
	empty := 0
	// Not a time.Timer: on an idle process a sub-millisecond timer ends
	// after about a millisecond (host/nap).
	nap := nap.New()
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
		if d := e.CallerLeft(CallerGrace); d > 0 {
			// A caller drives the CQ (CallerPoll); look again when its
			// grace ends. Not sleeping as far as Nudge knows: a submit
			// needs no wake-up (a system call and a thread switch in
			// the caller's path) while the caller polls anyway.
			if spinning {
				spin.Release()
				spinning = false
			}
			nap.Start(d)
			select {
			case <-nap.C():
			case <-e.quit:
			}
			continue
		}
		n, polled := e.Poll()
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
		if e.h.Busy() && empty < 2000 {
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
		if e.canWait.Load() && (empty > napsBeforeWait || !e.h.Busy()) {
			// Idle for a while, or with nothing of ours in flight: sleep
			// on the CQ's wait fd (the peers' writes and messages wake
			// it, so does a submit through Signal), unless a submit
			// slipped in after Busy() above. A target does not nap: with
			// manual progress a peer's large write moves only while we
			// poll, and the fd wakes us as soon as its bytes come, where
			// a nap would stall them (fi_trywait returns at once while
			// data is pending). Our own operations in flight nap first:
			// their completions come in bursts, and a nap's poll costs
			// less than a wake-up from poll().
			e.sleeping.Store(true)
			if !e.h.Busy() {
				e.inWait.Store(true)
				err := e.FI.Wait(int(waitMs.Load()))
				e.inWait.Store(false)
				if err != nil {
					e.canWait.Store(false)
					logx.Trace(abi.SubsysNet, "NET/wasm: fabric: %s cannot wait on its CQ (%v); polling with naps", e.Info.Provider, err)
				}
			}
			e.sleeping.Store(false)
			continue
		}
		// Idle: nap 10 µs, doubling up to 200 µs, unless a submit wakes
		// us. The peers' writes cannot wake a nap: they wait for the next
		// poll.
		nap.Start(time.Duration(10<<min(max(empty-2000, 0)/16, 4)) * time.Microsecond)
		e.sleeping.Store(true)
		select {
		case <-nap.C():
		case <-e.wake:
			empty = 0
		case <-e.quit:
		}
		nap.Stop()
		e.sleeping.Store(false)
	}
}

// Nudge wakes the progress goroutine when it naps: an operation just
// posted needs polling to progress (manual progress) and to complete.
func (e *Endpoint) Nudge() {
	if e.sleeping.Load() {
		if e.canWait.Load() {
			e.FI.Signal()
		}
		select {
		case e.wake <- struct{}{}:
		default:
		}
	}
}

// Poll reaps one batch of completions through the Handler. One thread
// polls at a time (callers' threads, or the progress goroutine); ok is
// false when another was.
func (e *Endpoint) Poll() (n int, ok bool) {
	if !e.pollMu.TryLock() {
		return 0, false
	}
	defer e.pollMu.Unlock()
	if e.gone {
		return 0, true
	}
	e.h.BeforePoll()
	n, err := e.FI.Poll(e.comps)
	if err != nil {
		logx.Warn(abi.SubsysNet, "NET/wasm: fabric: %v", err)
	}
	for i := 0; i < n; i++ {
		e.h.Completion(e.comps.At(i))
	}
	e.h.AfterPoll()
	return n, true
}
