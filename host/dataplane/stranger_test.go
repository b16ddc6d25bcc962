package dataplane_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/handshake"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// Strangers are dropped fast: what a connection that is not a rank can
// hold, and for how long (SPEC.md §9).

// strangerKinds are byte strings no rank sends: each must get its
// connection closed, never admitted. early: refused as soon as it arrives
// (a wrong byte in the hello's fixed prefix), not at the hello bound.
func strangerKinds() []struct {
	name  string
	bytes []byte
	early bool
} {
	var valid [handshake.HelloSize]byte
	var nonce [32]byte
	nonce[0] = 1
	copy(valid[:], "RMAH")
	valid[4] = handshake.Protocol
	binary.LittleEndian.PutUint32(valid[8:], 1)
	binary.LittleEndian.PutUint32(valid[12:], 2)
	binary.LittleEndian.PutUint16(valid[18:], 1)
	copy(valid[24:], nonce[:])
	forged := append([]byte(nil), valid[:]...)
	forged[4] = 2 // a hello of another version, whole
	huge := []byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0}
	return []struct {
		name  string
		bytes []byte
		early bool
	}{
		{"junk", []byte("GET / HTTP/1.0\r\n\r\n12345"), true},
		{"forged version, 5 bytes", []byte("RMAH\x02"), true},
		{"forged version, whole", forged, true},
		{"unknown flags", []byte{'R', 'M', 'A', 'H', handshake.Protocol, 0x80}, true},
		{"huge length frame", huge, true},
		{"truncated hello", valid[:40], false},
		{"magic only", []byte("RMAH"), false},
	}
}

// validHello is a well-formed hello (rank 1 of 2) whose proof no one can
// make.
func validHello() []byte {
	var b [handshake.HelloSize]byte
	copy(b[:], "RMAH")
	b[4] = handshake.Protocol
	binary.LittleEndian.PutUint32(b[8:], 1)
	binary.LittleEndian.PutUint32(b[12:], 2)
	binary.LittleEndian.PutUint16(b[18:], 1)
	b[24] = 1
	return b[:]
}

// afterHello sends a well-formed hello on a new connection to l, takes the
// challenge, then sends proof.
func afterHello(t *testing.T, l *dataplane.Listener, proof []byte) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Write(validHello())
	var ch [handshake.ChallengeSize]byte
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, ch[:]); err != nil || string(ch[:4]) != handshake.ChallengeMagic {
		t.Fatalf("no challenge for a well-formed hello: %v", err)
	}
	c.Write(proof)
	return c
}

// closedByServer waits (up to a generous 5 s) for c to be closed by the
// listener: a read that ends in EOF or a reset, not our deadline.
func closedByServer(t *testing.T, c net.Conn, what string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 256)
	// A hello of another protocol version is answered with the version
	// refusal (its magic and our protocol number, nothing else), so that
	// a rank of another build can say why; any other stranger gets nothing.
	refusal := make([]byte, handshake.ChallengeSize)
	copy(refusal, "RMAV")
	refusal[4] = handshake.Protocol
	got := 0
	for {
		n, err := c.Read(b)
		if n > 0 {
			if !strings.HasPrefix(what, "forged version") || got+n > len(refusal) || !bytes.Equal(b[:n], refusal[got:got+n]) {
				t.Fatalf("%s: the listener answered %x", what, b[:n])
			}
			got += n
		}
		if err == nil {
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("%s: still open after 5 s", what)
		}
		return // EOF or reset: the listener closed it
	}
}

