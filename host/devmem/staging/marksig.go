package staging

import (
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/profile"
)

// Signals that wait on the device for their mark
// (NCCL_RMA_WASM_INTRANODE_MARK_WAIT_DEVICE). A marked put+signal's header
// usually reaches the target a few microseconds before the sender's agent
// marks its copy; the target's host otherwise waits for the mark and only
// then hands the signal to its own agent, whose pickup then adds a bus
// round trip or two. With this on, the target hands the signal over at
// once as one agent command that first polls the peer's mark word itself
// (the peer's mark page, pinned here read-only when it is mapped, from our
// own page's context, the only one whose signals take this way), so the
// pickup overlaps the sender's copy and NCCL's proxy thread never waits.
//
// Order with everything else: the command takes a bounce slot of its
// context, its event the command's ticket, as a queued copy does; so every
// fence (a host signal word, a synchronous copy, a get served, a signal on
// another context's stream) waits for it, as it waits for copies queued
// before it, and signals of the same context follow it in the agent's
// order. A mark that never comes (the peer's process died) holds that
// agent for at most 30 s, after which the kernel skips the signal and
// counts it; the queue watch WARNs (watchMarkWaits).

var markWaitDevice atomic.Bool

// SetMarkWaitDevice turns the device's mark waits on or off (host/plugin,
// at init; peers' pages mapped before keep their state).
func SetMarkWaitDevice(on bool) { markWaitDevice.Store(on) }

// devicePins is the state of the peers' pages pinned for the device: ms
// holds those mapped before our own page was made (a peer may hand its
// page over first), which MarkPage pins, from our page's context, once it
// exists; rel is one pinned page of release words, one per pinned peer
// page (relUse), which the agent's wait also reads and the queue watch
// sets once that page's process is gone, so that a wait for a mark that
// will never come ends within a second instead of 30 s (releaseDead). The
// words are made with the first pin and freed at the last finalize.
var devicePins struct {
	sync.Mutex
	ms     []*PeerMarks
	rel    unsafe.Pointer // releaseWords pinned words
	relUse [releaseWords]bool
}

// pinnedPages lists the pinned pages for releaseDead. Its lock is never
// held across a driver call, which can wait for an agent that waits for
// the very release releaseDead would give (devicePins is, around pinning
// and unpinning).
var pinnedPages struct {
	sync.Mutex
	ms []*PeerMarks
}

// releaseWords is how many pages may be pinned at once (a 4 KiB page of
// words).
const releaseWords = 512

// pinForDevice pins m's page read-only for the device to read, from our
// own mark page's context, where the device waits for marks; without our
// page yet, once it is made (pinPending).
func (m *PeerMarks) pinForDevice() {
	if !markWaitDevice.Load() {
		return
	}
	devicePins.Lock()
	defer devicePins.Unlock()
	p := marks.page.Load()
	if p == nil {
		devicePins.ms = append(devicePins.ms, m)
		return
	}
	m.pinLocked(p.ctx)
}

// pinPending pins the pages mapped before our page (made from ctx)
// existed.
func pinPending(ctx uintptr) {
	devicePins.Lock()
	defer devicePins.Unlock()
	for _, m := range devicePins.ms {
		m.pinLocked(ctx)
	}
	devicePins.ms = nil
}

// pinLocked pins m from ctx; one INFO line when it cannot, and the host
// waits for this peer's marks. devicePins held.
func (m *PeerMarks) pinLocked(ctx uintptr) {
	mw, ok := devmem.Get().(devmem.MarkWaiter)
	if !ok || m.mem == nil {
		return
	}
	i := slices.Index(devicePins.relUse[:], false)
	if devicePins.rel == nil && i >= 0 {
		p, err := devmem.Get().AllocPinned(ctx, releaseWords*8)
		if err != nil {
			logx.Info(abi.SubsysNet, "NET/wasm: the device cannot wait for the peers' marks, so the host does: %v", err)
			return
		}
		clear(unsafe.Slice((*uint64)(p), releaseWords))
		devicePins.rel = p
	}
	if i < 0 {
		logx.Info(abi.SubsysNet, "NET/wasm: %d peers' mark pages are waited for on the device already; the host waits for those of pid %d", releaseWords, m.pid)
		return
	}
	if err := mw.HostRegisterReadOnly(ctx, unsafe.Pointer(&m.mem[0]), markPageSize); err != nil {
		logx.Info(abi.SubsysNet, "NET/wasm: the mark page of pid %d cannot be read by the device, so the host waits for its marks: %v", m.pid, err)
		return
	}
	devicePins.relUse[i] = true
	m.relIdx = i
	m.relw = (*atomic.Uint64)(unsafe.Add(devicePins.rel, i*8))
	m.relw.Store(0)
	m.rel.Store(uintptr(unsafe.Pointer(m.relw)))
	pinnedPages.Lock()
	pinnedPages.ms = append(pinnedPages.ms, m)
	pinnedPages.Unlock()
	m.pinCtx.Store(ctx)
}

