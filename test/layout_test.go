// layout_test.go checks the C boundary: capi/rma_plugin.h against the Go
// mirror in abi/, and the exported symbols and ELF flags of
// build/librccl-rma-wasm.so. Its helpers are self-contained (prefixed
// capi) so that this file builds on its own.

package test

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/plugin"
)

// capiLibrary returns the library built by make (see build in
// driver_test.go), so every test in this package runs the same binary.
func capiLibrary(t testing.TB) string {
	t.Helper()
	return filepath.Join(build(t), "build", "librccl-rma-wasm.so")
}

// buildC compiles test/csrc/<src> against capi/rma_plugin.h into dir.
func capiBuildC(t testing.TB, dir, src, out string, extra ...string) string {
	t.Helper()
	root := repoRoot(t)
	bin := filepath.Join(dir, out)
	args := append([]string{"-O1", "-Wall", "-Wextra", "-Werror", "-I", filepath.Join(root, "capi"),
		"-o", bin, filepath.Join(root, "test", "csrc", src)}, extra...)
	args = append(args, "-ldl")
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", cc, strings.Join(args, " "), err, out)
	}
	return bin
}

// runLayout runs the layout program and parses its "key value" lines.
func capiLayout(t *testing.T, args ...string) map[string]string {
	t.Helper()
	bin := capiBuildC(t, t.TempDir(), "layout.c", "layout")
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("layout %v: %v\n%s", args, err, out)
	}
	m := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok {
			m[k] = v
		}
	}
	return m
}

