package nics

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric"
)

// TestNICSysfs: PCI paths and link speeds read from a sysfs tree, for an
// RDMA device, a network interface below a virtio child, a PCI address
// fi_nic gave, and devices with none.
func TestNICSysfs(t *testing.T) {
	root := t.TempDir()
	old := sysRoot
	sysRoot = root
	defer func() { sysRoot = old }()
	mk := func(p string) {
		if err := os.MkdirAll(filepath.Join(root, p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link := func(target, name string) {
		mk(filepath.Dir(name))
		if err := os.Symlink(filepath.Join(root, target), filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	mk("devices/pci0000:00/0000:00:03.0/virtio2")
	mk("devices/pci0000:16/0000:16:02.0/0000:17:00.0")
	link("devices/pci0000:00/0000:00:03.0/virtio2", "class/net/eth0/device")
	link("devices/pci0000:16/0000:16:02.0/0000:17:00.0", "class/infiniband/mlx5_0/device")
	link("devices/pci0000:16/0000:16:02.0/0000:17:00.0", "bus/pci/devices/0000:17:00.0")
	if err := os.WriteFile(filepath.Join(root, "class/net/eth0/speed"), []byte("25000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mk("class/net/lo")
	if err := os.WriteFile(filepath.Join(root, "class/net/lo/speed"), []byte("-1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ pci, domain, want string }{
		{"", "eth0", root + "/devices/pci0000:00/0000:00:03.0"},
		{"", "mlx5_0", root + "/devices/pci0000:16/0000:16:02.0/0000:17:00.0"},
		{"0000:17:00.0", "whatever", root + "/devices/pci0000:16/0000:16:02.0/0000:17:00.0"},
		{"", "lo", ""},
		{"", "../../etc", ""},
	} {
		// The temp dir itself may sit below symlinks: compare resolved.
		want := c.want
		if want != "" {
			if r, err := filepath.EvalSymlinks(want); err == nil {
				want = r
			}
		}
		if got := pciPath(c.pci, c.domain); got != want {
			t.Errorf("pciPath(%q, %q) = %q, want %q", c.pci, c.domain, got, want)
		}
	}
	if got := sysfsSpeed("eth0"); got != 25000 {
		t.Errorf("eth0 speed %d, want 25000", got)
	}
	if got := sysfsSpeed("lo"); got != 0 {
		t.Errorf("lo speed %d, want 0 (unknown)", got)
	}
	if got := sysfsSpeed("nonexistent"); got != 0 {
		t.Errorf("missing interface speed %d, want 0", got)
	}
	for s, want := range map[string]bool{"0000:17:00.0": true, "0000:17:00": false, "virtio2": false, "000g:17:00.0": false} {
		if isBDF(s) != want {
			t.Errorf("isBDF(%q) = %v", s, !want)
		}
	}
}

// TestAddrInterface: the interface an address pins (loopback is always
// there), and none for unset, unspecified or foreign addresses.
func TestAddrInterface(t *testing.T) {
	lo := AddrInterface("lo")
	if lo != "lo" {
		t.Skipf("no interface named lo here (%q)", lo)
	}
	for addr, want := range map[string]string{"127.0.0.1": "lo", "127.0.0.1:4000": "lo", "lo": "lo",
		"": "", "0.0.0.0": "", "192.0.2.77": "", "not-an-address": ""} {
		if got := AddrInterface(addr); got != want {
			t.Errorf("AddrInterface(%q) = %q, want %q", addr, got, want)
		}
	}
}

// TestPinNICs: a pinned interface that is one of the domains comes first
// (alone when it is loopback); otherwise the list stays.
func TestPinNICs(t *testing.T) {
	nics := []NIC{{Domain: "eth0"}, {Domain: "lo", Loopback: true}, {Domain: "eth1"}}
	if got := Pin(nics, "lo"); len(got) != 1 || got[0].Domain != "lo" {
		t.Fatalf("pinned to lo: %+v", got)
	}
	if got := Pin(nics, "eth1"); len(got) != 3 || got[0].Domain != "eth1" || got[1].Domain != "eth0" || got[2].Domain != "lo" {
		t.Fatalf("pinned to eth1: %+v", got)
	}
	if got := Pin(nics, "ib0"); len(got) != 3 || got[0].Domain != "eth0" {
		t.Fatalf("pinned to an interface that is no domain: %+v", got)
	}
	if got := Pin(nics, ""); len(got) != 3 || got[0].Domain != "eth0" {
		t.Fatalf("unpinned: %+v", got)
	}
	if nics[0].Domain != "eth0" || nics[2].Domain != "eth1" {
		t.Fatalf("the input changed: %+v", nics)
	}
}

// TestSelectFabricModes: tcp never loads libfabric; a missing library
// fails an explicit request (transport fabric or a provider named) and
// leaves auto on TCP.
func TestSelectFabricModes(t *testing.T) {
	if p, err := selectFabric("tcp", "tcp;ofi_rxm", "libfabric.so.1"); p != "" || err != nil {
		t.Fatalf("tcp mode chose %q, %v", p, err)
	}
	if err := fabric.Load("/nonexistent/libfabric.so.1"); err == nil {
		t.Skip("libfabric already loaded in this process")
	}
	if p, err := selectFabric("fabric", "", "/nonexistent/libfabric.so.1"); p != "" || err == nil || !strings.Contains(err.Error(), "libfabric, which is missing") {
		t.Fatalf("fabric without libfabric: %q, %v", p, err)
	}
	if p, err := selectFabric("auto", "efa", "/nonexistent/libfabric.so.1"); p != "" || err == nil || !strings.Contains(err.Error(), "NCCL_RMA_WASM_FI_PROVIDER=efa") {
		t.Fatalf("a named provider without libfabric: %q, %v", p, err)
	}
	if p, err := selectFabric("auto", "", "/nonexistent/libfabric.so.1"); p != "" || err != nil {
		t.Fatalf("auto without libfabric: %q, %v", p, err)
	}
}

// TestDecideExplicit: the choice once libfabric is loaded, on made-up
// probe answers: each way an explicit request fails names what is
// missing; auto falls back; a named provider takes libfabric's match.
func TestDecideExplicit(t *testing.T) {
	rdm := []fabric.Info{{Provider: "udp;ofi_rxd", Domain: "lo"}}
	dgram := []fabric.Info{{Provider: "udp", Domain: "lo"}}
	all := []fabric.Info{{Provider: "tcp;ofi_rxm"}, {Provider: "shm"}, {Provider: "shm"}}
	for _, c := range []struct {
		mode, prov        string
		infos, known, all []fabric.Info
		want, errHas      string
	}{
		{"auto", "udp", nil, dgram, nil, "", `provider "udp" (udp) offers no RDM endpoint with FI_RMA and FI_MSG`},
		{"fabric", "udp", nil, dgram, nil, "", "NCCL_RMA_WASM_TRANSPORT=fabric with NCCL_RMA_WASM_FI_PROVIDER=udp"},
		{"auto", "no-such-provider", nil, nil, all, "", `libfabric has no provider "no-such-provider" (it has: tcp;ofi_rxm, shm)`},
		{"fabric", "", nil, nil, all, "", "NCCL_RMA_WASM_TRANSPORT=fabric: no libfabric provider offers an RDM endpoint"},
		{"auto", "", nil, nil, nil, "", ""},
		{"auto", "", rdm, nil, nil, "", ""},
		{"auto", "udp", rdm, nil, nil, "udp;ofi_rxd", ""},
		{"fabric", "", rdm, nil, nil, "udp;ofi_rxd", ""},
		{"auto", "", []fabric.Info{{Provider: "tcp;ofi_rxm"}, {Provider: "verbs;ofi_rxm"}}, nil, nil, "verbs;ofi_rxm", ""},
	} {
		got, err := decide(c.mode, c.prov, c.infos, c.known, c.all)
		if got != c.want || (err == nil) != (c.errHas == "") || (err != nil && !strings.Contains(err.Error(), c.errHas)) {
			t.Errorf("decide(%s, %q) = %q, %v; want %q, error containing %q", c.mode, c.prov, got, err, c.want, c.errHas)
		}
	}
}
