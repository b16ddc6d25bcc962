package admission

import (
	"net"
	"net/netip"
	"testing"
)

func tcp(ip string) *net.TCPAddr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: 5} }

// TestSource: what the per-source cap counts by, for a listener on
// 10.9.9.9.
func TestSource(t *testing.T) {
	local := &net.TCPAddr{IP: net.ParseIP("10.9.9.9"), Port: 6}
	for _, c := range []struct{ in, want string }{
		{"10.9.9.9", "invalid IP"}, // this host: not capped by source
		{"::ffff:10.9.9.9", "invalid IP"},
		{"10.1.2.3", "10.1.2.3"},
		{"::ffff:10.1.2.3", "10.1.2.3"},
		{"127.0.0.1", "::1"},
		{"127.9.9.9", "::1"},
		{"::1", "::1"},
		{"2001:db8:1:2:3:4:5:6", "2001:db8:1:2::"},
		{"2001:db8:1:2:ffff::1", "2001:db8:1:2::"},
	} {
		if got := Source(tcp(c.in), local).String(); got != c.want {
			t.Errorf("Source(%s) = %s, want %s", c.in, got, c.want)
		}
	}
	if got := Source(&net.UnixAddr{Name: "x"}, local); got.IsValid() {
		t.Errorf("Source of a non-TCP address = %s, want invalid", got)
	}
}

// TestGateCaps: a source holds at most PerSource, the listener at most
// Max; this host is capped only by Max; Leave gives the room back, and
// every refusal is counted by its cause.
func TestGateCaps(t *testing.T) {
	g := &Gate{Name: "10.9.9.9:6", Max: 6, PerSource: 2}
	local := tcp("10.9.9.9")
	a, b := tcp("10.1.1.1"), tcp("2001:db8::1")
	var srcs []netip.Addr
	admit := func(r net.Addr, want bool) {
		t.Helper()
		src, ok := g.Admit(r, local)
		if ok != want {
			t.Fatalf("Admit(%s) = %v, want %v (strangers %d)", r, ok, want, g.Strangers())
		}
		if ok {
			srcs = append(srcs, src)
		}
	}
	admit(a, true)
	admit(a, true)
	admit(a, false) // a's cap
	admit(b, true)
	admit(tcp("2001:db8::2"), true) // the same /64
	admit(tcp("2001:db8::3"), false)
	admit(local, true) // this host: no source cap
	admit(local, true)
	admit(local, false) // Max
	if g.Strangers() != 6 || g.Sources() != 2 {
		t.Fatalf("%d strangers from %d sources, want 6 from 2", g.Strangers(), g.Sources())
	}
	if full, source := g.Refused(); full != 1 || source != 2 {
		t.Fatalf("refused %d full, %d by source; want 1 and 2", full, source)
	}
	g.Leave(srcs[0]) // one of a's
	admit(a, true)
	srcs = srcs[1:]
	for _, s := range srcs {
		g.Leave(s)
	}
	if g.Strangers() != 0 || g.Sources() != 0 {
		t.Fatalf("%d strangers from %d sources after all left, want none", g.Strangers(), g.Sources())
	}
}
