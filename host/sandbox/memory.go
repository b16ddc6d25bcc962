package sandbox

import (
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"unsafe"

	"github.com/tetratelabs/wazero/experimental"
	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// Linear memory outside the Go heap (SPEC.md §8.8, cold start).
//
// wazero's default linear memory is a Go []byte that memory.grow extends
// with append: every grow past the capacity copies the whole memory and
// leaves the old buffer to the GC. A Go guest grows its memory dozens of
// times while its runtime starts, which cost tens of milliseconds per process (BENCH.md,
// "Figures behind the code").
//
// mmapAllocator instead reserves the instance's maximum (the module's max,
// which wazero has already clamped to the runtime's memory cap,
// NCCL_RMA_WASM_GUEST_MEMORY_MB) as PROT_NONE|MAP_NORESERVE address space
// and makes pages readable and writable as the guest grows. The memory never
// moves, so views of it (the descriptor area) stay valid across grows; pages
// come zeroed from the kernel and cost RSS only once touched; nothing of it
// is on the Go heap, so it neither feeds nor slows the GC. wazero calls Free
// when the instance closes, which unmaps it.

type mmapAllocator struct{}

var (
	// mmapFallbacks counts reservations that failed (e.g. RLIMIT_AS) and
	// used Go-heap memory instead.
	mmapFallbacks atomic.Int32
	// liveReservations counts mapped guest memories (tests check that
	// closing instances unmaps them).
	liveReservations atomic.Int64
)

// hugePage is the x86-64/arm64 transparent huge page size. Reservations of
// at least this size are aligned to it and advised MADV_HUGEPAGE: on the
// development VM a 4 KiB first-touch fault is expensive, so a Go guest
// touching its first megabytes paid milliseconds per instance in faults
// (BENCH.md, "Figures behind the code"); with huge pages it is one fault
// per 2 MiB.
const hugePage = 2 << 20

// mapAnon maps n bytes of private anonymous memory with prot, 2 MiB-aligned
// and advised for huge pages when n >= 2 MiB.
func mapAnon(n uintptr, prot, flags int) (unsafe.Pointer, error) {
	flags |= unix.MAP_PRIVATE | unix.MAP_ANON
	if n < hugePage {
		return unix.MmapPtr(-1, 0, nil, n, prot, flags)
	}
	p, err := unix.MmapPtr(-1, 0, nil, n+hugePage, prot, flags)
	if err != nil {
		return nil, err
	}
	start := uintptr(p)
	aligned := (start + hugePage - 1) &^ (hugePage - 1)
	if head := aligned - start; head > 0 {
		_ = unix.MunmapPtr(p, head)
	}
	if tail := start + n + hugePage - (aligned + n); tail > 0 {
		_ = unix.MunmapPtr(unsafe.Add(p, aligned-start+n), tail)
	}
	q := unsafe.Add(p, aligned-start)
	_ = unix.Madvise(unsafe.Slice((*byte)(q), n), unix.MADV_HUGEPAGE) // best effort (THP may be off)
	return q, nil
}

// Allocate implements experimental.MemoryAllocator.
func (mmapAllocator) Allocate(_, max uint64) experimental.LinearMemory {
	if max > 0 && max <= 1<<32 {
		p, err := mapAnon(uintptr(max), unix.PROT_NONE, unix.MAP_NORESERVE)
		if err == nil {
			liveReservations.Add(1)
			return &mmapMemory{res: unsafe.Slice((*byte)(p), max)}
		}
		if mmapFallbacks.Add(1) == 1 {
			logx.Warn(0, "wasm: reserving %d bytes of address space for a guest memory failed (%v); using Go-heap memory, which copies on every grow", max, err)
		}
	}
	return &heapMemory{max: max}
}

// mmapMemory is a reservation of max bytes of which the first committed are
// readable and writable. Commits follow the guest's size exactly (64 KiB
// pages), so huge pages only back 2 MiB ranges the guest owns entirely and
// RSS never exceeds the guest's memory size.
type mmapMemory struct {
	res       []byte // the whole reservation
	committed uint64
}

// Reallocate implements experimental.LinearMemory: it commits up to size and
// returns the first size bytes, always at the same address.
func (m *mmapMemory) Reallocate(size uint64) []byte {
	if m.res == nil || size > uint64(len(m.res)) {
		return nil
	}
	if size > m.committed {
		// size and committed are multiples of the 64 KiB wasm page, so of
		// the OS page too.
		if err := unix.Mprotect(m.res[m.committed:size], unix.PROT_READ|unix.PROT_WRITE); err != nil {
			return nil // memory.grow returns -1 to the guest
		}
		m.committed = size
	}
	return m.res[:size:size]
}

// Free implements experimental.LinearMemory.
func (m *mmapMemory) Free() {
	if m.res != nil {
		_ = unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(m.res)), uintptr(len(m.res)))
		m.res, m.committed = nil, 0
		liveReservations.Add(-1)
	}
}

