// Package guestabi holds the constants of Guest ABI v1.1 (SPEC.md §8): the
// names of the exports and imports, status codes, feature bits and the byte
// layout of the descriptor area a guest keeps in its linear memory. The host
// (host/sandbox) and the Go guest SDK (guests/go/rmaw) both import it; the C
// SDK (guests/c/rmaw.h) mirrors it and a host test checks the two agree.
//
// Pure Go, no dependencies, safe to build for GOOS=wasip1.
package guestabi

// Version is the ABI major version this package describes; it is also the
// area's version field. Minor versions add feature bits, never a marker or
// an area version: v1.1 is v1 plus FeaturesV11.
const Version = 1

// Minor is the ABI minor version this package describes (SPEC.md §8.1).
const Minor = 1

// Marker is the export whose presence declares Guest ABI v1. A v2 host keeps
// accepting modules that export only this marker and speaks v1 to them.
const Marker = "rmaw_abi_v1"

// MarkerPrefix is shared by every ABI version's marker ("rmaw_abi_v<N>").
const MarkerPrefix = "rmaw_abi_v"

// ImportModule is the module name of the host functions.
const ImportModule = "rmaw"

// WASIModule is the only other import module a guest may use. The host
// instantiates it with everything denied (no fs, env, args, sockets; fake
// clocks; deterministic random).
const WASIModule = "wasi_snapshot_preview1"

// Host functions (imports, module "rmaw").
const (
	ImportLog       = "log"        // (level i32, ptr i32, len i32) -> i32 status
	ImportGetConfig = "get_config" // (buf i32, limit i32) -> i32 needed_len
)

// Guest exports.
const (
	ExportMemory      = "memory"
	ExportInitialize  = "_initialize"      // optional, language runtime (Go, wasi-libc); called first
	ExportInit        = "rmaw_init"        // (host_features i64) -> i64 enabled features, or < 0 status
	ExportArea        = "rmaw_area"        // () -> i32 address of the descriptor area
	ExportDevices     = "rmaw_devices"     // optional (max i32) -> i32 count or < 0 status
	ExportConnPlan    = "rmaw_conn_plan"   // optional (nranks i32, rank i32) -> i32 status
	ExportCtxOpen     = "rmaw_ctx_open"    // optional (ctx i32, comm i64, nranks i32, rank i32, ncontexts i32) -> i32 status
	ExportCtxClose    = "rmaw_ctx_close"   // optional (ctx i32) -> i32 status
	ExportPlanOp      = "rmaw_plan_op"     // FeaturePlanOp: (ctx i32, kind i32, peer i32, size i64, opt_flags i32, signal_op i32) -> i32
	ExportCompletions = "rmaw_completions" // FeatureCompletions: (ctx i32, n i32) -> i32 status
	ExportFinalize    = "rmaw_finalize"    // optional () -> i32 status
	ExportMetrics     = "rmaw_metrics"     // optional () -> i64 ptr<<32 | len of Prometheus text in guest memory (v1.1)
	ExportPlanOps     = "rmaw_plan_ops"    // FeaturePlanBatch: (ctx i32, n i32) -> i32 status
)

// Feature bits negotiated by rmaw_init: the host offers, the guest returns the
// subset it enables. Unknown bits are reserved; a guest must not return a bit
// the host did not offer.
const (
	FeaturePlanOp      uint64 = 1 << 0 // call rmaw_plan_op for every operation
	FeatureCompletions uint64 = 1 << 1 // call rmaw_completions with batches
	FeaturesV1                = FeaturePlanOp | FeatureCompletions

	// v1.1. Without its bit a field keeps its v1 meaning: the host zeroes
	// or pre-fills it and ignores what the guest writes there.
	FeatureChunk       uint64 = 1 << 2 // plan.chunk_size acts (per-op striping unit)
	FeatureDelay       uint64 = 1 << 3 // plan.delay_ns acts (pacing, at most MaxDelayNs)
	FeatureCompression uint64 = 1 << 4 // plan.codec and conn.codec act
	FeatureTransports  uint64 = 1 << 5 // conn.transport may be TransportFabric
	FeaturePlanBatch   uint64 = 1 << 6 // aggregated ops are planned in batches by rmaw_plan_ops
	FeatureLaneEvents  uint64 = 1 << 7 // completion batches carry EventLaneDown records (needs FeatureCompletions)
	FeaturesV11               = FeaturesV1 | FeatureChunk | FeatureDelay | FeatureCompression | FeatureTransports | FeaturePlanBatch | FeatureLaneEvents
)

