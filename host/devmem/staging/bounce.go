package staging

import (
	"errors"
	"fmt"
	"io"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/profile"
)

// Asynchronous small copies (SPEC.md §4, "Asynchronous small copies"). A
// device payload of at most the bounce size (NCCL_RMA_WASM_ASYNC_COPY_KB)
// takes no synchronous copy:
//   - the target reads it from the socket into a pinned bounce slot of the
//     registration's context, queues the copy to the device on the
//     context's stream (where the signal write that follows it also goes)
//     and moves on; the slot is reused once an event recorded after the
//     copy has passed (LandOnDevice);
//   - a sender gathers the small device payloads of one batch into slots,
//     each copy queued on the stream, and waits once for them all before
//     the one writev that sends them (Gather).
//
// Synchronous device copies keep working beside them. Each first waits for
// the asynchronous copies queued before it on any context (fence), so that
// a later large put, a get served from device memory or a read-modify-write
// of a signal never overtakes an earlier put's copy; a signal written on a
// context's stream first waits for the other contexts' queued copies, so
// that it still follows every payload of the operations before it.
//
// The slots of a context are made once, with its stream, when memory of it
// is first registered (Prewarm): a pinned allocation on the data path can
// wait for the application's running kernel.

const (
	bounceSlots = 16 // per context
	maxQueues   = 64 // contexts with bounce slots (as many as the CUDA glue's streams)
	// gatherSlots bounds the slots one sender's batch holds at once, so
	// that a sender blocked in writev cannot take every slot of a context
	// from the targets (who fall back to synchronous copies meanwhile).
	gatherSlots = 4
	// gatherSpins is how many looks at a gathered copy's event the sender
	// takes, yielding between them, before it blocks on the stream.
	gatherSpins = 200
)

// bounceSize is the largest payload copied asynchronously, and the size of
// a slot (0: off).
var bounceSize atomic.Uint64

// SetAsyncCopy sets the largest device payload copied asynchronously, in
// bytes, rounded up to 4 KiB (0 turns asynchronous copies off); host/plugin
// sets it from NCCL_RMA_WASM_ASYNC_COPY_KB at init. Contexts prewarmed
// before keep their slots.
func SetAsyncCopy(n uint64) { bounceSize.Store((n + 4095) &^ 4095) }

// ctxQueue is a context's bounce slots. A slot is free, held (a reader is
// filling it from the socket, or a sender's gathered copies are in it) or
// queued (a copy to the device was queued from it and the event recorded
// after that copy has not been seen to pass). Queued slots are kept in
// the order they were queued, which is the order their events pass in.
type ctxQueue struct {
	ctx  uintptr
	d    devmem.Device
	st   devmem.Streams
	size uint64
	mem  unsafe.Pointer

	mu     sync.Mutex
	dead   bool
	ipc    uintptr // CopyMappedAsync's event, while it is recorded (under mu)
	free   uint32  // bit i: slot i is free
	held   uint32  // bit i: slot i is held
	ev     [bounceSlots]uintptr
	order  [bounceSlots]uint8 // queued slots, oldest first from head
	head   int
	nq     int
	queued atomic.Int32       // nq, read without the lock by fences
	pushed [bounceSlots]int64 // when each queued slot's copy was queued (since stuckEpoch)
	warned bool               // the oldest queued copy was reported stuck
	// owed[i]: the request a queued copy of a rank to itself completes
	// once it executed (CopySelfAsync); waiting counts them, read without
	// the lock by Reap.
	owed    [bounceSlots]owed
	waiting atomic.Int32
}

// Completer finishes the request named by tag (dataplane's Owner).
type Completer interface {
	Complete(tag uint64, status abi.Result)
}

// owed is a request a queued copy completes.
type owed struct {
	c   Completer
	tag uint64
}

var queues struct {
	mu sync.Mutex // makes and drops queues
	n  atomic.Int32
	q  [maxQueues]atomic.Pointer[ctxQueue]
}

var asyncSaid, asyncFailSaid atomic.Bool

