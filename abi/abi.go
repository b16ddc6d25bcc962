// Package abi is the pure-Go mirror of the ncclRma plugin C ABI (v14, v15,
// v16): result codes, memory types, registration flags, signal operations,
// log levels and subsystem flags, and the byte layout of the structs that
// cross the boundary. It has no cgo so that tests, tools and guest SDKs can
// import it; capi/ checks from C that these mirrors match its header.
package abi

import "fmt"

// Result mirrors ncclResult_t. Plugins only ever return values 0-6.
type Result int32

const (
	Success            Result = 0
	UnhandledCudaError Result = 1
	SystemError        Result = 2
	InternalError      Result = 3
	InvalidArgument    Result = 4
	InvalidUsage       Result = 5
	RemoteError        Result = 6
	InProgress         Result = 7
)

var resultNames = [...]string{"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError",
	"ncclInternalError", "ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress"}

func (r Result) String() string {
	if r >= 0 && int(r) < len(resultNames) {
		return resultNames[r]
	}
	return fmt.Sprintf("ncclResult(%d)", int32(r))
}

// Memory types (the type argument of regMrSym, bits of ptrSupport).
const (
	PtrHost   = 0x1
	PtrCuda   = 0x2
	PtrDmaBuf = 0x4
)

// Memory registration flags.
const (
	MrFlagForceSO          = 1 << 0
	MrFlagSignalNeverReset = 1 << 1
)

// Signal operations of iputSignal.
const (
	SignalOpInc = 0x1
	SignalOpAdd = 0x2
)

// OptFlagAggregateRequests is the v15 optFlags hint: another op to the same
// peer follows in this progress pass, so a doorbell may be deferred.
const OptFlagAggregateRequests = 1 << 0

// Device types reported in NetProperties.NetDeviceType.
const (
	NetDeviceHost     = 0
	NetDeviceGinProxy = 2
)

const (
	HandleSize        = 128 // NCCL_NET_HANDLE_MAXSIZE
	MaxRequests       = 32  // NCCL_NET_MAX_REQUESTS
	MaxDevsPerNIC     = 8   // NCCL_NET_MAX_DEVS_PER_NIC_V12
	ConfigUndefInt    = -2147483648
	MaxNetSizeBytes   = 1 << 40
	TableSlotsV14V15  = 21
	TableSlotsV16     = 22
	NetPropertiesSize = 128
	RmaConfigSize     = 12
)

// LogLevel is the level a log line is written at, independent of the
// numbering of the host library; see Flavor.Level.
type LogLevel int

const (
	LogNone LogLevel = iota
	LogVersion
	LogWarn
	LogInfo
	LogAbort
	LogTrace
)

// Flavor is the host library family. NCCL and RCCL number log levels
// differently (RCCL inserts ERROR=1), so the wire value depends on it.
type Flavor int

const (
	FlavorNCCL Flavor = iota
	FlavorRCCL
)

func (f Flavor) String() string {
	if f == FlavorRCCL {
		return "rccl"
	}
	return "nccl"
}

// Level returns the ncclDebugLogLevel number the host library expects.
func (f Flavor) Level(l LogLevel) int32 {
	if f == FlavorRCCL && l != LogNone {
		return int32(l) + 1
	}
	return int32(l)
}

// Subsystem flags of the logger.
const (
	SubsysInit  uint64 = 0x1
	SubsysNet   uint64 = 0x10
	SubsysEnv   uint64 = 0x80
	SubsysAlloc uint64 = 0x100
	SubsysProxy uint64 = 0x400
	SubsysReg   uint64 = 0x2000
	SubsysAll   uint64 = ^uint64(0)
)

// NetProperties mirrors ncclNetProperties_v12_t (128 bytes, align 8 on
// x86-64). String fields are C pointers, kept as uintptr here.
type NetProperties struct {
	Name                uintptr
	PciPath             uintptr
	GUID                uint64
	PtrSupport          int32
	RegIsGlobal         int32
	ForceFlush          int32
	Speed               int32
	Port                int32
	Latency             float32
	MaxComms            int32
	MaxRecvs            int32
	NetDeviceType       int32
	NetDeviceVersion    int32
	VPropsNdevs         int32
	VPropsDevs          [MaxDevsPerNIC]int32
	_                   int32
	MaxP2pBytes         uint64
	MaxCollBytes        uint64
	MaxMultiRequestSize int32
	RailID              int16
	PlaneID             int16
}

// RmaConfig mirrors ncclRmaConfig_v14_t/_v15_t/_v16_t.
type RmaConfig struct {
	NContexts    int32
	TrafficClass int32
	RankStride   int32
}

// MaxLanes is the most lanes (TCP streams per peer) a communicator may use:
// it bounds backend.ConnPlan.Lanes, dataplane.Options.Lanes and
// NCCL_RMA_WASM_LANES. abi/guestabi repeats it for guests, which build
// without this package; a test there keeps the two equal.
const MaxLanes = 8
