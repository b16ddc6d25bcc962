package hip

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
)

// hipPresent reports whether a libamdhip64 is installed where dlopen looks.
func hipPresent() bool {
	for _, dir := range []string{"/usr/lib/x86_64-linux-gnu", "/opt/rocm/lib", "/usr/lib64", "/usr/lib"} {
		if m, _ := filepath.Glob(filepath.Join(dir, "libamdhip64.so*")); len(m) > 0 {
			return true
		}
	}
	return false
}

// TestProbeWithoutDevice: no AMD GPU exists on these machines. Without the
// runtime (a name that is not installed, and the usual names on machines
// without ROCm) the probe says the library is missing; with it (Debian's
// libamdhip64-5) the runtime loads and reports no device. Either way no
// device is registered, so ptrSupport stays HOST.
func TestProbeWithoutDevice(t *testing.T) {
	if _, err := os.Stat("/dev/kfd"); err == nil {
		t.Skip("an AMD GPU driver is present")
	}
	if _, err := open("libamdhip64-not-installed.so"); err == nil || !strings.Contains(err.Error(), "libamdhip64-not-installed.so") {
		t.Fatalf("a missing runtime: %v, want dlopen's error naming the library", err)
	}
	n, err := open("")
	if err == nil {
		t.Fatalf("HIP runtime found %d device(s) on a machine without an AMD GPU", n)
	}
	// Missing runtime: dlopen's error names the library; present runtime
	// (Debian's libamdhip64-5 here): it finds no device.
	if msg := err.Error(); !strings.Contains(msg, "libamdhip64") && !strings.Contains(msg, "no HIP device") {
		t.Fatalf("probe error %q names neither the missing library nor the missing device", msg)
	}
	if hipPresent() && !strings.Contains(err.Error(), "no HIP device") {
		t.Fatalf("runtime installed, but the probe failed before counting devices: %v", err)
	}
	t.Logf("runtime present: %v; probe: %v", hipPresent(), err)
	Probe()
	if devmem.Get() != nil {
		t.Fatal("a device was registered without a HIP device")
	}
}

// TestLocate: a HIP context is the device ordinal + 1; a NIC reaches that
// memory through libfabric's ROCR interface.
func TestLocate(t *testing.T) {
	var d devmem.Locator = hipDevice{}
	if iface, dev, err := d.Locate(3, 0x7000); err != nil || iface != devmem.IfaceROCR || dev != 2 {
		t.Fatalf("Locate(ctx 3) = %d, %d, %v; want ROCR, device 2", iface, dev, err)
	}
	if _, _, err := d.Locate(0, 0x7000); err == nil {
		t.Fatal("context 0 (host memory) located on a device")
	}
}

// fakeRuntime builds test/gpu/fakehip.c (with extra cc flags) into a
// temporary directory and opens it, or skips without a C compiler.
func fakeRuntime(t *testing.T, flags ...string) {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler")
	}
	lib := filepath.Join(t.TempDir(), "libamdhip64.so")
	args := append([]string{"-shared", "-fPIC", "-o", lib, "../../../test/gpu/fakehip.c", "-lpthread"}, flags...)
	if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("building the fake runtime: %v\n%s", err, out)
	}
	if n, err := open(lib); err != nil || n != 2 {
		t.Fatalf("fake runtime: %d devices, %v", n, err)
	}
}

// TestExportDmaBuf: the RDMA path's DMA-BUF export widens the range to
// whole pages (the fake refuses anything else) and returns the range's
// offset in the fd.
func TestExportDmaBuf(t *testing.T) {
	fakeRuntime(t)
	var x devmem.DmaBufExporter = hipDevice{}
	pg := uintptr(os.Getpagesize())
	ptr := 0x10000*pg + 0x123
	fd, off, err := x.ExportDmaBuf(2, ptr, 3*uint64(pg))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	if off != 0x123 || st.Size != int64(4*pg) {
		t.Fatalf("offset %#x, span %d bytes; want 0x123 and %d (four pages)", off, st.Size, 4*pg)
	}
}

// TestExportDmaBufMissing: a runtime without hipMemGetHandleForAddressRange
// gives an error naming it (the registration then uses the address range).
func TestExportDmaBufMissing(t *testing.T) {
	fakeRuntime(t, "-DFAKEHIP_NO_DMABUF")
	if _, _, err := (hipDevice{}).ExportDmaBuf(1, 0x1000, 8); err == nil || !strings.Contains(err.Error(), "hipMemGetHandleForAddressRange") {
		t.Fatalf("a runtime without the export: %v, want an error naming it", err)
	}
}

func TestPageSpan(t *testing.T) {
	pg := uintptr(os.Getpagesize())
	for _, c := range []struct {
		ptr  uintptr
		size uint64
		base uintptr
		n    uint64
	}{{pg, 1, pg, uint64(pg)}, {pg + 1, uint64(pg), pg, 2 * uint64(pg)}, {2*pg - 1, 1, pg, uint64(pg)}, {3 * pg, 2 * uint64(pg), 3 * pg, 2 * uint64(pg)}} {
		base, n, off := devmem.PageSpan(c.ptr, c.size)
		if base != c.base || n != c.n || off != uint64(c.ptr-c.base) {
			t.Errorf("PageSpan(%#x, %d) = %#x, %d, %d; want %#x, %d", c.ptr, c.size, base, n, off, c.base, c.n)
		}
	}
}
