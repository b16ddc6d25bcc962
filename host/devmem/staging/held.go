package staging

import (
	"fmt"
	"io"
	"sync/atomic"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
)

// Fused landings (NCCL_RMA_WASM_FUSED_LANDING). A small put+signal that
// arrives for device memory of a context whose device agent runs costs
// the agent two commands: the payload's copy out of a bounce slot, then
// the signal's write or add. Fused, the target reads the payload into a
// bounce slot and holds its copy (LandHeld) until the signal is applied
// (AddSignalAfter), and the agent lands both as one command: a payload of
// up to 64 bytes rides in the command itself, so the agent reads it with
// the command instead of in a second round trip over the bus.
//
// A held copy is always queued before anything that must follow it: its
// own signal carries it, and whatever is not fused is queued first
// (Flush). The caller holds a payload only when its signal will be
// applied at once, on its own thread (every operation numbered before it
// has landed), and flushes after applying it, so nothing else ever waits
// for a held copy.

// fusedLanding allows holding payloads for their signals; host/plugin
// sets it from NCCL_RMA_WASM_FUSED_LANDING at init.
var fusedLanding atomic.Bool

// SetFusedLanding allows or forbids fused landings.
func SetFusedLanding(on bool) { fusedLanding.Store(on) }

// FusedLanding reports whether fused landings are allowed: a caller asks
// before it does any work toward holding a payload.
func FusedLanding() bool { return fusedLanding.Load() }

// Held is a put's small device payload read into a bounce slot, its copy
// to the device not yet queued: its signal's application queues both
// (AddSignalAfter), or Flush queues the copy alone. The zero value holds
// nothing; a service keeps one, so a put allocates nothing.
type Held struct {
	q   *ctxQueue // nil: nothing held
	i   int
	dst uintptr
	n   uint64
}

// Pending reports whether h holds a copy not yet queued.
func (h *Held) Pending() bool { return h != nil && h.q != nil }

// LandHeld reads a put's payload of n bytes from r into a bounce slot of
// ctx and holds its copy to device address dst in h, where fused landings
// are on, the device lands a payload and a signal as one command and ctx
// runs a device agent. false (and no error): nothing was read; land it
// with LandOnDevice. After a read error the slot is given back.
func LandHeld(r io.Reader, ctx, dst uintptr, n uint64, h *Held) (bool, error) {
	if !fusedLanding.Load() || h.Pending() || n == 0 || n > bounceSize.Load() {
		return false, nil
	}
	d := devmem.Get()
	if _, ok := d.(devmem.FusedLander); !ok || !AgentRuns(ctx) {
		return false, nil
	}
	q, i, read, err := readSlot(d, r, ctx, n)
	if !read {
		return false, nil // no slot: LandOnDevice lands it, and meets any error itself
	}
	if q == nil {
		return true, err
	}
	*h = Held{q: q, i: i, dst: dst, n: n}
	return true, nil
}

// Flush queues the held copy by itself; nothing held, nothing to do.
func (h *Held) Flush() error {
	if !h.Pending() {
		return nil
	}
	q := h.q
	h.q = nil
	return q.push(h.i, h.dst, h.n)
}

// fuse queues the held copy and then the write (add false) or atomic add
// of v to the device word sig as one command of the device agent. false
// (and no error): the agent cannot take them; the copy is still held.
func (h *Held) fuse(sig uintptr, v uint64, add bool) (bool, error) {
	q := h.q
	fl, ok := q.d.(devmem.FusedLander)
	if !ok {
		return false, nil
	}
	ok, err := q.pushFused(fl, h.i, h.dst, h.n, sig, v, add)
	if ok || err != nil {
		h.q = nil
	}
	return ok, err
}

// pushFused is push for a held slot whose copy goes with its signal as
// one command (Held.fuse); false (and no error): not taken, still held.
func (q *ctxQueue) pushFused(fl devmem.FusedLander, i int, dst uintptr, n uint64, sig uintptr, v uint64, add bool) (bool, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	ok, err := fl.LandSignal(q.ctx, dst, q.slot(i), n, sig, v, add)
	if err != nil {
		q.held &^= 1 << i
		q.free |= 1 << i
		return false, fmt.Errorf("device agent's landing of %d bytes and their signal: %w", n, err)
	}
	if !ok {
		return false, nil
	}
	q.held &^= 1 << i
	return true, q.watchLocked(i, n)
}

// fusedSignal applies a signal to the device word dev of ctx together
// with the copy h holds, where both are of one context and the signal
// would be the agent's write (a never-reset shadow's) or its atomic add.
// false (and no error): apply it apart, after flushing h.
func fusedSignal(d devmem.Device, ctx, dev uintptr, v uint64, sh *Shadow, h *Held) (bool, error) {
	st, ok := d.(devmem.Streams)
	// LandHeld saw ctx's agent run; one that stopped since declines the
	// command (fuse), and the signal goes apart.
	if !ok || h.q.ctx != ctx || dev%8 != 0 {
		return false, nil
	}
	if _, gdr := d.(devmem.WordAdder); gdr {
		// GDRCopy's adds are the CPU's read-modify-writes, which the
		// agent's atomic adds to the same word would race with.
		return false, nil
	}
	switch {
	case shadowWrites(st, ctx, sh):
	case queuedAdd(st, ctx) != 0:
		sh = nil
	default:
		return false, nil
	}
	// The payloads queued on other contexts before it land first, as for
	// any signal written on a stream (AddSignal).
	if err := fence(d, ctx); err != nil {
		return true, err
	}
	if sh != nil {
		return true, sh.addFused(st, ctx, dev, v, h)
	}
	done, err := h.fuse(dev, v, true)
	if done {
		traceSignal(dev, v, 0, pathFused)
	}
	return done, err
}
