package plugin

import (
	"encoding/binary"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
)

// putsAtDepth has rank i post n 8-byte puts with a signal (add 1 to word
// i) to every other rank on context ctx, without testing any: op k sends
// the word i<<32|ctx<<24|k from src[base+k] to dst[i*size+base+k].
func putsAtDepth(t *testing.T, rs []*rank, i int, ctx int32, base, n, size int) []uint64 {
	t.Helper()
	r := rs[i]
	var reqs []uint64
	for p := range rs {
		if p == i {
			continue
		}
		for k := 0; k < n; k++ {
			off := 8 * (base + k)
			binary.LittleEndian.PutUint64(r.src[off:], uint64(i)<<32|uint64(ctx)<<24|uint64(base+k))
			req, res := IputSignal(r.rma, ctx, uint64(off), r.srcMh, 8, uint64(i*size+off), r.dstMh, uint32(p), uint64(8*i), r.sigMh, 1, abi.SignalOpAdd, true, 0)
			if res != abi.Success {
				t.Fatalf("rank %d: iputSignal %d to %d on context %d: %v", i, k, p, ctx, res)
			}
			reqs = append(reqs, req)
		}
	}
	return reqs
}

// checkArrived waits for every signal and checks every word of ops
// [0, n) from each sender.
func checkArrived(t *testing.T, rs []*rank, n, size int, perCtx int) {
	t.Helper()
	for q, r := range rs {
		for i := range rs {
			if i == q {
				continue
			}
			want := uint64(n)
			deadline := time.Now().Add(30 * time.Second)
			for signalWord(r.sig, i) < want && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if got := signalWord(r.sig, i); got != want {
				t.Fatalf("rank %d: signal from %d is %d, want %d (an operation was lost)", q, i, got, want)
			}
			for k := 0; k < n; k++ {
				ctx := k / perCtx
				got := binary.LittleEndian.Uint64(r.dst[i*size+8*k:])
				if w := uint64(i)<<32 | uint64(ctx)<<24 | uint64(k); got != w {
					t.Fatalf("rank %d: word %d from %d = %#x, want %#x", q, k, i, got, w)
				}
			}
		}
	}
}

// TestGinQueueDepth: NCCL's GIN proxy keeps up to 32 x maxRecvs
// operations in flight per context and peer before it tests any. Every
// rank posts that many on each of two contexts to each peer, then as many
// again, with no test() in between: all are accepted at once, and every
// byte and signal arrives.
func TestGinQueueDepth(t *testing.T) {
	const n, perCtx = 3, 2 * ginQueueDepth
	size := 8 * 2 * perCtx
	rs := setupEnv(t, n, size, map[string]string{"NCCL_RMA_WASM_INTRANODE": "0"})
	reqs := make([][]uint64, n)
	var wg sync.WaitGroup
	for i := range rs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for ctx := int32(0); ctx < 2; ctx++ {
				reqs[i] = append(reqs[i], putsAtDepth(t, rs, i, ctx, int(ctx)*perCtx, ginQueueDepth, size)...)
				reqs[i] = append(reqs[i], putsAtDepth(t, rs, i, ctx, int(ctx)*perCtx+ginQueueDepth, ginQueueDepth, size)...)
			}
		}(i)
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	checkArrived(t, rs, 2*perCtx, size, perCtx)
	for i, r := range rs {
		for _, req := range reqs[i] {
			if res := wait(t, r.coll, req); res != abi.Success {
				t.Fatalf("rank %d: request %#x: %v", i, req, res)
			}
		}
	}
}

// TestSlotsFullWaits: with the pool cut to NCCL's depth for one (context,
// peer) pair, the operation past it waits instead of failing, and goes as
// soon as another thread's test() frees a slot; nothing is lost. With
// nobody testing, it fails after the bound with ncclInternalError and a
// WARN naming the cause, having accepted nothing.
func TestSlotsFullWaits(t *testing.T) {
	if slabSize != ginQueueDepth {
		t.Fatalf("a slab holds %d requests, NCCL's depth is %d: the test assumes they are equal", slabSize, ginQueueDepth)
	}
	const n = 2
	size := 8 * (ginQueueDepth + 2)
	rs := setupEnv(t, n, size, map[string]string{"NCCL_RMA_WASM_INTRANODE": "0"})
	r := rs[0]
	rc := lookupRma(r.rma)
	rc.reqs.mu.Lock()
	rc.reqs.limit = 1
	rc.reqs.mu.Unlock()
	reqs := putsAtDepth(t, rs, 0, 0, 0, ginQueueDepth, size)

	type answer struct {
		req uint64
		res abi.Result
	}
	extra := make(chan answer, 1)
	binary.LittleEndian.PutUint64(r.src[8*ginQueueDepth:], uint64(ginQueueDepth))
	go func() {
		req, res := IputSignal(r.rma, 0, uint64(8*ginQueueDepth), r.srcMh, 8, uint64(8*ginQueueDepth), r.dstMh, 1, 0, r.sigMh, 1, abi.SignalOpAdd, true, 0)
		extra <- answer{req, res}
	}()
	// No slot is free until a test() frees one, so it cannot have returned.
	for signalWord(rs[1].sig, 0) < ginQueueDepth {
		time.Sleep(time.Millisecond)
	}
	select {
	case a := <-extra:
		t.Fatalf("the operation past a full pool returned (%v) before a slot was freed", a.res)
	default:
	}
	if res := wait(t, r.coll, reqs[0]); res != abi.Success {
		t.Fatalf("first request: %v", res)
	}
	a := <-extra
	if a.res != abi.Success {
		t.Fatalf("the waiting operation: %v", a.res)
	}
	reqs = append(reqs[1:], a.req)
	deadline := time.Now().Add(30 * time.Second)
	for signalWord(rs[1].sig, 0) < ginQueueDepth+1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := signalWord(rs[1].sig, 0); got != ginQueueDepth+1 {
		t.Fatalf("signal %d, want %d", got, ginQueueDepth+1)
	}
	for k := 0; k <= ginQueueDepth; k++ {
		if got := binary.LittleEndian.Uint64(rs[1].dst[8*k:]); got != uint64(k) {
			t.Fatalf("word %d = %d, want %d", k, got, k)
		}
	}

	// Full again, and nobody tests: the bound runs out.
	old := slotWait
	slotWait = 20 * time.Millisecond
	defer func() { slotWait = old }()
	slotWarn.Reset()
	warns := warnings(t)
	if _, res := Iput(r.rma, 0, 0, r.srcMh, 8, 8*uint64(ginQueueDepth+1), r.dstMh, 1, 0); res != abi.InternalError {
		t.Fatalf("past the bound: %v, want ncclInternalError", res)
	}
	if w := warns(); len(w) != 1 || !strings.Contains(w[0], "iput refused: all 256 request slots") || !strings.Contains(w[0], "NCCL_GIN_PROXY_QUEUE_SIZE") {
		t.Errorf("WARN lines %q, want one naming the full request slots", w)
	}
	for _, req := range reqs {
		if res := wait(t, r.coll, req); res != abi.Success {
			t.Fatalf("request %#x: %v", req, res)
		}
	}
}
