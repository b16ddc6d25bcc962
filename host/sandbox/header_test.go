package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/guests/buildflags"
)

// TestCHeaderMatchesGuestABI compiles static assertions generated from
// abi/guestabi against guests/c/rmaw.h.
func TestCHeaderMatchesGuestABI(t *testing.T) {
	var b strings.Builder
	b.WriteString("#include \"rmaw.h\"\n")
	a := func(expr string, v any) { fmt.Fprintf(&b, "_Static_assert((%s) == (%v), %q);\n", expr, v, expr) }
	a("RMAW_ABI_VERSION", guestabi.Version)
	a("RMAW_AREA_MAGIC", uint32(guestabi.AreaMagic))
	a("RMAW_FEATURE_PLAN_OP", guestabi.FeaturePlanOp)
	a("RMAW_FEATURE_COMPLETIONS", guestabi.FeatureCompletions)
	a("RMAW_ABI_MINOR", guestabi.Minor)
	a("RMAW_FEATURE_CHUNK", guestabi.FeatureChunk)
	a("RMAW_FEATURE_DELAY", guestabi.FeatureDelay)
	a("RMAW_FEATURE_COMPRESSION", guestabi.FeatureCompression)
	a("RMAW_FEATURE_TRANSPORTS", guestabi.FeatureTransports)
	a("RMAW_TRANSPORT_AUTO", guestabi.TransportAuto)
	a("RMAW_TRANSPORT_TCP", guestabi.TransportTCP)
	a("RMAW_TRANSPORT_INTRANODE", guestabi.TransportIntraNode)
	a("RMAW_TRANSPORT_FABRIC", guestabi.TransportFabric)
	a("RMAW_CODEC_NONE", guestabi.CodecNone)
	a("RMAW_CODEC_S2", guestabi.CodecS2)
	a("RMAW_CODEC_ZSTD", guestabi.CodecZstd)
	a("RMAW_CODEC(RMAW_CODEC_ZSTD, 3)", guestabi.Codec(guestabi.CodecZstd, 3))
	a("RMAW_MAX_DELAY_NS", guestabi.MaxDelayNs)
	a("RMAW_MAX_CHUNK", uint64(guestabi.MaxChunk))
	a("RMAW_MIN_PLAN_CHUNK", guestabi.MinPlanChunk)
	a("RMAW_MAX_PIECES_PER_OP", guestabi.MaxPiecesPerOp)
	a("RMAW_FEATURE_PLAN_BATCH", guestabi.FeaturePlanBatch)
	a("RMAW_FEATURE_LANE_EVENTS", guestabi.FeatureLaneEvents)
	a("RMAW_EVENT_LANE_DOWN", guestabi.EventLaneDown)
	a("RMAW_MAX_BATCH", guestabi.MaxBatch)
	a("sizeof(struct rmaw_plan_rec)", guestabi.BatchRecordSize)
	a("offsetof(struct rmaw_plan_rec, size)", guestabi.BatOffSize)
	a("offsetof(struct rmaw_plan_rec, opt_flags)", guestabi.BatOffOptFlags)
	a("offsetof(struct rmaw_plan_rec, signal_op)", guestabi.BatOffSignalOp)
	a("offsetof(struct rmaw_plan_rec, plan)", guestabi.BatOffPlan)
	a("offsetof(struct rmaw_plan_rec, status)", guestabi.BatOffStatus)
	a("offsetof(struct rmaw_area, plan.codec)", guestabi.OffPlanCodec)
	a("offsetof(struct rmaw_area, conn.codec)", guestabi.OffConnCodec)
	a("RMAW_ERR_INVAL", guestabi.StatusErrInval)
	a("RMAW_ERR_NOTSUP", guestabi.StatusErrNotSup)
	a("RMAW_ERR_NOMEM", guestabi.StatusErrNoMem)
	a("RMAW_ERR_INTERNAL", guestabi.StatusErrInternal)
	a("RMAW_ERR_BOUNDS", guestabi.StatusErrBounds)
	a("RMAW_MAX_LANES", guestabi.MaxLanes)
	a("RMAW_MAX_DEVICES", guestabi.MaxDevices)
	a("RMAW_MAX_COMP_CAP", guestabi.MaxCompCap)
	a("offsetof(struct rmaw_area, plan.lane)", guestabi.OffPlanLane)
	a("offsetof(struct rmaw_area, plan.chunk_size)", guestabi.OffPlanChunk)
	a("offsetof(struct rmaw_area, plan.delay_ns)", guestabi.OffPlanDelayNs)
	a("offsetof(struct rmaw_area, conn.lanes)", guestabi.OffConnLanes)
	a("offsetof(struct rmaw_area, conn.transport)", guestabi.OffConnTransport)
	a("offsetof(struct rmaw_area, conn.stripe_threshold)", guestabi.OffConnStripe)
	a("offsetof(struct rmaw_area, conn.chunk_size)", guestabi.OffConnChunk)
	a("offsetof(struct rmaw_area, devices)", guestabi.OffDevices)
	a("offsetof(struct rmaw_device, speed_mbps)", guestabi.DevOffSpeedMbps)
	a("offsetof(struct rmaw_device, latency_us)", guestabi.DevOffLatencyUs)
	a("sizeof(struct rmaw_area)", guestabi.OffCompletions)
	a("offsetof(struct rmaw_completion, size)", guestabi.CompOffSize)
	a("offsetof(struct rmaw_completion, status)", guestabi.CompOffStatus)
	a("offsetof(struct rmaw_completion, latency_ns)", guestabi.CompOffLatency)
	a("offsetof(struct rmaw_completion, lane)", guestabi.CompOffLane)
	a("RMAW_MAX_METRICS_LEN", guestabi.MaxMetricsLen)
	src := filepath.Join(t.TempDir(), "check.c")
	writeFile(t, src, []byte(b.String()))
	clang, err := exec.LookPath("clang")
	if err != nil {
		t.Fatalf("clang is required: %v", err)
	}
	args := []string{"-fsyntax-only"} // the guest flags, less the linker's
	for _, f := range buildflags.CFlags() {
		if !strings.HasPrefix(f, "-Wl,") {
			args = append(args, f)
		}
	}
	out, err := exec.Command(clang, append(args, "-I", filepath.Join(repoRoot(t), "guests", "c"), src)...).CombinedOutput()
	if err != nil {
		t.Fatalf("rmaw.h disagrees with abi/guestabi: %v\n%s", err, out)
	}
	_ = os.Remove(src)
}
