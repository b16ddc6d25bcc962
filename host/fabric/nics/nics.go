// Package nics chooses the libfabric provider a process uses (Select),
// lists the NICs it offers (List) with what the provider or sysfs says of
// each, pins them to the interface of the configured listen address (Pin)
// and resolves the TCP listen address (ListenAddr). It sits beside the
// libfabric binding (host/fabric); host/plugin reports the NICs as devices
// and host/dataplane opens endpoints on them.
package nics

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// NIC is one network device the chosen libfabric provider offers: one of
// its domains. devices/getProperties report them when the fabric
// transport is selected, and a listener on device i opens its endpoint on
// NIC i's domain.
type NIC struct {
	Domain    string // the provider's domain name (mlx5_0, eth0, ...)
	Name      string // the NIC's name (fi_nic), else the domain's
	PCIPath   string // sysfs path of the PCI device, "" when none is found
	SpeedMbps int32  // 0 when neither the provider nor sysfs says
	Loopback  bool   // a loopback interface (tcp's "lo"): never a rail
}

// List lists the distinct domains provider prov offers RDM
// endpoints with RMA on, in libfabric's order (its preference), with what
// the provider (fi_nic) or sysfs says about each device. nil when there
// is no provider (or libfabric is not loaded).
func List(prov string) []NIC {
	if prov == "" {
		return nil
	}
	infos, err := fabric.Probe(prov)
	if err != nil {
		return nil
	}
	var nics []NIC
	for _, in := range infos {
		if in.Provider != prov || in.Domain == "" {
			continue
		}
		dup := false
		for _, n := range nics {
			dup = dup || n.Domain == in.Domain
		}
		if dup {
			continue
		}
		n := NIC{Domain: in.Domain, Name: in.NIC, PCIPath: pciPath(in.PCI, in.Domain), SpeedMbps: int32(min(in.LinkSpeed/1e6, 1<<31-1))}
		if n.Name == "" {
			n.Name = in.Domain
		}
		if n.SpeedMbps <= 0 {
			n.SpeedMbps = sysfsSpeed(in.Domain)
		}
		n.Loopback = loopback(in.Domain)
		nics = append(nics, n)
	}
	return nics
}

// sysRoot is where sysfs is read (tests point it elsewhere).
var sysRoot = "/sys"

// pciPath is the sysfs path of the device: from the PCI address fi_nic
// gave, else from the domain as an RDMA device or a network interface
// (verbs names domains after the former, tcp after the latter).
func pciPath(pci, domain string) string {
	var cands []string
	if pci != "" {
		cands = append(cands, filepath.Join(sysRoot, "bus/pci/devices", pci))
	}
	if domain != "" && !strings.ContainsAny(domain, "/") {
		cands = append(cands, filepath.Join(sysRoot, "class/infiniband", domain, "device"), filepath.Join(sysRoot, "class/net", domain, "device"))
	}
	for _, c := range cands {
		if p, err := filepath.EvalSymlinks(c); err == nil {
			return pciAncestor(p)
		}
	}
	return ""
}

// pciAncestor cuts p after its last PCI address element: a virtio or
// other child device sits below the PCI function NCCL's topology wants.
func pciAncestor(p string) string {
	parts := strings.Split(p, "/")
	for i := len(parts) - 1; i > 0; i-- {
		if isBDF(parts[i]) {
			return strings.Join(parts[:i+1], "/")
		}
	}
	return p
}

// isBDF: dddd:bb:dd.f in hex.
func isBDF(s string) bool {
	if len(s) != 12 || s[4] != ':' || s[7] != ':' || s[10] != '.' {
		return false
	}
	for i, c := range s {
		if i == 4 || i == 7 || i == 10 {
			continue
		}
		if !strings.ContainsRune("0123456789abcdef", c) {
			return false
		}
	}
	return true
}

// sysfsSpeed reads a network interface's link speed in Mbps (0: unknown,
// as for loopback or a link that is down).
func sysfsSpeed(domain string) int32 {
	if domain == "" || strings.ContainsAny(domain, "/") {
		return 0
	}
	b, err := os.ReadFile(filepath.Join(sysRoot, "class/net", domain, "speed"))
	if err != nil {
		return 0
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || v <= 0 {
		return 0
	}
	return int32(v)
}

// loopback reports a loopback network interface (ARPHRD_LOOPBACK in
// sysfs, or named lo).
func loopback(domain string) bool {
	if domain == "lo" {
		return true
	}
	if domain == "" || strings.ContainsAny(domain, "/") {
		return false
	}
	b, err := os.ReadFile(filepath.Join(sysRoot, "class/net", domain, "type"))
	return err == nil && strings.TrimSpace(string(b)) == "772"
}

// AddrInterface names the network interface that NCCL_RMA_WASM_ADDR (an
// ip, ip:port or interface name) pins the listener to, "" when it pins
// none (unset, or an address no interface holds).
func AddrInterface(addr string) string {
	if addr == "" {
		return ""
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if ifi, err := net.InterfaceByName(host); err == nil {
		return ifi.Name
	}
	ip := net.ParseIP(host)
	if ip == nil || ip.IsUnspecified() {
		return ""
	}
	ifs, _ := net.Interfaces()
	for i := range ifs {
		addrs, _ := ifs[i].Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
				return ifs[i].Name
			}
		}
	}
	return ""
}

