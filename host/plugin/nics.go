package plugin

import (
	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric/nics"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// withNICs is the device list NCCL is told about. When the fabric
// transport is selected (nics.Select, once per process), it is the NICs
// the provider offers: device i is NIC i (its name after the backend's
// first device's, its link speed where the provider or sysfs knows it,
// else the backend's; its PCI path), and a listener on device i opens its
// endpoint on that NIC's domain. Otherwise it is the backend's devices.
func withNICs(devs []backend.DeviceInfo) ([]backend.DeviceInfo, []nics.NIC) {
	prov, _ := selectTransport() // Init has failed already if this is an error
	list := nics.List(prov)
	if len(list) == 0 {
		return devs, nil
	}
	if ifc := nics.AddrInterface(config.Addr.Get()); ifc != "" {
		// NCCL_RMA_WASM_ADDR pins the listener to an interface: where the
		// provider's domains are interfaces (tcp), device 0 is that one
		// rather than the provider's first (the first real interface).
		if pinned := nics.Pin(list, ifc); pinned[0].Domain != list[0].Domain || len(pinned) < len(list) {
			logx.Info(abi.SubsysInit|abi.SubsysNet, "NET/wasm: NCCL_RMA_WASM_ADDR is on interface %s: device 0 is %s's domain %s (%d device(s))", ifc, prov, ifc, len(pinned))
			list = pinned
		}
	}
	base := devs[0]
	out := make([]backend.DeviceInfo, len(list))
	for i, n := range list {
		name := base.Name + "-" + n.Name
		if len(name) > 63 {
			name = name[:63]
		}
		out[i] = backend.DeviceInfo{Name: name, SpeedMbps: base.SpeedMbps, LatencyUs: base.LatencyUs}
		if n.SpeedMbps > 0 {
			out[i].SpeedMbps = n.SpeedMbps
		}
		logx.Info(abi.SubsysInit|abi.SubsysNet, "NET/wasm: device %d: %s NIC %s (domain %s, %d Mbps, pci %q)", i, prov, n.Name, n.Domain, out[i].SpeedMbps, n.PCIPath)
	}
	return out, list
}

// selectTransport is nics.Select with the settings from the environment.
func selectTransport() (string, error) {
	return nics.Select(config.Transport.Get(), config.FIProvider.Get(), config.FILibrary.Get())
}

// DevicePCIPath is the sysfs PCI path of device dev ("" when unknown or
// not a NIC), for capi to keep as a C string.
func DevicePCIPath(dev int32) string {
	l := current.Load()
	if l == nil || dev < 0 || int(dev) >= len(l.nics) {
		return ""
	}
	return l.nics[dev].PCIPath
}

// deviceDomain is the fabric domain a listener on dev opens its endpoint
// on ("" for the provider's first).
func (l *loaded) deviceDomain(dev int32) string {
	if dev < 0 || int(dev) >= len(l.nics) {
		return ""
	}
	return l.nics[dev].Domain
}

// railDomains are the domains of a listener's further rails: the other
// NICs, from dev+1 round, loopback excluded (it reaches no other host).
// A communicator uses as many as its plan has lanes (SPEC.md §4, Rails).
func (l *loaded) railDomains(dev int32) []string {
	if dev < 0 || int(dev) >= len(l.nics) {
		return nil
	}
	var d []string
	for i := 1; i < len(l.nics); i++ {
		n := l.nics[(int(dev)+i)%len(l.nics)]
		if !n.Loopback {
			d = append(d, n.Domain)
		}
	}
	return d
}
