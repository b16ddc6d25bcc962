package devrt

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// The stuck-copy watch. A synchronous device copy that never completes
// hangs the operation it serves with nothing in the log: the driver does
// not fail it. The known cause is work queued on the application's
// context ahead of the copy (GIN kernels launched back to back, the next
// one waiting for the running one, which waits for this copy: SPEC.md §4,
// "Copies queued behind the application's kernels"). So each synchronous
// copy takes a slot with its start time, and a goroutine WARNs once per
// copy that has waited stuckAfter, naming the remedies. Two atomic
// stores per copy; a copy finding every slot taken goes unwatched.

const stuckSlots = 64

// stuckAfter is how long a copy runs before its WARN, in ns (tests
// shorten it before the first copy; atomic, as the watch reads it).
var stuckAfter atomic.Int64

func init() { stuckAfter.Store(int64(5 * time.Second)) }

type copySlot struct {
	since atomic.Int64 // Now() in ns at start; 0: free
	n     atomic.Uint64
	to    atomic.Bool
	said  atomic.Bool
}

var stuck struct {
	once  sync.Once
	slots [stuckSlots]copySlot
	next  atomic.Uint32
}

var epoch = time.Now()

// beginCopy marks a copy as running; endCopy(slot) unmarks it (-1: none).
func beginCopy(n uint64, toDevice bool) int {
	stuck.once.Do(func() { go watchStuck() })
	now := int64(time.Since(epoch)) + 1
	start := stuck.next.Add(1)
	for k := uint32(0); k < 4; k++ { // a few tries: a busy table skips the watch
		i := int((start + k) % stuckSlots)
		s := &stuck.slots[i]
		if s.since.CompareAndSwap(0, now) {
			s.n.Store(n)
			s.to.Store(toDevice)
			s.said.Store(false)
			return i
		}
	}
	return -1
}

func endCopy(i int) {
	if i >= 0 {
		stuck.slots[i].since.Store(0)
	}
}

func watchStuck() {
	for range time.Tick(time.Duration(stuckAfter.Load()) / 5) {
		now := int64(time.Since(epoch))
		for i := range stuck.slots {
			s := &stuck.slots[i]
			t := s.since.Load()
			if t == 0 || now-t < stuckAfter.Load() || s.said.Swap(true) {
				continue
			}
			dir := "from"
			if s.to.Load() {
				dir = "to"
			}
			logx.Warn(abi.SubsysNet, "NET/wasm: a copy of %d bytes %s device memory has waited %v and not completed: work the application queued on its context ahead of it (kernels launched back to back, the next waiting for the one that waits for this operation) can hold the plugin's copies. Copies of cuMem-mapped memory (ncclMemAlloc) run in a context of the plugin's own unless NCCL_RMA_WASM_COPY_CONTEXT=0; other device memory (cudaMalloc) shares the application's: allocate windows and signals with ncclMemAlloc, or set CUDA_DEVICE_MAX_CONNECTIONS=32 before CUDA starts (SPEC.md §4)",
				s.n.Load(), dir, time.Duration(now-t).Round(time.Second))
		}
	}
}