func TestHeaderLayoutMatchesABI(t *testing.T) {
	m := capiLayout(t)
	var p abi.NetProperties
	var c abi.RmaConfig
	want := map[string]uintptr{
		"sizeof.ncclNetProperties_v12_t":              unsafe.Sizeof(p),
		"alignof.ncclNetProperties_v12_t":             unsafe.Alignof(p),
		"offsetof.P.name":                             unsafe.Offsetof(p.Name),
		"offsetof.P.pciPath":                          unsafe.Offsetof(p.PciPath),
		"offsetof.P.guid":                             unsafe.Offsetof(p.GUID),
		"offsetof.P.ptrSupport":                       unsafe.Offsetof(p.PtrSupport),
		"offsetof.P.regIsGlobal":                      unsafe.Offsetof(p.RegIsGlobal),
		"offsetof.P.forceFlush":                       unsafe.Offsetof(p.ForceFlush),
		"offsetof.P.speed":                            unsafe.Offsetof(p.Speed),
		"offsetof.P.port":                             unsafe.Offsetof(p.Port),
		"offsetof.P.latency":                          unsafe.Offsetof(p.Latency),
		"offsetof.P.maxComms":                         unsafe.Offsetof(p.MaxComms),
		"offsetof.P.maxRecvs":                         unsafe.Offsetof(p.MaxRecvs),
		"offsetof.P.netDeviceType":                    unsafe.Offsetof(p.NetDeviceType),
		"offsetof.P.netDeviceVersion":                 unsafe.Offsetof(p.NetDeviceVersion),
		"offsetof.P.vProps":                           unsafe.Offsetof(p.VPropsNdevs),
		"offsetof.P.vProps.devs":                      unsafe.Offsetof(p.VPropsDevs),
		"offsetof.P.maxP2pBytes":                      unsafe.Offsetof(p.MaxP2pBytes),
		"offsetof.P.maxCollBytes":                     unsafe.Offsetof(p.MaxCollBytes),
		"offsetof.P.maxMultiRequestSize":              unsafe.Offsetof(p.MaxMultiRequestSize),
		"offsetof.P.railId":                           unsafe.Offsetof(p.RailID),
		"offsetof.P.planeId":                          unsafe.Offsetof(p.PlaneID),
		"sizeof.ncclNetVDeviceProps_v12_t":            unsafe.Offsetof(p.MaxP2pBytes) - unsafe.Offsetof(p.VPropsNdevs) - 4,
		"sizeof.ncclRmaConfig_v14_t":                  unsafe.Sizeof(c),
		"sizeof.ncclRmaConfig_v15_t":                  unsafe.Sizeof(c),
		"sizeof.ncclRmaConfig_v16_t":                  unsafe.Sizeof(c),
		"offsetof.ncclRmaConfig_v15_t.nContexts":      unsafe.Offsetof(c.NContexts),
		"offsetof.ncclRmaConfig_v15_t.trafficClass":   unsafe.Offsetof(c.TrafficClass),
		"offsetof.ncclRmaConfig_v15_t.rankStride":     unsafe.Offsetof(c.RankStride),
		"sizeof.ncclRmaProperties_v16_t":              1,
		"sizeof.ncclRma_v14_t":                        abi.TableSlotsV14V15 * 8,
		"sizeof.ncclRma_v15_t":                        abi.TableSlotsV14V15 * 8,
		"sizeof.ncclRma_v16_t":                        abi.TableSlotsV16 * 8,
		"sizeof.ncclResult_t":                         unsafe.Sizeof(abi.Result(0)),
		"sizeof.void*":                                unsafe.Sizeof(uintptr(0)),
		"offsetof.ncclRma_v15_t.getProperties":        3 * 8,
		"offsetof.ncclRma_v15_t.iput":                 13 * 8,
		"offsetof.ncclRma_v15_t.finalize":             20 * 8,
		"offsetof.ncclRma_v14_t.iput":                 13 * 8,
		"offsetof.ncclRma_v14_t.finalize":             20 * 8,
		"offsetof.ncclRma_v16_t.getRmaProperties":     3 * 8,
		"offsetof.ncclRma_v16_t.getProperties":        4 * 8,
		"offsetof.ncclRma_v16_t.iput":                 14 * 8,
		"offsetof.ncclRma_v16_t.finalize":             21 * 8,
		"value.ncclSuccess":                           uintptr(abi.Success),
		"value.ncclInternalError":                     uintptr(abi.InternalError),
		"value.ncclInvalidArgument":                   uintptr(abi.InvalidArgument),
		"value.ncclInvalidUsage":                      uintptr(abi.InvalidUsage),
		"value.ncclRemoteError":                       uintptr(abi.RemoteError),
		"value.NCCL_PTR_HOST":                         abi.PtrHost,
		"value.NCCL_PTR_CUDA":                         abi.PtrCuda,
		"value.NCCL_PTR_DMABUF":                       abi.PtrDmaBuf,
		"value.NCCL_NET_MR_FLAG_FORCE_SO":             abi.MrFlagForceSO,
		"value.NCCL_NET_MR_FLAG_SIGNAL_NEVER_RESET":   abi.MrFlagSignalNeverReset,
		"value.NCCL_NET_SIGNAL_OP_INC":                abi.SignalOpInc,
		"value.NCCL_NET_SIGNAL_OP_ADD":                abi.SignalOpAdd,
		"value.NCCL_NET_HANDLE_MAXSIZE":               abi.HandleSize,
		"value.NCCL_NET_MAX_DEVS_PER_NIC_V12":         abi.MaxDevsPerNIC,
		"value.NCCL_NET_DEVICE_GIN_PROXY":             abi.NetDeviceGinProxy,
		"value.NCCL_RMA_OPT_FLAGS_AGGREGATE_REQUESTS": abi.OptFlagAggregateRequests,
		"value.RMA_NCCL_LOG_WARN":                     uintptr(abi.FlavorNCCL.Level(abi.LogWarn)),
		"value.RMA_NCCL_LOG_INFO":                     uintptr(abi.FlavorNCCL.Level(abi.LogInfo)),
	}
	if len(m) < len(want) {
		t.Errorf("layout printed %d keys, want at least %d", len(m), len(want))
	}
	for k, w := range want {
		v, ok := m[k]
		if !ok {
			t.Errorf("%s: not printed by layout.c", k)
			continue
		}
		got, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Errorf("%s: %q: %v", k, v, err)
			continue
		}
		if uintptr(got) != w {
			t.Errorf("%s = %d in C, %d in abi/", k, got, w)
		}
	}
	if abi.NetPropertiesSize != 128 || abi.RmaConfigSize != 12 {
		t.Errorf("abi size constants changed: %d, %d", abi.NetPropertiesSize, abi.RmaConfigSize)
	}
}

func TestLibraryExportsTables(t *testing.T) {
	lib := capiLibrary(t)

	out, err := exec.Command("nm", "-D", "--defined-only", lib).CombinedOutput()
	if err != nil {
		t.Fatalf("nm -D: %v\n%s", err, out)
	}
	types := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 {
			types[f[2]] = f[1]
		}
	}
	for _, sym := range []string{"ncclRmaPlugin_v14", "ncclRmaPlugin_v15", "ncclRmaPlugin_v16"} {
		switch ty := types[sym]; ty {
		case "D", "R":
		case "":
			t.Errorf("%s is not exported", sym)
		default:
			t.Errorf("%s has symbol type %s, want D or R (a data object)", sym, ty)
		}
	}
	for sym := range types {
		if strings.HasPrefix(sym, "ncclRmaPlugin_v") && sym != "ncclRmaPlugin_v14" &&
			sym != "ncclRmaPlugin_v15" && sym != "ncclRmaPlugin_v16" {
			t.Errorf("unexpected table %s exported", sym)
		}
	}

	out, err = exec.Command("readelf", "-d", lib).CombinedOutput()
	if err != nil {
		t.Fatalf("readelf -d: %v\n%s", err, out)
	}
	nodelete := false
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "FLAGS_1") && strings.Contains(line, "NODELETE") {
			nodelete = true
		}
	}
	if !nodelete {
		t.Errorf("library lacks FLAGS_1 NODELETE (a Go c-shared library cannot be unmapped):\n%s", out)
	}

	m := capiLayout(t, lib)
	for _, v := range []string{"v14", "v15", "v16"} {
		if got := m["table."+v+".name"]; got != plugin.PluginName {
			t.Errorf("ncclRmaPlugin_%s.name = %q, want %q", v, got, plugin.PluginName)
		}
		if got := m["table."+v+".nullslots"]; got != "0" {
			t.Errorf("ncclRmaPlugin_%s has %s NULL slots", v, got)
		}
	}
	for _, k := range []string{"table.v14v15.sameinit", "table.v16v15.sametest", "table.v14v15.diffiput"} {
		if m[k] != "1" {
			t.Errorf("%s = %q, want 1", k, m[k])
		}
	}
}