// prewarmQueue gives context ctx its bounce slots, once, where the device
// queues copies and events on the context's stream and asynchronous
// copies are on.
func prewarmQueue(d devmem.Device, ctx uintptr) {
	size := bounceSize.Load()
	st, ok := d.(devmem.Streams)
	if size == 0 || !ok || st.Caps(ctx)&devmem.CapAsync == 0 || queueOf(d, ctx) != nil {
		return
	}
	queues.mu.Lock()
	defer queues.mu.Unlock()
	n := int(queues.n.Load())
	if queueOf(d, ctx) != nil {
		return
	}
	if n == maxQueues {
		return
	}
	q := &ctxQueue{ctx: ctx, d: d, st: st, size: size, free: 1<<bounceSlots - 1}
	var err error
	if q.mem, err = d.AllocPinned(ctx, size*bounceSlots); err == nil {
		// The events are made now, recorded on the idle stream: creating
		// one on the data path is a driver call that could wait.
		for i := range q.ev {
			if err = st.Record(ctx, &q.ev[i]); err != nil {
				break
			}
		}
		if err != nil {
			q.release()
		}
	}
	if err != nil {
		if !asyncFailSaid.Swap(true) {
			logx.Info(abi.SubsysNet, "NET/wasm: no bounce slots for asynchronous device copies (%v); small device payloads take synchronous copies", err)
		}
		return
	}
	queues.q[n].Store(q)
	queues.n.Store(int32(n + 1))
	stuckOnce.Do(func() { go watchQueues() })
	if !asyncSaid.Swap(true) {
		logx.Info(abi.SubsysNet, "NET/wasm: device payloads up to %d bytes are copied asynchronously, in order with their signals on the context's stream (%d pinned slots per context)", size, bounceSlots)
	}
}

// queueOf returns ctx's bounce slots on device d, or nil.
func queueOf(d devmem.Device, ctx uintptr) *ctxQueue {
	n := int(queues.n.Load())
	for i := 0; i < n; i++ {
		if q := queues.q[i].Load(); q != nil && q.ctx == ctx && q.d == d {
			return q
		}
	}
	return nil
}

// slot is the host memory of slot i.
func (q *ctxQueue) slot(i int) unsafe.Pointer { return unsafe.Add(q.mem, uint64(i)*q.size) }

// take holds a slot: a free one, else the oldest queued one once its copy
// executed (waiting for the stream when it has not). -1 (and no error):
// every slot is held, or the queue was released.
func (q *ctxQueue) take() (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return -1, nil
	}
	if q.free == 0 && q.nq > 0 {
		ok, err := q.st.Passed(q.ctx, q.ev[q.order[q.head]])
		if err != nil {
			return -1, fmt.Errorf("asynchronous copy to device: %w", err)
		}
		if ok {
			q.popLocked()
		} else if err := q.drainLocked(); err != nil {
			return -1, err
		}
	}
	if q.free == 0 {
		return -1, nil
	}
	i := bits.TrailingZeros32(q.free)
	q.free &^= 1 << i
	q.held |= 1 << i
	return i, nil
}

// put gives held slot i back.
func (q *ctxQueue) put(i int) {
	q.mu.Lock()
	q.held &^= 1 << i
	q.free |= 1 << i
	q.mu.Unlock()
}

// push queues the copy of n bytes from held slot i to device address dst,
// then the slot's event; the slot is queued until the event passed.
func (q *ctxQueue) push(i int, dst uintptr, n uint64) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.held &^= 1 << i
	if err := q.st.HtoDAsync(q.ctx, dst, q.slot(i), n); err != nil {
		q.free |= 1 << i
		return fmt.Errorf("asynchronous copy of %d bytes to device: %w", n, err)
	}
	return q.watchLocked(i, n)
}

// watchLocked records slot i's event after the copy of n bytes just
// queued from it and queues the slot until the event passed; q.mu held.
func (q *ctxQueue) watchLocked(i int, n uint64) error {
	if err := q.st.Record(q.ctx, &q.ev[i]); err != nil {
		// The copy is queued and cannot be watched: the slot waits for
		// the stream before it is reused.
		err = fmt.Errorf("asynchronous copy of %d bytes to device: %w", n, err)
		if e := q.st.Sync(q.ctx); e != nil {
			q.dead = true // the slot's memory may still be read: never reuse it
			return err
		}
		q.free |= 1 << i
		return err
	}
	q.queueLocked(i)
	return nil
}

// queueLocked appends slot i, whose copy and event were just queued, to
// the queued slots; q.mu held.
func (q *ctxQueue) queueLocked(i int) {
	q.order[(q.head+q.nq)%bounceSlots] = uint8(i)
	q.pushed[i] = int64(time.Since(stuckEpoch))
	q.nq++
	q.queued.Store(int32(q.nq))
}

// drainLocked waits for the stream and frees every queued slot; q.mu held.
func (q *ctxQueue) drainLocked() error {
	if err := q.st.Sync(q.ctx); err != nil {
		err = fmt.Errorf("wait for asynchronous device copies: %w", err)
		q.failOwedLocked(err)
		return err
	}
	q.settledLocked()
	return nil
}

