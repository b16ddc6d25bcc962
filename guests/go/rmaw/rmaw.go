//go:build wasip1

// Package rmaw is the Go SDK for Guest ABI v1.1 backends of rccl-rma-wasm
// (SPEC.md §8). A backend is a main package built with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o mybackend.wasm .
//
// that calls Register from an init function and leaves main empty. This
// package provides every export (rmaw_abi_v1, rmaw_init, rmaw_area, ...) and
// forwards them to the registered Backend and to the optional interfaces it
// implements. The per-operation path (rmaw_plan_op) allocates nothing: keep
// your PlanOp free of allocations too, because a Go guest's garbage collector
// runs inside the call that allocates (and the call has a time budget).
package rmaw

import (
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
)

// CompCap is the number of completion records the Go SDK's area holds.
const CompCap = 64

// Op is one operation handed to PlanOp (no payload, ever).
type Op struct {
	Ctx      int32
	Kind     uint32 // guestabi.OpPut ...
	Peer     uint32
	Size     uint64
	OptFlags uint32
	SignalOp uint32
}

// Plan is the per-op answer; the host pre-fills it (Lane = -1 means "the
// runtime chooses"). ChunkSize, DelayNs and Codec act only when Init enabled
// guestabi.FeatureChunk, FeatureDelay and FeatureCompression (v1.1 hosts).
type Plan struct {
	Lane      int32
	Flags     uint32
	ChunkSize uint64 // striping unit over the lanes, 0 = the connection's
	DelayNs   uint64 // pacing: wait this long before sending, <= guestabi.MaxDelayNs
	Codec     uint32 // guestabi.Codec(id, level); pre-filled with ConnPlan.Codec
	_         uint32
}

// ConnPlan is the per-communicator plan, pre-filled with the host defaults.
type ConnPlan struct {
	Lanes           int32
	Transport       int32 // guestabi.Transport*; Fabric needs FeatureTransports
	StripeThreshold uint64
	ChunkSize       uint64
	Codec           uint32 // every peer's codec word (FeatureCompression)
	_               uint32
}

// Device is what NCCL sees for one device.
type Device struct {
	Name      [64]byte
	SpeedMbps int32
	LatencyUs float32
	_         uint64
}

// SetName stores s (truncated to 63 bytes) NUL-terminated.
func (d *Device) SetName(s string) {
	n := copy(d.Name[:guestabi.DeviceNameMax], s)
	clear(d.Name[n:])
}

// SetDefault makes d the default device (guestabi.DefaultDevice*), what the
// host assumes when a guest lists none.
func (d *Device) SetDefault() {
	d.SetName(guestabi.DefaultDeviceName)
	d.SpeedMbps, d.LatencyUs = guestabi.DefaultDeviceSpeedMbps, guestabi.DefaultDeviceLatencyUs
}

// Completion reports one finished operation.
type Completion struct {
	Kind      uint32
	Peer      uint32
	Size      uint64
	Status    int32
	Lane      int32 // the lane the op's plan asked for, -1 = runtime's choice (v1.1 host; v1 writes 0)
	LatencyNs uint64
}

// PlanRecord is one op of a batch (guestabi.FeaturePlanBatch): the op and
// its plan, pre-filled like the area's; PlanOps edits Plan and Status (0 go
// ahead, 1..6 fail the op with that ncclResult_t).
type PlanRecord struct {
	Kind     uint32
	Peer     uint32
	Size     uint64
	OptFlags uint32
	SignalOp uint32
	Plan     Plan
	Status   int32
	_        uint32
}

// BatchCap is how many plan records the SDK's area holds (they overlay the
// completion records).
const BatchCap = CompCap * guestabi.CompletionSize / guestabi.BatchRecordSize

// Area is the descriptor area, laid out exactly as guestabi describes.
type Area struct {
	Magic, Version, AreaSize, CompCap uint32
	Plan                              Plan
	Conn                              ConnPlan
	Devices                           [guestabi.MaxDevices]Device
	Completions                       [CompCap]Completion
}

// Compile-time layout checks against guestabi.
var (
	_ [guestabi.OffPlan]byte         = [unsafe.Offsetof(Area{}.Plan)]byte{}
	_ [guestabi.OffConn]byte         = [unsafe.Offsetof(Area{}.Conn)]byte{}
	_ [guestabi.OffPlanCodec]byte    = [guestabi.OffPlan + unsafe.Offsetof(Plan{}.Codec)]byte{}
	_ [guestabi.OffConnCodec]byte    = [guestabi.OffConn + unsafe.Offsetof(ConnPlan{}.Codec)]byte{}
	_ [guestabi.OffDevices]byte      = [unsafe.Offsetof(Area{}.Devices)]byte{}
	_ [guestabi.OffCompletions]byte  = [unsafe.Offsetof(Area{}.Completions)]byte{}
	_ [guestabi.DeviceSize]byte      = [unsafe.Sizeof(Device{})]byte{}
	_ [guestabi.CompletionSize]byte  = [unsafe.Sizeof(Completion{})]byte{}
	_ [guestabi.BatchRecordSize]byte = [unsafe.Sizeof(PlanRecord{})]byte{}
	_ [guestabi.BatOffPlan]byte      = [unsafe.Offsetof(PlanRecord{}.Plan)]byte{}
	_ [guestabi.BatOffStatus]byte    = [unsafe.Offsetof(PlanRecord{}.Status)]byte{}
)

// Backend is the required part of a guest backend.
type Backend interface {
	// Init receives the configuration string and the host's feature offer
	// and returns the features it enables (a subset) or a negative status.
	Init(config string, hostFeatures uint64) (features uint64, status int32)
}

