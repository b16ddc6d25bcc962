// Package staging moves device memory through host memory, for transports
// that cannot reach it: pooled pairs of pinned buffers and a copier
// goroutine (a stager) that pipeline a device payload to or from a socket
// (ReadToDevice, WriteFromDevice), the read-modify-write of a device signal
// word (AddSignal), and the intra-node staging ring, a shared-memory ring
// of slots between two processes of one host (ring.go). The copies are
// host/devmem's; host/dataplane decides when to stage.
package staging

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/profile"
)

// Device memory never meets a socket or process_vm_writev directly: its
// bytes are staged through pinned host buffers (a stager), a chunk at a
// time, with the copies of host/devmem. A payload of one chunk or less takes
// one synchronous copy; a larger one is pipelined over two buffers, the
// stager's copier goroutine copying chunk k+1 while the caller moves chunk k
// over the wire. Host memory takes none of these paths.

// ErrNoDevice: an operation names device memory and no device runtime is
// loaded (host/devmem.Register).
var ErrNoDevice = errors.New("device memory registered but no device runtime is loaded")

// DefaultChunk is the staging chunk size when the caller names none: the
// default of NCCL_RMA_WASM_STAGE_CHUNK_KB (host/config).
const DefaultChunk = 1 << 20

// devSigLocks serialise read-modify-writes of device signal words: the
// services of different peers (and lanes) may update one word at once, and
// two unlocked read-modify-writes would lose an increment. Striped by
// address so that unrelated words rarely share a lock.
var devSigLocks [64]sync.Mutex

// AddSignal adds v to the 8-byte signal word at device address dev of
// context ctx, after the payloads of the operations before it, whose copies
// have completed. In order of preference:
//   - sh (the registration's never-reset shadow, nil for others) and a
//     device that writes words on its stream: the shadow takes the add and
//     the new value is written, stream-ordered, without a read-back or a
//     wait (Shadow.add);
//   - a CPU mapping of the word (GDRCopy);
//   - an atomic add queued on ctx's stream: a stream memory operation
//     where the driver has one (CapStreamAtomic), else the device agent's
//     add where it runs in ctx, else CUDA's one-thread kernel where
//     NCCL_RMA_WASM_DEVICE_ATOMIC=1 allows it;
//   - a read-modify-write with synchronous copies, serialised per word.
func AddSignal(ctx, dev uintptr, v uint64, sh *Shadow) error {
	return AddSignalAfter(ctx, dev, v, sh, nil)
}

// AddSignalAfter is AddSignal for a put+signal whose payload h holds
// (LandHeld; nil or empty: none): the payload's copy and the signal go to
// the device agent as one command where they can (fusedSignal), else the
// copy is queued first. h holds nothing when it returns, error or not.
func AddSignalAfter(ctx, dev uintptr, v uint64, sh *Shadow, h *Held) error {
	profile.Mark(profile.PtSigCall)
	defer profile.Mark(profile.PtSignal)
	if profile.On() {
		defer profile.DevSignal.Since(profile.Now())
	}
	d := devmem.Get()
	if d == nil {
		return errors.Join(ErrNoDevice, h.Flush())
	}
	if h.Pending() {
		// Not fused (or failed): the held copy is queued before the signal.
		done, err := fusedSignal(d, ctx, dev, v, sh, h)
		if ferr := h.Flush(); err == nil {
			err = ferr
		}
		if done || err != nil {
			return err
		}
	}
	// Caps is asked only where its answer picks the path.
	st, _ := d.(devmem.Streams)
	if shadowWrites(st, ctx, sh) {
		// The write follows the payloads queued on ctx's stream; those
		// queued on other contexts' streams are waited for.
		if err := fence(d, ctx); err != nil {
			return err
		}
		return sh.add(st, ctx, dev, v)
	}
	// GDRCopy and the read-modify-write write at once: every payload
	// queued before must have landed first (the atomic kernel, on ctx's
	// stream, waits for the other contexts' only).
	stripe := int((dev >> 3) % uintptr(len(devSigLocks)))
	mu := &devSigLocks[stripe]
	if wa, ok := d.(devmem.WordAdder); ok {
		if err := fence(d, 0); err != nil {
			return err
		}
		mu.Lock()
		done, err := wa.AddWord(ctx, dev, v)
		mu.Unlock()
		if done || err != nil {
			traceSignal(dev, v, 0, pathGDR)
			return err
		}
	}
	if path := queuedAdd(st, ctx); path != 0 {
		if err := fence(d, ctx); err != nil {
			return err
		}
		if err := st.AtomicAdd(ctx, dev, v); err != nil {
			return fmt.Errorf("atomic add to device signal: %w", err)
		}
		traceSignal(dev, v, 0, path)
		return nil
	}
	if err := fence(d, 0); err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	w := sigWord(d, ctx, stripe)
	if err := d.DtoH(ctx, w, dev, 8); err != nil {
		return fmt.Errorf("read device signal: %w", err)
	}
	*(*uint64)(w) += v
	if err := d.HtoD(ctx, dev, w, 8); err != nil {
		return fmt.Errorf("write device signal: %w", err)
	}
	traceSignal(dev, v, *(*uint64)(w), pathRMW)
	return nil
}