// TestLoggerFlavor checks that the plugin picks NCCL or RCCL log-level
// numbers from the object holding the logger (dladdr), that
// NCCL_RMA_WASM_LOG_FLAVOR overrides it even when set after the library was
// loaded (libc getenv), and that a NULL out-pointer is ncclInvalidArgument
// with a WARN naming the call and the argument.
func TestLoggerFlavor(t *testing.T) {
	lib := capiLibrary(t)
	dir := t.TempDir()
	root := repoRoot(t)
	for _, name := range []string{"librccl.so.1", "libnccl.so.2"} {
		out, err := exec.Command("gcc", "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror",
			"-o", filepath.Join(dir, name), filepath.Join(root, "test", "csrc", "fake_logger.c")).CombinedOutput()
		if err != nil {
			t.Fatalf("building %s: %v\n%s", name, err, out)
		}
	}
	bin := capiBuildC(t, dir, "flavor.c", "flavor")
	for _, c := range []struct {
		logger, env string
		wantWarn    string
	}{
		{"librccl.so.1", "", "3"},
		{"libnccl.so.2", "", "2"},
		{"libnccl.so.2", "rccl", "3"},
		{"librccl.so.1", "nccl", "2"},
		{"librccl.so.1", "auto", "3"},
		{"libnccl.so.2", "bogus", "2"},
	} {
		args := []string{lib, filepath.Join(dir, c.logger)}
		if c.env != "" {
			args = append(args, c.env)
		}
		cmd := exec.Command(bin, args...)
		cmd.Env = os.Environ()
		for i, kv := range cmd.Env {
			if strings.HasPrefix(kv, "NCCL_RMA_WASM_LOG_FLAVOR=") {
				cmd.Env[i] = "NCCL_RMA_WASM_LOG_FLAVOR_UNSET="
			}
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("flavor %v: %v\n%s", args, err, out)
		}
		m := map[string]string{}
		for _, line := range strings.Split(string(out), "\n") {
			if k, v, ok := strings.Cut(line, " "); ok {
				m[k] = v
			}
		}
		if m["rc"] != strconv.Itoa(int(abi.InvalidArgument)) {
			t.Errorf("%s env=%q: init(ctx=NULL) = %s, want %d", c.logger, c.env, m["rc"], abi.InvalidArgument)
		}
		if m["level"] != c.wantWarn {
			t.Errorf("%s env=%q: WARN logged at level %s, want %s", c.logger, c.env, m["level"], c.wantWarn)
		}
		if !strings.Contains(m["msg"], "init") || !strings.Contains(m["msg"], "ctx") {
			t.Errorf("%s env=%q: WARN %q does not name the call and the argument", c.logger, c.env, m["msg"])
		}
	}
}

// TestPanicIsRecovered hands connect a handle pointer that faults when read:
// the Go panic must come back as ncclInternalError with one WARN, *collComm
// must be NULL, and the plugin must keep working afterwards.
func TestPanicIsRecovered(t *testing.T) {
	lib := capiLibrary(t)
	bin := capiBuildC(t, t.TempDir(), "recover.c", "recover")
	cmd := exec.Command(bin, lib)
	cmd.Env = append(os.Environ(), "NCCL_RMA_WASM_ADDR=127.0.0.1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("recover: %v\n%s", err, out)
	}
	m := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok {
			m[k] = v
		}
	}
	want := map[string]string{
		"init": "0", "devices": "0", "listen": "0",
		"connect":           strconv.Itoa(int(abi.InternalError)),
		"connect_warns":     "1",
		"connect_coll_null": "1",
		"devices_after":     "0", "closeListen": "0", "finalize": "0",
	}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s = %q, want %q\n%s", k, m[k], v, out)
		}
	}
	if !strings.Contains(m["connect_warn"], "connect") || !strings.Contains(m["connect_warn"], "panic") {
		t.Errorf("WARN %q does not say connect panicked", m["connect_warn"])
	}
}
