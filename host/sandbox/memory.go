package sandbox

import (
	"sync/atomic"

	"github.com/tetratelabs/wazero/experimental"
	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// Linear memory outside the Go heap (SPEC.md §8.8, cold start).
//
// wazero's default linear memory is a Go []byte that memory.grow extends
// with append: every grow past the capacity copies the whole memory and
// leaves the old buffer to the GC. A Go guest grows its memory dozens of
// times while its runtime starts, which cost ~80 ms per process.
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

// mmapFallbacks counts reservations that failed (e.g. RLIMIT_AS) and used
// Go-heap memory instead.
var mmapFallbacks atomic.Int32

// Allocate implements experimental.MemoryAllocator.
func (mmapAllocator) Allocate(_, max uint64) experimental.LinearMemory {
	if max > 0 && max <= 1<<32 {
		b, err := unix.Mmap(-1, 0, int(max), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANON|unix.MAP_NORESERVE)
		if err == nil {
			return &mmapMemory{res: b}
		}
		if mmapFallbacks.Add(1) == 1 {
			logx.Warn(0, "wasm: reserving %d bytes of address space for a guest memory failed (%v); using Go-heap memory, which copies on every grow", max, err)
		}
	}
	return &heapMemory{max: max}
}

// mmapMemory is a reservation of max bytes of which the first committed are
// readable and writable.
type mmapMemory struct {
	res       []byte // the whole reservation, as unix.Mmap returned it
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
		_ = unix.Munmap(m.res)
		m.res, m.committed = nil, 0
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