// queuedAdd says how ctx's device queues an atomic add on its stream, as
// a trace path: a stream memory operation (no SM needed, always allowed),
// the kernel (where allowed), or 0: it does not.
func queuedAdd(st devmem.Streams, ctx uintptr) int {
	if st == nil {
		return 0
	}
	switch c := st.Caps(ctx); {
	case c&devmem.CapStreamAtomic != 0:
		return pathStreamAtomic
	case agentAdds.Load() && AgentRuns(ctx):
		// The agent adds atomically, in order with the stream's work,
		// where the driver has no stream atomics (an H100 with driver
		// 580 under MPS reported none).
		return pathAgentAdd
	case atomicKernel.Load() && c&devmem.CapAtomicAdd != 0:
		return pathAtomic
	}
	return 0
}

// agentAdds lets the device agent add to plain signal words where the
// driver has no stream atomics; host/plugin sets it with
// NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL or NCCL_RMA_WASM_FUSED_LANDING,
// which need it, until it is measured on a GPU by itself.
var agentAdds atomic.Bool

// SetAgentAdds allows or forbids the device agent's adds (agentAdds).
func SetAgentAdds(on bool) { agentAdds.Store(on) }

// atomicKernel allows the atomic-add kernel (NCCL_RMA_WASM_DEVICE_ATOMIC):
// off by default, as a persistent kernel that holds every SM while it
// spins on the signal would keep the add from ever running; copy engines
// (stream writes, copies) and GDRCopy need no SM.
var atomicKernel atomic.Bool

// SetAtomicKernel allows or forbids the atomic-add kernel; host/plugin
// sets it from NCCL_RMA_WASM_DEVICE_ATOMIC at init.
func SetAtomicKernel(on bool) { atomicKernel.Store(on) }

// sigPage is a pinned page of one device through which each lock stripe
// reads and writes its signal word: a copy from pageable memory would take
// the driver's bounce buffer, and a Go variable handed to the device would
// be allocated per signal.
var sigPage struct {
	mu sync.Mutex
	p  atomic.Pointer[sigWords]
}

type sigWords struct {
	dev  devmem.Device
	base unsafe.Pointer // nil: pinned allocation failed, use Go memory
}

// sigWord returns stripe's word in d's pinned page, allocating the page on
// first use; called with the stripe's lock held.
func sigWord(d devmem.Device, ctx uintptr, stripe int) unsafe.Pointer {
	w := sigPage.p.Load()
	if w == nil || w.dev != d {
		sigPage.mu.Lock()
		if w = sigPage.p.Load(); w == nil || w.dev != d {
			// Another device (tests swap fakes): its page is dropped, not
			// freed, as a stripe may still hold it.
			w = &sigWords{dev: d}
			w.base, _ = d.AllocPinned(ctx, 8*uint64(len(devSigLocks)))
			sigPage.p.Store(w)
		}
		sigPage.mu.Unlock()
	}
	if w.base == nil {
		return unsafe.Pointer(new(uint64))
	}
	return unsafe.Add(w.base, 8*stripe)
}

