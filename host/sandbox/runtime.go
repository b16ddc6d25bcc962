package sandbox

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// One wazero Runtime per (memory cap, cache dir) for the whole process, with
// the host module "rmaw" and a deny-everything WASI instantiated once. Guest
// instances are anonymous, so one CompiledModule serves every context.

type rtKey struct {
	pages    uint32
	cacheDir string
}

type sharedRuntime struct {
	rt wazero.Runtime
	// WASI is compiled and instantiated on first need (wasi()): the
	// embedded default imports none of it, and compiling its host functions
	// is a visible part of a cold start (BENCH.md, "Figures behind the code").
	wasiOnce sync.Once
	wasiFns  map[string]api.FunctionDefinition
	wasiErr  error
	// cacheDir holds metered modules (metercache.go); "" when the
	// compilation cache is off or unusable.
	cacheDir string

	mu       sync.Mutex
	compiled map[[32]byte]*compiledEntry
}

type compiledEntry struct {
	once sync.Once
	cm   wazero.CompiledModule
	err  error
}

var (
	runtimesMu sync.Mutex
	runtimes   = map[rtKey]*sharedRuntime{}
	caches     = map[string]wazero.CompilationCache{}
)

// defaultCacheDir is os.UserCacheDir()/rccl-rma-wasm, or a per-user folder in
// the temp dir when there is no user cache directory.
func defaultCacheDir() string {
	if d, err := os.UserCacheDir(); err == nil && d != "" {
		return filepath.Join(d, "rccl-rma-wasm")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("rccl-rma-wasm-%d", os.Getuid()))
}

func getRuntime(pages uint32, cacheDir string) (*sharedRuntime, error) {
	runtimesMu.Lock()
	defer runtimesMu.Unlock()
	k := rtKey{pages, cacheDir}
	if r := runtimes[k]; r != nil {
		return r, nil
	}
	ctx := context.Background()
	cfg := wazero.NewRuntimeConfig().
		WithMemoryLimitPages(pages).
		WithCloseOnContextDone(false). // metering instead: see package meter
		WithCoreFeatures(api.CoreFeaturesV2)
	usedDir := ""
	if cacheDir != "off" {
		cc := caches[cacheDir]
		if cc == nil {
			// wazero writes each entry to a temp file and renames it into
			// place, so processes sharing the directory never see a torn
			// entry (internal/filecache/file_cache.go).
			if err := os.MkdirAll(cacheDir, 0o700); err != nil {
				logx.Warn(0, "wasm: compilation cache %s unusable (%v); compiling without it", cacheDir, err)
			} else if c, err := wazero.NewCompilationCacheWithDir(cacheDir); err != nil {
				logx.Warn(0, "wasm: compilation cache %s unusable (%v); compiling without it", cacheDir, err)
			} else {
				cc = c
				caches[cacheDir] = c
			}
		}
		if cc != nil {
			cfg = cfg.WithCompilationCache(cc)
			usedDir = cacheDir
		}
	}
	rt := wazero.NewRuntimeWithConfig(ctx, cfg)
	if _, err := hostModule(rt).Instantiate(ctx); err != nil {
		_ = rt.Close(ctx)
		return nil, fmt.Errorf("wasm: instantiating host module: %w", err)
	}
	r := &sharedRuntime{rt: rt, cacheDir: usedDir, compiled: map[[32]byte]*compiledEntry{}}
	runtimes[k] = r
	return r, nil
}

// wasi instantiates the deny-everything WASI in the runtime once and returns
// its functions. Modules that import WASI call it before they are
// instantiated (validate does).
func (r *sharedRuntime) wasi() (map[string]api.FunctionDefinition, error) {
	r.wasiOnce.Do(func() {
		ctx := context.Background()
		cm, err := wasi_snapshot_preview1.NewBuilder(r.rt).Compile(ctx)
		if err != nil {
			r.wasiErr = fmt.Errorf("wasm: compiling WASI: %w", err)
			return
		}
		if _, err := r.rt.InstantiateModule(ctx, cm, wazero.NewModuleConfig()); err != nil {
			r.wasiErr = fmt.Errorf("wasm: instantiating WASI: %w", err)
			return
		}
		r.wasiFns = cm.ExportedFunctions()
	})
	return r.wasiFns, r.wasiErr
}