// Status codes returned by guest exports and host imports. Zero is success;
// negative values are errors. rmaw_plan_op additionally returns 1..6, meaning
// "fail this operation with that ncclResult_t".
const (
	StatusOK          int32 = 0
	StatusErrInval    int32 = -1 // bad argument
	StatusErrNotSup   int32 = -2 // unsupported request
	StatusErrNoMem    int32 = -3 // out of memory
	StatusErrInternal int32 = -4 // guest-internal failure
	StatusErrBounds   int32 = -5 // a pointer/length is outside linear memory (host imports)
)

// Log levels of rmaw.log.
const (
	LogError = 0
	LogWarn  = 1
	LogInfo  = 2
	LogTrace = 3
)

// Area layout. The guest reserves the area in its own memory (static data,
// 8-byte aligned) and returns its address from rmaw_area. The host reads and
// writes it in place. All fields little-endian.
const (
	AreaMagic = 0x57414d52 // "RMAW"

	// Header, written by the guest (usually static initialised data).
	OffMagic    = 0x000 // u32 AreaMagic
	OffVersion  = 0x004 // u32 Version
	OffAreaSize = 0x008 // u32 total bytes of the area
	OffCompCap  = 0x00c // u32 completion records the area holds (0 = none)

	// Op plan, pre-filled by the host before rmaw_plan_op, edited by the guest.
	OffPlan        = 0x010
	OffPlanLane    = OffPlan + 0  // i32 lane, -1 = runtime's choice
	OffPlanFlags   = OffPlan + 4  // u32 reserved, 0
	OffPlanChunk   = OffPlan + 8  // u64 striping unit, 0 = the connection's (FeatureChunk)
	OffPlanDelayNs = OffPlan + 16 // u64 pacing delay before the op is sent (FeatureDelay)
	OffPlanCodec   = OffPlan + 24 // u32 codec word, pre-filled with conn.codec (FeatureCompression)
	PlanSize       = 32

	// Connection plan, pre-filled with defaults before rmaw_conn_plan.
	OffConn          = 0x030
	OffConnLanes     = OffConn + 0  // i32 1..MaxLanes
	OffConnTransport = OffConn + 4  // i32 Transport*
	OffConnStripe    = OffConn + 8  // u64 stripe threshold
	OffConnChunk     = OffConn + 16 // u64 stripe unit, > 0
	OffConnCodec     = OffConn + 24 // u32 codec word for every peer of the communicator (FeatureCompression)
	ConnSize         = 32

	// Devices, written by rmaw_devices.
	OffDevices      = 0x050
	MaxDevices      = 8
	DeviceSize      = 80
	DevOffName      = 0  // 64 bytes, NUL-terminated or NUL-padded
	DevOffSpeedMbps = 64 // i32
	DevOffLatencyUs = 68 // f32
	DeviceNameMax   = 63

	// Completion records, written by the host before rmaw_completions.
	OffCompletions = OffDevices + MaxDevices*DeviceSize // 0x2d0
	CompletionSize = 32
	CompOffKind    = 0  // u32 OpKind
	CompOffPeer    = 4  // u32
	CompOffSize    = 8  // u64
	CompOffStatus  = 16 // i32 ncclResult_t, 0 = success
	CompOffLane    = 20 // i32 the lane the op's plan asked for, -1 = the runtime's choice (v1.1 hosts; v1 hosts write 0)
	CompOffLatency = 24 // u64 nanoseconds, measured by the host

	// Batch plan records (FeaturePlanBatch), written by the host before
	// rmaw_plan_ops over the completion records' space: (area_size -
	// OffCompletions) / BatchRecordSize of them, at most MaxBatch.
	BatchRecordSize = 64
	BatOffKind      = 0  // u32 OpKind
	BatOffPeer      = 4  // u32
	BatOffSize      = 8  // u64
	BatOffOptFlags  = 16 // u32
	BatOffSignalOp  = 20 // u32
	BatOffPlan      = 24 // a plan descriptor (PlanSize bytes), pre-filled like plan
	BatOffStatus    = 56 // i32: 0 go ahead, 1..6 fail this op with that ncclResult_t
	MaxBatch        = 256

	// AreaMinSize is the smallest valid area (no completion records).
	AreaMinSize = OffCompletions
	// MaxCompCap bounds the completion ring a guest may declare.
	MaxCompCap = 4096
)

