// Package config declares the NCCL_RMA_WASM_* variables, once each, with
// their kind, default, allowed range and meaning (README.md's table is
// checked against Table). Values come from libc getenv (installed by capi)
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

// Var is one declaration: what the README table shows and how values are
// checked. The typed wrappers (StringVar, ...) hold the default's value.
type Var struct {
	Name    string
	Kind    Kind
	Default string   // the default as README.md shows it
	Doc     string   // one line: README.md's "meaning" column
	Min     int64    // KindInt, KindDurationMs (milliseconds)
	Max     int64    // KindInt, KindDurationMs (milliseconds)
	Values  []string // KindEnum
	raw     bool     // KindString: keep surrounding blanks (a guest's configuration string)
	warned  atomic.Bool
}

// Table lists every variable in declaration order (the README's order).
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

// The variables, in README.md's order.
var (
	Backend = StringVar{declare(&Var{Name: "NCCL_RMA_WASM_BACKEND", Kind: KindString, Default: "`default`",
		Doc: "backend name (see above)"}), "default"}
	Dir = StringVar{declare(&Var{Name: "NCCL_RMA_WASM_DIR", Kind: KindString, Default: "unset",
		Doc: "directory of `.wasm` backends"}), ""}
	BackendConfig = StringVar{declare(&Var{Name: "NCCL_RMA_WASM_CONFIG", Kind: KindString, Default: "unset", raw: true,
		Doc: "configuration string handed to the guest at init (else `<dir>/<name>.conf`)"}), ""}
	CacheDir = StringVar{declare(&Var{Name: "NCCL_RMA_WASM_CACHE_DIR", Kind: KindString, Default: "user cache dir `/rccl-rma-wasm`",
		Doc: "compiled-code cache shared by the processes of a job; `off` disables"}), ""}
	GuestMemoryMiB = IntVar{declare(&Var{Name: "NCCL_RMA_WASM_GUEST_MEMORY_MB", Kind: KindInt,
		Default: strconv.Itoa(DefaultGuestMemoryMiB), Min: 1, Max: 4096,
		Doc: "linear-memory cap per guest instance, in MiB (1..4096)"}), DefaultGuestMemoryMiB}
	GuestTimeout = DurationVar{declare(&Var{Name: "NCCL_RMA_WASM_GUEST_TIMEOUT_MS", Kind: KindDurationMs,
		Default: ms(DefaultGuestTimeout), Min: 1, Max: maxMs,
		Doc: "how long a guest call may run before it is stopped"}), DefaultGuestTimeout}
	MetricsFile = StringVar{declare(&Var{Name: "NCCL_RMA_WASM_METRICS_FILE", Kind: KindString, Default: "unset",
		Doc: "Prometheus textfile-collector file the host writes from a backend's `rmaw_metrics` (e.g. `guests/telemetry`); `%p` is the process id"}), ""}
	MetricsAddr = StringVar{declare(&Var{Name: "NCCL_RMA_WASM_METRICS_ADDR", Kind: KindString, Default: "unset",
		Doc: "loopback `host:port` where the host serves the same text at `/metrics` (port 0 picks one, logged at INFO)"}), ""}
	MetricsInterval = DurationVar{declare(&Var{Name: "NCCL_RMA_WASM_METRICS_INTERVAL_MS", Kind: KindDurationMs,
		Default: "1000", Min: 10, Max: maxMs,
		Doc: "how often each context's metrics are refreshed (also when it closes)"}), time.Second}
	Addr = StringVar{declare(&Var{Name: "NCCL_RMA_WASM_ADDR", Kind: KindString, Default: "first non-loopback IPv4",
		Doc: "address (`ip`, `ip:port` or interface name) to listen on and advertise"}), ""}
	ConnectTimeout = DurationVar{declare(&Var{Name: "NCCL_RMA_WASM_CONNECT_TIMEOUT_MS", Kind: KindDurationMs,
		Default: ms(DefaultConnectTimeout), Min: 1, Max: maxMs,
		Doc: "how long `connect` and the registration exchange wait for peers"}), DefaultConnectTimeout}
	CloseTimeout = DurationVar{declare(&Var{Name: "NCCL_RMA_WASM_CLOSE_TIMEOUT_MS", Kind: KindDurationMs,
		Default: ms(DefaultCloseTimeout), Min: 1, Max: maxMs,
		Doc: "the most `destroyContext`, `deregMrSym` and `closeColl` wait for a live peer to take and apply what was posted (SPEC.md §3)"}), DefaultCloseTimeout}
	PeerTimeout = DurationVar{declare(&Var{Name: "NCCL_RMA_WASM_PEER_TIMEOUT_MS", Kind: KindDurationMs,
		Default: ms(DefaultPeerTimeout), Min: 0, Max: maxMs,
		Doc: "a peer with operations outstanding that moves no byte on any of its TCP streams, and completes nothing over libfabric, for this long (stopped, frozen, cut off) is failed: its operations complete with `ncclRemoteError` (SPEC.md §3); 0 waits forever"}), DefaultPeerTimeout}
	OrderWindow = IntVar{declare(&Var{Name: "NCCL_RMA_WASM_ORDER_WINDOW", Kind: KindInt, Default: "1048576",
		Min: 1 << 10, Max: 1 << 26,
		Doc: "with several lanes, how far (in operations) a peer's sequence numbers may run ahead of the first one still missing (1024..2^26); beyond it the peer is dropped as broken (48 bytes of memory per number, at most)"}), DefaultOrderWindow}
	Encrypt = BoolVar{declare(&Var{Name: "NCCL_RMA_WASM_ENCRYPT", Kind: KindBool, Default: "0",
		Doc: "1 seals every TCP stream (X25519 agreed under the signed hello, AES-256-GCM records); set it alike on every rank (SPEC.md §9)"}), false}
	IntraNode = BoolVar{declare(&Var{Name: "NCCL_RMA_WASM_INTRANODE", Kind: KindBool, Default: "1",
		Doc: "0 turns the single-copy path off for ranks on one host"}), true}
	// Off by default: a put completes when it arrived (SPEC.md §3).
	LocalCompletion = BoolVar{declare(&Var{Name: "NCCL_RMA_WASM_LOCAL_COMPLETION", Kind: KindBool, Default: "0",
		Doc: "1: a put completes when the kernel has its bytes, before the target acknowledged them (faster, weaker; SPEC.md §3)"}), false}
	// Lanes 0 (the default) keeps the backend's plan.
	Lanes = IntVar{declare(&Var{Name: "NCCL_RMA_WASM_LANES", Kind: KindInt, Default: "backend's plan (1 per 4 cores, ≤ 4)",
		Min: 0, Max: abi.MaxLanes,
		Doc: fmt.Sprintf("TCP streams per peer (1..%d); large puts and gets are striped over them; over libfabric also the rails: an endpoint on each of up to that many NICs", abi.MaxLanes)}), 0}
	// SpinUs -1 (unset) is the default: 50 µs, with one spinning reader
	// per four cores (none below four); a value set here spins on any
	// machine.
	SpinUs = IntVar{declare(&Var{Name: "NCCL_RMA_WASM_SPIN_US", Kind: KindInt, Default: "50 (off below 4 cores)", Min: 0, Max: 10000,
		Doc: "how long a TCP stream's reader (and a libfabric endpoint's progress goroutine) keeps polling after traffic before it sleeps, in µs (0..10000; 0 off); at most one per four cores spins at once"}), -1}
	Transport = EnumVar{declare(&Var{Name: "NCCL_RMA_WASM_TRANSPORT", Kind: KindEnum, Default: "`auto`",
		Values: []string{"auto", "tcp", "fabric"},
		Doc:    "`tcp`, `fabric` (libfabric RDMA, any provider) or `auto` (libfabric only on RDMA hardware: verbs, efa, cxi, psm3, opx)"}), "auto"}
	FIProvider = StringVar{declare(&Var{Name: "NCCL_RMA_WASM_FI_PROVIDER", Kind: KindString, Default: "unset",
		Doc: "libfabric provider to use (e.g. `verbs;ofi_rxm`, `efa`, `cxi`, `tcp;ofi_rxm`, `shm`); naming one requires it: `init` fails with `ncclInvalidUsage` if it cannot be used"}), ""}
	FILibrary = StringVar{declare(&Var{Name: "NCCL_RMA_WASM_FI_LIBRARY", Kind: KindString, Default: "`libfabric.so.1`",
		Doc: "libfabric library dlopen'ed at init (a name or a path)"}), "libfabric.so.1"}
	FIDmaBuf = BoolVar{declare(&Var{Name: "NCCL_RMA_WASM_FI_DMABUF", Kind: KindBool, Default: "1",
		Doc: "hand device memory to a NIC provider (verbs, efa, cxi, psm3, opx) as a DMA-BUF where the libfabric found at run time takes one (1.20 or later); 0 registers the address range. shm and tcp always get the address range"}), true}
	CUDA = BoolVar{declare(&Var{Name: "NCCL_RMA_WASM_CUDA", Kind: KindBool, Default: "1",
		Doc: "0 skips loading the CUDA driver (no device memory)"}), true}
	GDRCopy = BoolVar{declare(&Var{Name: "NCCL_RMA_WASM_GDRCOPY", Kind: KindBool, Default: "1",
		Doc: "0 keeps device signal words on copies even where GDRCopy (`libgdrapi.so`, `/dev/gdrdrv`) is present"}), true}
	HIP = BoolVar{declare(&Var{Name: "NCCL_RMA_WASM_HIP", Kind: KindBool, Default: "1",
		Doc: "0 skips loading the HIP runtime (`libamdhip64.so`, probed when CUDA has no device)"}), true}
	StageChunkKiB = IntVar{declare(&Var{Name: "NCCL_RMA_WASM_STAGE_CHUNK_KB", Kind: KindInt, Default: "1024", Min: 4, Max: 1 << 16,
		Doc: "device payloads are staged through pinned host memory in chunks of this many KiB (4..65536), copies overlapped with the wire"}), 1024}
	IntraRing = BoolVar{declare(&Var{Name: "NCCL_RMA_WASM_INTRANODE_RING", Kind: KindBool, Default: "1",
		Doc: "0 sends device payloads between processes of one host over the TCP lanes instead of a shared staging ring"}), true}
	// DebugStderr is on when set to anything: it is read by logx on every
	// line, so it must never warn (the warning would log through it).
	DebugStderr = StringVar{declare(&Var{Name: "NCCL_RMA_WASM_DEBUG_STDERR", Kind: KindString, Default: "unset",
		Doc: "log to stderr until NCCL hands over its logger"}), ""}
	LogFlavor = EnumVar{declare(&Var{Name: "NCCL_RMA_WASM_LOG_FLAVOR", Kind: KindEnum, Default: "`auto`",
		Values: []string{"auto", "nccl", "rccl"},
		Doc:    "`nccl` or `rccl` log-level numbering; `auto` looks at the logger's library"}), "auto"}
)

// Markdown returns the rows of README.md's variable table, one per
// declaration: | `NAME` | default | meaning |.
func Markdown() []string {
	rows := make([]string, len(Table))
	for i, v := range Table {
		rows[i] = fmt.Sprintf("| `%s` | %s | %s |", v.Name, v.Default, v.Doc)
	}
	return rows
}
