package hip

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

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
