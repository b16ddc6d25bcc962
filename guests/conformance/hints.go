package conformance

// What to change for a loader error, and the names of the feature bits:
// shared with rmaw validate and inspect.

import (
	"fmt"
	"strings"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
)

// hints map a loader error to what the author should change. The first
// entry whose every fragment occurs in the error wins.
var hints = []struct {
	match []string
	fix   string
}{
	{[]string{"bad magic"}, "this is not a .wasm file: build with clang --target=wasm32 (C) or GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared (Go)"},
	{[]string{"binary version"}, "emit a WebAssembly 1.0 binary (the MVP format, version 01 00 00 00)"},
	{[]string{"not part of Guest ABI v1"}, "build without threads, exceptions and tail calls (clang: no -pthread, -matomics, -fwasm-exceptions, -mtail-call)"},
	{[]string{"declares Guest ABI"}, "this host speaks v1: export rmaw_abi_v1 as well (C: RMAW_ABI_V1(); Go: the rmaw SDK does it)"},
	{[]string{`missing export "rmaw_abi_v1"`}, "declare the ABI: C: RMAW_ABI_V1() at file scope; Go: import guests/go/rmaw and call rmaw.Register in init()"},
	{[]string{`missing export "rmaw_init"`}, "define RMAW_EXPORT(rmaw_init) int64_t rmaw_init(int64_t host_features) (Go: rmaw.Register a Backend)"},
	{[]string{`missing export "rmaw_area"`}, "reserve the descriptor area: C: RMAW_DEFINE_AREA(64) at file scope (Go: the rmaw SDK does it)"},
	{[]string{`missing export "memory"`}, "export the guest's own linear memory: do not link with --import-memory; wasm-ld exports \"memory\" by default"},
	{[]string{"imports memory"}, "do not link with --import-memory: a guest defines and exports its own memory"},
	{[]string{"has type", "Guest ABI v1 wants"}, "give the export the signature SPEC.md §8.2 lists (the SDK prototypes in guests/c/rmaw.h and guests/go/rmaw)"},
	{[]string{"import", "has type"}, "declare the import with the signature the host provides (use the SDK: guests/c/rmaw.h)"},
	{[]string{"which this host does not provide"}, "a guest may import only rmaw.log, rmaw.get_config and wasi_snapshot_preview1: build C with -nostdlib -ffreestanding and avoid libc calls, or drop the import"},
	{[]string{"locals (the limit)"}, "split the function: the plugin allows at most 50000 locals per function (SPEC.md §8.6)"},
	{[]string{"reserved name"}, "rename the export: __rmaw_fuel and __rmaw_depth belong to the host's metering"},
	{[]string{"tables"}, "use at most 4 tables of at most 65536 elements (SPEC.md §8.6)"},
	{[]string{"table", "limit"}, "use at most 4 tables of at most 65536 elements (SPEC.md §8.6)"},
	{[]string{"memory", "limit"}, "lower the initial memory (wasm-ld -Wl,--initial-memory=N, smaller static data) or raise NCCL_RMA_WASM_GUEST_MEMORY_MB / -memory-mb"},
	{[]string{"exceeds", "pages"}, "lower the initial memory (wasm-ld -Wl,--initial-memory=N, smaller static data) or raise NCCL_RMA_WASM_GUEST_MEMORY_MB / -memory-mb"},
	{[]string{"_initialize", "budget"}, "the language runtime's start-up runs out of the control budget: raise -timeout / NCCL_RMA_WASM_GUEST_TIMEOUT_MS or do less at start-up"},
	{[]string{"rmaw_init", "budget"}, "rmaw_init does not return within the budget (a loop?): it must be quick, deterministic and never wait"},
	{[]string{"budget"}, "the call does not return within its budget (a loop?): guests must be quick and never wait; plan_op gets 1/100 of the control budget"},
	{[]string{"rmaw_init failed with status"}, "rmaw_init returned a negative status: check the configuration string (-config or <module>.conf) and the guest's log lines"},
	{[]string{"enabled features"}, "return only bits the host offered: features & host_features"},
	{[]string{"without plan_op"}, "plan.chunk_size and plan.delay_ns are set only by rmaw_plan_op: enable RMAW_FEATURE_PLAN_OP too, or drop those bits"},
	{[]string{"unknown codec word"}, "a codec word is id | level<<8: none 0, S2 1 (levels 0..2), zstd 2 (levels 0..4); enable RMAW_FEATURE_COMPRESSION first"},
	{[]string{"unknown transport"}, "transport is 0 auto, 1 tcp, 2 intra-node, or 3 fabric with RMAW_FEATURE_TRANSPORTS enabled"},
	{[]string{"delay"}, "plan.delay_ns is at most 10 ms (guestabi.MaxDelayNs) and acts only with RMAW_FEATURE_DELAY"},
	{[]string{"enabled plan_op but"}, "export rmaw_plan_op (C: RMAW_EXPORT(rmaw_plan_op)) or do not enable RMAW_FEATURE_PLAN_OP"},
	{[]string{"enabled completions but"}, "export rmaw_completions or do not enable RMAW_FEATURE_COMPLETIONS"},
	{[]string{"descriptor area", "aligned"}, "align the area to 8 bytes (RMAW_DEFINE_AREA does)"},
	{[]string{"descriptor area", "magic"}, "start the area with magic 0x57414d52 (\"RMAW\"): use RMAW_DEFINE_AREA / the Go SDK's area"},
	{[]string{"descriptor area", "version"}, "set the area's version to 1"},
	{[]string{"descriptor area", "completion capacity"}, "declare at most 4096 completion records (RMAW_DEFINE_AREA(cap))"},
	{[]string{"descriptor area", "completions enabled"}, "declare room for completion records (RMAW_DEFINE_AREA(64)) or do not enable RMAW_FEATURE_COMPLETIONS"},
	{[]string{"descriptor area"}, "rmaw_area must return the address of an area inside linear memory whose area_size covers the layout (SPEC.md §8.3): use RMAW_DEFINE_AREA"},
	{[]string{"rmaw_devices"}, "rmaw_devices must fill 1..max devices, each with a non-empty name, speed > 0 and 0 <= latency < 1e6 (or leave it out: the default device is used)"},
	{[]string{"rmaw_conn_plan"}, "the connection plan needs lanes 1..8, transport 0..2 and chunk_size 1..2^40; return 0 or a negative status"},
	{[]string{"rmaw_ctx_open"}, "rmaw_ctx_open must return 0 for a context it accepts"},
	{[]string{"trapped"}, "the guest trapped (unreachable, out-of-bounds access, call depth): run it with -v to see its output"},
	{[]string{"malformed module"}, "the binary does not parse: rebuild it; wasm-validate (wabt) shows where it is broken"},
}

