package sandbox

// Instances: one guest instance with its cached functions, the fuel each
// call runs on, and the checks that turn its answers into Go values.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/sandbox/meter"
)

// instance is one guest instance with its cached functions and stacks.
type instance struct {
	b     *Backend
	mod   api.Module
	mem   api.Memory
	fuel  api.MutableGlobal
	depth api.MutableGlobal // frames left (meter.DepthExport)
	// depthLow: the last call failed and may have left depth low; a call
	// that returns normally gives back every frame it took, so the host
	// resets the counter only after a failure.
	depthLow bool
	// charged: a host function took fuel during the running call, which
	// may have left the counter negative without a trap. Only then does
	// the host read the counter back after a call that returned.
	charged bool
	// planView is the plan descriptor in guest memory, kept when the
	// memory is reserved (memory.go: it never moves); nil otherwise.
	planView []byte
	ctx      context.Context
	area     uint32
	compCap  uint32
	features uint64

	out outState // output limits

	fInit, fArea, fDevices, fConnPlan, fCtxOpen, fCtxClose, fPlanOp, fCompletions, fFinalize, fMetrics, fPlanOps api.Function
	batchCap                                                                                                     uint32 // plan records the area holds (FeaturePlanBatch)

	planStack [6]uint64
	stack     [8]uint64
}