// compile meters and compiles a module once per process and runtime. The
// metered bytes come from the disk cache when they are there (metercache.go).
func (r *sharedRuntime) compile(wasm []byte) (wazero.CompiledModule, error) {
	sum := sha256.Sum256(wasm)
	r.mu.Lock()
	e := r.compiled[sum]
	if e == nil {
		e = &compiledEntry{}
		r.compiled[sum] = e
	}
	r.mu.Unlock()
	e.once.Do(func() {
		metered, free, err := meterCached(r.cacheDir, wasm, sum)
		if err != nil {
			e.err = err
			return
		}
		// wazero copies what it keeps (function bodies, data segments), so
		// the metered bytes can go once CompileModule returns.
		// On a cache miss, compile functions on up to 4 threads (a Go
		// guest: ~1.2 s on one, see SPEC.md §8.8); a hit does not use them.
		ctx := experimental.WithCompilationWorkers(context.Background(), min(runtime.GOMAXPROCS(0), 4))
		e.cm, e.err = r.rt.CompileModule(ctx, metered)
		free()
	})
	if e.err != nil {
		// Do not cache failures: a fixed file with the same name is a new hash
		// anyway, but keep the map small.
		r.mu.Lock()
		delete(r.compiled, sum)
		r.mu.Unlock()
	}
	return e.cm, e.err
}

// Host functions, module "rmaw".

type instKey struct{}

func instanceFrom(ctx context.Context) *instance {
	in, _ := ctx.Value(instKey{}).(*instance)
	return in
}

const (
	i32 = api.ValueTypeI32
)

func hostModule(rt wazero.Runtime) wazero.HostModuleBuilder {
	b := rt.NewHostModuleBuilder(guestabi.ImportModule)
	b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(hostLog), []api.ValueType{i32, i32, i32}, []api.ValueType{i32}).
		WithParameterNames("level", "ptr", "len").Export(guestabi.ImportLog)
	b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(hostGetConfig), []api.ValueType{i32, i32}, []api.ValueType{i32}).
		WithParameterNames("buf", "limit").Export(guestabi.ImportGetConfig)
	return b
}

// Fuel charged by host functions, in instruction units.
const (
	fuelLog       = 2000
	fuelGetConfig = 200
)

func hostLog(ctx context.Context, mod api.Module, stack []uint64) {
	in := instanceFrom(ctx)
	level, ptr, n := int32(stack[0]), uint32(stack[1]), uint32(stack[2])
	if n > guestabi.MaxLogLen {
		n = guestabi.MaxLogLen
	}
	buf, ok := mod.Memory().Read(ptr, n)
	if !ok {
		stack[0] = statusWord(guestabi.StatusErrBounds)
		return
	}
	if level < guestabi.LogError || level > guestabi.LogTrace {
		stack[0] = statusWord(guestabi.StatusErrInval)
		return
	}
	name := "?"
	if in != nil {
		in.charge(fuelLog + int64(n))
		name = in.b.name
		if !in.out.admit(int(n)) { // over the output limits (instance.go)
			stack[0] = 0
			return
		}
	}
	msg := strings.TrimRight(string(buf), "\n")
	switch level {
	case guestabi.LogError, guestabi.LogWarn:
		logx.Warn(0, "wasm guest %s: %s", name, msg)
	case guestabi.LogInfo:
		logx.Info(0, "wasm guest %s: %s", name, msg)
	case guestabi.LogTrace:
		logx.Trace(0, "wasm guest %s: %s", name, msg)
	default:
		stack[0] = statusWord(guestabi.StatusErrInval)
		return
	}
	stack[0] = 0
}

func hostGetConfig(ctx context.Context, mod api.Module, stack []uint64) {
	in := instanceFrom(ctx)
	buf, limit := uint32(stack[0]), uint32(stack[1])
	cfg := ""
	if in != nil {
		cfg = in.b.config
		in.charge(fuelGetConfig + int64(min(limit, uint32(len(cfg)))))
	}
	n := min(uint32(len(cfg)), limit)
	if n > 0 && !mod.Memory().WriteString(buf, cfg[:n]) {
		stack[0] = statusWord(guestabi.StatusErrBounds)
		return
	}
	stack[0] = uint64(uint32(len(cfg)))
}

func statusWord(s int32) uint64 { return uint64(uint32(s)) }
