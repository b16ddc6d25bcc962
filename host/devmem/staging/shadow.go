package staging

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
)

// Shadow is the host copy of a never-reset signal registration
// (NCCL_NET_MR_FLAG_SIGNAL_NEVER_RESET): such a word changes only by the
// plugin's adds, so the host knows its value and an update is a write of
// the new value queued on the context's stream, never a read. One is made
// per registration, at registration (NewShadow), and dropped at
// deregistration after the stream passed (Quiesce).
type Shadow struct {
	base  uintptr
	words []shadowWord
	folds atomic.Uint64
}

type shadowWord struct {
	val     atomic.Uint64
	pending atomic.Uint32 // 1: a writer will issue the latest value
	seeded  bool          // val holds the device's value (under the stripe lock)
}

// NewShadow makes the shadow of a registration of size bytes at device
// address base.
func NewShadow(base uintptr, size uint64) *Shadow {
	return &Shadow{base: base, words: make([]shadowWord, size/8)}
}

// Folds is how many adds were folded into another's write.
func (s *Shadow) Folds() uint64 { return s.folds.Load() }

// add adds v to the word at dev and queues the write of its new value.
// Writes of one word are issued in the order of their values: the writer
// holds the word's stripe lock from reading the shadow to issuing. An add
// that finds a write pending leaves at once: that writer reads the shadow
// after clearing the flag, so its value includes this add, and it issues
// after this add's payload copy was queued (before the add), so the write
// follows the payload on the stream. The first write of a word reads the
// device's value once (a registration's initial contents are the
// application's).
func (s *Shadow) add(st devmem.Streams, ctx, dev uintptr, v uint64) error {
	w, err := s.word(dev)
	if err != nil {
		return err
	}
	w.val.Add(v)
	if !w.pending.CompareAndSwap(0, 1) {
		s.folds.Add(1)
		traceSignal(dev, v, 0, pathFolded)
		return nil
	}
	mu, err := s.lockSeeded(st, ctx, dev, w)
	if err != nil {
		w.pending.Store(0)
		return err
	}
	defer mu.Unlock()
	w.pending.Store(0)
	val := w.val.Load()
	if err := st.WriteWord(ctx, dev, val); err != nil {
		return fmt.Errorf("write device signal: %w", err)
	}
	traceSignal(dev, v, val, pathShadow)
	return nil
}

// addFused is add for a put whose payload h holds: the copy and the
// write of the new value go as one command of the device agent
// (Held.fuse), or one after the other where it cannot take them. It never
// folds into another writer's write, which could be queued before the
// held copy: under the stripe lock it adds and writes itself; a writer
// waiting for the lock writes again after it, with a value that includes
// this one.
func (s *Shadow) addFused(st devmem.Streams, ctx, dev uintptr, v uint64, h *Held) error {
	w, err := s.word(dev)
	if err != nil {
		return err
	}
	mu, err := s.lockSeeded(st, ctx, dev, w)
	if err != nil {
		return err
	}
	defer mu.Unlock()
	val := w.val.Add(v)
	done, err := h.fuse(dev, val, false)
	if err != nil {
		return err
	}
	if !done {
		if err := h.Flush(); err != nil {
			return err
		}
		if err := st.WriteWord(ctx, dev, val); err != nil {
			return fmt.Errorf("write device signal: %w", err)
		}
		traceSignal(dev, v, val, pathShadow)
		return nil
	}
	traceSignal(dev, v, val, pathFused)
	return nil
}

// lockSeeded takes the stripe lock of the device word dev and seeds its
// shadow w once; the caller unlocks. On an error nothing is held.
func (s *Shadow) lockSeeded(st devmem.Streams, ctx, dev uintptr, w *shadowWord) (*sync.Mutex, error) {
	mu := &devSigLocks[(dev>>3)%uintptr(len(devSigLocks))]
	mu.Lock()
	if !w.seeded {
		if err := s.seed(st, ctx, dev, w); err != nil {
			mu.Unlock()
			return nil, err
		}
	}
	return mu, nil
}

// word is the shadow of the device word dev.
func (s *Shadow) word(dev uintptr) (*shadowWord, error) {
	i := (dev - s.base) / 8
	if dev < s.base || dev%8 != 0 || i >= uintptr(len(s.words)) {
		return nil, fmt.Errorf("signal word %#x outside its shadow [%#x, +%d words)", dev, s.base, len(s.words))
	}
	return &s.words[i], nil
}

// seed adds the device's current value of the word to the shadow, once;
// called with the stripe lock held.
func (s *Shadow) seed(st devmem.Streams, ctx, dev uintptr, w *shadowWord) error {
	d := devmem.Get()
	if err := fence(d, 0); err != nil {
		return fmt.Errorf("read device signal: %w", err)
	}
	if err := st.Sync(ctx); err != nil {
		return fmt.Errorf("read device signal: %w", err)
	}
	p := sigWord(d, ctx, int((dev>>3)%uintptr(len(devSigLocks))))
	if err := d.DtoH(ctx, p, dev, 8); err != nil {
		return fmt.Errorf("read device signal: %w", err)
	}
	w.val.Add(*(*uint64)(p))
	w.seeded = true
	return nil
}

