package conformance

// The checks, each a method of the run's kit.

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/sandbox"
)

type check struct {
	name string
	what string
	run  func(k *kit) (string, error)
}

var checks = []check{
	{"devices", "rmaw_devices lists 1..8 sane devices (or the default)", (*kit).devices},
	{"conn-plan", "rmaw_conn_plan answers for 1, 2, 8, 64 and 4096 ranks, every rank position", (*kit).connPlan},
	{"context", "a context opens, plans, reports and closes", (*kit).oneContext},
	{"plan-op-kinds", "plan_op on put, putSignal, get and flush at sizes 0 B .. 1 TiB", (*kit).planKinds},
	{"plan-op-hostile", "plan_op with unknown kinds, peers 2^32-1, sizes 2^63-1, every flag bit, odd signal ops, pre-filled lanes", (*kit).planHostile},
	{"plan-op-volume", "many plan_op calls in a row stay within budget and log little", (*kit).planVolume},
	{"completions", "completion batches of 0, 1, cap, cap+1 and 10x cap records", (*kit).completions},
	{"completions-hostile", "completion records with unknown kinds, error statuses, huge sizes, peers and latencies", (*kit).completionsHostile},
	{"many-contexts", "many contexts open at once, each used, all closed, then one more", (*kit).manyContexts},
	{"metrics", "rmaw_metrics (if exported) returns Prometheus text the host accepts, during and at the close of a context", (*kit).metrics},
	{"finalize", "contexts and the backend close with status 0 and no fault was counted", (*kit).finalize},
}

func (k *kit) open(commID uint64, nranks, rank, contexts int32) (backend.Context, error) {
	return k.b.NewContext(backend.ContextInfo{CommID: commID, NRanks: nranks, Rank: rank, Contexts: contexts})
}

// openFor opens a context for a check that needs what (on says whether the
// context enables it). Without it, the context is closed again and openFor
// returns no context and the check's result, that there is nothing to drive.
func (k *kit) openFor(commID uint64, nranks, rank, contexts int32, on func(backend.Context) bool, what string) (backend.Context, string, error) {
	c, err := k.open(commID, nranks, rank, contexts)
	if err != nil {
		return nil, "", err
	}
	if !on(c) {
		c.Close()
		return nil, what + " not enabled; nothing to drive", nil
	}
	return c, "", nil
}

func (k *kit) devices() (string, error) {
	ds := k.b.Devices()
	if len(ds) < 1 || len(ds) > guestabi.MaxDevices {
		return "", fmt.Errorf("%d devices, want 1..%d", len(ds), guestabi.MaxDevices)
	}
	names := make([]string, len(ds))
	for i, d := range ds {
		names[i] = fmt.Sprintf("%s %d Mbps", d.Name, d.SpeedMbps)
	}
	return strings.Join(names, ", "), nil
}

func (k *kit) connPlan() (string, error) {
	seen := map[backend.ConnPlan]bool{}
	for _, n := range []int32{1, 2, 8, 64, 4096} {
		for _, r := range []int32{0, 1, n / 2, n - 1} {
			if r >= n {
				continue
			}
			p, err := k.b.ConnectionPlan(n, r)
			if err != nil {
				return "", fmt.Errorf("rmaw_conn_plan(%d ranks, rank %d): %w", n, r, err)
			}
			seen[p] = true
		}
	}
	return fmt.Sprintf("%d distinct plan(s)", len(seen)), nil
}

// planOne runs one PlanOp and turns a guest error into a check failure.
func planOne(c backend.Context, op backend.Op, lane int32) (backend.OpPlan, error) {
	p := backend.OpPlan{Lane: lane}
	if !c.PlansOps() {
		return p, nil
	}
	if err := c.PlanOp(&op, &p); err != nil {
		return p, fmt.Errorf("plan_op(kind %d, peer %d, size %d, flags %#x, signal op %d): %w",
			op.Kind, op.Peer, op.Size, op.OptFlags, op.SignalOp, err)
	}
	if p.Lane < -1 || p.Lane >= abi.MaxLanes {
		return p, fmt.Errorf("plan_op answered lane %d", p.Lane)
	}
	return p, nil
}

func (k *kit) oneContext() (string, error) {
	c, err := k.open(7, 2, 0, 1)
	if err != nil {
		return "", fmt.Errorf("rmaw_ctx_open: %w", err)
	}
	if _, err := planOne(c, backend.Op{Kind: backend.OpPut, Peer: 1, Size: 4096}, -1); err != nil {
		c.Close()
		return "", err
	}
	if c.WantsCompletions() {
		if err := c.Completions([]backend.Completion{{Kind: backend.OpPut, Peer: 1, Size: 4096, Latency: 20000}}); err != nil {
			c.Close()
			return "", fmt.Errorf("rmaw_completions: %w", err)
		}
	}
	if err := c.Close(); err != nil {
		return "", fmt.Errorf("rmaw_ctx_close: %w", err)
	}
	return fmt.Sprintf("plan_op %v, completions %v", c.PlansOps(), c.WantsCompletions()), nil
}

