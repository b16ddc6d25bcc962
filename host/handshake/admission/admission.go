// Package admission caps the connections a listener holds that have not
// authenticated yet (strangers): at most Max in all and PerSource from
// one source (Source), so that one host cannot fill the listener. A
// connection beyond either cap is refused at accept with a rate-limited
// WARN; a real dialer retries. host/dataplane's listener admits through a
// Gate before it authenticates a dialer (host/handshake).
package admission

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// Warn rate-limits, process-wide, the lines a stranger can cause (its
// refusal here, and its listener's rejections of it), so a flood of
// connections does not become a flood of log lines.
var Warn logx.Limited

// Gate counts one listener's strangers.
type Gate struct {
	// Name is the listener's address, for the WARN lines.
	Name string
	// Max caps the listener's strangers; PerSource those of one source.
	Max, PerSource int32

	strangers atomic.Int32 // accepted and not yet authenticated or dropped
	// bySource counts them per Source (only Admit adds, Leave removes).
	mu       sync.Mutex
	bySource map[netip.Addr]int32
	// Connections refused at accept: the listener held Max (full) or
	// their source held PerSource (source). The WARN lines are rate
	// limited; these count every one.
	refusedFull, refusedSource atomic.Int64
}

// Admit counts a connection just accepted from remote on local as a
// stranger and returns its source for Leave; false (after a WARN) when a
// cap refuses it, and the caller closes it.
func (g *Gate) Admit(remote, local net.Addr) (netip.Addr, bool) {
	if g.strangers.Add(1) > g.Max {
		g.strangers.Add(-1)
		g.refusedFull.Add(1)
		Warn.Warn(abi.SubsysNet, "NET/wasm: %s has %d connections that have not authenticated; closing one more from %s", g.Name, g.Max, remote)
		return netip.Addr{}, false
	}
	src := Source(remote, local)
	if !g.addSource(src) {
		g.strangers.Add(-1)
		g.refusedSource.Add(1)
		Warn.Warn(abi.SubsysNet, "NET/wasm: %s has %d connections from %s that have not authenticated; closing one more", g.Name, g.PerSource, src)
		return netip.Addr{}, false
	}
	return src, true
}

// Leave ends the count of a stranger Admit let in from src: it
// authenticated, or was dropped.
func (g *Gate) Leave(src netip.Addr) {
	g.dropSource(src)
	g.strangers.Add(-1)
}

// Strangers is how many connections the gate holds now.
func (g *Gate) Strangers() int32 { return g.strangers.Load() }

// Sources is how many sources those come from (this host not counted).
func (g *Gate) Sources() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.bySource)
}

// Refused is how many connections the caps refused: the listener full,
// and a source at its cap.
func (g *Gate) Refused() (full, source int64) {
	return g.refusedFull.Load(), g.refusedSource.Load()
}

// Source is what the per-source cap counts a connection by: an IPv4
// address, an IPv6 /64 (one host commonly holds a whole /64), and every
// loopback address as one (a local party can pick any of 127/8). A
// connection from this host itself (its source is the address it came
// to: a rank dialling its own or a co-located rank's listener) is not
// capped by source (the invalid Addr): every rank of a single-host job
// dials from it, and local processes share this host's limits anyway.
func Source(remote, local net.Addr) netip.Addr {
	ra, ok1 := remote.(*net.TCPAddr)
	la, ok2 := local.(*net.TCPAddr)
	if !ok1 || !ok2 {
		return netip.Addr{}
	}
	ip := ra.AddrPort().Addr().Unmap()
	if ip == la.AddrPort().Addr().Unmap() {
		return netip.Addr{}
	}
	switch {
	case ip.IsLoopback():
		return netip.IPv6Loopback()
	case ip.Is6():
		p, _ := ip.Prefix(64)
		return p.Addr()
	}
	return ip
}

// addSource counts one more stranger from src, refusing it beyond
// PerSource; one from this host (src invalid) is not counted.
func (g *Gate) addSource(src netip.Addr) bool {
	if !src.IsValid() {
		return true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.bySource[src] >= g.PerSource {
		return false
	}
	if g.bySource == nil {
		g.bySource = map[netip.Addr]int32{}
	}
	g.bySource[src]++
	return true
}

// dropSource forgets one stranger from src.
func (g *Gate) dropSource(src netip.Addr) {
	if !src.IsValid() {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.bySource[src]--; g.bySource[src] <= 0 {
		delete(g.bySource, src)
	}
}