// settledLocked frees every queued slot, whose copies have executed; q.mu
// held.
func (q *ctxQueue) settledLocked() {
	for q.nq > 0 {
		q.popLocked()
	}
}

// popLocked frees the oldest queued slot, whose copy executed, and
// completes the request it owes; q.mu held.
func (q *ctxQueue) popLocked() {
	i := q.order[q.head]
	if profile.On() {
		profile.CopyReaped.Add(int64(time.Since(stuckEpoch)) - q.pushed[i])
	}
	q.free |= 1 << i
	q.head = (q.head + 1) % bounceSlots
	q.nq--
	q.queued.Store(int32(q.nq))
	if o := q.owed[i]; o.c != nil {
		q.owed[i] = owed{}
		q.waiting.Add(-1)
		o.c.Complete(o.tag, abi.Success)
	}
}

// failOwedLocked fails every request a queued copy owes: the device
// failed, and they would otherwise never complete; q.mu held.
func (q *ctxQueue) failOwedLocked(err error) {
	failed := 0
	for i := range q.owed {
		if o := q.owed[i]; o.c != nil {
			q.owed[i] = owed{}
			q.waiting.Add(-1)
			o.c.Complete(o.tag, abi.RemoteError)
			failed++
		}
	}
	if failed > 0 {
		logx.Warn(abi.SubsysNet, "NET/wasm: %d operation(s) of a rank to itself, copied on the device (context %#x), failed: %v", failed, q.ctx, err)
	}
}

// settle returns once every copy queued from q's slots so far executed:
// at once when the newest one's event passed, else after the stream.
func (q *ctxQueue) settle() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.nq == 0 {
		return nil
	}
	newest := q.order[(q.head+q.nq-1)%bounceSlots]
	ok, err := q.st.Passed(q.ctx, q.ev[newest])
	if err != nil {
		return fmt.Errorf("asynchronous copy to device: %w", err)
	}
	if !ok {
		return q.drainLocked()
	}
	q.settledLocked()
	return nil
}

// release frees the slots' memory and events, unless a slot is held
// (a sender or reader still using it: the memory is left, not freed).
func (q *ctxQueue) release() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.dead = true
	if q.held != 0 || q.mem == nil {
		return
	}
	for i := range q.ev {
		q.st.FreeEvent(q.ctx, q.ev[i])
		q.ev[i] = 0
	}
	q.d.FreePinned(q.mem)
	q.mem = nil
}

// selfAsync: CopySelfAsync may queue (NCCL_RMA_WASM_SELF_ASYNC).
var selfAsync atomic.Bool

func init() { selfAsync.Store(true) }

// SetSelfAsync turns the asynchronous copies of CopySelfAsync on or off;
// host/plugin sets it from NCCL_RMA_WASM_SELF_ASYNC at init.
func SetSelfAsync(on bool) { selfAsync.Store(on) }

// CopySelfAsync queues the copy of n bytes from device address src to
// dst, both of context ctx, on ctx's stream (an operation of a rank to
// itself) and returns: the calling thread, NCCL's proxy, does not wait for
// the device. c.Complete(tag, ...) is called once the copy executed (Reap,
// a fence, or a slot's reuse sees it); a signal queued on the stream after
// it, or applied after a fence, follows it. false (and no error): copy
// synchronously (asynchronous copies off, no spare slot, a runtime
// without such copies).
func CopySelfAsync(ctx, dst, src uintptr, n uint64, c Completer, tag uint64) (bool, error) {
	if !selfAsync.Load() {
		return false, nil
	}
	ok, _, err := copyQueued(ctx, dst, src, n, c, tag, 0, 0, 0, 0)
	return ok, err
}

// AgentRuns reports whether ctx's device runs a device agent in it now
// (host/devmem/cuda, NCCL_RMA_WASM_DEVICE_AGENT): its small copies and the
// events that watch them cost no driver submission, while an interprocess
// event recorded after its work costs two (a stream wait for the agent and
// the record) and the target's wait a third.
func AgentRuns(ctx uintptr) bool {
	a, ok := devmem.Get().(interface{ AgentRuns(ctx uintptr) bool })
	return ok && ctx != 0 && a.AgentRuns(ctx)
}

// AgentWanted reports whether the process's device asks for device agents
// (NCCL_RMA_WASM_DEVICE_AGENT 1, or auto with MPS running); false without
// a device that has them.
func AgentWanted() bool {
	a, ok := devmem.Get().(interface{ AgentWanted() bool })
	return ok && a.AgentWanted()
}

