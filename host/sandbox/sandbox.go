// Package sandbox runs a backend's policy as a WebAssembly guest under wazero
// (Guest ABI v1, SPEC.md §8) and presents it as a backend.Backend.
//
// A module is validated, metered (meter.go) and compiled once per process;
// the Backend keeps one "control" instance for process-wide questions
// (devices, connection plans) and every backend.Context gets an instance of
// its own. Guests see only their own linear memory, the "rmaw" host module
// (log, get_config) and a WASI that denies everything. Every call runs on a
// fuel budget, so a guest that loops forever is stopped; traps and nonsense
// answers become errors, the instance is replaced, and after MaxFaults the
// backend is disabled.
package sandbox

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

//go:embed embedded/default.wasm
var defaultWasm []byte

// DefaultWasm returns the embedded default backend (guests/c/passthrough.c).
func DefaultWasm() []byte { return defaultWasm }

// Defaults of Options.
const (
	// The defaults of NCCL_RMA_WASM_GUEST_MEMORY_MB and _GUEST_TIMEOUT_MS.
	DefaultMemoryLimitMiB = config.DefaultGuestMemoryMiB
	DefaultCallTimeout    = config.DefaultGuestTimeout
	// MaxFaults is how many traps/nonsense answers a backend survives (each
	// replaces the instance that faulted); the next one disables it. Running
	// out of fuel (a guest that does not return) disables it at once.
	MaxFaults = 3
	// fuelPerNs calibrates budgets: one unit is one wasm instruction;
	// compiled code runs roughly one simple instruction per ns or faster.
	fuelPerNs = 1
	// planFuelDivisor: rmaw_plan_op gets CallTimeout/planFuelDivisor.
	planFuelDivisor = 100
)

// Options selects and limits a guest backend.
type Options struct {
	// Name is "" or "default" for the embedded default backend, a path to a
	// .wasm file (contains a '/' or ends in ".wasm"), or a module name looked
	// up as <Dir>/<Name>.wasm.
	Name string
	// Dir holds backend modules (NCCL_RMA_WASM_DIR).
	Dir string
	// CacheDir is the on-disk compilation cache; "" = default
	// (os.UserCacheDir()/rccl-rma-wasm), "off" disables it.
	CacheDir string
	// Config is handed to the guest at init; when empty, the file
	// <module>.conf beside the module is used if it exists.
	Config string
	// MemoryLimitMiB caps each instance's linear memory (default 64).
	MemoryLimitMiB uint32
	// CallTimeout bounds control-plane calls (init, contexts, completions);
	// rmaw_plan_op gets 1/100 of it. Default 100 ms.
	CallTimeout time.Duration
}

// OptionsFromEnv reads the NCCL_RMA_WASM_* variables through host/config.
// Unparsable values are reported with a WARN and replaced by defaults.
func OptionsFromEnv() Options {
	return Options{
		Name:           config.Backend.Get(),
		Dir:            config.Dir.Get(),
		CacheDir:       config.CacheDir.Get(),
		Config:         config.BackendConfig.Get(),
		MemoryLimitMiB: uint32(config.GuestMemoryMiB.Get()),
		CallTimeout:    config.GuestTimeout.Get(),
	}
}

// ErrTimeout is wrapped by errors of calls that ran out of their budget.
var ErrTimeout = errors.New("guest exceeded its time budget")

// Backend is a loaded guest module.
type Backend struct {
	name     string
	config   string
	rt       *sharedRuntime
	cm       wazero.CompiledModule
	ctlFuel  int64
	planFuel int64
	exports  map[string]bool

	devices []backend.DeviceInfo

	ctlMu sync.Mutex
	ctl   *instance // control instance (devices, connection plans)

	faults   atomic.Int32
	disabled atomic.Bool
	nextCtx  atomic.Int32
	closed   atomic.Bool
}

var _ backend.Backend = (*Backend)(nil)

// Open loads, validates and initialises a guest backend.
func Open(opts Options) (backend.Backend, error) {
	b, err := open(opts)
	if err != nil {
		return nil, err
	}
	return b, nil
}