// heapMemory is the fallback: wazero's default behaviour (append).
type heapMemory struct {
	buf []byte
	max uint64
}

func (m *heapMemory) Reallocate(size uint64) []byte {
	if size > m.max {
		return nil
	}
	if n := uint64(len(m.buf)); size > n {
		m.buf = append(m.buf, make([]byte, size-n)...)
	}
	return m.buf[:size]
}

func (m *heapMemory) Free() { m.buf = nil }

// MaxModuleBytes bounds a backend module file (real backends are a few
// MiB; the host reads the whole file before metering it).
const MaxModuleBytes = 256 << 20

// readFileOffHeap reads a regular file of at most max bytes into anonymous
// huge-page memory outside the Go heap (a 2 MB module read into fresh heap
// costs ~500 faults here). The caller must call free when it no longer uses
// the bytes. It falls back to a bounded ordinary read.
func readFileOffHeap(path string, max int64) (b []byte, free func(), err error) {
	f, st, err := openRegular(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	size := st.Size()
	if size > max {
		return nil, nil, fmt.Errorf("%s is %d bytes; the limit is %d", path, size, max)
	}
	if size < hugePage/2 {
		b, err := readAllBounded(f, path, max)
		return b, func() {}, err
	}
	n := (uintptr(size) + 1 + hugePage - 1) &^ (hugePage - 1) // +1: see a file that grew
	p, err := mapAnon(n, unix.PROT_READ|unix.PROT_WRITE, 0)
	if err != nil {
		b, err := readAllBounded(f, path, max)
		return b, func() {}, err
	}
	buf := unsafe.Slice((*byte)(p), n)
	free = func() { _ = unix.MunmapPtr(p, n) }
	got, err := io.ReadFull(f, buf)
	switch {
	case err == io.ErrUnexpectedEOF || err == io.EOF:
		return buf[:got:got], free, nil
	case err != nil:
		free()
		return nil, nil, err
	}
	free() // the file grew past its stat size: read it the ordinary way
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, nil, err
	}
	b, err = readAllBounded(f, path, max)
	return b, func() {}, err
}

// openRegular opens path for reading only if it is a regular file. The
// open does not block (a FIFO named like a module would otherwise hang the
// caller until a writer came).
func openRegular(path string) (*os.File, os.FileInfo, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	st, err := f.Stat()
	if err == nil && !st.Mode().IsRegular() {
		err = fmt.Errorf("%s is not a regular file (%v)", path, st.Mode().Type())
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, st, nil
}

// readAllBounded reads f to its end, refusing more than max bytes.
func readAllBounded(f *os.File, path string, max int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s is more than %d bytes", path, max)
	}
	return b, nil
}

// readSmallFile reads a regular file of at most max bytes.
func readSmallFile(path string, max int64) ([]byte, error) {
	f, _, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readAllBounded(f, path, max)
}