func (k *kit) planKinds() (string, error) {
	c, skip, err := k.openFor(8, 4, 1, 1, backend.Context.PlansOps, "plan_op")
	if c == nil {
		return skip, err
	}
	defer c.Close()
	failed, chunked, delayed, coded, lanes := 0, 0, 0, 0, map[int32]int{}
	for _, kind := range []backend.OpKind{backend.OpPut, backend.OpPutSignal, backend.OpGet, backend.OpFlush} {
		for _, size := range []uint64{0, 1, 8, 4096, 64 << 10, 1 << 20, 256 << 20, 1 << 30, 1 << 40} {
			for peer := uint32(0); peer < 4; peer++ {
				op := backend.Op{Kind: kind, Peer: peer, Size: size}
				if kind == backend.OpPutSignal {
					op.SignalOp = 1
				}
				p, err := planOne(c, op, -1)
				if err != nil {
					return "", err
				}
				if p.Status != 0 {
					failed++
				}
				if p.ChunkSize != 0 {
					chunked++
				}
				if p.DelayNs != 0 {
					delayed++
				}
				if p.Codec != 0 {
					coded++
				}
				lanes[p.Lane]++
			}
		}
	}
	return fmt.Sprintf("%d ops, %d failed on purpose, lanes used %v; v1.1: %d with chunk_size, %d delayed, %d with a codec",
		4*9*4, failed, lanes, chunked, delayed, coded), nil
}

func (k *kit) planHostile() (string, error) {
	c, skip, err := k.openFor(math.MaxUint64, 1<<20, 1<<20-1, 64, backend.Context.PlansOps, "plan_op")
	if c == nil {
		return skip, err
	}
	defer c.Close()
	n := 0
	for _, kind := range []backend.OpKind{0, 5, 99, math.MaxUint32} {
		for _, peer := range []uint32{0, 1 << 20, math.MaxUint32} {
			for _, size := range []uint64{0, math.MaxInt64, math.MaxUint64} {
				for _, lane := range []int32{-1, 0, abi.MaxLanes - 1} {
					op := backend.Op{Kind: kind, Peer: peer, Size: size, OptFlags: math.MaxUint32, SignalOp: math.MaxUint32}
					if _, err := planOne(c, op, lane); err != nil {
						return "", err
					}
					n++
				}
			}
		}
	}
	return fmt.Sprintf("%d ops", n), nil
}

func (k *kit) planVolume() (string, error) {
	c, skip, err := k.openFor(9, 8, 3, 1, backend.Context.PlansOps, "plan_op")
	if c == nil {
		return skip, err
	}
	defer c.Close()
	k.takeLogs()
	for i := 0; i < k.o.Ops; i++ {
		op := backend.Op{Kind: backend.OpKind(1 + i%3), Peer: uint32(i % 8), Size: uint64(8) << (i % 24)}
		if _, err := planOne(c, op, -1); err != nil {
			return "", fmt.Errorf("call %d: %w", i+1, err)
		}
	}
	if l := len(k.takeLogs()); l > k.o.Ops/100 {
		return "", fmt.Errorf("%d log lines for %d plan_op calls: log from the control plane (init, ctx_close, finalize), not per op", l, k.o.Ops)
	}
	return fmt.Sprintf("%d calls", k.o.Ops), nil
}

func (k *kit) completions() (string, error) {
	c, skip, err := k.openFor(10, 2, 0, 1, backend.Context.WantsCompletions, "completions")
	if c == nil {
		return skip, err
	}
	defer c.Close()
	capn := int(k.b.Info().CompCap)
	total := 0
	for _, n := range []int{0, 1, capn, capn + 1, 10 * capn} {
		batch := make([]backend.Completion, n)
		for i := range batch {
			batch[i] = backend.Completion{Kind: backend.OpKind(1 + i%4), Peer: uint32(i % 2), Size: uint64(i) * 512, Latency: uint64(1000 + i)}
		}
		if err := c.Completions(batch); err != nil {
			return "", fmt.Errorf("a batch of %d records (area holds %d): %w", n, capn, err)
		}
		total += n
	}
	return fmt.Sprintf("%d records, ring of %d", total, capn), nil
}