// Quiesce waits until every write and copy queued on ctx's stream
// executed (deregistration, a flush): afterwards the device memory holds
// what the host has been told.
func Quiesce(ctx uintptr) error {
	d := devmem.Get()
	st, ok := d.(devmem.Streams)
	if !ok || ctx == 0 || st.Caps(ctx) == 0 {
		return nil
	}
	if err := st.Sync(ctx); err != nil {
		return err
	}
	return settleQueue(d, ctx) // its slots' copies executed with the rest
}

// compareMax bounds how many words Compare reads (NCCL's GIN signal
// arrays are far smaller).
const compareMax = 1024

// Compare calls fn for every word, in order, that is non-zero in the
// shadow or on the device, with both values: the stall report's view of
// signals written late or lost. It reads each device word with a
// synchronous copy through its stripe's pinned word (no allocation: a
// pinned allocation can wait for the very kernel a stall is about),
// without waiting for the context's stream, so a write still queued there
// shows as a difference. Diagnostics only.
func (s *Shadow) Compare(ctx uintptr, fn func(i int, host, dev uint64)) error {
	d := devmem.Get()
	if d == nil {
		return ErrNoDevice
	}
	for i := range min(len(s.words), compareMax) {
		addr := s.base + uintptr(8*i)
		stripe := int((addr >> 3) % uintptr(len(devSigLocks)))
		mu := &devSigLocks[stripe]
		mu.Lock()
		w := sigWord(d, ctx, stripe)
		err := d.DtoH(ctx, w, addr, 8)
		v := *(*uint64)(w)
		mu.Unlock()
		if err != nil {
			return fmt.Errorf("read device signal word %d: %w", i, err)
		}
		if h := s.words[i].val.Load(); h != 0 || v != 0 {
			fn(i, h, v)
		}
	}
	return nil
}

// shadowWrites reports whether AddSignal updates a word of ctx with sh's
// stream-ordered write (a never-reset word, a device that writes words on
// its stream).
func shadowWrites(st devmem.Streams, ctx uintptr, sh *Shadow) bool {
	return sh != nil && st != nil && st.Caps(ctx)&devmem.CapWriteWord != 0
}

// DeviceAtomicAdds reports whether AddSignal adds to a device word of ctx
// with an atomic on the device (the device agent, a stream atomic or the
// atomic kernel) when the registration has no shadow: only then may a
// peer's agent add to the same words (NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL).
// GDRCopy and the read-modify-write update from the host, which a
// device's atomic would race.
func DeviceAtomicAdds(ctx uintptr) bool {
	d := devmem.Get()
	st, ok := d.(devmem.Streams)
	if !ok || ctx == 0 {
		return false
	}
	if _, gdr := d.(devmem.WordAdder); gdr {
		return false
	}
	return queuedAdd(st, ctx) != 0
}

// SignalStreamOrdered reports whether AddSignal applies a signal to the
// device word of ctx (sh its never-reset shadow, or nil) on ctx's stream,
// after the work queued there: a target's stream can then wait for a
// peer's event instead of its host (AfterPeerEvent).
func SignalStreamOrdered(ctx uintptr, sh *Shadow) bool {
	d := devmem.Get()
	st, ok := d.(devmem.Streams)
	if !ok || ctx == 0 {
		return false
	}
	if shadowWrites(st, ctx, sh) {
		return true
	}
	// GDRCopy, tried first, writes from the host.
	_, gdr := d.(devmem.WordAdder)
	return !gdr && queuedAdd(st, ctx) != 0
}

// peerEventTimeout bounds a host wait for a peer's event: its copy runs
// on a device of this host, so only a failed device outlasts it.
var peerEventTimeout = 30 * time.Second

// AfterPeerEvent makes what follows wait for the work before ev's latest
// recording, ev an event another process recorded after its copy into our
// memory (IPCEvents): on ctx's stream when the signal that follows goes
// there (stream true), else on this host, watching the event.
func AfterPeerEvent(ctx, ev uintptr, stream bool) error {
	d := devmem.Get()
	ie, ok := d.(devmem.IPCEvents)
	st, ok2 := d.(devmem.Streams)
	if !ok || !ok2 {
		return ErrNoDevice
	}
	if stream {
		if err := ie.StreamWait(ctx, ev); err != nil {
			return fmt.Errorf("wait for a peer's copy on the stream: %w", err)
		}
		return nil
	}
	deadline := time.Now().Add(peerEventTimeout)
	for spin := 0; ; spin++ {
		done, err := st.Passed(ctx, ev)
		if err != nil {
			return fmt.Errorf("a peer's copy into this memory: %w", err)
		}
		if done {
			return nil
		}
		if spin > 200 {
			if time.Now().After(deadline) {
				return fmt.Errorf("a peer's copy into this memory did not finish in %s", peerEventTimeout)
			}
			time.Sleep(10 * time.Microsecond)
		} else {
			runtime.Gosched()
		}
	}
}