func (b *Backend) newInstance() (*instance, error) {
	in := &instance{b: b, depthLow: true}
	in.ctx = &instCtx{Context: context.Background(), in: in}
	fallbacks := mmapFallbacks.Load()
	cfg := wazero.NewModuleConfig().
		WithName("").
		WithStartFunctions().
		WithStdout(&logWriter{in: in}).
		WithStderr(&logWriter{in: in})
	// The allocator goes on the instantiation context only: calls keep the
	// short in.ctx.
	mod, err := b.rt.rt.InstantiateModule(experimental.WithMemoryAllocator(in.ctx, mmapAllocator{}), b.cm, cfg)
	if err != nil {
		return nil, fmt.Errorf("instantiating: %w", err)
	}
	in.mod = mod
	in.mem = mod.Memory()
	g, ok := mod.ExportedGlobal(meter.FuelExport).(api.MutableGlobal)
	d, ok2 := mod.ExportedGlobal(meter.DepthExport).(api.MutableGlobal)
	if !ok || !ok2 || in.mem == nil {
		mod.Close(context.Background())
		return nil, errors.New("internal: metering global missing")
	}
	in.fuel, in.depth = g, d
	reserved := mmapFallbacks.Load() == fallbacks // no instance fell back meanwhile, so neither did this one
	fn := func(name string) api.Function {
		if !b.exports[name] {
			return nil
		}
		return mod.ExportedFunction(name)
	}
	in.fInit, in.fArea, in.fDevices = fn(guestabi.ExportInit), fn(guestabi.ExportArea), fn(guestabi.ExportDevices)
	in.fConnPlan, in.fCtxOpen, in.fCtxClose = fn(guestabi.ExportConnPlan), fn(guestabi.ExportCtxOpen), fn(guestabi.ExportCtxClose)
	in.fPlanOp, in.fCompletions, in.fFinalize = fn(guestabi.ExportPlanOp), fn(guestabi.ExportCompletions), fn(guestabi.ExportFinalize)
	in.fMetrics = fn(guestabi.ExportMetrics)
	in.fPlanOps = fn(guestabi.ExportPlanOps)

	if init := fn(guestabi.ExportInitialize); init != nil {
		if err := in.call(init, guestabi.ExportInitialize, in.stack[:0], b.ctlFuel); err != nil {
			in.close()
			return nil, err
		}
	}
	in.stack[0] = guestabi.FeaturesV11
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
	if in.features&^guestabi.FeaturesV11 != 0 {
		in.close()
		return nil, fmt.Errorf("%s enabled features %#x the host did not offer (offered %#x)", guestabi.ExportInit, in.features, guestabi.FeaturesV11)
	}
	if in.features&(guestabi.FeatureChunk|guestabi.FeatureDelay) != 0 && in.features&guestabi.FeaturePlanOp == 0 {
		in.close()
		return nil, fmt.Errorf("%s enabled plan.chunk_size or plan.delay_ns (features %#x) without plan_op, which is the only call that sets them", guestabi.ExportInit, in.features)
	}
	if in.features&guestabi.FeaturePlanOp != 0 && in.fPlanOp == nil {
		in.close()
		return nil, fmt.Errorf("%s enabled plan_op but the module does not export %q", guestabi.ExportInit, guestabi.ExportPlanOp)
	}
	if in.features&guestabi.FeaturePlanBatch != 0 && (in.fPlanOps == nil || in.features&guestabi.FeaturePlanOp == 0) {
		in.close()
		return nil, fmt.Errorf("%s enabled plan batches but the module does not export %q or does not enable plan_op too", guestabi.ExportInit, guestabi.ExportPlanOps)
	}
	if in.features&guestabi.FeatureLaneEvents != 0 && in.features&guestabi.FeatureCompletions == 0 {
		in.close()
		return nil, fmt.Errorf("%s enabled lane events without completions, which is the only call that carries them", guestabi.ExportInit)
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
	if reserved {
		in.planView, _ = in.mem.Read(in.area+guestabi.OffPlan, guestabi.PlanSize)
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
	if in.features&guestabi.FeaturePlanBatch != 0 {
		in.batchCap = min((asz-guestabi.OffCompletions)/guestabi.BatchRecordSize, guestabi.MaxBatch)
		if in.batchCap == 0 {
			return bad("plan batches enabled but the area (%d bytes) holds no %d-byte plan record", asz, guestabi.BatchRecordSize)
		}
	}
	in.area, in.compCap = area, ccap
	return nil
}

// instCtx is the context of every call into an instance: it carries the
// instance for the host functions. wazero looks a key up in it on every
// call (its snapshotter), which walks a context.WithValue chain but is
// one comparison here; that is a few ns of the per-op hook.
type instCtx struct {
	context.Context // Background: no deadline, never done
	in              *instance
}

// Value implements context.Context.
func (c *instCtx) Value(key any) any {
	if key == (instKey{}) {
		return c.in
	}
	return nil
}

// charge takes fuel from the running call (host functions).
func (in *instance) charge(n int64) {
	in.charged = true
	in.fuel.Set(uint64(int64(in.fuel.Get()) - n))
}

// call runs f with a fuel budget. Errors name the export and tell a timeout
// (ErrTimeout) from a trap.
func (in *instance) call(f api.Function, export string, stack []uint64, fuel int64) error {
	in.fuel.Set(uint64(fuel))
	in.charged = false
	if in.depthLow {
		in.depth.Set(meter.MaxCallDepth)
		in.depthLow = false
	}
	err := f.CallWithStack(in.ctx, stack)
	if err == nil && !in.charged {
		// The per-op fast path: no host function ran (every one that
		// counts output charges first), so nothing more to look at.
		return nil
	}
	if in.out.call != (outCounts{}) {
		in.endCall(export)
	}
	if err == nil && int64(in.fuel.Get()) >= 0 {
		return nil
	}
	in.depthLow = true
	if err == nil { // a host function's charge after the guest's last check
		return fmt.Errorf("%s: %w (budget %d instructions): host calls used the rest", export, ErrTimeout, fuel)
	}
	if int64(in.fuel.Get()) < 0 {
		return fmt.Errorf("%s: %w (budget %d instructions): %v", export, ErrTimeout, fuel, firstLine(err))
	}
	if int32(in.depth.Get()) < 0 {
		return fmt.Errorf("%s trapped: call depth limit (%d nested calls) exceeded", export, meter.MaxCallDepth)
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
	m.WriteUint64Le(a+guestabi.OffConnCodec, uint64(def.Codec)) // codec + reserved
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
	p := backend.ConnPlan{Lanes: int32(lanes), Transport: backend.Transport(int32(tr)), StripeThreshold: stripe, ChunkSize: chunk, Codec: def.Codec}
	maxTransport := backend.TransportIntraNode
	if in.features&guestabi.FeatureTransports != 0 {
		maxTransport = backend.TransportFabric
	}
	if in.features&guestabi.FeatureCompression != 0 {
		codec, _ := m.ReadUint32Le(a + guestabi.OffConnCodec)
		if !guestabi.ValidCodec(codec) {
			return def, fmt.Errorf("%s: unknown codec word %#x", guestabi.ExportConnPlan, codec)
		}
		p.Codec = backend.Codec(codec)
	}
	switch {
	case p.Lanes < 1 || p.Lanes > abi.MaxLanes:
		return def, fmt.Errorf("%s: lanes %d outside 1..%d", guestabi.ExportConnPlan, p.Lanes, abi.MaxLanes)
	case p.Transport < backend.TransportAuto || p.Transport > maxTransport:
		return def, fmt.Errorf("%s: unknown transport %d (features %#x)", guestabi.ExportConnPlan, p.Transport, in.features)
	case p.ChunkSize == 0 || p.ChunkSize > guestabi.MaxChunk:
		return def, fmt.Errorf("%s: chunk size %d outside 1..2^40", guestabi.ExportConnPlan, p.ChunkSize)
	}
	return p, nil
}

// Guest output (WASI stdout/stderr and rmaw.log) goes to NCCL's logger,
// which is slow per line, so it is bounded (SPEC.md §8.6): lines are cut at
// guestabi.MaxLogLen bytes, every byte written costs fuel, and lines beyond
// these limits are dropped, with one WARN per call saying how much.
const (
	maxOutLinesPerCall     = 256
	maxOutBytesPerCall     = 64 << 10
	maxOutLinesPerInstance = 4096
	maxOutBytesPerInstance = 1 << 20
	fuelWrite              = 200 // per fd_write buffer, plus 1 per byte
)

// outCounts is the output of the running call.
type outCounts struct{ lines, bytes, dropLines, dropBytes int }

// outState is an instance's output so far.
type outState struct {
	call             outCounts
	lines, bytes     int  // whole instance
	instanceReported bool // the per-instance limit was reported
}

func (o *outState) full() bool {
	return o.call.lines >= maxOutLinesPerCall || o.call.bytes >= maxOutBytesPerCall ||
		o.lines >= maxOutLinesPerInstance || o.bytes >= maxOutBytesPerInstance
}

// admit counts a line of n bytes and reports whether it may be logged.
func (o *outState) admit(n int) bool {
	if o.full() {
		o.call.dropLines++
		o.call.dropBytes += n
		return false
	}
	o.call.lines++
	o.call.bytes += n
	o.lines++
	o.bytes += n
	return true
}

// endCall reports what the call dropped and starts counting the next one.
func (in *instance) endCall(export string) {
	o := &in.out
	if o.call.dropLines > 0 && !o.instanceReported {
		more := ""
		if o.lines >= maxOutLinesPerInstance || o.bytes >= maxOutBytesPerInstance {
			o.instanceReported = true
			more = "; the instance's limit is reached, later output is dropped without a warning"
		}
		logx.Warn(0, "wasm guest %s: dropped %d lines (%d bytes) of output in %s: the limits are %d lines or %d bytes per call, %d lines or %d bytes per instance%s",
			in.b.name, o.call.dropLines, o.call.dropBytes, export, maxOutLinesPerCall, maxOutBytesPerCall,
			maxOutLinesPerInstance, maxOutBytesPerInstance, more)
	}
	o.call = outCounts{}
}

var errOutputFuel = errors.New("out of fuel")

// logWriter forwards a guest's stdout/stderr (e.g. a Go panic) to the log,
// a line at a time, within the instance's output limits.
type logWriter struct {
	in   *instance
	mu   sync.Mutex
	buf  []byte // the line so far, at most guestabi.MaxLogLen bytes
	skip bool   // the line was cut: drop bytes up to its newline
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	in, n := w.in, len(p)
	if in.fuel != nil {
		in.charge(fuelWrite + int64(n))
		if int64(in.fuel.Get()) < 0 {
			// Fails fd_write, ending its loop over the iovecs; the guest
			// traps at its next charge.
			return 0, errOutputFuel
		}
	}
	o := &in.out
	for len(p) > 0 {
		if o.full() { // count the rest without logging it
			o.call.dropLines += bytes.Count(p, []byte{'\n'})
			o.call.dropBytes += len(p) + len(w.buf)
			w.buf, w.skip = w.buf[:0], false
			break
		}
		i := bytes.IndexByte(p, '\n')
		end := i
		if i < 0 {
			end = len(p)
		}
		if w.skip {
			o.call.dropBytes += end
		} else {
			take := min(end, guestabi.MaxLogLen-len(w.buf))
			w.buf = append(w.buf, p[:take]...)
			o.call.dropBytes += end - take
			if len(w.buf) == guestabi.MaxLogLen {
				w.emit()
				w.skip = true
			}
		}
		if i < 0 {
			break
		}
		if !w.skip {
			w.emit()
		}
		w.skip = false
		p = p[i+1:]
	}
	return n, nil
}

func (w *logWriter) emit() {
	if w.in.out.admit(len(w.buf)) {
		if w.in.fuel != nil {
			w.in.charge(fuelLog)
		}
		logx.Warn(0, "wasm guest %s (stdio): %s", w.in.b.name, w.buf)
	}
	w.buf = w.buf[:0]
}

var _ io.Writer = (*logWriter)(nil)