func open(opts Options) (*Backend, error) {
	if opts.MemoryLimitMiB == 0 {
		opts.MemoryLimitMiB = DefaultMemoryLimitMiB
	}
	if opts.MemoryLimitMiB > 4096 {
		return nil, fmt.Errorf("wasm: memory limit %d MiB exceeds 4096", opts.MemoryLimitMiB)
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = DefaultCallTimeout
	}
	if opts.CacheDir == "" {
		opts.CacheDir = defaultCacheDir()
	}
	name, wasm, freeWasm, cfg, err := resolve(opts)
	if err != nil {
		return nil, err
	}
	defer freeWasm()
	b := &Backend{
		name:     name,
		config:   cfg,
		ctlFuel:  int64(opts.CallTimeout.Nanoseconds()) * fuelPerNs,
		planFuel: max(int64(opts.CallTimeout.Nanoseconds())*fuelPerNs/planFuelDivisor, 10000),
	}
	if len(b.config) > guestabi.MaxConfigLen {
		return nil, fmt.Errorf("wasm backend %s: configuration is %d bytes, the limit is %d", name, len(b.config), guestabi.MaxConfigLen)
	}
	rt, err := getRuntime(opts.MemoryLimitMiB*16, opts.CacheDir)
	if err != nil {
		return nil, err
	}
	cm, err := rt.compile(wasm)
	if err != nil {
		return nil, fmt.Errorf("wasm backend %s: %w", name, err)
	}
	b.cm, b.rt = cm, rt
	if err := b.validate(rt); err != nil {
		return nil, fmt.Errorf("wasm backend %s: %w", name, err)
	}
	ctl, err := b.newInstance()
	if err != nil {
		return nil, fmt.Errorf("wasm backend %s: %w", name, err)
	}
	b.ctl = ctl
	if b.devices, err = ctl.devices(); err != nil {
		ctl.close()
		return nil, fmt.Errorf("wasm backend %s: %w", name, err)
	}
	logx.Info(0, "wasm: backend %s loaded (features plan_op=%v completions=%v, %d device(s))",
		name, ctl.features&guestabi.FeaturePlanOp != 0, ctl.features&guestabi.FeatureCompletions != 0, len(b.devices))
	return b, nil
}

// resolve finds the module bytes and its configuration. The caller calls
// free when it no longer needs wasm (a file is read outside the Go heap).
func resolve(opts Options) (name string, wasm []byte, free func(), cfg string, err error) {
	cfg = opts.Config
	switch n := opts.Name; {
	case n == "" || n == "default":
		return "default", defaultWasm, func() {}, cfg, nil
	case n == "native":
		return "", nil, nil, "", errors.New("wasm: backend \"native\" has no module; use backend.Native{}")
	default:
		path := n
		if !strings.Contains(n, "/") && !strings.HasSuffix(n, ".wasm") {
			if opts.Dir == "" {
				return "", nil, nil, "", fmt.Errorf("wasm: backend %q: %s is not set (it names the directory of .wasm backends)", n, config.Dir.Name)
			}
			path = filepath.Join(opts.Dir, n+".wasm")
		}
		name = strings.TrimSuffix(filepath.Base(path), ".wasm")
		wasm, free, err = readFileOffHeap(path)
		if err != nil {
			return "", nil, nil, "", fmt.Errorf("wasm: backend %q: %w", n, err)
		}
		if cfg == "" {
			conf := strings.TrimSuffix(path, ".wasm") + ".conf"
			if c, err := os.ReadFile(conf); err == nil {
				cfg = string(c)
			} else if !errors.Is(err, os.ErrNotExist) {
				free()
				return "", nil, nil, "", fmt.Errorf("wasm: backend %q: reading %s: %w", n, conf, err)
			}
		}
		return name, wasm, free, cfg, nil
	}
}

type sig struct {
	params, results []api.ValueType
	required        bool
}

var (
	tI32 = api.ValueTypeI32
	tI64 = api.ValueTypeI64
)