// CopyMappedAsync is CopySelfAsync for a put into a peer's device memory
// mapped into this process (SPEC.md §4, "Device windows mapped"), of at
// most a bounce slot: after the copy it also records ev, an interprocess
// event the target's stream waits for before it applies the signal, so
// that neither host waits for the copy. c.Complete(tag, ...) once the copy
// executed.
func CopyMappedAsync(ctx, dst, src uintptr, n uint64, c Completer, tag uint64, ev uintptr) (bool, error) {
	if n > bounceSize.Load() || ev == 0 {
		return false, nil
	}
	ok, _, err := copyQueued(ctx, dst, src, n, c, tag, ev, 0, 0, 0)
	return ok, err
}

// CopyMappedWrite is CopyMappedAsync where ctx's device agent copies: one
// agent command copies (n 0: nothing), then writes v to the device word w
// (a peer's inbox entry, host/devmem/inbox), and c.Complete(tag, ...) once
// it executed; no event. false (and no error): no agent in ctx, more than a bounce slot,
// no free slot.
func CopyMappedWrite(ctx, dst, src uintptr, n uint64, w uintptr, v uint64, c Completer, tag uint64) (bool, error) {
	if n > bounceSize.Load() || w == 0 || !AgentRuns(ctx) {
		return false, nil
	}
	ok, _, err := copyQueued(ctx, dst, src, n, c, tag, 0, 0, w, v)
	return ok, err
}

// AgentWrite queues, as ctx's device agent's command after the work
// queued on the device so far, the write of v to the device word w (a
// peer's inbox entry for a signal alone, host/devmem/inbox): nothing waits
// for it here. false (and no error): no agent in ctx.
func AgentWrite(ctx, w uintptr, v uint64) (bool, error) {
	return writeAfter(ctx, w, func(d devmem.Device) (bool, error) {
		if ib, ok := d.(devmem.Inboxer); ok {
			return ib.CopyWrite(ctx, 0, 0, 0, w, v)
		}
		return false, nil
	})
}

// WriteIdle writes v to the host word w (a peer's inbox entry in shared
// host memory, a signal alone's) from this thread when everything queued
// on the device before it executed: the asynchronous copies of other
// contexts settled first, as for AgentWrite, and ctx's agent and stream
// with nothing left to run. No agent command, so no device round trip
// before the peer's agent sees it. false (and no error): work is still
// queued in ctx, or no agent runs there; the caller queues the write
// (AgentWrite).
func WriteIdle(ctx, w uintptr, v uint64) (bool, error) {
	return writeAfter(ctx, w, func(d devmem.Device) (bool, error) {
		iw, ok := d.(devmem.IdleWriter)
		return ok && iw.WriteIdle(ctx, w, v), nil
	})
}

// writeAfter settles the asynchronous copies of contexts other than ctx
// and then writes w as write does; false (and no error): no word, or no
// agent in ctx.
func writeAfter(ctx, w uintptr, write func(devmem.Device) (bool, error)) (bool, error) {
	d := devmem.Get()
	if d == nil || w == 0 || !AgentRuns(ctx) {
		return false, nil
	}
	if err := fence(d, ctx); err != nil {
		return false, err
	}
	return write(d)
}