// ListenAddr turns the configured listen address (NCCL_RMA_WASM_ADDR: "ip",
// "ip:port" or an interface name) into a bind address, the counterpart of
// AddrInterface. With nothing configured it uses the first non-loopback IPv4 address that is up,
// and loopback when there is none.
func ListenAddr(addr string) (*net.TCPAddr, error) {
	// Enumerating interfaces costs about a millisecond (netlink); every
	// communicator listens again, so remember the answer per setting.
	if v, ok := resolved.Load(addr); ok {
		a := *v.(*net.TCPAddr)
		return &a, nil
	}
	a, err := resolveListenAddrUncached(addr)
	if err == nil {
		c := *a
		resolved.Store(addr, &c)
	}
	return a, err
}

var resolved sync.Map // configured address -> *net.TCPAddr

func resolveListenAddrUncached(addr string) (*net.TCPAddr, error) {
	if addr != "" {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			host, port = addr, "0"
		}
		if ifi, err := net.InterfaceByName(host); err == nil {
			ip, err := interfaceIPv4(ifi)
			if err != nil {
				return nil, err
			}
			host = ip.String()
		}
		a, err := net.ResolveTCPAddr("tcp", net.JoinHostPort(host, port))
		if err != nil {
			return nil, fmt.Errorf("bad listen address %q: %w", addr, err)
		}
		return a, nil
	}
	ifs, _ := net.Interfaces()
	for i := range ifs {
		if ifs[i].Flags&net.FlagUp == 0 || ifs[i].Flags&net.FlagLoopback != 0 {
			continue
		}
		if ip, err := interfaceIPv4(&ifs[i]); err == nil {
			return &net.TCPAddr{IP: ip}, nil
		}
	}
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}, nil
}

func interfaceIPv4(ifi *net.Interface) (net.IP, error) {
	addrs, err := ifi.Addrs()
	if err != nil {
		return nil, fmt.Errorf("interface %s: %w", ifi.Name, err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
			return n.IP.To4(), nil
		}
	}
	return nil, fmt.Errorf("interface %s has no IPv4 address", ifi.Name)
}

// Pin puts the NIC whose domain is interface ifc first (the tcp
// provider's domains are interface names), so device 0, and rail 0 of a
// listener on it, follow the address the listener was pinned to, while
// the other NICs stay for rails; a loopback interface is kept alone (it
// reaches no other host, and rails beside it would leave it). nics is
// returned unchanged when no domain is ifc (verbs domains are device
// names, mlx5_0 and so on).
func Pin(nics []NIC, ifc string) []NIC {
	if ifc == "" {
		return nics
	}
	for i, n := range nics {
		if n.Domain != ifc {
			continue
		}
		if n.Loopback {
			return []NIC{n}
		}
		out := append([]NIC{n}, nics[:i]...)
		return append(out, nics[i+1:]...)
	}
	return nics
}

// fabricChoice is what Select decided for this process.
var fabricChoice struct {
	once sync.Once
	prov string
	err  error
}

// hardware names the libfabric providers that drive an RDMA NIC: auto
// uses only these; tcp and shm only when asked for.
var hardware = []string{"verbs", "efa", "cxi", "psm3", "opx"}

// Select decides, once per process, whether listeners open a
// libfabric endpoint and on which provider. mode is auto, tcp or fabric;
// prov names a provider (empty: any that auto or fabric accepts); lib is
// the library to dlopen. It logs the decision and why. An explicit request
// (mode fabric, or a provider named) that cannot be honoured is an error
// naming what is missing, for init to fail with (NCCL's rule for an
// explicit NCCL_NET); under auto the answer is "" (TCP) with one INFO line.
func Select(mode, prov, lib string) (string, error) {
	fabricChoice.once.Do(func() { fabricChoice.prov, fabricChoice.err = selectFabric(mode, prov, lib) })
	return fabricChoice.prov, fabricChoice.err
}