var exportSigs = map[string]sig{
	guestabi.Marker:            {nil, nil, true},
	guestabi.ExportInit:        {[]api.ValueType{tI64}, []api.ValueType{tI64}, true},
	guestabi.ExportArea:        {nil, []api.ValueType{tI32}, true},
	guestabi.ExportInitialize:  {nil, nil, false},
	guestabi.ExportDevices:     {[]api.ValueType{tI32}, []api.ValueType{tI32}, false},
	guestabi.ExportConnPlan:    {[]api.ValueType{tI32, tI32}, []api.ValueType{tI32}, false},
	guestabi.ExportCtxOpen:     {[]api.ValueType{tI32, tI64, tI32, tI32, tI32}, []api.ValueType{tI32}, false},
	guestabi.ExportCtxClose:    {[]api.ValueType{tI32}, []api.ValueType{tI32}, false},
	guestabi.ExportPlanOp:      {[]api.ValueType{tI32, tI32, tI32, tI64, tI32, tI32}, []api.ValueType{tI32}, false},
	guestabi.ExportCompletions: {[]api.ValueType{tI32, tI32}, []api.ValueType{tI32}, false},
	guestabi.ExportFinalize:    {nil, []api.ValueType{tI32}, false},
}

var importSigs = map[string]sig{
	guestabi.ImportLog:       {[]api.ValueType{tI32, tI32, tI32}, []api.ValueType{tI32}, false},
	guestabi.ImportGetConfig: {[]api.ValueType{tI32, tI32}, []api.ValueType{tI32}, false},
}

func typeString(ps, rs []api.ValueType) string {
	f := func(ts []api.ValueType) string {
		s := make([]string, len(ts))
		for i, t := range ts {
			s[i] = api.ValueTypeName(t)
		}
		return "(" + strings.Join(s, ", ") + ")"
	}
	return f(ps) + " -> " + f(rs)
}

func sameTypes(a, b []api.ValueType) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func (b *Backend) validate(rt *sharedRuntime) error {
	exps := b.cm.ExportedFunctions()
	if _, ok := exps[guestabi.Marker]; !ok {
		var other []string
		for n := range exps {
			if strings.HasPrefix(n, guestabi.MarkerPrefix) {
				other = append(other, n)
			}
		}
		if len(other) > 0 {
			return fmt.Errorf("module declares Guest ABI %s; this host speaks %s only",
				strings.TrimPrefix(strings.Join(other, ", "), guestabi.MarkerPrefix[:len(guestabi.MarkerPrefix)-1]), guestabi.Marker)
		}
		return fmt.Errorf("missing export %q: not an rccl-rma-wasm guest (Guest ABI v1)", guestabi.Marker)
	}
	b.exports = map[string]bool{}
	for name, s := range exportSigs {
		d, ok := exps[name]
		if !ok {
			if s.required {
				return fmt.Errorf("missing export %q %s", name, typeString(s.params, s.results))
			}
			continue
		}
		if !sameTypes(d.ParamTypes(), s.params) || !sameTypes(d.ResultTypes(), s.results) {
			return fmt.Errorf("export %q has type %s, Guest ABI v1 wants %s", name,
				typeString(d.ParamTypes(), d.ResultTypes()), typeString(s.params, s.results))
		}
		b.exports[name] = true
	}
	if _, ok := b.cm.ExportedMemories()[guestabi.ExportMemory]; !ok {
		return fmt.Errorf("missing export %q (the guest's linear memory)", guestabi.ExportMemory)
	}
	if ms := b.cm.ImportedMemories(); len(ms) > 0 {
		mod, n, _ := ms[0].Import()
		return fmt.Errorf("module imports memory %s.%s; a guest must define and export its own", mod, n)
	}
	for _, d := range b.cm.ImportedFunctions() {
		mod, n, _ := d.Import()
		switch mod {
		case guestabi.ImportModule:
			s, ok := importSigs[n]
			if !ok {
				return fmt.Errorf("module imports %s.%s, which this host does not provide (it provides %s.%s and %s.%s)",
					mod, n, mod, guestabi.ImportLog, mod, guestabi.ImportGetConfig)
			}
			if !sameTypes(d.ParamTypes(), s.params) || !sameTypes(d.ResultTypes(), s.results) {
				return fmt.Errorf("import %s.%s has type %s, the host provides %s", mod, n,
					typeString(d.ParamTypes(), d.ResultTypes()), typeString(s.params, s.results))
			}
		case guestabi.WASIModule:
			fns, err := rt.wasi()
			if err != nil {
				return err
			}
			w, ok := fns[n]
			if !ok {
				return fmt.Errorf("module imports %s.%s, which this host does not provide", mod, n)
			}
			if !sameTypes(d.ParamTypes(), w.ParamTypes()) || !sameTypes(d.ResultTypes(), w.ResultTypes()) {
				return fmt.Errorf("import %s.%s has type %s, the host provides %s", mod, n,
					typeString(d.ParamTypes(), d.ResultTypes()), typeString(w.ParamTypes(), w.ResultTypes()))
			}
		default:
			return fmt.Errorf("module imports %s.%s, which this host does not provide (allowed modules: %q, %q)",
				mod, n, guestabi.ImportModule, guestabi.WASIModule)
		}
	}
	return nil
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return b.name }