// copyQueued queues the copy, then records ipc (when not 0), then a
// slot's event that completes tag. With mark (not 0) the copy is a device
// agent's command that then writes its number, returned, to the host word
// mark (CopyMappedMark); with w (not 0), one that then writes wv to the
// device word w (CopyMappedWrite).
func copyQueued(ctx, dst, src uintptr, n uint64, c Completer, tag uint64, ipc, mark, w uintptr, wv uint64) (bool, uint64, error) {
	if n == 0 && w == 0 {
		return false, 0, nil // (an inbox entry's write may come alone)
	}
	if mark != 0 {
		profile.Mark(profile.PtQueue)
	}
	ac, q, err := queueFor(ctx)
	if q == nil {
		return false, 0, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	// Half the slots stay for the landings of other ranks' puts.
	if q.dead || bits.OnesCount32(q.free) <= bounceSlots/2 {
		return false, 0, nil
	}
	i := bits.TrailingZeros32(q.free)
	var v uint64
	if mark != 0 {
		cm, ok := q.d.(devmem.CopyMarker)
		if !ok {
			return false, 0, nil
		}
		if v, ok, err = cm.CopyMark(ctx, dst, src, n, mark); !ok {
			if err != nil {
				err = fmt.Errorf("marked copy of %d bytes into a mapped window: %w", n, err)
			}
			return false, 0, err
		}
		profile.Mark(profile.PtCopy)
	} else if w != 0 {
		ib, ok := q.d.(devmem.Inboxer)
		if !ok {
			return false, 0, nil
		}
		if ok, err = ib.CopyWrite(ctx, dst, src, n, w, wv); !ok {
			if err != nil {
				err = fmt.Errorf("copy of %d bytes into a mapped window and its inbox entry: %w", n, err)
			}
			return false, 0, err
		}
	} else if ok, err := queueDtoD(ac, ctx, dst, src, n); !ok {
		return false, 0, err
	}
	if ipc != 0 {
		// Recorded through a field of q (held under q.mu): a pointer to
		// the parameter would move it to the heap on every call.
		q.ipc = ipc
		if err := q.st.Record(q.ctx, &q.ipc); err != nil {
			// The copy is queued and the target cannot wait for it:
			// the caller copies again and waits (the same bytes).
			return false, 0, fmt.Errorf("record the event of a mapped copy: %w", err)
		}
	}
	if err := q.st.Record(q.ctx, &q.ev[i]); err != nil {
		// Queued and not watchable: wait for it here.
		if err := q.drainLocked(); err != nil {
			return false, 0, err
		}
		c.Complete(tag, abi.Success)
		return true, v, nil
	}
	q.free &^= 1 << i
	q.owed[i] = owed{c: c, tag: tag}
	q.waiting.Add(1)
	q.queueLocked(i)
	return true, v, nil
}

// dtodQueue returns what a queued device-to-device copy of n bytes in ctx
// needs, the runtime's copier and ctx's queue, once the copies that other
// contexts queued before it executed, as a synchronous copy would wait for
// them (a later put to the same bytes must not be overtaken; ctx's own are
// ahead of it on its stream). A nil queue (and no error): copy
// synchronously (no such copies, asynchronous copies off, no stream).
func dtodQueue(ctx uintptr, n uint64) (devmem.AsyncDeviceCopier, *ctxQueue, error) {
	if n == 0 {
		return nil, nil, nil
	}
	return queueFor(ctx)
}

// queueFor is dtodQueue whatever the size.
func queueFor(ctx uintptr) (devmem.AsyncDeviceCopier, *ctxQueue, error) {
	d := devmem.Get()
	ac, ok := d.(devmem.AsyncDeviceCopier)
	if !ok || bounceSize.Load() == 0 {
		return nil, nil, nil
	}
	q := queueOf(d, ctx)
	if q == nil {
		return nil, nil, nil
	}
	if err := fence(d, ctx); err != nil {
		return nil, nil, err
	}
	return ac, q, nil
}

// queueDtoD queues the copy on ctx's stream; false (and no error): the
// runtime has no such copy.
func queueDtoD(ac devmem.AsyncDeviceCopier, ctx, dst, src uintptr, n uint64) (bool, error) {
	if err := ac.DtoDAsync(ctx, dst, src, n); err != nil {
		if errors.Is(err, devmem.ErrUnsupported) {
			return false, nil
		}
		return false, fmt.Errorf("asynchronous copy of %d bytes on the device: %w", n, err)
	}
	return true, nil
}

// Reap completes the requests owed by queued copies that executed
// (CopySelfAsync), without waiting for any: test() and rmaProgress call
// it. A load per context when none is owed.
func Reap() {
	n := int(queues.n.Load())
	for i := 0; i < n; i++ {
		if q := queues.q[i].Load(); q != nil && q.waiting.Load() > 0 {
			q.reap()
		}
	}
}

func (q *ctxQueue) reap() {
	if !q.mu.TryLock() {
		return // another thread settles it
	}
	defer q.mu.Unlock()
	for q.nq > 0 {
		ok, err := q.st.Passed(q.ctx, q.ev[q.order[q.head]])
		if err != nil {
			q.failOwedLocked(fmt.Errorf("asynchronous device copy: %w", err))
			return
		}
		if !ok {
			return
		}
		q.popLocked()
	}
}

// fence returns once every asynchronous copy queued on device d so far
// executed, on every context but except (0: every context): what a
// synchronous copy, or a signal write on except's stream, must follow.
// Nothing queued: a load per context.
func fence(d devmem.Device, except uintptr) error {
	n := int(queues.n.Load())
	for i := 0; i < n; i++ {
		q := queues.q[i].Load()
		if q == nil || q.ctx == except || q.queued.Load() == 0 || q.d != d {
			continue
		}
		if err := q.settle(); err != nil {
			return err
		}
	}
	return nil
}

// Fence returns once every asynchronous device copy queued so far
// executed: what a host-visible sign of a payload's arrival (a signal word
// in host memory) must follow. Nothing queued: a load per context.
func Fence() error {
	d := devmem.Get()
	if d == nil || queues.n.Load() == 0 {
		return nil
	}
	return fence(d, 0)
}

// The stuck-queue watch: the target no longer waits for its small copies,
// so a copy held on the device (work the application queued ahead of it on
// a shared hardware queue: SPEC.md §4, "Copies queued behind the
// application's kernels") would hang the operation with nothing in the
// log. Every second a goroutine looks at each context's oldest
// queued copy and WARNs once when it has waited stuckAfter and not
// executed.

// stuckAfter is how long a queued copy waits before its WARN, in
// nanoseconds (tests shorten it).
var stuckAfter atomic.Int64

func init() { stuckAfter.Store(int64(5 * time.Second)) }

var (
	stuckOnce  sync.Once
	stuckEpoch = time.Now()
)

func watchQueues() {
	for range time.Tick(time.Second) {
		watchMarkWaits()
		n := int(queues.n.Load())
		for i := 0; i < n; i++ {
			if q := queues.q[i].Load(); q != nil {
				q.checkStuck()
				if q.waiting.Load() > 0 {
					q.reap() // for callers that stopped calling test()
				}
			}
		}
	}
}

// checkStuck WARNs once per stuck episode of q's oldest queued copy.
func (q *ctxQueue) checkStuck() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.nq == 0 || q.dead {
		q.warned = false
		return
	}
	oldest := q.order[q.head]
	age := time.Duration(int64(time.Since(stuckEpoch)) - q.pushed[oldest])
	if age < time.Duration(stuckAfter.Load()) {
		q.warned = false
		return
	}
	if ok, err := q.st.Passed(q.ctx, q.ev[oldest]); err != nil || ok || q.warned {
		return // executed (its slot is reclaimed at the next use), failed (reported there), or said
	}
	q.warned = true
	logx.Warn(abi.SubsysNet, "NET/wasm: an asynchronous copy of a put's payload to device memory (context %#x) has waited %v on the device and not executed, and so has every signal queued behind it: work the application queued on its context ahead of it (kernels launched back to back, the next waiting for the one that waits for this operation) can hold the plugin's copies. Copies of cuMem-mapped memory (ncclMemAlloc) run in a context of the plugin's own unless NCCL_RMA_WASM_COPY_CONTEXT=0; other device memory (cudaMalloc) shares the application's: allocate windows and signals with ncclMemAlloc, or set CUDA_DEVICE_MAX_CONNECTIONS=32 before CUDA starts (SPEC.md §4)",
		q.ctx, age.Round(time.Second))
}

