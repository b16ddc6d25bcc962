package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/guests/buildflags"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
)

// forgetProcessState closes the shared runtimes that use cacheDir and drops
// their compiled modules and cache object, so the next Open with cacheDir
// starts like a fresh process with a warm disk cache. Runtimes of other
// directories (held by other tests, the host package's backend cache) stay.
func forgetProcessState(cacheDir string) {
	runtimesMu.Lock()
	defer runtimesMu.Unlock()
	for k, r := range runtimes {
		if k.cacheDir == cacheDir {
			_ = r.rt.Close(context.Background())
			delete(runtimes, k)
		}
	}
	if c := caches[cacheDir]; c != nil {
		_ = c.Close(context.Background())
		delete(caches, cacheDir)
	}
}

var (
	goGuestOnce sync.Once
	goGuestPath string
	goGuestErr  []byte
)

// goGuest is build/guests/passthrough-go.wasm (make guests), or the same
// module built once into a temp dir.
func goGuest(t testing.TB) string {
	t.Helper()
	if p := filepath.Join(repoRoot(t), "build", "guests", "passthrough-go.wasm"); fileExists(p) {
		return p
	}
	goGuestOnce.Do(func() {
		dir, err := os.MkdirTemp("", "rmaw-goguest-")
		if err != nil {
			goGuestErr = []byte(err.Error())
			return
		}
		out := filepath.Join(dir, "passthrough-go.wasm")
		if err := buildflags.CompileGo(repoRoot(t), "./guests/passthrough-go", out); err != nil {
			goGuestErr = []byte(err.Error())
			return
		}
		goGuestPath = out
	})
	if goGuestPath == "" {
		t.Fatalf("building the Go guest: %s", goGuestErr)
	}
	return goGuestPath
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// coldOnce is the sandbox's share of a cold start: Open (runtime, meter,
// compile from the disk cache, control instance), NewContext (a second
// instance) and one PlanOp.
func coldOnce(tb testing.TB, o Options) (open, ctx time.Duration) {
	t0 := time.Now()
	b, err := Open(o)
	if err != nil {
		tb.Fatal(err)
	}
	t1 := time.Now()
	c, err := b.NewContext(info)
	if err != nil {
		tb.Fatal(err)
	}
	plan := backend.OpPlan{Lane: -1}
	if c.PlansOps() {
		if err := c.PlanOp(&backend.Op{Kind: backend.OpPut, Peer: 0, Size: 8}, &plan); err != nil {
			tb.Fatal(err)
		}
	}
	t2 := time.Now()
	c.Close()
	b.Close()
	return t1.Sub(t0), t2.Sub(t1)
}

func benchCold(b *testing.B, name string) {
	o := Options{Name: name, CacheDir: b.TempDir(), CallTimeout: DefaultCallTimeout}
	forgetProcessState(o.CacheDir)
	coldOnce(b, o) // fills the disk caches
	var open, ctx time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		forgetProcessState(o.CacheDir)
		runtime.GC()
		b.StartTimer()
		o1, c1 := coldOnce(b, o)
		open += o1
		ctx += c1
	}
	b.StopTimer()
	forgetProcessState(o.CacheDir)
	b.ReportMetric(float64(open.Microseconds())/1000/float64(b.N), "open-ms/op")
	b.ReportMetric(float64(ctx.Microseconds())/1000/float64(b.N), "ctx-ms/op")
}

// BenchmarkColdDefault / BenchmarkColdGoSDK: Open + NewContext + PlanOp as
// in a fresh process with a warm disk cache. Profile with
// go test -run X -bench Cold -cpuprofile cpu.out ./host/sandbox
func BenchmarkColdDefault(b *testing.B) { benchCold(b, "default") }
func BenchmarkColdGoSDK(b *testing.B)   { benchCold(b, goGuest(b)) }
