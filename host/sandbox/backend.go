package sandbox

// Backend: the loaded, validated module and its control instance, presented
// as a backend.Backend; it counts faults and disables itself after too many.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tetratelabs/wazero"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

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

	exp *exporter // nil unless the module exports rmaw_metrics and a destination is set

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
	if opts.MetricsFile != "" || opts.MetricsAddr != "" {
		if !b.exports[guestabi.ExportMetrics] {
			logx.Info(0, "wasm: backend %s does not export %s; the metrics file and endpoint are not used", name, guestabi.ExportMetrics)
		} else if b.exp, err = newExporter(name, opts.MetricsFile, opts.MetricsAddr, opts.MetricsInterval); err != nil {
			ctl.finalize()
			ctl.close()
			return nil, fmt.Errorf("wasm backend %s: %w", name, err)
		}
	}
	logx.Info(0, "wasm: backend %s loaded (features %#x: plan_op=%v completions=%v chunk=%v delay=%v compression=%v transports=%v, %d device(s))",
		name, ctl.features, ctl.features&guestabi.FeaturePlanOp != 0, ctl.features&guestabi.FeatureCompletions != 0,
		ctl.features&guestabi.FeatureChunk != 0, ctl.features&guestabi.FeatureDelay != 0,
		ctl.features&guestabi.FeatureCompression != 0, ctl.features&guestabi.FeatureTransports != 0, len(b.devices))
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
		wasm, free, err = readFileOffHeap(path, MaxModuleBytes)
		if err != nil {
			return "", nil, nil, "", fmt.Errorf("wasm: backend %q: %w", n, err)
		}
		if cfg == "" {
			conf := strings.TrimSuffix(path, ".wasm") + ".conf"
			if c, err := readSmallFile(conf, guestabi.MaxConfigLen); err == nil {
				cfg = string(c)
			} else if !errors.Is(err, os.ErrNotExist) {
				free()
				return "", nil, nil, "", fmt.Errorf("wasm: backend %q: reading %s: %w", n, conf, err)
			}
		}
		return name, wasm, free, cfg, nil
	}
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
	if b.exp != nil {
		b.exp.close() // the last write has every closed context's final text
	}
	return nil
}

// MetricsAddr is the address the metrics endpoint listens on ("" if none).
func (b *Backend) MetricsAddr() string {
	if b.exp == nil {
		return ""
	}
	return b.exp.addr
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