// Devices implements backend.Backend.
func (b *Backend) Devices() []backend.DeviceInfo {
	out := make([]backend.DeviceInfo, len(b.devices))
	copy(out, b.devices)
	return out
}

// Disabled reports whether the backend was disabled after faults.
func (b *Backend) Disabled() bool { return b.disabled.Load() }

// ConnectionPlan implements backend.Backend.
func (b *Backend) ConnectionPlan(nranks, rank int32) (backend.ConnPlan, error) {
	plan := backend.DefaultConnPlan()
	if !b.exports[guestabi.ExportConnPlan] {
		return plan, nil
	}
	if b.disabled.Load() {
		return plan, backend.ErrDisabled
	}
	b.ctlMu.Lock()
	defer b.ctlMu.Unlock()
	if b.ctl == nil {
		in, err := b.newInstance()
		if err != nil {
			return plan, b.fault(err)
		}
		b.ctl = in
	}
	p, err := b.ctl.connPlan(nranks, rank, plan)
	if err != nil {
		if !isGuestStatus(err) {
			b.ctl.close()
			b.ctl = nil
			return plan, b.fault(err)
		}
		return plan, err
	}
	return p, nil
}

// NewContext implements backend.Backend: one guest instance per context.
func (b *Backend) NewContext(info backend.ContextInfo) (backend.Context, error) {
	if b.disabled.Load() {
		return nil, backend.ErrDisabled
	}
	c := &guestContext{b: b, info: info, id: b.nextCtx.Add(1)}
	if err := c.revive(); err != nil {
		return nil, err
	}
	return c, nil
}

// Close implements backend.Backend. The compiled module stays cached for
// the life of the process.
func (b *Backend) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	b.ctlMu.Lock()
	defer b.ctlMu.Unlock()
	if b.ctl != nil {
		b.ctl.finalize()
		b.ctl.close()
		b.ctl = nil
	}
	return nil
}

// fault counts a fault and disables the backend when it is a timeout or the
// MaxFaults-th one. It returns err, annotated.
func (b *Backend) fault(err error) error {
	n := b.faults.Add(1)
	if errors.Is(err, ErrTimeout) || n >= MaxFaults {
		if !b.disabled.Swap(true) {
			logx.Warn(0, "wasm: backend %s disabled after %d fault(s); last: %v", b.name, n, err)
		}
	} else {
		logx.Warn(0, "wasm: backend %s fault %d/%d, instance replaced: %v", b.name, n, MaxFaults, err)
	}
	return err
}

// guestStatusError is a negative status a guest returned on purpose: an
// error for the caller, not a fault of the sandbox.
type guestStatusError struct {
	backend, export string
	status          int32
}

func (e *guestStatusError) Error() string {
	return fmt.Sprintf("wasm backend %s: %s returned status %d", e.backend, e.export, e.status)
}