// WriteQueues writes each context's bounce slots (the stall report): how
// many are free, held and queued, and whether the oldest queued copy has
// executed; a copy that never does (held behind other work on the
// device) shows as "not executed".
func WriteQueues(w io.Writer) {
	n := int(queues.n.Load())
	fmt.Fprintf(w, "=== NET/wasm asynchronous device copies: %d context(s) with bounce slots of %d bytes\n", n, bounceSize.Load())
	for i := 0; i < n; i++ {
		q := queues.q[i].Load()
		if q == nil {
			continue
		}
		q.mu.Lock()
		state := "none queued"
		if q.nq > 0 {
			ok, err := q.st.Passed(q.ctx, q.ev[q.order[q.head]])
			switch {
			case err != nil:
				state = fmt.Sprintf("oldest queued copy failed: %v", err)
			case ok:
				state = "oldest queued copy executed"
			default:
				state = "oldest queued copy not executed"
			}
		}
		fmt.Fprintf(w, "  context %#x: %d free, %d held, %d queued; %s\n", q.ctx,
			bits.OnesCount32(q.free), bits.OnesCount32(q.held), q.nq, state)
		q.mu.Unlock()
	}
}

// releaseQueues waits for every context's queued copies and frees the
// slots (plugin finalize).
func releaseQueues() {
	queues.mu.Lock()
	defer queues.mu.Unlock()
	n := int(queues.n.Load())
	for i := 0; i < n; i++ {
		if q := queues.q[i].Swap(nil); q != nil {
			q.mu.Lock()
			if q.nq > 0 {
				q.drainLocked() // a failed device: the memory goes anyway
			}
			q.mu.Unlock()
			q.release()
		}
	}
	queues.n.Store(0)
}

// settleQueue waits for the copies queued from ctx's slots and frees them
// (Quiesce: the memory may be freed next).
func settleQueue(d devmem.Device, ctx uintptr) error {
	if q := queueOf(d, ctx); q != nil {
		return q.settle()
	}
	return nil
}