func (k *kit) completionsHostile() (string, error) {
	c, skip, err := k.openFor(11, 2, 1, 1, backend.Context.WantsCompletions, "completions")
	if c == nil {
		return skip, err
	}
	defer c.Close()
	var batch []backend.Completion
	for _, kind := range []backend.OpKind{0, 5, math.MaxUint32} {
		for _, st := range []int32{1, 6, 7, -1, math.MaxInt32} {
			batch = append(batch, backend.Completion{Kind: kind, Peer: math.MaxUint32, Size: math.MaxUint64, Status: st, Latency: math.MaxUint64})
			batch = append(batch, backend.Completion{Kind: backend.OpPut, Peer: 1 << 20, Size: 0, Status: st, Latency: 0})
		}
	}
	if err := c.Completions(batch); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d records", len(batch)), nil
}

func (k *kit) manyContexts() (string, error) {
	cs := make([]backend.Context, 0, k.o.Contexts)
	var errs []error
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	for i := 0; i < k.o.Contexts; i++ {
		c, err := k.open(uint64(100+i/8), 8, int32(i%8), 8)
		if err != nil {
			return "", fmt.Errorf("context %d of %d: %w", i+1, k.o.Contexts, err)
		}
		cs = append(cs, c)
	}
	for i, c := range cs {
		if _, err := planOne(c, backend.Op{Kind: backend.OpPut, Peer: uint32(i % 8), Size: 1 << 20}, -1); err != nil {
			return "", fmt.Errorf("context %d: %w", i+1, err)
		}
		if c.WantsCompletions() {
			if err := c.Completions([]backend.Completion{{Kind: backend.OpPut, Peer: uint32(i % 8), Size: 1 << 20, Latency: 1e5}}); err != nil {
				return "", fmt.Errorf("context %d: %w", i+1, err)
			}
		}
	}
	for i, c := range cs {
		if err := c.Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing context %d: %w", i+1, err))
		}
	}
	cs = cs[:0]
	if len(errs) > 0 {
		return "", errors.Join(errs...)
	}
	c, err := k.open(200, 2, 0, 1)
	if err != nil {
		return "", fmt.Errorf("a context after closing %d: %w", k.o.Contexts, err)
	}
	cs = append(cs, c)
	return fmt.Sprintf("%d contexts", k.o.Contexts), nil
}

// metrics loads the module a second time with a metrics file, so that the
// host calls rmaw_metrics after every completion batch and at the close.
func (k *kit) metrics() (string, error) {
	if !slices.Contains(k.b.Info().Exports, guestabi.ExportMetrics) {
		return "rmaw_metrics not exported; nothing to drive", nil
	}
	dir, err := os.MkdirTemp("", "rmaw-test-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "metrics.prom")
	abs, _ := filepath.Abs(k.path)
	bi, err := sandbox.Open(sandbox.Options{Name: abs, Config: k.o.Config, CacheDir: "off", MemoryLimitMiB: k.o.MemoryLimitMiB,
		CallTimeout: k.o.CallTimeout, MetricsFile: file, MetricsInterval: time.Nanosecond})
	if err != nil {
		return "", err
	}
	b := bi.(*sandbox.Backend)
	defer b.Close()
	c, err := b.NewContext(backend.ContextInfo{CommID: 13, NRanks: 4, Rank: 2, Contexts: 1})
	if err != nil {
		return "", err
	}
	for i := 0; i < 3 && c.WantsCompletions(); i++ {
		if err := c.Completions([]backend.Completion{{Kind: backend.OpPut, Peer: uint32(i), Size: 4096, Latency: 30000, Lane: -1}}); err != nil {
			c.Close()
			return "", fmt.Errorf("completions with metrics export: %w", err)
		}
	}
	if err := c.Close(); err != nil {
		return "", fmt.Errorf("close with metrics export: %w", err)
	}
	if inf := b.Info(); inf.Faults != 0 {
		return "", fmt.Errorf("%d fault(s) with the metrics export (see the log lines)", inf.Faults)
	}
	text, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("the host wrote no metrics file: %w", err)
	}
	return fmt.Sprintf("%d bytes of text, %d lines", len(text), strings.Count(string(text), "\n")), nil
}

func (k *kit) finalize() (string, error) {
	k.takeLogs()
	c, err := k.open(12, 2, 0, 1)
	if err != nil {
		return "", err
	}
	if err := c.Close(); err != nil {
		return "", fmt.Errorf("rmaw_ctx_close: %w", err)
	}
	if err := k.b.Close(); err != nil {
		return "", err
	}
	for _, l := range k.takeLogs() {
		if strings.Contains(l, guestabi.ExportFinalize) || strings.Contains(l, guestabi.ExportCtxClose) {
			return "", fmt.Errorf("%s", l)
		}
	}
	if inf := k.b.Info(); inf.Faults != 0 || inf.Disabled {
		return "", fmt.Errorf("%d fault(s) over the whole run, disabled %v", inf.Faults, inf.Disabled)
	}
	return "", nil
}