func isGuestStatus(err error) bool {
	var g *guestStatusError
	return errors.As(err, &g)
}

// instance is one guest instance with its cached functions and stacks.
type instance struct {
	b        *Backend
	mod      api.Module
	mem      api.Memory
	fuel     api.MutableGlobal
	ctx      context.Context
	area     uint32
	compCap  uint32
	features uint64

	fInit, fArea, fDevices, fConnPlan, fCtxOpen, fCtxClose, fPlanOp, fCompletions, fFinalize api.Function

	planStack [6]uint64
	stack     [8]uint64
}

func (b *Backend) newInstance() (*instance, error) {
	in := &instance{b: b}
	in.ctx = context.WithValue(context.Background(), instKey{}, in)
	cfg := wazero.NewModuleConfig().
		WithName("").
		WithStartFunctions().
		WithStdout(&logWriter{name: b.name}).
		WithStderr(&logWriter{name: b.name})
	// The allocator goes on the instantiation context only: calls keep the
	// short in.ctx.
	mod, err := b.rt.rt.InstantiateModule(experimental.WithMemoryAllocator(in.ctx, mmapAllocator{}), b.cm, cfg)
	if err != nil {
		return nil, fmt.Errorf("instantiating: %w", err)
	}
	in.mod = mod
	in.mem = mod.Memory()
	g, ok := mod.ExportedGlobal(fuelExport).(api.MutableGlobal)
	if !ok || in.mem == nil {
		mod.Close(context.Background())
		return nil, errors.New("internal: metering global missing")
	}
	in.fuel = g
	fn := func(name string) api.Function {
		if !b.exports[name] {
			return nil
		}
		return mod.ExportedFunction(name)
	}
	in.fInit, in.fArea, in.fDevices = fn(guestabi.ExportInit), fn(guestabi.ExportArea), fn(guestabi.ExportDevices)
	in.fConnPlan, in.fCtxOpen, in.fCtxClose = fn(guestabi.ExportConnPlan), fn(guestabi.ExportCtxOpen), fn(guestabi.ExportCtxClose)
	in.fPlanOp, in.fCompletions, in.fFinalize = fn(guestabi.ExportPlanOp), fn(guestabi.ExportCompletions), fn(guestabi.ExportFinalize)

	if init := fn(guestabi.ExportInitialize); init != nil {
		if err := in.call(init, guestabi.ExportInitialize, in.stack[:0], b.ctlFuel); err != nil {
			in.close()
			return nil, err
		}
	}
	in.stack[0] = guestabi.FeaturesV1
	if err := in.call(in.fInit, guestabi.ExportInit, in.stack[:1], b.ctlFuel); err != nil {
		in.close()
		return nil, err
	}
	res := int64(in.stack[0])
	if res < 0 {
		in.close()
		return nil, fmt.Errorf("%s failed with status %d", guestabi.ExportInit, res)
	}
	in.features = uint64(res)
	if in.features&^guestabi.FeaturesV1 != 0 {
		in.close()
		return nil, fmt.Errorf("%s enabled features %#x the host did not offer (offered %#x)", guestabi.ExportInit, in.features, guestabi.FeaturesV1)
	}
	if in.features&guestabi.FeaturePlanOp != 0 && in.fPlanOp == nil {
		in.close()
		return nil, fmt.Errorf("%s enabled plan_op but the module does not export %q", guestabi.ExportInit, guestabi.ExportPlanOp)
	}
	if in.features&guestabi.FeatureCompletions != 0 && in.fCompletions == nil {
		in.close()
		return nil, fmt.Errorf("%s enabled completions but the module does not export %q", guestabi.ExportInit, guestabi.ExportCompletions)
	}
	if err := in.call(in.fArea, guestabi.ExportArea, in.stack[:1], b.ctlFuel); err != nil {
		in.close()
		return nil, err
	}
	if err := in.checkArea(uint32(in.stack[0])); err != nil {
		in.close()
		return nil, err
	}
	return in, nil
}

