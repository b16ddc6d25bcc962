package sandbox

import (
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/plugin"
)

// hostRank is one rank of an in-process communicator driven through the
// plugin runtime with a guest backend.
type hostRank struct {
	coll, rma uint64
	buf, sig  []byte
	bufMh     uint64
	sigMh     uint64
}

// hostComm builds a communicator of n ranks in this process, as NCCL would.
func hostComm(t testing.TB, n, contexts int) []*hostRank {
	t.Helper()
	rs := make([]*hostRank, n)
	handles := make([]*[abi.HandleSize]byte, n)
	listens := make([]uint64, n)
	ctxs := make([]uint64, n)
	for i := range rs {
		ctx, res := plugin.Init(0x42)
		if res != abi.Success {
			t.Fatalf("init: %v", res)
		}
		handles[i] = new([abi.HandleSize]byte)
		if listens[i], res = plugin.Listen(ctx, 0, handles[i]); res != abi.Success {
			t.Fatalf("listen: %v", res)
		}
		ctxs[i] = ctx
		rs[i] = &hostRank{}
	}
	var wg sync.WaitGroup
	for i := range rs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r := rs[i]
			var res abi.Result
			if r.coll, res = plugin.Connect(handles, int32(i), listens[i]); res != abi.Success {
				t.Errorf("connect: %v", res)
				return
			}
			plugin.CloseListen(listens[i])
			if r.rma, res = plugin.CreateContext(r.coll, abi.RmaConfig{NContexts: int32(contexts), RankStride: 1}); res != abi.Success {
				t.Errorf("createContext: %v", res)
				return
			}
			r.buf, r.sig = make([]byte, 4096*(n+1)), make([]byte, 8*n) // slot n is the source
			if r.bufMh, res = plugin.RegMr(r.coll, uintptr(unsafe.Pointer(&r.buf[0])), uint64(len(r.buf)), abi.PtrHost, 0); res != abi.Success {
				t.Errorf("regMr: %v", res)
			}
			if r.sigMh, res = plugin.RegMr(r.coll, uintptr(unsafe.Pointer(&r.sig[0])), uint64(len(r.sig)), abi.PtrHost, 0); res != abi.Success {
				t.Errorf("regMr: %v", res)
			}
		}(i)
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Cleanup(func() {
		for i, r := range rs {
			plugin.DeregMr(r.coll, r.bufMh)
			plugin.DeregMr(r.coll, r.sigMh)
			plugin.DestroyContext(r.rma)
			plugin.CloseColl(r.coll)
			plugin.Finalize(ctxs[i])
		}
	})
	return rs
}

func hostWait(t *testing.T, coll, req uint64) abi.Result {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if done, res := plugin.Test(coll, req); done || res != abi.Success {
			return res
		}
		runtime.Gosched() // let the data path's goroutines run on few cores
	}
	t.Fatal("request did not complete")
	return abi.InternalError
}

// useGuest points the runtime at a guest backend for this test.
func useGuest(t testing.TB, wasm, cfg string) {
	dir := t.TempDir()
	b, err := os.ReadFile(wasm)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "planner.wasm"), b)
	env := map[string]string{config.Backend.Name: "planner", config.Dir.Name: dir, config.BackendConfig.Name: cfg, config.IntraNode.Name: "0",
		config.CacheDir.Name: "off", config.Addr.Name: "127.0.0.1"}
	config.SetGetenv(func(k string) string { return env[k] })
	t.Cleanup(func() { config.SetGetenv(os.Getenv) })
	plugin.RegisterGuestLoader(func(name string) (backend.Backend, error) {
		o := OptionsFromEnv()
		o.Name = name
		return Open(o)
	})
}

// TestManyCommunicatorsWithPlanner runs six communicators in one process,
// each with three guest contexts planning every operation, driven from
// several goroutines at once, and checks every byte and signal.
func TestManyCommunicatorsWithPlanner(t *testing.T) {
	useGuest(t, cguest(t, "planner"), "lanes=1")
	const n, contexts = 6, 3
	rs := hostComm(t, n, contexts)
	for i, r := range rs {
		for j := 0; j < 4096; j++ {
			r.buf[n*4096+j] = byte(i + 3*j)
		}
	}
	var wg sync.WaitGroup
	for i := range rs {
		for c := 0; c < contexts; c++ {
			wg.Add(1)
			go func(i, c int) {
				defer wg.Done()
				r := rs[i]
				for p := c; p < n; p += contexts {
					// Each sender owns a 4 KiB slot at every target.
					req, res := plugin.IputSignal(r.rma, int32(c), uint64(n*4096), r.bufMh, 4096, uint64(i*4096), r.bufMh,
						uint32(p), uint64(8*i), r.sigMh, 0, abi.SignalOpInc, true, 0)
					if res != abi.Success || hostWait(t, r.coll, req) != abi.Success {
						t.Errorf("rank %d -> %d: %v", i, p, res)
					}
				}
			}(i, c)
		}
	}
	wg.Wait()
	for i, r := range rs {
		for p := 0; p < n; p++ {
			deadline := time.Now().Add(10 * time.Second)
			for atomic.LoadUint64((*uint64)(unsafe.Pointer(&r.sig[8*p]))) != 1 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if got := atomic.LoadUint64((*uint64)(unsafe.Pointer(&r.sig[8*p]))); got != 1 {
				t.Fatalf("rank %d: signal from %d = %d", i, p, got)
			}
			for j := 0; j < 4096; j++ {
				if r.buf[p*4096+j] != byte(p+3*j) {
					t.Fatalf("rank %d: byte %d from %d wrong", i, j, p)
				}
			}
		}
		if bad, _ := plugin.QueryLastError(r.rma); bad {
			t.Fatalf("rank %d: sticky error after a clean run", i)
		}
	}
}

