// Package config declares the NCCL_RMA_WASM_* variables, once each, with
// their kind, default, allowed range and meaning (docs/guide/variables.md is
// generated from Table: go generate ./host/config, or make docs). Values come from libc getenv (installed by capi)
// because os.Getenv inside a c-shared library only sees the environment as it
// was at exec, not what the host setenv()s later; every accessor reads the
// variable again, so a later setenv is seen.
//
// A malformed or out-of-range value is reported once per variable per
// process through the warn hook (logx installs it) and the default is used:
// accessors run on every communicator and rank, and one line says enough.
package config

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
)

var getenv atomic.Pointer[func(string) string]

// SetGetenv installs the lookup used by every accessor. Tests and pure-Go
// callers can leave the default (os.Getenv).
func SetGetenv(f func(string) string) { getenv.Store(&f) }

func lookup(name string) string {
	if f := getenv.Load(); f != nil {
		return (*f)(name)
	}
	return os.Getenv(name)
}

var warnHook atomic.Pointer[func(string)]

// SetWarn installs the sink of malformed-value warnings. logx installs one
// that logs at WARN under the ENV subsystem; config cannot import logx
// because logx reads DebugStderr from here.
func SetWarn(f func(msg string)) { warnHook.Store(&f) }

// Kind is how a variable's value is parsed.
type Kind int

const (
	KindString     Kind = iota // taken as is (blank = unset)
	KindBool                   // 1/0, true/false, yes/no, on/off
	KindInt                    // integer (Go syntax: 0x.. allowed) in [Min, Max]
	KindDurationMs             // millisecond count in [Min, Max]
	KindEnum                   // one of Values, case-insensitive
)

func (k Kind) String() string {
	return [...]string{"string", "bool", "int", "duration-ms", "enum"}[k]
}

// Var is one declaration: what the variables page shows and how values are
// checked. The typed wrappers (StringVar, ...) hold the default's value.
type Var struct {
	Name    string
	Kind    Kind
	Default string   // the default as docs/guide/variables.md shows it
	Doc     string   // one line: the variables page's "meaning" column
	Min     int64    // KindInt, KindDurationMs (milliseconds)
	Max     int64    // KindInt, KindDurationMs (milliseconds)
	Values  []string // KindEnum
	raw     bool     // KindString: keep surrounding blanks (a guest's configuration string)
	warned  atomic.Bool
}

// Table lists every variable in declaration order (the variables page's order).
var Table []*Var

func declare(v *Var) *Var {
	Table = append(Table, v)
	return v
}

// Lookup returns the trimmed value, or "" when the variable is unset.
func (v *Var) Lookup() string {
	s := lookup(v.Name)
	if !v.raw {
		s = strings.TrimSpace(s)
	}
	return s
}

// malformed warns the first time a variable holds a bad value.
func (v *Var) malformed(val, want string) {
	if !v.warned.CompareAndSwap(false, true) {
		return
	}
	msg := fmt.Sprintf("NET/wasm: ignoring %s=%q: want %s; using the default (%s)", v.Name, val, want, v.Default)
	if f := warnHook.Load(); f != nil {
		(*f)(msg)
	}
}

// want describes the accepted values, for the warning.
func (v *Var) want() string {
	switch v.Kind {
	case KindBool:
		return "1/0, true/false, yes/no or on/off"
	case KindInt:
		return fmt.Sprintf("an integer in %d..%d", v.Min, v.Max)
	case KindDurationMs:
		return fmt.Sprintf("milliseconds in %d..%d", v.Min, v.Max)
	case KindEnum:
		return strings.Join(v.Values, ", ")
	}
	return "a string"
}

// StringVar is a KindString variable.
type StringVar struct {
	*Var
	Def string
}

// Get returns the value, or Def when unset or blank.
func (s StringVar) Get() string {
	if v := s.Lookup(); v != "" {
		return v
	}
	return s.Def
}

// BoolVar is a KindBool variable.
type BoolVar struct {
	*Var
	Def bool
}

// Get returns the value, or Def when unset or malformed.
func (b BoolVar) Get() bool {
	s := b.Lookup()
	switch strings.ToLower(s) {
	case "":
		return b.Def
	case "1", "true", "yes", "on":
		return true
	case "0", "false", "no", "off":
		return false
	}
	b.malformed(s, b.want())
	return b.Def
}

// IntVar is a KindInt variable.
type IntVar struct {
	*Var
	Def int64
}