// releaseSigPage frees the pinned signal page (plugin finalize); every
// stripe's lock is taken first, so no signal is using it.
func releaseSigPage() {
	for i := range devSigLocks {
		devSigLocks[i].Lock()
	}
	if w := sigPage.p.Swap(nil); w != nil && w.base != nil {
		w.dev.FreePinned(w.base)
	}
	for i := range devSigLocks {
		devSigLocks[i].Unlock()
	}
}

// stager is a pair of pinned staging buffers and the goroutine that runs
// device copies on them, so that a copy overlaps the caller's socket I/O.
// Stagers are pooled per process and reused: pinned allocation costs
// milliseconds, and the pool holds as many as ran at once.
type stager struct {
	dev    devmem.Device
	chunk  uint64
	buf    [2]unsafe.Pointer
	keep   []byte // the buffers in Go memory, when nothing else could be had
	mapped []byte // the buffers in an anonymous mapping (pageable stagers)
	jobs   chan copyJob
	done   chan error
}

type copyJob struct {
	toDev bool
	ctx   uintptr
	dev   uintptr
	host  unsafe.Pointer
	n     uint64
}

var stagers struct {
	mu   sync.Mutex
	free []*stager
	// warm: Prewarm ran (a device registration), so the data path no
	// longer allocates pinned memory. cuMemHostAlloc can wait for the
	// kernels running in the context, and a kernel may be waiting for
	// the very operation being staged (NCCL's GIN alltoall under MPS hung
	// this way); past the prewarmed stagers, extra ones use pageable
	// memory instead.
	warm bool
}

var pinnedWarned, pageableSaid, copyCtxSaid, copyCtxFailSaid, streamAtomicSaid atomic.Bool

// pageableMade counts the stagers made with pageable buffers because more
// than PrewarmStagers ran at once.
var pageableMade atomic.Int64

// PageableStagers is how many stagers were made with pageable buffers
// because more than PrewarmStagers device payloads were staged at once.
func PageableStagers() int64 { return pageableMade.Load() }

// streamAtomics is what the CUDA device says about its stream atomics.
type streamAtomics interface{ StreamAtomic() string }

// copyContexts is what the CUDA device says about the contexts of the
// plugin's own it made for copies (host/devmem/cuda).
type copyContexts interface {
	CopyContexts() int
	CopyContextFailed() int
}

// PrewarmStagers is how many stagers Prewarm readies: concurrent device
// stagings beyond it (several peers' payloads at once) use pageable
// buffers, slower but never a pinned allocation on the data path.
const PrewarmStagers = 4

// Prewarm readies device staging for context ctx before the data path
// needs it, where a kernel of the application may be running: the pool
// gets up to PrewarmStagers pinned stagers of chunk bytes (0:
// DefaultChunk), the signal page is allocated, and the context's stream
// is made. Registration of device memory calls it.
func Prewarm(ctx uintptr, chunk uint64) {
	d := devmem.Get()
	if d == nil {
		return
	}
	if chunk == 0 {
		chunk = DefaultChunk
	}
	sigWord(d, ctx, 0)
	if st, ok := d.(devmem.Streams); ok {
		st.Caps(ctx)
	}
	prewarmQueue(d, ctx)
	if sa, ok := d.(streamAtomics); ok && !streamAtomicSaid.Swap(true) {
		how := sa.StreamAtomic()
		if st, ok := d.(devmem.Streams); !ok || st.Caps(ctx)&devmem.CapStreamAtomic == 0 {
			how = "no stream atomics (" + how + "): GDRCopy where present, else the device agent's atomic add where it runs, else the atomic kernel where NCCL_RMA_WASM_DEVICE_ATOMIC=1, else a read-modify-write"
		}
		logx.Info(abi.SubsysNet, "NET/wasm: device signal words of registrations that are not never-reset: %s", how)
	}
	if cc, ok := d.(copyContexts); ok {
		if cc.CopyContexts() > 0 && !copyCtxSaid.Swap(true) {
			logx.Info(abi.SubsysNet, "NET/wasm: copies and signal writes of cuMem-mapped device memory run in a CUDA context of the plugin's own (NCCL_RMA_WASM_COPY_CONTEXT=1)")
		}
		if r := cc.CopyContextFailed(); r != 0 && !copyCtxFailSaid.Swap(true) {
			logx.Info(abi.SubsysNet, "NET/wasm: the CUDA driver refused a context of the plugin's own (cuCtxCreate: status %d; under MPS, too many client contexts?): copies of that device memory stay on the application's context, where kernels it queues behind one waiting for a signal can hold them (SPEC.md §4)", r)
		}
	}
	stagers.mu.Lock()
	have := 0
	for _, s := range stagers.free {
		if s.dev == d && s.chunk == chunk && s.mapped == nil {
			have++
		}
	}
	stagers.mu.Unlock()
	var made []*stager
	for ; have < PrewarmStagers; have++ {
		s := newStager(d, ctx, chunk, true)
		made = append(made, s)
	}
	stagers.mu.Lock()
	stagers.free = append(stagers.free, made...)
	stagers.warm = true
	stagers.mu.Unlock()
	// Last: the agent's kernel runs from here on, and pinned allocations
	// in its context would have to stop it.
	if ag, ok := d.(deviceAgent); ok {
		ag.StartAgent(ctx)
		if how := ag.Agent(); !strings.HasPrefix(how, "not started") {
			if last := agentSaid.Swap(&how); last == nil || *last != how {
				logx.Info(abi.SubsysNet, "NET/wasm: device agent: %s", how)
			}
		}
	}
}