func selectFabric(mode, prov, lib string) (string, error) {
	if mode == "tcp" {
		return "", nil
	}
	explicit := mode == "fabric" || prov != ""
	if err := fabric.Load(lib); err != nil {
		if explicit {
			return "", fmt.Errorf("%s asks for libfabric, which is missing: %w (install libfabric, or set NCCL_RMA_WASM_FI_LIBRARY)", asked(mode, prov), err)
		}
		logx.Info(abi.SubsysNet|abi.SubsysInit, "NET/wasm: transport %s: libfabric unavailable (%v); using TCP", mode, err)
		return "", nil
	}
	infos, err := fabric.Probe(prov)
	if err != nil {
		infos = nil
	}
	var known []fabric.Info
	if len(infos) == 0 && prov != "" {
		known, _ = fabric.ProbeAny(prov)
	}
	var all []fabric.Info
	if len(infos) == 0 && len(known) == 0 && explicit {
		all, _ = fabric.ProbeAny("")
	}
	return decide(mode, prov, infos, known, all)
}

// decide is selectFabric's choice once libfabric is loaded: infos are the
// entries offering RDM endpoints with RMA and messages (of prov, or of
// every provider), known the entries of prov with no capability asked for
// (only looked up when infos is empty), all every provider's (for the
// message, when nothing matched).
func decide(mode, prov string, infos, known, all []fabric.Info) (string, error) {
	explicit := mode == "fabric" || prov != ""
	if len(infos) == 0 {
		if !explicit {
			logx.Info(abi.SubsysNet|abi.SubsysInit, "NET/wasm: transport auto: no libfabric provider with RDM endpoints and RMA; using TCP")
			return "", nil
		}
		switch {
		case prov != "" && len(known) > 0:
			return "", fmt.Errorf("%s: libfabric provider %q (%s) offers no RDM endpoint with FI_RMA and FI_MSG", asked(mode, prov), prov, strings.Join(names(known), ", "))
		case prov != "":
			return "", fmt.Errorf("%s: libfabric has no provider %q (it has: %s)", asked(mode, prov), prov, strings.Join(names(all), ", "))
		default:
			return "", fmt.Errorf("%s: no libfabric provider offers an RDM endpoint with FI_RMA and FI_MSG (it has: %s)", asked(mode, prov), strings.Join(names(all), ", "))
		}
	}
	var seen []string
	for _, in := range infos {
		seen = append(seen, in.Provider)
		core := strings.SplitN(in.Provider, ";", 2)[0]
		hw := false
		for _, h := range hardware {
			hw = hw || core == h
		}
		// A named provider takes what libfabric matched for the name
		// ("udp" is "udp;ofi_rxd" there).
		if explicit || hw {
			why := "RDMA hardware"
			if !hw {
				why = "asked for (" + asked(mode, prov) + ")"
			}
			logx.Info(abi.SubsysNet|abi.SubsysInit, "NET/wasm: transport fabric: libfabric provider %s, domain %s (%s)", in.Provider, in.Domain, why)
			return in.Provider, nil
		}
	}
	logx.Info(abi.SubsysNet|abi.SubsysInit, "NET/wasm: transport auto: no RDMA provider among libfabric's %v; using TCP (NCCL_RMA_WASM_TRANSPORT=fabric uses them)", dedupe(seen))
	return "", nil
}

// asked names the setting that made a request explicit, for messages.
func asked(mode, prov string) string {
	switch {
	case mode == "fabric" && prov != "":
		return "NCCL_RMA_WASM_TRANSPORT=fabric with NCCL_RMA_WASM_FI_PROVIDER=" + prov
	case prov != "":
		return "NCCL_RMA_WASM_FI_PROVIDER=" + prov
	default:
		return "NCCL_RMA_WASM_TRANSPORT=fabric"
	}
}

// names lists the distinct provider names of infos ("none" when empty).
func names(infos []fabric.Info) []string {
	var s []string
	for _, in := range infos {
		s = append(s, in.Provider)
	}
	s = dedupe(s)
	if len(s) == 0 {
		return []string{"none"}
	}
	return s
}

// Hardware reports whether prov (a provider name, "verbs;ofi_rxm" for one
// layered over another) drives an RDMA NIC.
func Hardware(prov string) bool {
	for _, h := range hardware {
		if prov == h || strings.HasPrefix(prov, h+";") {
			return true
		}
	}
	return false
}

func dedupe(s []string) []string {
	var out []string
	for _, x := range s {
		dup := false
		for _, y := range out {
			dup = dup || x == y
		}
		if !dup {
			out = append(out, x)
		}
	}
	return out
}