// landAsync reads n bytes from r into a slot of ctx and queues their copy
// to device address dst. false (and no error): no slot could be had, use
// a synchronous copy.
func landAsync(d devmem.Device, r io.Reader, ctx, dst uintptr, n uint64) (bool, error) {
	q, i, read, err := readSlot(d, r, ctx, n)
	if q == nil {
		return read, err
	}
	return true, q.push(i, dst, n)
}

// readSlot reads n bytes from r into slot i of ctx's bounce slots and
// returns them held. q nil: nothing held; read says whether r was read
// (a read error gives the slot back), err what failed.
func readSlot(d devmem.Device, r io.Reader, ctx uintptr, n uint64) (q *ctxQueue, i int, read bool, err error) {
	if q = queueOf(d, ctx); q == nil || n > q.size {
		return nil, 0, false, nil
	}
	if i, err = q.take(); i < 0 {
		return nil, 0, false, err
	}
	if _, err := io.ReadFull(r, unsafe.Slice((*byte)(q.slot(i)), n)); err != nil {
		q.put(i)
		return nil, 0, true, err
	}
	return q, i, true, nil
}

// Gather collects the small device payloads of one sender's batch: Add
// queues each one's copy from the device into a bounce slot of its context
// (several payloads share a slot), Wait waits for them all before the
// bytes are written, and Done gives the slots back once they were. Its
// zero value is ready; a lane keeps one, so a batch allocates nothing.
type Gather struct {
	held   [gatherSlots]gathered
	n      int
	waited bool // Wait saw every gathered copy execute
}

type gathered struct {
	q      *ctxQueue
	i      int
	used   uint64
	copies bool // device-to-device copies were queued before the slot's event (AddCopy)
	rec    bool // the slot's event is recorded after its last copy (Ready)
}

// Add queues a copy of n bytes at device address src of context ctx and
// returns the host bytes that will hold them once Wait returned. nil (and
// no error): use the synchronous path (asynchronous copies off for ctx,
// payload too large, no slot to be had).
func (g *Gather) Add(ctx, src uintptr, n uint64) ([]byte, error) {
	d := devmem.Get()
	if d == nil || n == 0 || n > bounceSize.Load() {
		return nil, nil
	}
	q := queueOf(d, ctx)
	if q == nil || n > q.size {
		return nil, nil
	}
	h, err := g.hold(q, n)
	if h == nil {
		return nil, err
	}
	p := unsafe.Add(q.slot(h.i), h.used)
	if err := q.st.DtoHAsync(ctx, p, src, n); err != nil {
		return nil, fmt.Errorf("asynchronous copy of %d bytes from device: %w", n, err)
	}
	h.used = (h.used + n + 7) &^ 7 // the next payload starts aligned
	h.rec = false
	g.waited = false
	return unsafe.Slice((*byte)(p), n), nil
}

// AddCopy queues a copy of n bytes from device address src to device
// address dst (a peer's memory mapped into this process) on ctx's stream,
// as part of the batch: Wait waits for it with the rest, so the header
// that tells the target comes after the bytes are in its memory. A slot
// of ctx is held for its event only. false (and no error): copy
// synchronously (no stream, no slot, no such copy in the runtime, or more
// than a bounce slot's bytes, whose copy would hold up the landings and
// signal writes queued on the stream behind it).
func (g *Gather) AddCopy(ctx, dst, src uintptr, n uint64) (bool, error) {
	if n > bounceSize.Load() {
		return false, nil // a long copy would hold the context's stream
	}
	ac, q, err := dtodQueue(ctx, n)
	if q == nil {
		return false, err
	}
	h, err := g.hold(q, 0) // for its event only
	if h == nil {
		return false, err
	}
	if ok, err := queueDtoD(ac, ctx, dst, src, n); !ok {
		return false, err
	}
	h.copies = true
	h.rec = false
	g.waited = false
	return true, nil
}

// AddAdd queues an atomic add of v to the 8-byte word at device address
// dev (a peer's signal word mapped into this process) on ctx's device
// agent, after what the batch queued there (AddCopy), as part of the
// batch: Wait waits for it with the rest. false (and no error): ctx runs
// no agent, whose commands alone keep the add after the copies and reach
// a peer's memory with an atomic (the caller lets the target apply the
// signal instead).
func (g *Gather) AddAdd(ctx, dev uintptr, v uint64) (bool, error) {
	st, ok := devmem.Get().(devmem.Streams)
	if !ok || dev%8 != 0 {
		return false, nil
	}
	return g.AddAgent(ctx, func() (bool, error) {
		if err := st.AtomicAdd(ctx, dev, v); err != nil {
			return false, fmt.Errorf("device agent's add to a peer's signal word: %w", err)
		}
		return true, nil
	})
}