func (v *Var) integer() (int64, bool) {
	s := v.Lookup()
	if s == "" {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 0, 64)
	if err != nil || n < v.Min || n > v.Max {
		v.malformed(s, v.want())
		return 0, false
	}
	return n, true
}

// Get returns the value, or Def when unset, malformed or out of range.
func (i IntVar) Get() int64 {
	if n, ok := i.integer(); ok {
		return n
	}
	return i.Def
}

// DurationVar is a KindDurationMs variable.
type DurationVar struct {
	*Var
	Def time.Duration
}

// Get returns the value, or Def when unset, malformed or out of range.
func (d DurationVar) Get() time.Duration {
	if n, ok := d.integer(); ok {
		return time.Duration(n) * time.Millisecond
	}
	return d.Def
}

// EnumVar is a KindEnum variable.
type EnumVar struct {
	*Var
	Def string
}

// Get returns the value in lower case, or Def when unset or not one of Values.
func (e EnumVar) Get() string {
	val, ok := e.Parse()
	if !ok {
		e.malformed(e.Lookup(), e.want())
	}
	return val
}

// Parse is Get without the warning, for callers that must decide before
// warnings can be seen (the log flavor, read before the logger is set).
// ok is false when the variable is set to something not in Values.
func (e EnumVar) Parse() (string, bool) {
	s := strings.ToLower(e.Lookup())
	if s == "" {
		return e.Def, true
	}
	for _, x := range e.Values {
		if s == x {
			return s, true
		}
	}
	return e.Def, false
}

// Defaults that code outside the environment path also uses (a zero field
// of dataplane.Options or sandbox.Options means the same as unset here).
const (
	DefaultGuestMemoryMiB = 64
	DefaultGuestTimeout   = 100 * time.Millisecond
	DefaultConnectTimeout = 120 * time.Second
	DefaultCloseTimeout   = 10 * time.Second
	// DefaultPeerTimeout: how long a peer with operations outstanding may
	// make no progress at all before it is failed (SPEC.md §3, "Faults").
	DefaultPeerTimeout = 60 * time.Second
	// DefaultOrderWindow: sequence numbers a peer may have in flight past
	// the first one that has not landed (SPEC.md §4, "Lanes").
	DefaultOrderWindow = 1 << 20
)

const maxMs = int64(1<<63-1) / int64(time.Millisecond)

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// The declaring helpers, one per kind: each adds a variable to Table with
// the default as the variables page shows it (shown) and as its accessor returns it
// (def).

func stringVar(name, shown, def, doc string) StringVar {
	return StringVar{declare(&Var{Name: name, Kind: KindString, Default: shown, Doc: doc}), def}
}

// keepBlanks makes s keep its value's surrounding blanks.
func (s StringVar) keepBlanks() StringVar {
	s.raw = true
	return s
}

func boolVar(name string, def bool, doc string) BoolVar {
	shown := "0"
	if def {
		shown = "1"
	}
	return boolVarShown(name, shown, def, doc)
}

// boolVarShown is boolVar for a default that depends on more than the
// variable (its accessor's caller decides when it is unset).
func boolVarShown(name, shown string, def bool, doc string) BoolVar {
	return BoolVar{declare(&Var{Name: name, Kind: KindBool, Default: shown, Doc: doc}), def}
}

// intVar takes values in [lo, hi].
func intVar(name, shown string, lo, hi, def int64, doc string) IntVar {
	return IntVar{declare(&Var{Name: name, Kind: KindInt, Default: shown, Min: lo, Max: hi, Doc: doc}), def}
}

// durationVar takes any whole number of milliseconds from lo.
func durationVar(name string, def time.Duration, lo int64, doc string) DurationVar {
	return DurationVar{declare(&Var{Name: name, Kind: KindDurationMs, Default: ms(def), Min: lo, Max: maxMs, Doc: doc}), def}
}

func enumVar(name, def string, values []string, doc string) EnumVar {
	return EnumVar{declare(&Var{Name: name, Kind: KindEnum, Default: "`" + def + "`", Values: values, Doc: doc}), def}
}

