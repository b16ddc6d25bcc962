// Package backend is the seam between the plugin runtime (mechanism) and the
// code that decides policy. A Backend is asked for what RCCL sees (devices),
// for a connection plan per communicator, and, when it opts in, for a plan per
// operation and for batched completion reports. The native passthrough in this
// package is the baseline; host/sandbox implements the same interface on top
// of a WebAssembly guest.
//
// Threading contract: Backend methods may be called concurrently. A Context is
// used by one goroutine at a time (the runtime holds the owning rma context's
// lock around every call), so implementations need no locking of their own.
package backend

import (
	"errors"
	"runtime"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
)

// DeviceInfo is what a backend wants NCCL to see for one device. The runtime
// clamps values to what the data path can honour.
type DeviceInfo struct {
	Name      string  // at most 63 bytes, shown in NCCL's topology and logs
	SpeedMbps int32   // advertised bandwidth
	LatencyUs float32 // advertised latency
}

// Transport selects how payload moves between two ranks.
type Transport int32

const (
	TransportAuto      Transport = 0 // intra-node when possible, else TCP
	TransportTCP       Transport = 1
	TransportIntraNode Transport = 2 // still falls back to TCP when the kernel refuses
	TransportFabric    Transport = 3 // libfabric when both ranks opened an endpoint, else as auto
)

// Codec is a codec word (guestabi.Codec): which compression a put's payload
// gets on the TCP transport. Zero is none.
type Codec uint32

// ID and Level split the word.
func (c Codec) ID() uint32    { return uint32(c) & guestabi.CodecIDMask }
func (c Codec) Level() uint32 { return uint32(c) >> guestabi.CodecLevelShift & 0xff }

// ConnPlan is decided once per communicator (collComm) at connect time.
type ConnPlan struct {
	Lanes           int32     // TCP streams per peer, 1..abi.MaxLanes
	StripeThreshold uint64    // puts/gets at least this large are striped over all lanes
	ChunkSize       uint64    // smallest stripe piece; a striped op is cut in at most Lanes pieces of at least this size
	Transport       Transport // preference
	Codec           Codec     // every peer's default codec; a per-op plan may change it
}

// DefaultConnPlan is what the native backend and the embedded default use:
// one lane per four cores, up to four. Measured (BENCH.md): on 2 vCPUs extra
// streams only add threads competing for the cores; on 16 vCPUs 4 lanes
// move large puts at 3x one TCP stream and 3x one process_vm_writev.
func DefaultConnPlan() ConnPlan {
	lanes := int32(min(max(runtime.NumCPU()/4, 1), 4))
	return ConnPlan{Lanes: lanes, StripeThreshold: 256 << 10, ChunkSize: 64 << 10, Transport: TransportAuto}
}

// OpKind names a data operation as a planner sees it. The numbers are the
// guest ABI's (a guest reads them in completion records); the dataplane's
// wire message types are a different set (host/wire's Msg*).
type OpKind uint32

const (
	OpPut       OpKind = guestabi.OpPut
	OpPutSignal OpKind = guestabi.OpPutSignal
	OpGet       OpKind = guestabi.OpGet
	OpFlush     OpKind = guestabi.OpFlush
	// EventLaneDown: a completion record that reports a failed lane
	// (Completion.Lane, of the connection to Completion.Peer) instead of
	// an operation; Size is how many operations moved. Only to contexts
	// that want lane events (LaneEventer).
	EventLaneDown OpKind = guestabi.EventLaneDown
)

// Op describes one data operation to a planner. Payload bytes are never part
// of it: a backend decides policy, it never touches memory.
type Op struct {
	Kind     OpKind
	Context  int32
	Peer     uint32
	Size     uint64
	OptFlags uint32
	SignalOp uint32
}

// OpPlan is a planner's answer. The runtime fills defaults before the call.
type OpPlan struct {
	Lane      int32  // lane index in [0, Lanes), or -1 for the runtime's choice
	Status    int32  // 0 = go ahead; non-zero = fail this operation (fault injection, policy)
	ChunkSize uint64 // striping unit over the lanes; 0 = the connection plan's
	DelayNs   uint64 // pacing: the op waits this long in the data path before it is sent
	Codec     Codec  // pre-filled with the connection plan's
}

// Completion reports one finished operation for telemetry.
type Completion struct {
	Kind    OpKind
	Peer    uint32
	Size    uint64
	Status  int32 // 0 success, else the ncclResult_t the request failed with
	Lane    int32 // the lane the op's plan asked for, -1 = the runtime's choice
	Latency uint64
}

// ContextInfo identifies the rma context a Context serves.
type ContextInfo struct {
	CommID   uint64
	NRanks   int32
	Rank     int32
	Contexts int32 // nContexts of the createContext call
}

// Backend is one loaded policy module, shared by all communicators of the
// process.
type Backend interface {
	// Name is the backend's name ("native", "default", a module name).
	Name() string
	// Devices lists at least one device; called when init runs.
	Devices() []DeviceInfo
	// ConnectionPlan is asked once per collComm.
	ConnectionPlan(nranks, rank int32) (ConnPlan, error)
	// NewContext returns the per-rma-context policy state (a guest instance).
	NewContext(info ContextInfo) (Context, error)
	// Close releases the backend after the last communicator is gone.
	Close() error
}

// Context is the per-rma-context side of a backend.
type Context interface {
	// PlansOps reports whether PlanOp must be called for every operation.
	// When false the runtime never calls PlanOp (zero per-op cost).
	PlansOps() bool
	// PlanOp fills plan for op. An error means the backend failed (a trap,
	// a timeout, a nonsense answer); the runtime fails the operation's
	// request, records a sticky error, and keeps going.
	PlanOp(op *Op, plan *OpPlan) error
	// WantsCompletions reports whether Completions should be called.
	WantsCompletions() bool
	// Completions receives a batch of finished operations; the slice is
	// reused after the call returns.
	Completions(batch []Completion) error
	// Close releases the context (a guest instance).
	Close() error
}

// BatchPlanner is implemented by a Context that can plan several
// operations in one call (Guest ABI v1.1 FeaturePlanBatch). The runtime
// uses it for operations posted with the aggregation hint: it keeps them
// back until the batch is full or something would send them anyway (an op
// without the hint, test, iflush, rmaProgress) and plans them together.
type BatchPlanner interface {
	// BatchCap is the largest batch PlanOps takes; 0 means no batches.
	BatchCap() int
	// PlanOps fills plans[i] for ops[i] (plans pre-filled like PlanOp's).
	// An error fails every op of the batch.
	PlanOps(ops []Op, plans []OpPlan) error
}

// LaneEventer is implemented by a Context that wants EventLaneDown
// records in its completion batches (Guest ABI v1.1 FeatureLaneEvents).
type LaneEventer interface {
	WantsLaneEvents() bool
}

// ErrDisabled is returned by a Context whose backend was disabled after
// repeated faults.
var ErrDisabled = errors.New("backend disabled after a fault")