// Optional interfaces.
type (
	DeviceLister interface {
		Devices(d []Device) (n int32) // fill d[:n], 1 <= n <= len(d)
	}
	ConnPlanner interface {
		ConnPlan(nranks, rank int32, p *ConnPlan) int32
	}
	ContextHandler interface {
		OpenContext(ctx int32, commID uint64, nranks, rank, ncontexts int32) int32
		CloseContext(ctx int32) int32
	}
	OpPlanner interface {
		PlanOp(op *Op, p *Plan) int32 // 0, an ncclResult_t 1..6, or a negative status
	}
	CompletionHandler interface {
		Completions(ctx int32, c []Completion) int32
	}
	Finalizer interface {
		Finalize() int32
	}
	// BatchPlanner plans aggregated ops in batches (FeaturePlanBatch,
	// with OpPlanner too). A non-zero result fails the whole batch.
	BatchPlanner interface {
		PlanOps(ctx int32, recs []PlanRecord) int32
	}
)

var (
	area = Area{Magic: guestabi.AreaMagic, Version: guestabi.Version,
		AreaSize: uint32(unsafe.Sizeof(Area{})), CompCap: CompCap}
	registered Backend
	op         Op
	planner    OpPlanner
	completer  CompletionHandler
	batcher    BatchPlanner
)

// Register installs the backend; call it from init().
func Register(b Backend) {
	registered = b
	planner, _ = b.(OpPlanner)
	completer, _ = b.(CompletionHandler)
	batcher, _ = b.(BatchPlanner)
}

//go:wasmimport rmaw log
func hostLog(level int32, ptr unsafe.Pointer, n int32) int32

//go:wasmimport rmaw get_config
func hostGetConfig(buf unsafe.Pointer, limit int32) int32

// Log writes one line through the plugin's logger (level guestabi.Log*).
func Log(level int32, msg string) int32 {
	if len(msg) == 0 {
		return 0
	}
	return hostLog(level, unsafe.Pointer(unsafe.StringData(msg)), int32(len(msg)))
}

func config() string {
	n := hostGetConfig(nil, 0)
	if n <= 0 {
		return ""
	}
	buf := make([]byte, n)
	hostGetConfig(unsafe.Pointer(&buf[0]), n)
	return string(buf)
}

//go:wasmexport rmaw_abi_v1
func abiV1() {}

//go:wasmexport rmaw_area
func exportArea() int32 { return int32(uintptr(unsafe.Pointer(&area))) }

//go:wasmexport rmaw_init
func exportInit(hostFeatures int64) int64 {
	if registered == nil {
		Log(guestabi.LogError, "rmaw: no backend registered (call rmaw.Register in init)")
		return int64(guestabi.StatusErrInternal)
	}
	f, st := registered.Init(config(), uint64(hostFeatures))
	if st < 0 {
		return int64(st)
	}
	if planner == nil {
		f &^= guestabi.FeaturePlanOp
	}
	if completer == nil {
		f &^= guestabi.FeatureCompletions | guestabi.FeatureLaneEvents // lane events ride completion batches
	}
	if batcher == nil || planner == nil {
		f &^= guestabi.FeaturePlanBatch
	}
	return int64(f & uint64(hostFeatures))
}

//go:wasmexport rmaw_devices
func exportDevices(max int32) int32 {
	if d, ok := registered.(DeviceLister); ok {
		return d.Devices(area.Devices[:min(max, guestabi.MaxDevices)])
	}
	area.Devices[0].SetDefault()
	return 1
}

//go:wasmexport rmaw_conn_plan
func exportConnPlan(nranks, rank int32) int32 {
	if p, ok := registered.(ConnPlanner); ok {
		return p.ConnPlan(nranks, rank, &area.Conn)
	}
	return 0
}

//go:wasmexport rmaw_ctx_open
func exportCtxOpen(ctx int32, comm int64, nranks, rank, ncontexts int32) int32 {
	if h, ok := registered.(ContextHandler); ok {
		return h.OpenContext(ctx, uint64(comm), nranks, rank, ncontexts)
	}
	return 0
}

//go:wasmexport rmaw_ctx_close
func exportCtxClose(ctx int32) int32 {
	if h, ok := registered.(ContextHandler); ok {
		return h.CloseContext(ctx)
	}
	return 0
}

//go:wasmexport rmaw_plan_op
func exportPlanOp(ctx, kind, peer int32, size int64, optFlags, signalOp int32) int32 {
	if planner == nil {
		return 0
	}
	op = Op{Ctx: ctx, Kind: uint32(kind), Peer: uint32(peer), Size: uint64(size),
		OptFlags: uint32(optFlags), SignalOp: uint32(signalOp)}
	return planner.PlanOp(&op, &area.Plan)
}

//go:wasmexport rmaw_completions
func exportCompletions(ctx, n int32) int32 {
	if completer == nil {
		return 0
	}
	if n < 0 || n > CompCap {
		return guestabi.StatusErrInval
	}
	return completer.Completions(ctx, area.Completions[:n])
}

//go:wasmexport rmaw_plan_ops
func exportPlanOps(ctx, n int32) int32 {
	if batcher == nil {
		return guestabi.StatusErrNotSup
	}
	if n < 0 || n > BatchCap {
		return guestabi.StatusErrInval
	}
	recs := (*[BatchCap]PlanRecord)(unsafe.Pointer(&area.Completions))
	return batcher.PlanOps(ctx, recs[:n])
}

//go:wasmexport rmaw_finalize
func exportFinalize() int32 {
	if f, ok := registered.(Finalizer); ok {
		return f.Finalize()
	}
	return 0
}