func (in *instance) checkArea(area uint32) error {
	size := uint64(in.mem.Size())
	bad := func(format string, args ...any) error {
		return fmt.Errorf("descriptor area at %#x: "+format, append([]any{area}, args...)...)
	}
	if area%8 != 0 {
		return bad("not 8-byte aligned")
	}
	if uint64(area)+guestabi.AreaMinSize > size {
		return bad("outside linear memory (%d bytes)", size)
	}
	magic, _ := in.mem.ReadUint32Le(area + guestabi.OffMagic)
	ver, _ := in.mem.ReadUint32Le(area + guestabi.OffVersion)
	asz, _ := in.mem.ReadUint32Le(area + guestabi.OffAreaSize)
	ccap, _ := in.mem.ReadUint32Le(area + guestabi.OffCompCap)
	if magic != guestabi.AreaMagic {
		return bad("magic %#x, want %#x", magic, guestabi.AreaMagic)
	}
	if ver != guestabi.Version {
		return bad("version %d, want %d", ver, guestabi.Version)
	}
	if ccap > guestabi.MaxCompCap {
		return bad("completion capacity %d exceeds %d", ccap, guestabi.MaxCompCap)
	}
	need := uint64(guestabi.OffCompletions) + uint64(ccap)*guestabi.CompletionSize
	if uint64(asz) < need {
		return bad("size %d is smaller than the layout needs (%d for %d completion records)", asz, need, ccap)
	}
	if uint64(area)+uint64(asz) > size {
		return bad("size %d runs past linear memory (%d bytes)", asz, size)
	}
	if in.features&guestabi.FeatureCompletions != 0 && ccap == 0 {
		return bad("completions enabled but the area holds no completion records")
	}
	in.area, in.compCap = area, ccap
	return nil
}

// charge takes fuel from the running call (host functions).
func (in *instance) charge(n int64) {
	in.fuel.Set(uint64(int64(in.fuel.Get()) - n))
}

// call runs f with a fuel budget. Errors name the export and tell a timeout
// (ErrTimeout) from a trap.
func (in *instance) call(f api.Function, export string, stack []uint64, fuel int64) error {
	in.fuel.Set(uint64(fuel))
	err := f.CallWithStack(in.ctx, stack)
	if err == nil {
		return nil
	}
	if int64(in.fuel.Get()) < 0 {
		return fmt.Errorf("%s: %w (budget %d instructions): %v", export, ErrTimeout, fuel, firstLine(err))
	}
	return fmt.Errorf("%s trapped: %v", export, firstLine(err))
}