// deviceAgent is what the CUDA device says and does about its agents
// (host/devmem/cuda, agent.c).
type deviceAgent interface {
	StartAgent(ctx uintptr)
	StopAgents()
	Agent() (note string)
	AgentStats() string
}

// agentSaid is the agent's state last logged.
var agentSaid atomic.Pointer[string]

// getStager takes a stager of device d and chunk size chunk (0:
// DefaultChunk) from the pool, or makes one: pinned before Prewarm ran,
// pageable after. Stagers of another device (tests swap fakes) or chunk
// size stay in the pool until Release: freeing pinned memory here, on the
// data path, can wait for a running kernel.
func getStager(d devmem.Device, ctx uintptr, chunk uint64) *stager {
	if chunk == 0 {
		chunk = DefaultChunk
	}
	stagers.mu.Lock()
	for i := len(stagers.free) - 1; i >= 0; i-- {
		if s := stagers.free[i]; s.dev == d && s.chunk == chunk {
			last := len(stagers.free) - 1
			stagers.free[i], stagers.free[last] = stagers.free[last], nil
			stagers.free = stagers.free[:last]
			stagers.mu.Unlock()
			return s
		}
	}
	pinned := !stagers.warm
	stagers.mu.Unlock()
	if !pinned {
		pageableMade.Add(1)
	}
	if !pinned && !pageableSaid.Swap(true) {
		logx.Info(abi.SubsysNet, "NET/wasm: more than %d device payloads staged at once: the extra ones use pageable buffers (no pinned allocation while the application's kernels may run)", PrewarmStagers)
	}
	return newStager(d, ctx, chunk, pinned)
}

// newStager makes a stager with pinned buffers when pinned (falling back
// to pageable ones if that fails), else pageable ones: anonymous
// mappings, which are not Go memory and may be handed to the driver.
func newStager(d devmem.Device, ctx uintptr, chunk uint64, pinned bool) *stager {
	s := &stager{dev: d, chunk: chunk, jobs: make(chan copyJob, 2), done: make(chan error, 2)}
	for i := 0; pinned && i < len(s.buf); i++ {
		p, err := d.AllocPinned(ctx, chunk)
		if err != nil {
			if !pinnedWarned.Swap(true) {
				logx.Info(abi.SubsysNet, "NET/wasm: no pinned staging memory (%v); device payloads are staged through pageable memory, several times slower", err)
			}
			for j := 0; j < i; j++ {
				d.FreePinned(s.buf[j])
			}
			pinned = false
			break
		}
		s.buf[i] = p
	}
	if !pinned {
		m, err := unix.Mmap(-1, 0, int(2*chunk), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			// Go memory as the last resort: the copies only read or
			// write it for the duration of the call.
			m = make([]byte, 2*chunk)
			s.keep = m
		} else {
			s.mapped = m
		}
		s.buf = [2]unsafe.Pointer{unsafe.Pointer(&m[0]), unsafe.Pointer(&m[chunk])}
	}
	go s.copier()
	return s
}

