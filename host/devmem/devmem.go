// Package devmem is the seam to GPU memory. The runtime stays pure Go: the
// cgo subpackages devmem/cuda and devmem/hip (probed by capi at the plugin's
// init, each filling the ops table devmem/devrt calls through) register an
// implementation that reaches the CUDA driver or the HIP runtime through
// dlopen at run time (never linked), and tests register a fake. Device
// memory is never dereferenced by the host: payloads are staged through host buffers with
// the copies below, which run on whatever thread calls them with the
// context captured at registration (NCCL's progress threads have none).
package devmem

import (
	"errors"
	"os"
	"sync/atomic"
	"unsafe"
)

// Device copies between host memory and one kind of device memory.
type Device interface {
	// Name is shown in logs ("CUDA").
	Name() string
	// Inspect checks that [ptr, ptr+size) is device memory and returns the
	// context copies of it must run in.
	Inspect(ptr uintptr, size uint64) (ctx uintptr, err error)
	// DtoH copies n bytes from device address src to host memory dst.
	DtoH(ctx uintptr, dst unsafe.Pointer, src uintptr, n uint64) error
	// HtoD copies n bytes from host memory src to device address dst.
	HtoD(ctx uintptr, dst uintptr, src unsafe.Pointer, n uint64) error
	// AllocPinned returns n bytes of page-locked host memory usable with
	// any context (staging buffers: pinned copies run several times faster
	// than pageable ones). ctx is a context to allocate from.
	AllocPinned(ctx uintptr, n uint64) (unsafe.Pointer, error)
	// FreePinned releases memory from AllocPinned.
	FreePinned(p unsafe.Pointer)
}

// ErrUnsupported: the device runtime lacks the operation asked for.
var ErrUnsupported = errors.New("not supported by this device runtime")

// DeviceCopier is implemented by a device that copies between two device
// addresses of one context (an operation of a rank to itself), instead of
// through host memory; ErrUnsupported where its runtime cannot.
type DeviceCopier interface {
	// DtoD copies n bytes from device address src to dst and waits.
	DtoD(ctx, dst, src uintptr, n uint64) error
}

// AsyncDeviceCopier is implemented by a device that queues a copy between
// two device addresses of one context on that context's stream (Streams),
// where the signal writes that follow it also go.
type AsyncDeviceCopier interface {
	// DtoDAsync queues the copy of n bytes from src to dst and returns;
	// ErrUnsupported where the runtime has no such copy.
	DtoDAsync(ctx, dst, src uintptr, n uint64) error
}

// WordAdder is implemented by a device that can add to a word of device
// memory from the CPU through a mapping of it (GDRCopy), much faster than
// the two copies of a read-modify-write. Callers serialise updates of one
// word; the write is visible to the device when AddWord returns.
type WordAdder interface {
	// AddWord adds v to the 8-byte word at addr. false (and no error):
	// this word cannot be mapped, use copies.
	AddWord(ctx, addr uintptr, v uint64) (bool, error)
	// Forget drops mappings of [addr, addr+size), which is being
	// deregistered and may be freed.
	Forget(addr uintptr, size uint64)
}

// FusedLander is implemented by a device whose device agent lands a small
// payload and then updates its signal word as one command
// (host/devmem/cuda): no second command to pick up, and a payload of up to
// 64 bytes read with the command itself.
type FusedLander interface {
	// LandSignal queues, after the work queued on ctx so far, the copy of
	// n bytes from pinned host memory src to device address dst, then the
	// write (add false) or atomic add of v to the 8-byte word sig. false
	// (and no error): not for this context or copy; queue them apart.
	LandSignal(ctx, dst uintptr, src unsafe.Pointer, n uint64, sig uintptr, v uint64, add bool) (bool, error)
}

// CopyMarker is implemented by a device whose device agent copies between
// device addresses and then writes the command's number to a host word
// (host/devmem/cuda): a peer process that maps the word learns, by
// reading it, that the copy is visible, with no event and no host of ours
// waiting (staging.CopyMappedMark).
type CopyMarker interface {
	// CopyMark queues, after the work queued on ctx so far, the copy of n
	// bytes from src to dst and then the write of the command's number,
	// which it returns, to the 8-byte word mark (pinned host memory the
	// device reaches); a word written this way only grows. false (and no
	// error): not for this context, copy or word.
	CopyMark(ctx, dst, src uintptr, n uint64, mark uintptr) (uint64, bool, error)
}