// AddAgent joins to the batch the agent command that queue queues on ctx
// (an add to a peer's signal word, a peer inbox entry: host/devmem/inbox),
// after what the batch queued there: Wait waits for it with the rest. false (and no error): ctx runs
// no agent, or queue queued nothing.
func (g *Gather) AddAgent(ctx uintptr, queue func() (bool, error)) (bool, error) {
	d := devmem.Get()
	if !AgentRuns(ctx) {
		return false, nil
	}
	q := queueOf(d, ctx)
	if q == nil {
		return false, nil
	}
	if err := fence(d, ctx); err != nil {
		return false, err
	}
	h, err := g.hold(q, 0) // for its event only
	if h == nil {
		return false, err
	}
	if ok, err := queue(); !ok || err != nil {
		return false, err
	}
	h.copies = true
	h.rec = false
	g.waited = false
	return true, nil
}

// hold returns the batch's slot of q with room for n more bytes: the last
// one taken, or a new one. nil: none to be had (the batch holds
// gatherSlots already, or q has none free), with the error of a failed
// device if that is why.
func (g *Gather) hold(q *ctxQueue, n uint64) (*gathered, error) {
	if g.n > 0 && g.held[g.n-1].q == q && g.held[g.n-1].used+n <= q.size {
		return &g.held[g.n-1], nil
	}
	if g.n == gatherSlots {
		return nil, nil
	}
	i, err := q.take()
	if i < 0 {
		return nil, err
	}
	g.held[g.n] = gathered{q: q, i: i}
	g.n++
	return &g.held[g.n-1], nil
}

// Pending reports whether copies were gathered and not yet given back.
func (g *Gather) Pending() bool { return g.n > 0 }

// Wait returns once every gathered copy executed: an event recorded after
// each slot's copies is watched, yielding between looks, and after a
// while the stream is waited for instead.
func (g *Gather) Wait() error {
	if profile.On() {
		defer profile.GatherWait.Since(profile.Now())
	}
	for k := 0; k < g.n; k++ {
		h := &g.held[k]
		q := h.q
		if h.used == 0 && !h.copies {
			continue
		}
		if err := h.record(); err != nil {
			// Without the event the stream itself is waited for.
			if err := q.st.Sync(q.ctx); err != nil {
				return fmt.Errorf("wait for asynchronous copies from device: %w", err)
			}
			continue
		}
		for spin := 0; ; spin++ {
			ok, err := q.st.Passed(q.ctx, q.ev[h.i])
			if err != nil {
				return fmt.Errorf("asynchronous copy from device: %w", err)
			}
			if ok {
				break
			}
			if spin == gatherSpins {
				if err := q.st.Sync(q.ctx); err != nil {
					return fmt.Errorf("wait for asynchronous copies from device: %w", err)
				}
				break
			}
			runtime.Gosched()
		}
	}
	g.waited = true
	return nil
}

// record records h's event after the slot's last copy, once (Wait and
// Ready both look at it).
func (h *gathered) record() error {
	if h.rec {
		return nil
	}
	if err := h.q.st.Record(h.q.ctx, &h.q.ev[h.i]); err != nil {
		return err
	}
	h.rec = true
	return nil
}

// Ready reports, without waiting, whether every gathered copy executed:
// it records each slot's event once, after its last copy, and looks at
// it. Not ready (or an event that cannot be recorded): Wait, later, waits
// or synchronizes the stream; an error is a copy's.
func (g *Gather) Ready() (bool, error) {
	for k := 0; k < g.n; k++ {
		h := &g.held[k]
		if h.used == 0 && !h.copies {
			continue
		}
		if h.record() != nil {
			return false, nil
		}
		if ok, err := h.q.st.Passed(h.q.ctx, h.q.ev[h.i]); err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

// Done gives the gathered slots back: their bytes were written (or the
// batch failed). After a failed batch, whose copies Wait did not see
// execute, the streams are waited for first, so that no slot is reused
// while the device still writes it.
func (g *Gather) Done() {
	for k := 0; k < g.n; k++ {
		h := &g.held[k]
		if !g.waited && (h.used > 0 || h.copies) {
			h.q.st.Sync(h.q.ctx) // a failing device fails the peer elsewhere
		}
		h.q.put(h.i)
		g.held[k] = gathered{}
	}
	g.n, g.waited = 0, false
}