// The variables, in the variables page's order.
var (
	Backend         = stringVar("NCCL_RMA_WASM_BACKEND", "`default`", "default", "backend name (see above)")
	Dir             = stringVar("NCCL_RMA_WASM_DIR", "unset", "", "directory of `.wasm` backends")
	BackendConfig   = stringVar("NCCL_RMA_WASM_CONFIG", "unset", "", "configuration string handed to the guest at init (else `<dir>/<name>.conf`)").keepBlanks()
	CacheDir        = stringVar("NCCL_RMA_WASM_CACHE_DIR", "user cache dir `/rccl-rma-wasm`", "", "compiled-code cache shared by the processes of a job; `off` disables")
	GuestMemoryMiB  = intVar("NCCL_RMA_WASM_GUEST_MEMORY_MB", strconv.Itoa(DefaultGuestMemoryMiB), 1, 4096, DefaultGuestMemoryMiB, "linear-memory cap per guest instance, in MiB (1..4096)")
	GuestTimeout    = durationVar("NCCL_RMA_WASM_GUEST_TIMEOUT_MS", DefaultGuestTimeout, 1, "how long a guest call may run before it is stopped")
	MetricsFile     = stringVar("NCCL_RMA_WASM_METRICS_FILE", "unset", "", "Prometheus textfile-collector file the host writes from a backend's `rmaw_metrics` (e.g. `guests/telemetry`); `%p` is the process id")
	MetricsAddr     = stringVar("NCCL_RMA_WASM_METRICS_ADDR", "unset", "", "loopback `host:port` where the host serves the same text at `/metrics` (port 0 picks one, logged at INFO)")
	MetricsInterval = durationVar("NCCL_RMA_WASM_METRICS_INTERVAL_MS", time.Second, 10, "how often each context's metrics are refreshed (also when it closes)")
	Addr            = stringVar("NCCL_RMA_WASM_ADDR", "first non-loopback IPv4", "", "address (`ip`, `ip:port` or interface name) to listen on and advertise")
	ConnectTimeout  = durationVar("NCCL_RMA_WASM_CONNECT_TIMEOUT_MS", DefaultConnectTimeout, 1, "how long `connect` and the registration exchange wait for peers")
	CloseTimeout    = durationVar("NCCL_RMA_WASM_CLOSE_TIMEOUT_MS", DefaultCloseTimeout, 1, "the most `destroyContext`, `deregMrSym` and `closeColl` wait for a live peer to take and apply what was posted (SPEC.md §3)")
	PeerTimeout     = durationVar("NCCL_RMA_WASM_PEER_TIMEOUT_MS", DefaultPeerTimeout, 0, "a peer with operations outstanding that moves no byte on any of its TCP streams, and completes nothing over libfabric, for this long (stopped, frozen, cut off) is failed: its operations complete with `ncclRemoteError` (SPEC.md §3); 0 waits forever")
	StallReport     = durationVar("NCCL_RMA_WASM_STALL_REPORT_MS", 0, 0, "when a request has been pending this long, WARN what the rma context holds: pending requests per peer and kind, the oldest, and every never-reset device signal word's host shadow beside its device value; again each period while something stays stuck (0, the default: off; a diagnostic for hangs)")
	OrderWindow     = intVar("NCCL_RMA_WASM_ORDER_WINDOW", "1048576", 1<<10, 1<<26, DefaultOrderWindow, "with several lanes, how far (in operations) a peer's sequence numbers may run ahead of the first one still missing (1024..2^26); beyond it the peer is dropped as broken (48 bytes of memory per number, at most)")
	Encrypt         = boolVar("NCCL_RMA_WASM_ENCRYPT", false, "1 seals every TCP stream (X25519 agreed under the signed hello, AES-256-GCM records); set it alike on every rank (SPEC.md §9)")
	IntraNode       = boolVar("NCCL_RMA_WASM_INTRANODE", true, "0 turns the single-copy path off for ranks on one host")
	// Off by default: a put completes when it arrived (SPEC.md §3).
	LocalCompletion = boolVar("NCCL_RMA_WASM_LOCAL_COMPLETION", false, "1: a put completes when the kernel has its bytes, before the target acknowledged them (faster, weaker; SPEC.md §3)")
	// On since measured on an H100 (SPEC.md §3): the bytes have arrived
	// when such a put completes; only its signal may still be on its way.
	PlacedCompletion = boolVar("NCCL_RMA_WASM_PLACED_COMPLETION", true, "a put or put+signal whose payload the intra-node path placed straight into a peer's memory (a device copy into its mapped device window, or a cross-process write into host memory) completes once that copy executed and its header was written, without waiting for the target's acknowledgement: the bytes are in the target's memory by then, and its signal follows in order (GIN's flush asks for no more: the source may be reused). A rejection the target reports later reaches the sticky error (queryLastError) only. On by default since measured on an H100 under MPS with the device agent: the ncclPutSignal hop at 8 B 48.7 to 28.2 us (1.01x NCCL's send/recv), the GIN alltoall at 64 B 111.7 to 99.9 us; 0: such a put also waits for the acknowledgement")
	// Lanes 0 (the default) keeps the backend's plan.
	Lanes = intVar("NCCL_RMA_WASM_LANES", "backend's plan (1 per 4 cores, ≤ 4)", 0, abi.MaxLanes, 0, fmt.Sprintf("TCP streams per peer (1..%d); large puts and gets are striped over them; over libfabric also the rails: an endpoint on each of up to that many NICs", abi.MaxLanes))
	// SpinUs -1 (unset) is the default: 50 µs, with one spinning reader
	// per four cores (none below four); a value set here spins on any
	// machine.
	SpinUs              = intVar("NCCL_RMA_WASM_SPIN_US", "50 (off below 4 cores)", 0, 10000, -1, "how long a TCP stream's reader (and a libfabric endpoint's progress goroutine) keeps polling after traffic before it sleeps, in µs (0..10000; 0 off); unset, at most one per four cores of the host spins at once, that budget shared among the job's processes on the host; set, each process may spin one per four cores (at least one)")
	Transport           = enumVar("NCCL_RMA_WASM_TRANSPORT", "auto", []string{"auto", "tcp", "fabric"}, "`tcp`, `fabric` (libfabric RDMA, any provider) or `auto` (libfabric only on RDMA hardware: verbs, efa, cxi, psm3, opx)")
	FIProvider          = stringVar("NCCL_RMA_WASM_FI_PROVIDER", "unset", "", "libfabric provider to use (e.g. `verbs;ofi_rxm`, `efa`, `cxi`, `tcp;ofi_rxm`, `shm`); naming one requires it: `init` fails with `ncclInvalidUsage` if it cannot be used")
	FILibrary           = stringVar("NCCL_RMA_WASM_FI_LIBRARY", "`libfabric.so.1`", "libfabric.so.1", "libfabric library dlopen'ed at init (a name or a path)")
	FIDmaBuf            = boolVar("NCCL_RMA_WASM_FI_DMABUF", true, "hand device memory to a NIC provider (verbs, efa, cxi, psm3, opx) as a DMA-BUF where the libfabric found at run time takes one (1.20 or later); 0 registers the address range. shm and tcp always get the address range")
	CUDA                = boolVar("NCCL_RMA_WASM_CUDA", true, "0 skips loading the CUDA driver (no device memory)")
	GDRCopy             = boolVar("NCCL_RMA_WASM_GDRCOPY", true, "0 keeps device signal words on copies even where GDRCopy (`libgdrapi.so`, `/dev/gdrdrv`) is present")
	DeviceAtomic        = boolVar("NCCL_RMA_WASM_DEVICE_ATOMIC", false, "1 adds to device signal words of registrations that are not never-reset with a one-thread CUDA kernel queued after the payload, instead of a read-modify-write (it needs a free SM: a kernel holding every SM while it waits for the signal would hang)")
	StreamAtomic        = boolVar("NCCL_RMA_WASM_STREAM_ATOMIC", true, "adds to device signal words of registrations that are not never-reset with a stream atomic (`cuStreamBatchMemOp_v2` atomic reduction, CUDA 13.1 drivers; verified on a scratch word at a context's first use) queued after the payload: no kernel, no SM, no host wait; 0 keeps GDRCopy, the atomic kernel or the read-modify-write")
	CopyContext         = boolVar("NCCL_RMA_WASM_COPY_CONTEXT", true, "device copies and signal writes for cuMem-mapped memory (NCCL's windows and GIN signal arrays) run in a CUDA context of the plugin's own, whose hardware queues no application stream shares, so that kernels the application queued behind one waiting for a signal cannot hold them (docs/design/device-memory.md); 0 keeps them on the application's context")
	DeviceAgent         = enumVar("NCCL_RMA_WASM_DEVICE_AGENT", "auto", []string{"0", "1", "auto"}, "`auto` (the default) runs a device agent in each CUDA copy context (NCCL_RMA_WASM_COPY_CONTEXT) when MPS is running (its control pipe exists): one block of 128 threads that takes the context's small copies, signal writes and adds from a ring in pinned host memory, so that a small device hop costs no driver submission (docs/design/device-memory.md, \"The device agent\"; measured on an H100 under MPS it shortens every small-operation series, and without MPS, where the GPU time-slices the processes' contexts, it makes them several times slower); `1` runs it without MPS too; `0` never (the copy engines and stream operations carry everything)")
	DeviceAgentFence    = enumVar("NCCL_RMA_WASM_DEVICE_AGENT_FENCE", "sc", []string{"sc", "acqrel", "lean"}, "the fences the device agent's kernel publishes a command with: `sc` (the default) a sequentially consistent system-scope fence before a command's signal word and again before its done word; `acqrel` an acquire-release fence at each, which is what a release needs (the signal after the copies of every thread, the done word after the signal) and no more; `lean` SC fences, the first only where the command copied before its signal (a fused command), since any other command's signal follows nothing of its own. The agent's own round trip (agent_probe, H100) was 0.6–0.8 µs shorter per command with release publishing, 0.5–0.6 µs without the first fence; in the plugin's GIN runs `acqrel` measured within the noise; `sc` stays the default")
	DeviceAgentOneRead  = boolVar("NCCL_RMA_WASM_DEVICE_AGENT_ONE_READ", false, "1 starts the device agent's kernel reading each ring slot whole with its first warp, one request over the bus per look, its fields beside its number, taken only when they match the slot's check word (three torn reads: the two-trip read); the default reads the number, then the fields, two round trips per command. Off: on an H100 under MPS the first warp's read was 0.4-0.6 us shorter per command and a tie end to end (docs/design/device-memory.md)")
	DeviceAgentStagger  = boolVar("NCCL_RMA_WASM_DEVICE_AGENT_STAGGER", false, "1 starts the device agent's kernel with three more pollers beside thread 0 (lane 0 of warps 1 to 3), each round's first look 256 ns apart per warp: a poll of the ring in pinned host memory is a bus round trip, so a command written while one load is in flight waits for it and the next; with four looks in flight, staggered, it is seen sooner. The first to see it tells thread 0 through shared memory. The two-trip read only (not with NCCL_RMA_WASM_DEVICE_AGENT_ONE_READ). Off: slower on an H100 under MPS (an agent command 5.5 → 7.8 µs, the GIN alltoall about twice as long; docs/bench/log/2026-12-08-hop-trace-h100.md)")
	DeviceAgentIdleUs   = intVar("NCCL_RMA_WASM_DEVICE_AGENT_IDLE_US", "1000", 0, 10_000_000, 1000, "with the device agent running: how long, in µs, its kernel polls an empty ring before it parks (ends; the next command launches it again, one driver launch). A resident kernel makes every module load in the process (CUDA lazy loading: an application's first launch of a kernel) and, under MPS, on the GPU wait until it ends; parking bounds that wait by this much once the plugin's traffic pauses. `0` never parks: a module the application loads after the plugin registered device memory then waits for ever")
	DeviceAgentMaxKiB   = intVar("NCCL_RMA_WASM_DEVICE_AGENT_MAX_KB", "64", 0, 1<<20, 64, "with the device agent running: the largest copy, in KiB, it takes; larger ones go to the copy engines")
	DeviceAgentWarnMs   = durationVar("NCCL_RMA_WASM_DEVICE_AGENT_WARN_MS", 5*time.Second, 0, "with the device agent running: WARN once when it has had commands waiting and done none of them for this long (its kernel not running: no SM free for its block, as when a grid holding every SM waits for a signal the agent is to write); 0 never")
	SignalShadow        = boolVar("NCCL_RMA_WASM_SIGNAL_SHADOW", true, "0 updates device signal words of never-reset registrations (NCCL_NET_MR_FLAG_SIGNAL_NEVER_RESET) like any other word, by read-modify-write (or GDRCopy, or the atomic kernel), instead of from a host shadow with one stream-ordered write")
	HIP                 = boolVar("NCCL_RMA_WASM_HIP", true, "0 skips loading the HIP runtime (`libamdhip64.so`, probed when CUDA has no device)")
	StageChunkKiB       = intVar("NCCL_RMA_WASM_STAGE_CHUNK_KB", "1024", 4, 1<<16, 1024, "device payloads are staged through pinned host memory in chunks of this many KiB (4..65536), copies overlapped with the wire")
	Profile             = boolVar("NCCL_RMA_WASM_PROFILE", false, "1 keeps latency histograms of the data path's stages (the caller's cadence, queueing, device copies, the wire, the target, completion) and writes their percentiles to stderr when a communicator closes; a diagnostic: one clock read per stage")
	ProfileTrace        = stringVar("NCCL_RMA_WASM_PROFILE_TRACE", "unset", "", "a path prefix: records the moments of each operation's way (a data call entered, the data plane's post, a marked device copy's queue entered and the copy handed to the device agent, its header written; at the target the header looked at, the mark seen, the signal's device write entered and the signal applied) with the host's realtime clock, at most 131072 per process, and writes them to `<prefix>.<pid>` when a communicator closes; `test/gpu/gin_pingpong.cu` and `test/gpu/hoptrace` set them beside the kernels' own times (docs/guide/gpus.md, \"Checking a GPU machine with real NCCL\"); a diagnostic: one clock read per point")
	AsyncCopyKiB        = intVar("NCCL_RMA_WASM_ASYNC_COPY_KB", "64", 0, 1024, 64, "device payloads up to this many KiB (0..1024; 0 turns it off) are copied through pinned bounce slots asynchronously, in order with their signals on the context's stream, instead of by synchronous copies")
	SelfAsync           = boolVar("NCCL_RMA_WASM_SELF_ASYNC", true, "a rank's device-to-device operations to itself (a GIN alltoall's own slot, NCCL's flush puts) are queued on the context's stream and completed when an event says they executed, so NCCL's proxy thread does not wait for the copy; 0 waits for each copy (a strongly-ordered registration always does); needs NCCL_RMA_WASM_ASYNC_COPY_KB > 0")
	IntraStream         = boolVar("NCCL_RMA_WASM_INTRANODE_STREAM", true, "0 keeps the request streams between processes of one host on their sockets instead of shared-memory rings (a ring's write is a copy and a store, its read a load and a copy: no system call while the reader polls; the socket still carries replies and wakes a sleeping reader)")
	AckHoldAdapt        = boolVar("NCCL_RMA_WASM_ACK_HOLD_ADAPT", true, "a target that has sent the initiator a batch since it last read holds the acks of what it landed for its next batch, up to 50 µs; with this on it holds only while holding pays: after four holds in a row whose acks left alone after all, it acknowledges at once, holding again once every 64 times and after a hold that paid (a GIN round: each side's next batch comes only after its flush, which waits for the acks the other side holds). 0 always holds")
	FlushAskAtOnce      = boolVar("NCCL_RMA_WASM_FLUSH_ASK_AT_ONCE", true, "a flush (GIN's, NCCL's iflush) whose puts' acks a target holds for a batch of its own asks for them after 10 µs; with this on, a lane whose last four flushes all had to ask asks at once, waiting again once every 64 flushes and after acks that came unasked (a GIN round: each side's flush follows its puts, and the target's next batch comes only after the flush ends). 0 always waits the 10 µs first")
	IntraRing           = boolVar("NCCL_RMA_WASM_INTRANODE_RING", true, "0 sends device payloads between processes of one host over the TCP lanes instead of a shared staging ring")
	IntraIPC            = boolVarShown("NCCL_RMA_WASM_INTRANODE_IPC", "1 with CUDA, 0 with HIP", true, "1 maps the device windows (CUDA cuMem allocations, such as `ncclMemAlloc`'s; HIP `hipMalloc` ones) of peers on this host into each rank, handed over as file descriptors on an abstract unix socket, and copies device payloads of at least NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB straight into them: one copy on the device, no host staging, the target applying only the signal (docs/design/device-memory.md, \"Device windows mapped\"); on by default with CUDA since measured on an H100 (5 December 2026), off with HIP until measured on an AMD GPU")
	GatherWriter        = enumVar("NCCL_RMA_WASM_GATHER_WRITER", "auto", []string{"0", "1", "auto"}, "`auto` (the default) is 1 where the device agent runs (NCCL_RMA_WASM_DEVICE_AGENT 1, or auto with MPS running), 0 elsewhere. 1: a batch whose small device payloads NCCL's proxy thread gathered (their device-to-host copies queued in test() or rmaProgress) is handed over instead of waited for: the proxy's next call writes it once the copies' events passed, or, after the send delay (200 µs), the lane's writer goroutine waits and writes it; so the proxy thread never waits for a copy and puts to several peers copy at once (measured on an H100 under MPS with the agent: the 64 B GIN alltoall 142 µs against 158-166). 0: the proxy thread waits (12-16 µs under MPS on an H100)")
	IntraIPCAgent       = boolVar("NCCL_RMA_WASM_INTRANODE_IPC_AGENT", true, "with NCCL_RMA_WASM_INTRANODE_IPC on and the device agent running in a device source's context: puts of every size the agent copies (up to NCCL_RMA_WASM_DEVICE_AGENT_MAX_KB), not only from NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB, copy straight into the mapped window (the agent's device-to-device copy, its ticket waited for before the header leaves; the target lands nothing and applies only the signal). Measured on an H100 under MPS: the 2-rank GIN alltoall 7–14 % faster than staging the small puts with the agent (docs/design/device-memory.md); without the agent, mapped small puts are slower, so the floor stays for them")
	IntraIPCMinKiB      = intVar("NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB", "64", 0, 1<<20, 64, "with NCCL_RMA_WASM_INTRANODE_IPC on: device puts and gets smaller than this many KiB (0..1048576; 0: every size) keep the staged path, which measured as fast or faster for small operations on an H100 under MPS, while larger ones copy straight into the mapped window (10× the bandwidth at 64 MiB)")
	DirectSignal        = boolVar("NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL", false, "1 (off by default: on an H100 under MPS its 64-byte kernel-watched ping was slower than the target applying the signal, one run): with the device agent running and a peer's device window and signal registration mapped (NCCL_RMA_WASM_INTRANODE_IPC), a small put+signal's agent copy is followed by the agent's own atomic add into the peer's signal word, and a signal alone is that add: the peer's kernel sees the signal without its host taking part (its header still goes, marked applied, for the order and the acknowledgement). A rank with it on adds to plain device signal words with its agent where the driver has no stream atomics, keeps no never-reset shadow for its device registrations, and tells its peers that their agents may add to them. Used for a peer until its first operation that cannot be carried so (host memory, larger than the agent's copies, another context). NCCL's own GIN and RMA proxy signal arrays are cuMem allocations without shareable handles, which cannot be mapped into a peer: the path serves signal words in shareable memory only, and an INFO line says why a signal did not take it")
	IntraInbox          = boolVar("NCCL_RMA_WASM_INTRANODE_INBOX", false, "1 (off by default: on an H100 under MPS it cut the GPU-initiated one way from 18.2-20.1 to 15.6-15.8 us, but made the GIN alltoall slower, its own puts completing later): with the device agent running on both sides and device windows mapped between the ranks of a host (NCCL_RMA_WASM_INTRANODE_IPC), a small put+signal's agent copy into the peer's window is followed by our agent's 8-byte entry in the peer's inbox, rows of the peer's device memory its agent looks at between commands; the peer's agent adds the signal to the word the entry names through a table of the peer's registrations. The peer's kernel sees the signal without either host on the way; the header still goes, marked applied, and the peer's host acknowledges the operation once its agent took the entry. A signal alone is the entry alone. Unlike NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL it needs no shareable signal memory: NCCL's GIN and RMA proxy signal arrays take it. A rank with it on keeps no never-reset shadow for the device registrations it enters into its table, and adds to their words with device atomics only. Used for a peer until its first operation that cannot be carried so (host memory, larger than the agent's copies, a signal value above 2^28-1, another context), and for 16 peer processes in all: a process has 16 rows, one per sending process (and context), shared by all the communicators between the two processes; the row of a process that exited is handed again")
	InboxHostRows       = boolVar("NCCL_RMA_WASM_INTRANODE_INBOX_HOST_ROWS", false, "1 (off by default: on an H100 under MPS the GIN alltoall was 4-5 % slower than with marks at 64 B and 4 KiB, its barriers shorter but its puts later, since the agent reads host memory whenever its ring is empty): with the peer inbox, 16 host rows beside its device rows, a sealed memfd of host memory pinned by both processes, which the target's agent looks at when its ring is empty. A signal alone (a GIN barrier's, a flush's) that can pass nothing (every earlier entry taken, nothing queued before it on the sender's device) is written there by NCCL's proxy thread itself, with no command to the sender's agent, whose round trip is the largest part of such a hop under MPS; every other entry stays the agent's, in the device row. An earlier layout with every entry in host rows also shortened the barriers and slowed the puts. Both processes must have the inbox on; the target's setting decides")
	InboxCallerWaitUs   = intVar("NCCL_RMA_WASM_INTRANODE_INBOX_CALLER_WAIT_US", "25", 0, 1000, 25, "with the peer inbox: how long NCCL's proxy thread, reading a put+signal's header (in test() or rmaProgress) whose entry our agent has not taken yet, waits for it before it leaves the header to the stream's service, in us (0..1000). 0 only looks. 25 (the default): on an H100 under MPS the GIN alltoall with the inbox took 96-108 us per alltoall with it against 113-135 us with 0, the sender's flush waiting for acknowledgements the service, woken, sent later")
	FusedLanding        = boolVar("NCCL_RMA_WASM_FUSED_LANDING", true, "on by default (measured on an H100 under MPS: the 64-byte kernel-watched ping over TCP 6-18 % faster in four runs, the GIN alltoalls over TCP lanes 2-3 % faster on average over five runs, which moved both ways; 0 turns it off): a small put+signal that arrives over a TCP lane for device memory of a context whose device agent runs, its signal applied at once (every operation numbered before it landed), is landed by one agent command: the payload's copy out of its bounce slot, then the signal's write (a never-reset shadow's) or atomic add; a payload of up to 64 bytes rides in the command itself. Saves the agent's pickup of a second command and, inline, its read of the payload. As with NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL, adds to plain device signal words are the agent's where the driver has no stream atomics")
	IntraAgentMarks     = boolVar("NCCL_RMA_WASM_INTRANODE_AGENT_MARKS", true, "with NCCL_RMA_WASM_INTRANODE_IPC on and the device agent running in a device source's context (on by default; it has no effect without the agent): a put+signal into a mapped window is one agent command, the copy and then the write of the command's number to this process's mark page (pinned shared memory each peer of this host maps read-only), and its header leaves at once naming that number; the target applies the signal once the mark reached it. Off, the lane waits for the agent's copy before the header leaves (on an H100 under MPS the 8 B ncclPutSignal hop was 57 µs off against 41 on, the GPU-initiated one-way 64 B put+signal 23 against 18). A target whose sender's process exits before the mark fails the operation instead of waiting")
	IntraMarkWaitDevice = boolVar("NCCL_RMA_WASM_INTRANODE_MARK_WAIT_DEVICE", false, "with agent marks (NCCL_RMA_WASM_INTRANODE_AGENT_MARKS): 1 has the target's device agent wait for a marked put+signal's mark itself: the signal is queued at once as one agent command that polls the peer's mark word (its mark page, pinned here read-only) and then writes or adds, instead of the host waiting for the mark and then handing the signal over, so the agent's pickup overlaps the sender's copy and NCCL's proxy thread never waits for a mark. Fences (host signal words, synchronous copies, gets served, other contexts' signals) wait for such a command as for a queued copy. A mark that never comes holds that agent for about a second when its process exited, else at most 30 s, then the signal is dropped with a WARN. Off by default: a tie end to end on an H100 under MPS (docs/bench/log/2026-12-08-hop-trace-h100.md)")
	IntraIPCEvents      = boolVar("NCCL_RMA_WASM_INTRANODE_IPC_EVENTS", true, "with NCCL_RMA_WASM_INTRANODE_IPC=1 (CUDA and HIP): a put+signal into a mapped window records an interprocess event after its queued copy and leaves at once, and the target's stream waits for that event before the signal write, so no host waits for the copy; 0: the sender waits for its copies before the header leaves")
	// DebugStderr is on when set to anything: it is read by logx on every
	// line, so it must never warn (the warning would log through it).
	DebugStderr = stringVar("NCCL_RMA_WASM_DEBUG_STDERR", "unset", "", "log to stderr until NCCL hands over its logger")
	LogFlavor   = enumVar("NCCL_RMA_WASM_LOG_FLAVOR", "auto", []string{"auto", "nccl", "rccl"}, "`nccl` or `rccl` log-level numbering; `auto` looks at the logger's library")
)

// Markdown returns the rows of the variables page's table, one per
// declaration: | `NAME` | default | meaning |.
func Markdown() []string {
	rows := make([]string, len(Table))
	for i, v := range Table {
		rows[i] = fmt.Sprintf("| `%s` | %s | %s |", v.Name, v.Default, v.Doc)
	}
	return rows
}