func putStager(s *stager) {
	stagers.mu.Lock()
	stagers.free = append(stagers.free, s)
	stagers.mu.Unlock()
}

// Release frees the pooled stagers that are idle (plugin finalize):
// pinned memory lives in a device context the application may destroy.
// Stagers in use return to the pool and are freed at the next call.
func Release() {
	if ag, ok := devmem.Get().(deviceAgent); ok {
		if st := ag.AgentStats(); st != "" {
			logx.Info(abi.SubsysNet, "NET/wasm: device agent: %s", st)
		}
		ag.StopAgents() // before the memory it reads and writes is freed
	}
	releaseQueues()
	releaseSigPage()
	releaseMarks()
	stagers.mu.Lock()
	free := stagers.free
	stagers.free, stagers.warm = nil, false
	stagers.mu.Unlock()
	for _, s := range free {
		s.release()
	}
}

// release ends the copier and frees the buffers; nothing is in flight.
func (s *stager) release() {
	close(s.jobs)
	switch {
	case s.mapped != nil:
		unix.Munmap(s.mapped)
	case s.keep == nil:
		for _, p := range s.buf {
			s.dev.FreePinned(p)
		}
	}
}

func (s *stager) copier() {
	for j := range s.jobs {
		if j.toDev {
			s.done <- s.dev.HtoD(j.ctx, j.dev, j.host, j.n)
		} else {
			s.done <- s.dev.DtoH(j.ctx, j.host, j.dev, j.n)
		}
	}
}

func (s *stager) bytes(i int, n uint64) []byte { return unsafe.Slice((*byte)(s.buf[i]), n) }

// takeStager returns the loaded device and a pooled stager for ctx; the
// caller gives the stager back with putStager.
func takeStager(ctx uintptr, chunk uint64) (devmem.Device, *stager, error) {
	d := devmem.Get()
	if d == nil {
		return nil, nil, ErrNoDevice
	}
	return d, getStager(d, ctx, chunk), nil
}

// LandOnDevice reads a put's payload of n bytes from r into device memory
// at dst of context ctx: a small one into a bounce slot, its copy to the
// device queued on ctx's stream and not waited for (bounce.go); a larger
// one as ReadToDevice does. Either way a signal applied after it
// (AddSignal) becomes visible after the payload.
func LandOnDevice(r io.Reader, ctx, dst uintptr, n, chunk uint64) error {
	d := devmem.Get()
	if d == nil {
		return ErrNoDevice
	}
	if n <= bounceSize.Load() {
		if done, err := landAsync(d, r, ctx, dst, n); done || err != nil {
			return err
		}
	}
	return ReadToDevice(r, ctx, dst, n, chunk)
}

// CopyLocal copies n bytes between two buffers of this process, either or
// both device memory (a context of 0 says host memory): an operation of a
// rank to itself, which needs no socket. It first waits for the
// asynchronous copies queued before it, so it lands after them. Device to
// device is one copy on the device where both ends are of one context and
// the runtime has it (devmem.DeviceCopier), else it goes through a
// stager's pinned buffer, a chunk (0: DefaultChunk) at a time. Every copy
// has completed when it returns.
func CopyLocal(dstCtx uintptr, dst unsafe.Pointer, srcCtx uintptr, src unsafe.Pointer, n, chunk uint64) error {
	d := devmem.Get()
	if d == nil {
		return ErrNoDevice
	}
	if err := fence(d, 0); err != nil {
		return err
	}
	switch {
	case srcCtx == 0 && dstCtx == 0:
		copy(unsafe.Slice((*byte)(dst), n), unsafe.Slice((*byte)(src), n))
		return nil
	case srcCtx == 0:
		if err := d.HtoD(dstCtx, uintptr(dst), src, n); err != nil {
			return fmt.Errorf("copy to device: %w", err)
		}
		return nil
	case dstCtx == 0:
		if err := d.DtoH(srcCtx, dst, uintptr(src), n); err != nil {
			return fmt.Errorf("copy from device: %w", err)
		}
		return nil
	}
	if dc, ok := d.(devmem.DeviceCopier); ok && srcCtx == dstCtx {
		err := dc.DtoD(dstCtx, uintptr(dst), uintptr(src), n)
		if !errors.Is(err, devmem.ErrUnsupported) {
			if err != nil {
				return fmt.Errorf("copy on the device: %w", err)
			}
			return nil
		}
	}
	s := getStager(d, srcCtx, chunk)
	defer putStager(s)
	for done := uint64(0); done < n; {
		m := min(s.chunk, n-done)
		if err := d.DtoH(srcCtx, s.buf[0], uintptr(src)+uintptr(done), m); err != nil {
			return fmt.Errorf("copy from device: %w", err)
		}
		if err := d.HtoD(dstCtx, uintptr(dst)+uintptr(done), s.buf[0], m); err != nil {
			return fmt.Errorf("copy to device: %w", err)
		}
		done += m
	}
	return nil
}