func firstLine(err error) string {
	s := err.Error()
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func (in *instance) close() {
	if in != nil && in.mod != nil {
		_ = in.mod.Close(context.Background())
		in.mod = nil
	}
}

func (in *instance) finalize() {
	if in.fFinalize != nil && in.mod != nil {
		if err := in.call(in.fFinalize, guestabi.ExportFinalize, in.stack[:1], in.b.ctlFuel); err != nil {
			logx.Warn(0, "wasm backend %s: %v", in.b.name, err)
		}
	}
}

func (in *instance) devices() ([]backend.DeviceInfo, error) {
	def := []backend.DeviceInfo{backend.DefaultDevice()}
	if in.fDevices == nil {
		return def, nil
	}
	in.stack[0] = guestabi.MaxDevices
	if err := in.call(in.fDevices, guestabi.ExportDevices, in.stack[:1], in.b.ctlFuel); err != nil {
		return nil, err
	}
	n := int32(in.stack[0])
	if n < 0 {
		return nil, fmt.Errorf("%s failed with status %d", guestabi.ExportDevices, n)
	}
	if n == 0 || n > guestabi.MaxDevices {
		return nil, fmt.Errorf("%s returned %d devices, want 1..%d", guestabi.ExportDevices, n, guestabi.MaxDevices)
	}
	out := make([]backend.DeviceInfo, n)
	for i := range out {
		base := in.area + guestabi.OffDevices + uint32(i)*guestabi.DeviceSize
		raw, _ := in.mem.Read(base+guestabi.DevOffName, 64)
		name := string(raw)
		if j := strings.IndexByte(name, 0); j >= 0 {
			name = name[:j]
		}
		if len(name) > guestabi.DeviceNameMax {
			name = name[:guestabi.DeviceNameMax]
		}
		speed, _ := in.mem.ReadUint32Le(base + guestabi.DevOffSpeedMbps)
		lat, _ := in.mem.ReadFloat32Le(base + guestabi.DevOffLatencyUs)
		if name == "" {
			return nil, fmt.Errorf("%s: device %d has an empty name", guestabi.ExportDevices, i)
		}
		if int32(speed) <= 0 {
			return nil, fmt.Errorf("%s: device %d speed %d Mbps is not positive", guestabi.ExportDevices, i, int32(speed))
		}
		if !(lat >= 0 && lat < 1e6) || math.IsNaN(float64(lat)) {
			return nil, fmt.Errorf("%s: device %d latency %v us is out of range", guestabi.ExportDevices, i, lat)
		}
		out[i] = backend.DeviceInfo{Name: name, SpeedMbps: int32(speed), LatencyUs: lat}
	}
	return out, nil
}

func (in *instance) connPlan(nranks, rank int32, def backend.ConnPlan) (backend.ConnPlan, error) {
	m, a := in.mem, in.area
	m.WriteUint32Le(a+guestabi.OffConnLanes, uint32(def.Lanes))
	m.WriteUint32Le(a+guestabi.OffConnTransport, uint32(def.Transport))
	m.WriteUint64Le(a+guestabi.OffConnStripe, def.StripeThreshold)
	m.WriteUint64Le(a+guestabi.OffConnChunk, def.ChunkSize)
	in.stack[0], in.stack[1] = uint64(uint32(nranks)), uint64(uint32(rank))
	if err := in.call(in.fConnPlan, guestabi.ExportConnPlan, in.stack[:2], in.b.ctlFuel); err != nil {
		return def, err
	}
	if st := int32(in.stack[0]); st != 0 {
		if st < 0 {
			return def, &guestStatusError{in.b.name, guestabi.ExportConnPlan, st}
		}
		return def, fmt.Errorf("%s returned status %d (want 0 or negative)", guestabi.ExportConnPlan, st)
	}
	lanes, _ := m.ReadUint32Le(a + guestabi.OffConnLanes)
	tr, _ := m.ReadUint32Le(a + guestabi.OffConnTransport)
	stripe, _ := m.ReadUint64Le(a + guestabi.OffConnStripe)
	chunk, _ := m.ReadUint64Le(a + guestabi.OffConnChunk)
	p := backend.ConnPlan{Lanes: int32(lanes), Transport: backend.Transport(int32(tr)), StripeThreshold: stripe, ChunkSize: chunk}
	switch {
	case p.Lanes < 1 || p.Lanes > abi.MaxLanes:
		return def, fmt.Errorf("%s: lanes %d outside 1..%d", guestabi.ExportConnPlan, p.Lanes, abi.MaxLanes)
	case p.Transport < backend.TransportAuto || p.Transport > backend.TransportIntraNode:
		return def, fmt.Errorf("%s: unknown transport %d", guestabi.ExportConnPlan, p.Transport)
	case p.ChunkSize == 0 || p.ChunkSize > 1<<40:
		return def, fmt.Errorf("%s: chunk size %d outside 1..2^40", guestabi.ExportConnPlan, p.ChunkSize)
	}
	return p, nil
}

// logWriter forwards a guest's stdout/stderr (e.g. a Go panic) to the log.
type logWriter struct {
	name string
	mu   sync.Mutex
	buf  []byte
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			break
		}
		logx.Warn(0, "wasm guest %s (stdio): %s", w.name, w.buf[:i])
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) > 4096 {
		logx.Warn(0, "wasm guest %s (stdio): %s", w.name, w.buf)
		w.buf = w.buf[:0]
	}
	return len(p), nil
}

var _ io.Writer = (*logWriter)(nil)