// TestStrangersClosedWithinHelloBound: each kind of stranger, including
// those whose bytes are a valid start of a hello, is closed by the default
// hello bound (at most the documented 2 s; checked within 5 s) and frees
// its slot.
func TestStrangersClosedWithinHelloBound(t *testing.T) {
	meshtest.ResetLimits()
	if *dataplane.HelloTimeout() > 2*time.Second {
		t.Fatalf("helloTimeout %v, the documented bound is 2 s", *dataplane.HelloTimeout())
	}
	l, _, err := dataplane.Listen(dataplane.ListenOptions{Addr: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var wg sync.WaitGroup
	for _, k := range strangerKinds() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			c.Write(k.bytes)
			closedByServer(t, c, k.name)
		}()
	}
	wg.Wait()
	// A well-formed hello, then half a proof: closed by the same bound.
	c := afterHello(t, l, []byte("RMAP"))
	defer c.Close()
	closedByServer(t, c, "a hello with half a proof")
	meshtest.WaitFor(t, "the strangers' slots", func() bool { return l.Gate().Strangers() == 0 })
}

// TestWrongPrefixRejectedAtOnce: with the hello bound far away (a minute),
// a wrong magic, version, flag or a length frame is still closed, so it
// was refused when its bytes arrived.
func TestWrongPrefixRejectedAtOnce(t *testing.T) {
	got := meshtest.Warnings(t)
	meshtest.ResetLimits()
	defer func(d, k time.Duration) { *dataplane.HelloTimeout(), *dataplane.KeyWaitTimeout() = d, k }(*dataplane.HelloTimeout(), *dataplane.KeyWaitTimeout())
	*dataplane.HelloTimeout(), *dataplane.KeyWaitTimeout() = time.Minute, time.Minute
	l, _, err := dataplane.Listen(dataplane.ListenOptions{Addr: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, k := range strangerKinds() {
		if !k.early {
			continue
		}
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.Write(k.bytes)
		closedByServer(t, c, k.name)
		c.Close()
	}
	// A proof's wrong magic is refused at its first byte too.
	c := afterHello(t, l, []byte("X"))
	closedByServer(t, c, "a proof with a wrong magic")
	c.Close()
	lines := got()
	if meshtest.CountMatching(lines, "not an rccl-rma-wasm hello") == 0 || meshtest.CountMatching(lines, "speaks wire protocol 2 and this library") == 0 {
		t.Fatalf("the refusals do not say why: %q", lines)
	}
}

// TestStrangerCapPerAddr: one source holds at most maxStrangersPerAddr
// unauthenticated connections of a listener, even with the listener's cap
// far away; the rest are closed at accept with a WARN naming the source.
// The strangers come from 127.0.0.2 to a listener on 127.0.0.1 (from this
// host itself, a connection is not capped by source): meanwhile a rank
// dialling from 127.0.0.1 is admitted, and once they leave, one from their
// source too.
func TestStrangerCapPerAddr(t *testing.T) {
	got := meshtest.Warnings(t)
	meshtest.ResetLimits()
	defer func(n, p int32, d time.Duration) {
		*dataplane.MaxStrangers(), *dataplane.MaxStrangersPerAddr(), *dataplane.HelloTimeout() = n, p, d
	}(*dataplane.MaxStrangers(), *dataplane.MaxStrangersPerAddr(), *dataplane.HelloTimeout())
	*dataplane.MaxStrangers(), *dataplane.MaxStrangersPerAddr(), *dataplane.HelloTimeout() = 100, 4, time.Minute
	l, h, err := dataplane.Listen(dataplane.ListenOptions{Addr: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	hi, _ := wire.DecodeHandle(h)
	var held []net.Conn
	closed := 0
	other := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}
	for i := 0; i < 20; i++ {
		c, err := net.DialTCP("tcp", other, l.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte("RMAH")) // a valid start: held until the hello bound
		held = append(held, c)
	}
	// 4 stay (the hello bound is a minute away); the other 16 are closed
	// at accept.
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, c := range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			var b [1]byte
			if _, err := c.Read(b[:]); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				mu.Lock()
				closed++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if closed < 16 {
		t.Fatalf("%d of 20 strangers from one address closed, want at least 16", closed)
	}
	if n := l.Gate().Strangers(); n > 4 {
		t.Fatalf("listener holds %d strangers from one address, cap 4", n)
	}
	if n := meshtest.CountMatching(got(), "from "+netip.IPv6Loopback().String()+" that have not authenticated"); n == 0 {
		t.Fatalf("no WARN names the source: %q", got())
	}
	cl := handshake.Claim{Rank: 0, NRanks: 1, Lane: 0, Lanes: 1}
	l.SetPeers([]wire.HandleInfo{hi}, false)
	c, err := dataplane.Dial(hi, l.ID(), cl, time.Now().Add(10*time.Second))
	if err != nil {
		t.Fatalf("a rank from the listener's own address while another source is at its cap: %v", err)
	}
	c.Close()
	for _, c := range held {
		c.Close()
	}
	meshtest.WaitFor(t, "the source's count to drop", func() bool {
		return l.Gate().Strangers() == 0 && l.Gate().Sources() == 0
	})
	c2, err := net.DialTCP("tcp", other, l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, ok := handshake.ForgeHello(c2, &hi.Key, l.ID(), cl, cl, nil); !ok {
		t.Fatal("a rank from 127.0.0.2 after its strangers left was refused")
	}
}

// TestKeyWaitOutlivesHelloBound: a rank whose hello and proof arrive
// before this rank's connect started waits for the peers' keys past the
// hello bound (its own bound, keyWaitTimeout) and is admitted once they
// come; with a short key bound, it is closed instead.
func TestKeyWaitOutlivesHelloBound(t *testing.T) {
	meshtest.ResetLimits()
	defer func(d, k time.Duration) { *dataplane.HelloTimeout(), *dataplane.KeyWaitTimeout() = d, k }(*dataplane.HelloTimeout(), *dataplane.KeyWaitTimeout())
	*dataplane.HelloTimeout() = 400 * time.Millisecond
	cl := handshake.Claim{Rank: 0, NRanks: 1, Lane: 0, Lanes: 1}

	l, h, err := dataplane.Listen(dataplane.ListenOptions{Addr: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	hi, _ := wire.DecodeHandle(h)
	type result struct {
		answer []byte
		acked  bool
	}
	res := make(chan result, 1)
	go func() {
		a, ok := dialerSteps(t, hi.Addr, &hi.Key, l.ID(), cl, cl, nil)
		res <- result{a, ok}
	}()
	// Let five hello bounds pass with the proof sent and no peers known,
	// then start "connect".
	meshtest.WaitFor(t, "the dialer to be waiting", func() bool { return l.Gate().Strangers() == 1 })
	time.Sleep(5 * *dataplane.HelloTimeout())
	l.SetPeers([]wire.HandleInfo{hi}, false)
	if r := <-res; !r.acked {
		t.Fatalf("a rank waiting for connect past the hello bound got %x, not an ack", r.answer)
	}

	*dataplane.KeyWaitTimeout() = 300 * time.Millisecond
	l2, h2, err := dataplane.Listen(dataplane.ListenOptions{Addr: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	hi2, _ := wire.DecodeHandle(h2)
	if a, ok := dialerSteps(t, hi2.Addr, &hi2.Key, l2.ID(), cl, cl, nil); ok || len(a) != 0 {
		t.Fatalf("connect never started, yet the key wait answered %x", a)
	}
	meshtest.WaitFor(t, "the slot", func() bool { return l2.Gate().Strangers() == 0 })
}

// TestRankConnectsDuringFloodNetns: three network namespaces on a bridge,
// one process in each: ranks 0 and 1 of a communicator, and a stranger
// that floods rank 0's listener from its own address with connections
// holding a valid hello prefix, reopening each one the listener closes,
// many more than the listener's cap. The per-address cap keeps room for
// the ranks: both connect and a put lands, byte for byte.
func TestRankConnectsDuringFloodNetns(t *testing.T) {
	if role := os.Getenv("RMAW_FLOOD_ROLE"); role != "" {
		floodChild(t, role, os.Getenv("RMAW_FLOOD_DIR"))
		return
	}
	prefix := floodNetns(t)
	dir := t.TempDir()
	start := func(role string, ns int) (*exec.Cmd, *bytes.Buffer) {
		cmd := exec.Command("ip", "netns", "exec", fmt.Sprintf("%s%d", prefix, ns), os.Args[0],
			"-test.run=^TestRankConnectsDuringFloodNetns$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "RMAW_FLOOD_ROLE="+role, "RMAW_FLOOD_DIR="+dir)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd, &out
	}
	wait := func(cmd *exec.Cmd, out *bytes.Buffer, what string) string {
		err := cmd.Wait()
		if err != nil || !strings.Contains(out.String(), "--- PASS") {
			t.Fatalf("%s: %v\n%s", what, err, out)
		}
		return out.String()
	}
	r0, out0 := start("rank0", 0)
	r1, out1 := start("rank1", 1)
	waitFile(t, filepath.Join(dir, "handle0"))
	waitFile(t, filepath.Join(dir, "handle1"))
	fl, outF := start("flood", 2)
	waitFile(t, filepath.Join(dir, "flooding"))
	os.WriteFile(filepath.Join(dir, "go"), nil, 0o644)
	o0 := wait(r0, out0, "rank 0")
	wait(r1, out1, "rank 1")
	os.WriteFile(filepath.Join(dir, "stop"), nil, 0o644)
	t.Log(strings.TrimSpace(lineWith(wait(fl, outF, "flooder"), "flood:")))
	t.Log(strings.TrimSpace(lineWith(o0, "rank 0:")))
}

// floodCaps are the rank 0 listener's caps in the netns test, small so the
// flood is cheap: the flooder holds three times the listener's cap.
const (
	floodCap, floodCapPerAddr, floodConns = 64, 16, 192
)

// floodChild is one process of TestRankConnectsDuringFloodNetns, inside
// its namespace; the processes meet through files in dir.
func floodChild(t *testing.T, role, dir string) {
	stop := func(name string) bool { _, err := os.Stat(filepath.Join(dir, name)); return err == nil }
	if role == "flood" {
		b, _ := os.ReadFile(filepath.Join(dir, "handle0"))
		hb, _ := hex.DecodeString(strings.TrimSpace(string(b)))
		var h wire.Handle
		copy(h[:], hb)
		hi, err := wire.DecodeHandle(&h)
		if err != nil {
			t.Fatal(err)
		}
		var dials, closes atomic.Int64
		var wg sync.WaitGroup
		for i := 0; i < floodConns; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop("stop") {
					c, err := net.DialTimeout("tcp", hi.Addr.String(), time.Second)
					if err != nil {
						continue
					}
					dials.Add(1)
					c.Write([]byte{'R', 'M', 'A', 'H', handshake.Protocol, 0, 0, 0}) // a valid prefix, never finished
					c.SetReadDeadline(time.Now().Add(10 * time.Second))
					io.Copy(io.Discard, c)
					closes.Add(1)
					c.Close()
					time.Sleep(5 * time.Millisecond) // a flood, not a spin of 2 cores
				}
			}()
		}
		meshtest.WaitFor(t, "the flood to fill the listener", func() bool { return dials.Load() >= floodConns && closes.Load() > 0 })
		os.WriteFile(filepath.Join(dir, "flooding"), nil, 0o644)
		wg.Wait()
		t.Logf("flood: %d connections opened, %d closed by the listener", dials.Load(), closes.Load())
		if dials.Load() <= floodCap {
			t.Fatalf("the flood opened %d connections, not more than the listener's cap %d", dials.Load(), floodCap)
		}
		return
	}
	rank := int(role[len(role)-1] - '0')
	if rank == 0 {
		*dataplane.MaxStrangers(), *dataplane.MaxStrangersPerAddr() = floodCap, floodCapPerAddr
	}
	l, h, err := dataplane.Listen(dataplane.ListenOptions{Addr: floodAddr(rank)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	os.WriteFile(filepath.Join(dir, fmt.Sprintf("handle%d", rank)), []byte(hex.EncodeToString(h[:])), 0o644)
	waitFile(t, filepath.Join(dir, "go"))
	hs := make([]*wire.Handle, 2)
	for r := range hs {
		b, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("handle%d", r)))
		hb, _ := hex.DecodeString(strings.TrimSpace(string(b)))
		hs[r] = new(wire.Handle)
		copy(hs[r][:], hb)
	}
	owner := &meshtest.MemOwner{Mem: make([]byte, 64), Done: map[uint64]abi.Result{}}
	m, err := dataplane.Connect(l, hs, rank, owner, dataplane.Options{Timeout: 30 * time.Second, Lanes: 1, CloseTimeout: time.Second})
	if err != nil {
		t.Fatalf("rank %d could not connect during the flood: %v", rank, err)
	}
	defer m.Close()
	src := make([]byte, 64)
	for i := range src {
		src[i] = byte(0xa0 + i)
	}
	if rank == 1 {
		m.Post(0, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 7, Local: unsafe.Pointer(&src[0]), Size: 64}}, false, -1)
		if st := meshtest.WaitDone(t, owner, 7); st != abi.Success {
			t.Fatalf("put from rank 1: %v", st)
		}
		os.WriteFile(filepath.Join(dir, "put"), nil, 0o644)
		waitFile(t, filepath.Join(dir, "checked"))
		return
	}
	waitFile(t, filepath.Join(dir, "put"))
	m.Close() // its service goroutines, which wrote the put, have ended
	if !bytes.Equal(owner.Mem, src) {
		t.Fatalf("rank 0's memory holds %x, want %x", owner.Mem, src)
	}
	// The flood was capped by its source, and the listener never filled:
	// no rank's connection was refused for want of room.
	full, source := l.Gate().Refused()
	t.Logf("rank 0: %d flood connections closed at accept by the per-address cap, %d for a full listener", source, full)
	if source == 0 || full != 0 {
		t.Fatalf("refused %d by source and %d for a full listener; want some and none", source, full)
	}
	os.WriteFile(filepath.Join(dir, "checked"), nil, 0o644)
}

func floodAddr(ns int) string { return fmt.Sprintf("10.79.0.%d", ns+1) }

// waitFile waits (up to 60 s) for another process to create path.
func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func lineWith(out, sub string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}

// floodNetns makes namespaces prefix0..2, each with a veth (10.79.0.n+1/24)
// to a bridge in namespace prefix+"br" (as test/netns_test.go's buildNetns
// does), removed when the test ends; it skips where they cannot be made.
func floodNetns(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no ip command (iproute2)")
	}
	ip := func(args ...string) error {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	prefix := fmt.Sprintf("rmfl%d-%d-", os.Getpid(), time.Now().UnixNano()%100000)
	br := prefix + "br"
	if err := ip("netns", "add", br); err != nil {
		t.Skipf("ip netns does not work here: %v", err)
	}
	t.Cleanup(func() {
		for n := 0; n < 3; n++ {
			ip("netns", "del", fmt.Sprintf("%s%d", prefix, n))
		}
		ip("netns", "del", br)
	})
	steps := [][]string{{"-n", br, "link", "add", "br0", "type", "bridge"}, {"-n", br, "link", "set", "br0", "up"}}
	for n := 0; n < 3; n++ {
		ns, port := fmt.Sprintf("%s%d", prefix, n), fmt.Sprintf("p%d", n)
		steps = append(steps, []string{"netns", "add", ns}, []string{"-n", ns, "link", "set", "lo", "up"},
			[]string{"-n", ns, "link", "add", "rmfl0", "type", "veth", "peer", "name", port, "netns", br},
			[]string{"-n", ns, "addr", "add", floodAddr(n) + "/24", "dev", "rmfl0"},
			[]string{"-n", ns, "link", "set", "rmfl0", "up"},
			[]string{"-n", br, "link", "set", port, "master", "br0"},
			[]string{"-n", br, "link", "set", port, "up"})
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			t.Fatal(err)
		}
	}
	return prefix
}