// ReadToDevice reads n bytes from r into device memory at dst of context
// ctx, staged in pieces of chunk bytes (0: DefaultChunk). With more than
// one chunk, the copy to the device of chunk k runs while chunk k+1 is
// received; it returns once every copy completed, so whatever follows (a
// signal, a completion) sees the whole payload.
func ReadToDevice(r io.Reader, ctx, dst uintptr, n, chunk uint64) error {
	d, s, err := takeStager(ctx, chunk)
	if err != nil {
		return err
	}
	defer putStager(s)
	if err := fence(d, 0); err != nil {
		return err
	}
	c := s.chunk
	if n <= c {
		if _, err := io.ReadFull(r, s.bytes(0, n)); err != nil {
			return err
		}
		if err := d.HtoD(ctx, dst, s.buf[0], n); err != nil {
			return fmt.Errorf("copy to device: %w", err)
		}
		return nil
	}
	pending := 0
	for done, k := uint64(0), 0; done < n && err == nil; k++ {
		m := min(c, n-done)
		if pending == 2 { // the copy of chunk k-2 frees buffer k&1
			pending--
			if e := <-s.done; e != nil {
				err = fmt.Errorf("copy to device: %w", e)
				break
			}
		}
		if _, err = io.ReadFull(r, s.bytes(k&1, m)); err != nil {
			break
		}
		s.jobs <- copyJob{toDev: true, ctx: ctx, dev: dst + uintptr(done), host: s.buf[k&1], n: m}
		pending++
		done += m
	}
	for ; pending > 0; pending-- {
		if e := <-s.done; e != nil && err == nil {
			err = fmt.Errorf("copy to device: %w", e)
		}
	}
	return err
}

// WriteFromDevice writes n bytes of device memory at src of context ctx to
// w, staged in pieces of chunk bytes (0: DefaultChunk). With more than one
// chunk, chunk k+1 is copied from the device while chunk k is
// written.
func WriteFromDevice(w io.Writer, ctx, src uintptr, n, chunk uint64) error {
	if profile.On() {
		defer profile.StageOut.Since(profile.Now())
	}
	d, s, err := takeStager(ctx, chunk)
	if err != nil {
		return err
	}
	defer putStager(s)
	if err := fence(d, 0); err != nil {
		return err
	}
	if n <= s.chunk {
		if err := d.DtoH(ctx, s.buf[0], src, n); err != nil {
			return fmt.Errorf("copy from device: %w", err)
		}
		_, err := w.Write(s.bytes(0, n))
		return err
	}
	c := s.chunk
	s.jobs <- copyJob{ctx: ctx, dev: src, host: s.buf[0], n: c}
	for done, k := uint64(0), 0; done < n; k++ {
		m := min(c, n-done)
		if e := <-s.done; e != nil { // chunk k is in buffer k&1; nothing else in flight
			return fmt.Errorf("copy from device: %w", e)
		}
		next := done + m
		ahead := next < n
		if ahead {
			s.jobs <- copyJob{ctx: ctx, dev: src + uintptr(next), host: s.buf[(k+1)&1], n: min(c, n-next)}
		}
		if _, err := w.Write(s.bytes(k&1, m)); err != nil {
			if ahead {
				<-s.done // the buffer goes back to the pool idle
			}
			return err
		}
		done = next
	}
	return nil
}