// Inboxer is implemented by a device whose agent keeps a peer inbox
// (host/devmem/cuda's inbox.c): rows of device memory that the agents of
// other processes of the host write 8-byte entries into, each adding a
// value to a signal word that the owner's table names. The owner's agent
// takes them between its own commands, with no host on the way.
type Inboxer interface {
	// InboxOpen makes ctx's inbox once; ctx must run the agent. taken,
	// not 0, is where the agent counts the entries it took, a word per
	// row, the device rows' then the host rows' (pinned host memory it
	// reaches: the mark page, which the peers map); 0: memory of its
	// own. hrows, not 0, is host rows beside the device rows: size bytes
	// of pinned host memory the agent reaches, the caller's to share with
	// the peers and to free after the inbox; 0: none.
	InboxOpen(ctx, taken, hrows uintptr, size uint64) error
	// InboxRow hands out ctx's next row (row negative), or row again (one
	// handed out before), and returns it with the rows' allocation for a
	// peer to map (Fd the caller's to send and close; Size its bytes) and
	// the row's entries (a power of two).
	InboxRow(ctx uintptr, row int) (int, Segment, int, error)
	// InboxReset empties row, handed out before, for a new sender: its
	// entries zeroed and its count 0. No sender may write it any more.
	InboxReset(ctx uintptr, row int) error
	// InboxTable sets table entry idx to the n bytes at base (n 0: empty)
	// and returns once the agent uses it.
	InboxTable(ctx uintptr, idx int, base uintptr, n uint64) error
	// InboxKick launches ctx's agent if it parked.
	InboxKick(ctx uintptr) error
	// CopyWrite queues, after the work queued on ctx so far, the copy of n
	// bytes from src to dst (n 0: none) and then the write of v to the
	// device word w (an inbox entry, mapped here). false (and no error):
	// not for this context or copy.
	CopyWrite(ctx, dst, src uintptr, n uint64, w uintptr, v uint64) (bool, error)
}

// Caps are the stream-ordered operations a device supports for a context
// (Streams.Caps).
type Caps uint32

const (
	CapWriteWord Caps = 1 << iota // WriteWord (cuStreamWriteValue64, hipStreamWriteValue64)
	CapAtomicAdd                  // AtomicAdd (a one-thread atom.global.add.u64 kernel; CUDA only)
	CapAsync                      // HtoDAsync, DtoHAsync, Record, Passed, FreeEvent, Sync
	// CapStreamAtomic: AtomicAdd is a stream memory operation (CUDA 13.1's
	// atomic reduction), run without a kernel, so it needs no free SM.
	CapStreamAtomic
)

// Streams is implemented by a device that queues work on one stream per
// context, shared by every thread: work queued after a copy executes
// after it, whichever thread queued either, so a signal queued after its
// payload's copy needs no host synchronisation. Caps says what ctx
// supports; callers use only those methods and fall back to the
// synchronous copies otherwise.
type Streams interface {
	Caps(ctx uintptr) Caps
	// WriteWord queues a write of v to the 8-byte word at addr.
	WriteWord(ctx, addr uintptr, v uint64) error
	// AtomicAdd queues an atomic add of v to the 8-byte word at addr.
	AtomicAdd(ctx, addr uintptr, v uint64) error
	// HtoDAsync and DtoHAsync queue a copy; the host side is pinned memory
	// (AllocPinned) left untouched until an event recorded after the copy
	// passed.
	HtoDAsync(ctx, dst uintptr, src unsafe.Pointer, n uint64) error
	DtoHAsync(ctx uintptr, dst unsafe.Pointer, src uintptr, n uint64) error
	// Record records *ev (created when 0) after the work queued so far;
	// Passed reports whether that work executed; FreeEvent destroys it.
	Record(ctx uintptr, ev *uintptr) error
	Passed(ctx, ev uintptr) (bool, error)
	FreeEvent(ctx, ev uintptr)
	// Sync waits until everything queued on ctx's stream executed.
	Sync(ctx uintptr) error
}

// Memory interfaces a NIC may reach directly, numbered as libfabric's
// enum fi_hmem_iface.
const (
	IfaceCUDA = 1
	IfaceROCR = 2
)

// Locator is implemented by a device whose memory a NIC can reach
// directly (libfabric's FI_HMEM): the interface and device ordinal of an
// address of a context Inspect returned.
type Locator interface {
	Locate(ctx, ptr uintptr) (iface, device int, err error)
}

// DmaBufExporter is implemented by a device that can export its memory as
// a DMA-BUF (cuMemGetHandleForAddressRange, hipMemGetHandleForAddressRange):
// the fabric transport hands the fd to a provider that imports DMA-BUFs
// (FI_MR_DMABUF) when the caller registered the memory by address.
type DmaBufExporter interface {
	// ExportDmaBuf returns a new fd the caller closes, covering the pages
	// under [ptr, ptr+size), and ptr's offset in it.
	ExportDmaBuf(ctx, ptr uintptr, size uint64) (fd int, off uint64, err error)
}

// MaxSegments bounds the allocations one registration shares with another
// process (IPCSharer): a window of more keeps the staged path.
const MaxSegments = 64

// Segment is one exported allocation: its address in the exporting
// process, its size, and its shareable handle: a POSIX fd the holder
// closes (CUDA's cuMem), or Fd -1 and Handle (HIP's hipIpcMemHandle_t).
type Segment struct {
	Fd         int
	Base, Size uint64
	Handle     [64]byte
}