// releaseDead sets the release word of each pinned page whose process is
// gone, once (the queue watch, each second): its agent will never mark,
// and the device's waits for it end, their signals skipped and counted.
// A page stays listed until its unpinning drained its agent, so the word
// it sets is still that page's.
func releaseDead() {
	pinnedPages.Lock()
	defer pinnedPages.Unlock()
	for _, m := range pinnedPages.ms {
		if m.released || unix.Kill(m.pid, 0) != unix.ESRCH {
			continue
		}
		m.released = true
		m.relw.Store(1)
		logx.Info(abi.SubsysNet, "NET/wasm: pid %d exited: the device agent no longer waits for its marks", m.pid)
	}
}

// freeReleaseWords frees the release words' page (the last finalize, every
// agent stopped and every page unpinned).
func freeReleaseWords() {
	devicePins.Lock()
	defer devicePins.Unlock()
	if devicePins.rel == nil || slices.Contains(devicePins.relUse[:], true) {
		return
	}
	if d := devmem.Get(); d != nil {
		d.FreePinned(devicePins.rel)
	}
	devicePins.rel = nil
}

// DeviceWaits reports whether our device agent may wait for m's marks
// (AddSignalAfterMark): the setting is on and the page is pinned here.
func (m *PeerMarks) DeviceWaits() bool { return markWaitDevice.Load() && m.pinCtx.Load() != 0 }

// DeviceWaitsIn reports whether it may for a signal of context ctx.
func (m *PeerMarks) DeviceWaitsIn(ctx uintptr) bool { return m.DeviceWaits() && ctx == m.pinCtx.Load() }

// unpinForDevice undoes pinForDevice before the page is unmapped.
func (m *PeerMarks) unpinForDevice() {
	devicePins.Lock()
	defer devicePins.Unlock()
	if i := slices.Index(devicePins.ms, m); i >= 0 {
		devicePins.ms = slices.Delete(devicePins.ms, i, i+1)
	}
	ctx := m.pinCtx.Swap(0)
	if ctx == 0 {
		return
	}
	// Unregistering pauses ctx's agent, which first runs every command
	// queued before (a wait for a dead peer's mark ends by releaseDead,
	// the page still listed): none reads the page or its release word
	// after.
	if hr, ok := devmem.Get().(devmem.HostRegisterer); ok {
		hr.HostUnregister(ctx, unsafe.Pointer(&m.mem[0]))
	}
	pinnedPages.Lock()
	if i := slices.Index(pinnedPages.ms, m); i >= 0 {
		pinnedPages.ms = slices.Delete(pinnedPages.ms, i, i+1)
	}
	pinnedPages.Unlock()
	m.rel.Store(0)
	devicePins.relUse[m.relIdx] = false
}