// TestGuestFaultsFailOnlyTheirOps injects policy failures and traps through
// the whole runtime: the affected requests fail, queryLastError reports the
// traps, and every other operation still lands.
func TestGuestFaultsFailOnlyTheirOps(t *testing.T) {
	for _, cfg := range []string{"lanes=1, fail_every=3", "lanes=1, trap_every=4"} {
		t.Run(cfg, func(t *testing.T) {
			useGuest(t, cguest(t, "planner"), cfg)
			rs := hostComm(t, 2, 1)
			r := rs[0]
			ok, failed := 0, 0
			for k := 0; k < 8; k++ {
				req, res := plugin.Iput(r.rma, 0, 0, r.bufMh, 64, 64, r.bufMh, 1, 0)
				if res != abi.Success {
					t.Fatalf("iput %d: %v", k, res)
				}
				if hostWait(t, r.coll, req) == abi.Success {
					ok++
				} else {
					failed++
				}
			}
			if failed == 0 || ok == 0 {
				t.Fatalf("%d ok, %d failed: want some of each", ok, failed)
			}
			t.Logf("%s: %d ok, %d failed", cfg, ok, failed)
		})
	}
}

// benchHostPut8 measures 8-byte puts to a peer through the runtime with a
// guest backend (or native), bursts of 64 then tests, like rmabench.
func benchHostPut8(b *testing.B, wasm, cfg string) {
	if wasm != "" {
		useGuest(b, wasm, cfg)
	} else {
		env := map[string]string{config.Backend.Name: "native", config.Addr.Name: "127.0.0.1", config.IntraNode.Name: "0"}
		config.SetGetenv(func(k string) string { return env[k] })
		b.Cleanup(func() { config.SetGetenv(os.Getenv) })
	}
	rs := hostComm(b, 2, 1)
	r := rs[0]
	reqs := make([]uint64, 0, 64)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req, res := plugin.Iput(r.rma, 0, 0, r.bufMh, 8, 64, r.bufMh, 1, 0)
		if res != abi.Success {
			b.Fatal(res)
		}
		reqs = append(reqs, req)
		if len(reqs) == cap(reqs) || i == b.N-1 {
			for _, q := range reqs {
				for {
					if done, res := plugin.Test(r.coll, q); done || res != abi.Success {
						break
					}
				}
			}
			reqs = reqs[:0]
		}
	}
}

func BenchmarkHostPut8Native(b *testing.B)  { benchHostPut8(b, "", "") }
func BenchmarkHostPut8Planner(b *testing.B) { benchHostPut8(b, cguest(b, "planner"), "lanes=1") }
func BenchmarkHostPut8PlannerNoCompletions(b *testing.B) {
	benchHostPut8(b, cguest(b, "planner"), "lanes=1, completions=0")
}

// TestGuestBatchesThroughRuntime: a Wasm guest plans aggregated puts in
// batches (rmaw_plan_ops) through the whole runtime, over real sockets,
// two contexts: every byte lands, the signal posted last (from the other
// context, without the hint) is applied after all of them, nothing fails.
func TestGuestBatchesThroughRuntime(t *testing.T) {
	useGuest(t, cguest(t, "plan11"), "batch=1, plan=1, lanes=1, op_codec=1")
	const n = 2
	rs := hostComm(t, n, 2)
	r0, r1 := rs[0], rs[1]
	for j := 0; j < 4096; j++ {
		r0.buf[n*4096+j] = byte(7*j + 1)
	}
	var reqs []uint64
	for k := uint64(0); k < 150; k++ { // two full batches of 64 and a rest
		req, res := plugin.Iput(r0.rma, 0, n*4096+k*20, r0.bufMh, 20, k*20, r0.bufMh, 1, abi.OptFlagAggregateRequests)
		if res != abi.Success {
			t.Fatal(res)
		}
		reqs = append(reqs, req)
	}
	sreq, res := plugin.IputSignal(r0.rma, 1, 0, 0, 0, 0, 0, 1, 0, r0.sigMh, 0, abi.SignalOpInc, true, 0)
	if res != abi.Success || hostWait(t, r0.coll, sreq) != abi.Success {
		t.Fatalf("signal: %v", res)
	}
	sig := (*uint64)(unsafe.Pointer(&r1.sig[0]))
	deadline := time.Now().Add(10 * time.Second)
	for atomic.LoadUint64(sig) != 1 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Microsecond)
	}
	if atomic.LoadUint64(sig) != 1 {
		t.Fatal("signal never arrived")
	}
	for j := 0; j < 150*20; j++ {
		if r1.buf[j] != r0.buf[n*4096+j] {
			t.Fatalf("byte %d: %d, want %d (signal before the batched puts?)", j, r1.buf[j], r0.buf[n*4096+j])
		}
	}
	for k, req := range reqs {
		if st := hostWait(t, r0.coll, req); st != abi.Success {
			t.Fatalf("put %d: %v", k, st)
		}
	}
	if bad, _ := plugin.QueryLastError(r0.rma); bad {
		t.Fatal("sticky error after a clean run")
	}
}