// Hint says what the author of a module should change to get past err, an
// error of the loader (host/sandbox) or of a check.
func Hint(err error) string {
	s := err.Error()
next:
	for _, h := range hints {
		for _, m := range h.match {
			if !strings.Contains(s, m) {
				continue next
			}
		}
		return h.fix
	}
	return "see SPEC.md §8 for the rule"
}

var featureBits = []struct {
	bit  uint64
	name string
}{
	{guestabi.FeaturePlanOp, "plan_op"}, {guestabi.FeatureCompletions, "completions"},
	{guestabi.FeatureChunk, "chunk"}, {guestabi.FeatureDelay, "delay"},
	{guestabi.FeatureCompression, "compression"}, {guestabi.FeatureTransports, "transports"},
	{guestabi.FeaturePlanBatch, "plan_batch"}, {guestabi.FeatureLaneEvents, "lane_events"},
}

// FeatureNames spells a feature set, e.g. "plan_op+completions".
func FeatureNames(f uint64) string {
	var n []string
	for _, b := range featureBits {
		if f&b.bit != 0 {
			n = append(n, b.name)
		}
	}
	if rest := f &^ guestabi.FeaturesV11; rest != 0 {
		n = append(n, fmt.Sprintf("%#x", rest))
	}
	if len(n) == 0 {
		return "none"
	}
	return strings.Join(n, "+")
}