// IdleWriter is implemented by a device whose agent can tell, under its
// own lock, that everything queued in a context ran: the host then writes
// a peer inbox entry in shared host memory itself, where an agent command
// would cost the device's round trip to the ring.
type IdleWriter interface {
	// WriteIdle stores v to the 8-byte host word w and returns true when
	// every command and stream work queued in ctx so far executed (none
	// can be queued meanwhile); false, storing nothing, otherwise.
	WriteIdle(ctx, w uintptr, v uint64) bool
}

// IPCSharer is implemented by a device whose memory another process of
// the host can map (CUDA's cuMem POSIX fds): an intra-node peer then
// copies a device payload straight into the target's window, one copy on
// the device and none through host memory.
type IPCSharer interface {
	// IPCExport returns the allocations under [ptr, ptr+size), back to
	// back, each with a new fd the caller closes.
	IPCExport(ctx, ptr uintptr, size uint64) ([]Segment, error)
	// IPCImport maps segs back to back in a new reservation reachable
	// from ctx's device and returns its address; the fds stay the
	// caller's.
	IPCImport(ctx uintptr, segs []Segment) (va uintptr, err error)
	// IPCUnmap undoes IPCImport: sizes are the segments' sizes.
	IPCUnmap(ctx, va uintptr, sizes []uint64) error
}

// IPCEvents is implemented by a device whose events another process of
// the host can wait for (CUDA's interprocess events): the target of a
// mapped put makes its stream wait for the sender's copy, so neither
// side's host waits for it.
type IPCEvents interface {
	// IPCEventNew makes an event of ctx (Streams.Record records it;
	// Streams.FreeEvent frees it) and returns its shareable handle.
	IPCEventNew(ctx uintptr) (ev uintptr, handle [64]byte, err error)
	// IPCEventOpen opens another process's handle in ctx.
	IPCEventOpen(ctx uintptr, handle [64]byte) (uintptr, error)
	// StreamWait makes what is queued on ctx's stream from now on wait
	// for the work before ev's latest recording.
	StreamWait(ctx, ev uintptr) error
}

// PageSpan widens [ptr, ptr+size) to whole host pages, as DMA-BUF export
// requires: the first page's address, the span's length and ptr's offset.
func PageSpan(ptr uintptr, size uint64) (base uintptr, n, off uint64) {
	pg := uintptr(os.Getpagesize())
	base = ptr &^ (pg - 1)
	end := (ptr + uintptr(size) + pg - 1) &^ (pg - 1)
	return base, uint64(end - base), uint64(ptr - base)
}

// MarkWaiter is implemented by a device whose agent can wait for a peer's
// agent mark before a signal (NCCL_RMA_WASM_INTRANODE_MARK_WAIT_DEVICE):
// the target's host then queues a marked put+signal's signal without
// waiting for the mark itself.
type MarkWaiter interface {
	// HostRegisterReadOnly pins [p, p+n), mapped read-only here (a peer's
	// mark page), for the device to read; HostRegisterer's HostUnregister
	// undoes it.
	HostRegisterReadOnly(ctx uintptr, p unsafe.Pointer, n uint64) error
	// SignalAfterMark queues, after the work queued on ctx so far, the
	// write (add false) or atomic add of v to the device word sig, run
	// once the host word mark (pinned by HostRegisterReadOnly) reached
	// mv, or skipped once the pinned host word release (0: none) is not
	// 0. false (and no error): ctx runs no agent, or it cannot reach mark
	// or release.
	SignalAfterMark(ctx, sig uintptr, v uint64, add bool, mark uintptr, mv uint64, release uintptr) (bool, error)
	// MarkWaitsSkipped is how many such signals the agents skipped: the
	// release word was set (the peer exited), or no mark within 30 s.
	MarkWaitsSkipped() uint64
}

// HostRegisterer is implemented by a device that can pin host memory it
// did not allocate (cuMemHostRegister): the intra-node staging ring, shared
// memory mapped by two processes, is pinned at both ends this way.
type HostRegisterer interface {
	// HostRegister pins [p, p+n) for copies of every context; ctx is a
	// context to register from.
	HostRegister(ctx uintptr, p unsafe.Pointer, n uint64) error
	// HostUnregister undoes HostRegister before the memory is unmapped;
	// ctx is the one HostRegister was given (the calling thread may have
	// none current).
	HostUnregister(ctx uintptr, p unsafe.Pointer)
}

var current atomic.Pointer[Device]

// Register installs the device implementation (nil removes it).
func Register(d Device) {
	if d == nil {
		current.Store(nil)
		return
	}
	current.Store(&d)
}

// Get returns the registered device, or nil when there is none.
func Get() Device {
	if p := current.Load(); p != nil {
		return *p
	}
	return nil
}