// Op kinds: the numbers of backend.OpKind (which takes them from here). They
// are not the dataplane's wire message types.
const (
	OpPut       = 1
	OpPutSignal = 2
	OpGet       = 3
	OpFlush     = 4
	// EventLaneDown is the kind of a completion record that is no
	// operation (FeatureLaneEvents): lane `lane` of the connection to
	// `peer` failed and the host moved its operations to the other lanes
	// (size: how many). The lane stays down for the communicator's life.
	EventLaneDown = 5
)

// Transports a connection plan may ask for (conn.transport).
const (
	TransportAuto      = 0 // libfabric when both ranks opened it, else intra-node on one host, else TCP
	TransportTCP       = 1
	TransportIntraNode = 2 // falls back to TCP when the kernel refuses
	TransportFabric    = 3 // FeatureTransports: libfabric, else what auto picks among the rest
)

// Codec words (plan.codec, conn.codec): the codec id in bits 0..7, its
// level in bits 8..15, the rest zero. The host compresses put payloads on
// the TCP transport; the target decompresses into the registered range.
const (
	CodecNone = 0 // send bytes as they are
	CodecS2   = 1 // github.com/klauspost/compress/s2; level 0 or 1 (Encode), 2 (EncodeBetter)
	CodecZstd = 2 // github.com/klauspost/compress/zstd; level 0 (= 1) .. 4, klauspost's EncoderLevel

	CodecIDMask     = 0xff
	CodecLevelShift = 8
	MaxS2Level      = 2
	MaxZstdLevel    = 4
)

// Codec makes a codec word.
func Codec(id, level uint32) uint32 { return id&CodecIDMask | (level&0xff)<<CodecLevelShift }

// ValidCodec reports whether w is a codec word this ABI defines.
func ValidCodec(w uint32) bool {
	if w>>16 != 0 {
		return false
	}
	id, level := w&CodecIDMask, w>>CodecLevelShift&0xff
	switch id {
	case CodecNone:
		return level == 0
	case CodecS2:
		return level <= MaxS2Level
	case CodecZstd:
		return level <= MaxZstdLevel
	}
	return false
}

// Bounds of the v1.1 plan fields.
const (
	// MaxDelayNs caps plan.delay_ns (10 ms); a larger value is a nonsense
	// answer.
	MaxDelayNs = 10_000_000
	// MaxChunk caps plan.chunk_size and conn.chunk_size (2^40).
	MaxChunk = 1 << 40
	// MinPlanChunk is the smallest striping unit; smaller plan.chunk_size
	// values are raised to it.
	MinPlanChunk = 4096
	// MaxPiecesPerOp bounds how many pieces plan.chunk_size may cut one
	// operation into; the unit is raised to size/MaxPiecesPerOp.
	MaxPiecesPerOp = 1024
)

// MaxLanes is abi.MaxLanes, repeated because guests build without package
// abi (guestabi_test.go checks they agree).
const MaxLanes = 8

// The default device: what the native backend and the embedded default
// report, and what the host assumes when a guest has no rmaw_devices.
// guests/passthrough/passthrough.c repeats it in C (host/sandbox tests check it).
const (
	DefaultDeviceName      = "wasm-tcp"
	DefaultDeviceSpeedMbps = 40000 // measured TCP loopback on the reference machine (SPEC.md §1)
	DefaultDeviceLatencyUs = 20
)

// MaxConfigLen bounds the configuration string handed to a guest.
const MaxConfigLen = 64 << 10

// MaxMetricsLen bounds the Prometheus text one rmaw_metrics call returns.
const MaxMetricsLen = 256 << 10

// MaxLogLen bounds one log line (longer lines are truncated).
const MaxLogLen = 1024