// AddSignalAfterMark is AddSignal for a put+signal whose payload the peer's
// agent copies and marks as word k reaching mv of its page pm: where that
// mark is not there yet and ctx's agent can wait for it, the signal is
// queued as one agent command that waits first, and true returned; false
// (and no error): the caller waits for the mark on the host and adds as
// before (no agent, no slot free, the page not pinned here, the mark
// already there, a word the agent does not update).
func AddSignalAfterMark(ctx, dev uintptr, v uint64, sh *Shadow, pm *PeerMarks, k int, mv uint64) (bool, error) {
	// Only in the context the page is pinned from: unpinning it pauses
	// that context's agent, which first runs every command queued before,
	// so no agent reads the page after it is gone.
	if !markWaitDevice.Load() || pm == nil || ctx == 0 || pm.pinCtx.Load() != ctx || k < 0 || k >= MarkWords || dev%8 != 0 || pm.Reached(k, mv) {
		return false, nil
	}
	d := devmem.Get()
	mw, ok := d.(devmem.MarkWaiter)
	st, _ := d.(devmem.Streams)
	if !ok || st == nil {
		return false, nil
	}
	if _, gdr := d.(devmem.WordAdder); gdr {
		return false, nil // GDRCopy's adds are the CPU's: the agent's would race them
	}
	mark := uintptr(unsafe.Pointer(&pm.mem[k*8]))
	// The payloads queued on other contexts before it land first, as for
	// any signal written on a stream, waited for before the stripe lock is
	// taken (queueFor's fence then finds them settled).
	if err := fence(d, ctx); err != nil {
		return false, err
	}
	if shadowWrites(st, ctx, sh) {
		w, err := sh.word(dev)
		if err != nil {
			return false, err
		}
		// Never folded into another writer's write, which would not wait
		// for this mark: under the stripe lock it adds and writes itself,
		// as a fused landing does; a writer waiting for the lock writes
		// again after it, in the agent's order.
		mu, err := sh.lockSeeded(st, ctx, dev, w)
		if err != nil {
			return false, err
		}
		defer mu.Unlock()
		val := w.val.Add(v)
		ok, err := queueAfterMark(mw, ctx, dev, val, false, mark, mv, pm.rel.Load())
		if !ok {
			w.val.Add(-v) // not queued: the caller's path adds it
		} else {
			traceSignal(dev, v, val, pathShadow)
			profile.Mark(profile.PtSignal)
		}
		return ok, err
	}
	if queuedAdd(st, ctx) == 0 {
		return false, nil
	}
	ok, err := queueAfterMark(mw, ctx, dev, v, true, mark, mv, pm.rel.Load())
	if ok {
		traceSignal(dev, v, 0, pathAgentAdd)
		profile.Mark(profile.PtSignal)
	}
	return ok, err
}

// queueAfterMark queues the signal command on ctx's agent with a bounce
// slot whose event is its ticket, so that fences wait for it as for a
// queued copy. false (and no error): no queue or slot, or the agent
// declined; nothing queued.
func queueAfterMark(mw devmem.MarkWaiter, ctx, dev uintptr, v uint64, add bool, mark uintptr, mv uint64, rel uintptr) (bool, error) {
	_, q, err := queueFor(ctx) // (after the other contexts' queued copies)
	if q == nil {
		return false, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	// Slots whose commands ran go back first: nothing else reaps a slot
	// that owes no request but a fence.
	for q.nq > 0 {
		if ok, err := q.st.Passed(q.ctx, q.ev[q.order[q.head]]); err != nil || !ok {
			break
		}
		q.popLocked()
	}
	if q.dead || bits.OnesCount32(q.free) <= bounceSlots/2 {
		return false, nil
	}
	i := bits.TrailingZeros32(q.free)
	ok, err := mw.SignalAfterMark(ctx, dev, v, add, mark, mv, rel)
	if !ok {
		if err != nil {
			err = fmt.Errorf("signal after a peer's mark: %w", err)
		}
		return false, err
	}
	if err := q.st.Record(q.ctx, &q.ev[i]); err != nil {
		// Queued and not watchable: wait for it here.
		return true, q.drainLocked()
	}
	q.free &^= 1 << i
	q.queueLocked(i)
	return true, nil
}

// markWaitsWarned is how many skipped signals the watch has reported.
var markWaitsWarned atomic.Uint64

// watchMarkWaits releases the waits for exited peers' marks (releaseDead)
// and WARNs when the agents skipped signals since the last look (the queue
// watch, each second).
func watchMarkWaits() {
	mw, ok := devmem.Get().(devmem.MarkWaiter)
	if !ok || !markWaitDevice.Load() {
		return
	}
	releaseDead()
	n := mw.MarkWaitsSkipped()
	if was := markWaitsWarned.Load(); n > was && markWaitsWarned.CompareAndSwap(was, n) {
		logx.Warn(abi.SubsysNet, "NET/wasm: %d signal(s) were dropped: the device agent stopped waiting for a peer's mark that did not come (the peer's process exited, or 30 s passed: its agent stopped mid-copy); their operations' data may be missing (NCCL_RMA_WASM_INTRANODE_MARK_WAIT_DEVICE=0 has the host wait instead)", n-was)
	}
}
