package dataplane_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/handshake"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// putLands sends 64 bytes from rank 1 to rank 0 and checks they arrived.
func putLands(t *testing.T, ms []*dataplane.Mesh, owners []*meshtest.MemOwner, seed byte) {
	t.Helper()
	src := make([]byte, 64)
	for i := range src {
		src[i] = seed + byte(i)
	}
	tag := uint64(seed) + 100
	ms[1].Post(0, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: tag, Local: unsafe.Pointer(&src[0]), Size: 64}}, false, -1)
	if st := meshtest.WaitDone(t, owners[1], tag); st != abi.Success {
		t.Fatalf("put from rank 1: %v", st)
	}
	if !bytes.Equal(owners[0].Mem, src) {
		t.Fatalf("rank 0's memory holds %x, want %x", owners[0].Mem[:8], src[:8])
	}
}

// TestHelloReplayDuringConnect: an on-path party records rank 1's hello
// and proof to rank 0 and replays them on a connection of its own while
// both ranks connect, before the real stream finishes its hello. The
// listener's fresh nonce makes the replayed proof fail: the replay is
// dropped with a WARN and the connect succeeds (before the nonce, the
// replayed token was admitted and the connect failed with "two connections
// claim rank 1 lane 0").
func TestHelloReplayDuringConnect(t *testing.T) {
	got := meshtest.Warnings(t)
	meshtest.ResetLimits()
	ls, hs, his := meshtest.Pair(t)
	relay, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	// Rank 1 reaches rank 0 through the relay (same key, another port).
	via := his[0]
	via.Addr = relay.Addr().(*net.TCPAddr)
	var h0 wire.Handle
	via.Encode(&h0)
	replayGot := make(chan []byte, 1)
	go func() {
		a, err := relay.AcceptTCP()
		if err != nil {
			return
		}
		defer a.Close()
		u, err := net.DialTCP("tcp", nil, his[0].Addr)
		if err != nil {
			return
		}
		defer u.Close()
		go func() { io.Copy(a, u); a.Close() }()
		rec := make([]byte, handshake.HelloSize+handshake.ProofSize)
		if _, err := io.ReadFull(a, rec[:handshake.HelloSize]); err != nil {
			return
		}
		u.Write(rec[:handshake.HelloSize])
		if _, err := io.ReadFull(a, rec[handshake.HelloSize:]); err != nil {
			return
		}
		// The real proof is held; the replay goes first.
		b, err := net.DialTCP("tcp", nil, his[0].Addr)
		if err != nil {
			return
		}
		b.Write(rec)
		b.SetReadDeadline(time.Now().Add(15 * time.Second))
		answer, _ := io.ReadAll(b)
		b.Close()
		replayGot <- answer
		u.Write(rec[handshake.HelloSize:])
		io.Copy(u, a)
	}()
	ms, owners := meshtest.ConnectPair(t, ls, [][]*wire.Handle{hs, {&h0, hs[1]}})
	answer := <-replayGot
	if len(answer) != handshake.ChallengeSize || string(answer[:4]) != handshake.ChallengeMagic {
		t.Fatalf("the replay got %d bytes %q, want a challenge and nothing after it", len(answer), answer)
	}
	if meshtest.CountMatching(got(), "claims rank 1 of 2 lane 0 but its signature does not verify") != 1 {
		t.Fatalf("no WARN for the replay: %q", got())
	}
	putLands(t, ms, owners, 7)
}

// TestImpostorWithAllHandles: a party that read every handle connects to
// rank 0 as rank 1 before anyone connects. It cannot sign with rank 1's
// key, so it is refused with a WARN, and the real rank 1 connects and its
// put lands (before, the impostor was admitted silently and the real
// rank 1's stream either aborted the connect or was parked).
func TestImpostorWithAllHandles(t *testing.T) {
	got := meshtest.Warnings(t)
	meshtest.ResetLimits()
	ls, hs, his := meshtest.Pair(t)
	evil, err := handshake.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	// It may even present rank 1's public key as its own: the proof is
	// checked with the key in rank 1's handle, which it cannot sign for.
	posing := evil
	posing.Pub = his[1].Key
	impostor := make(chan error, 2)
	for _, id := range []*handshake.Identity{&evil, &posing} {
		c, err := net.DialTCP("tcp", nil, his[0].Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		go func(id *handshake.Identity) {
			_, err := handshake.Hello(c, &his[0].Key, id, handshake.Claim{Rank: 1, NRanks: 2, Lane: 0, Lanes: 1}, time.Now().Add(15*time.Second))
			impostor <- err
		}(id)
	}
	meshtest.WaitFor(t, "the impostors to wait for connect", func() bool { return ls[0].Gate().Strangers() == 2 })
	ms, owners := meshtest.ConnectPair(t, ls, [][]*wire.Handle{hs, hs})
	for i := 0; i < 2; i++ {
		if err := <-impostor; err == nil {
			t.Fatal("an impostor was admitted as rank 1")
		}
	}
	if n := meshtest.CountMatching(got(), "claims rank 1 of 2 lane 0 but its signature does not verify"); n != 2 {
		t.Fatalf("%d WARN lines for 2 impostors: %q", n, got())
	}
	putLands(t, ms, owners, 3)
}

// dialerSteps runs the dialer's side of the hello by hand so a test can
// tamper with each message; it returns the listener's answer to the proof
// and whether it is an ack.
func dialerSteps(t *testing.T, addr *net.TCPAddr, key *[wire.KeySize]byte, id *handshake.Identity, said, signed handshake.Claim, tamper func(proof []byte)) ([]byte, bool) {
	t.Helper()
	c, err := net.DialTCP("tcp", nil, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(15 * time.Second))
	return handshake.ForgeHello(c, key, id, said, signed, tamper)
}

// TestHelloRefusals: every way a proof can be wrong is refused with a
// rate-limited WARN and never reaches connect, which then succeeds.
func TestHelloRefusals(t *testing.T) {
	got := meshtest.Warnings(t)
	meshtest.ResetLimits()
	ls, hs, his := meshtest.Pair(t)
	ls[0].SetPeers(his, false)
	other, _, err := dataplane.Listen(dataplane.ListenOptions{Addr: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	r1 := ls[1].ID()
	good := handshake.Claim{Rank: 1, NRanks: 2, Lane: 0, Lanes: 1}
	for _, c := range []struct {
		name        string
		key         *[wire.KeySize]byte // the listener key the dialer signs for
		said, signd handshake.Claim
		tamper      func([]byte)
		warn        string
	}{
		{"bit flipped in the signature", &his[0].Key, good, good, func(p []byte) { p[20] ^= 1 }, "signature does not verify"},
		{"signed for lane 1, claims lane 0", &his[0].Key, good, handshake.Claim{Rank: 1, NRanks: 2, Lane: 1, Lanes: 2}, nil, "signature does not verify"},
		{"fabric flag flipped on the way", &his[0].Key, handshake.Claim{Rank: 1, NRanks: 2, Lane: 0, Lanes: 1, NoFabric: true}, good, nil, "signature does not verify"},
		{"signed for another listener", &other.Info().Key, good, good, nil, "signature does not verify"},
		{"claims a 3-rank communicator", &his[0].Key, handshake.Claim{Rank: 1, NRanks: 3, Lane: 0, Lanes: 1}, handshake.Claim{Rank: 1, NRanks: 3, Lane: 0, Lanes: 1}, nil, "this communicator has 2 ranks"},
		{"no proof magic", &his[0].Key, good, good, func(p []byte) { copy(p, "XXXX") }, "sent no proof"},
		{"rank outside nranks", &his[0].Key, handshake.Claim{Rank: 2, NRanks: 2, Lane: 0, Lanes: 1}, good, nil, "hello claims rank 2 of 2"},
		{"lane outside lanes", &his[0].Key, handshake.Claim{Rank: 1, NRanks: 2, Lane: 1, Lanes: 1}, good, nil, "lane 1 of 1"},
	} {
		before := len(got())
		answer, _ := dialerSteps(t, his[0].Addr, c.key, r1, c.said, c.signd, c.tamper)
		if len(answer) != 0 {
			t.Fatalf("%s: the listener answered the proof with %q", c.name, answer)
		}
		meshtest.WaitFor(t, c.name+" WARN", func() bool { return len(got()) > before })
		if line := got()[before]; !strings.Contains(line, c.warn) || !strings.Contains(line, "rejected connection") {
			t.Fatalf("%s: WARN %q, want it to say %q", c.name, line, c.warn)
		}
	}
	// The right proof on the same listener is acknowledged with the
	// listener's own signature.
	answer, acked := dialerSteps(t, his[0].Addr, &his[0].Key, r1, good, good, nil)
	if !acked {
		t.Fatalf("a correct proof got %q", answer)
	}
	// That stream is rank 1 lane 0 now; connect takes it as such and
	// refuses the real one as a second proven stream for the same lane.
	if in := <-ls[0].Conns(); in.Claim != good {
		t.Fatalf("admitted %+v", in.Claim)
	}
	if len(ls[0].Conns()) != 0 {
		t.Fatal("a refused connection reached connect")
	}
	ms, owners := meshtest.ConnectPair(t, ls, [][]*wire.Handle{hs, hs})
	putLands(t, ms, owners, 9)
}

// TestDuplicateProvenStream: two authenticated streams for one rank and
// lane are an error of connect, not silently parked.
func TestDuplicateProvenStream(t *testing.T) {
	ls, hs, his := meshtest.Pair(t)
	ls[1].SetPeers(his, false) // rank 1's listener answers rank 0's dial
	done := make(chan error, 2)
	for i := 0; i < 2; i++ {
		extra, err := net.DialTCP("tcp", nil, his[0].Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer extra.Close()
		go func() {
			_, err := handshake.Hello(extra, &his[0].Key, ls[1].ID(), handshake.Claim{Rank: 1, NRanks: 2, Lane: 0, Lanes: 1}, time.Now().Add(10*time.Second))
			done <- err
		}()
	}
	// Both are proven and queued before connect looks, so it sees them
	// ahead of rank 0's own stream.
	ls[0].SetPeers(his, false)
	meshtest.WaitFor(t, "both streams admitted", func() bool { return len(ls[0].Conns()) == 2 })
	_, err := dataplane.Connect(ls[0], hs, 0, &meshtest.MemOwner{Mem: make([]byte, 64), Done: map[uint64]abi.Result{}}, dataplane.Options{Timeout: 5 * time.Second, Lanes: 1})
	if err == nil || !strings.Contains(err.Error(), "two connections claim rank 1 lane 0") {
		t.Fatalf("connect with two proven streams for rank 1 lane 0: %v", err)
	}
	for i := 0; i < 2; i++ {
		if err := <-done; err != nil {
			t.Fatalf("a proven stream was refused: %v", err)
		}
	}
}

// TestStrangerFloodQuiet: 300 connections with garbage hellos produce a
// bounded number of WARN lines, and a real connect still works.
func TestStrangerFloodQuiet(t *testing.T) {
	got := meshtest.Warnings(t)
	meshtest.ResetLimits()
	ls, hs, his := meshtest.Pair(t)
	start := time.Now()
	garbage := bytes.Repeat([]byte{0x5a}, handshake.HelloSize)
	for i := 0; i < 300; i++ {
		c, err := net.DialTCP("tcp", nil, his[0].Addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(garbage)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadAll(c); err != nil && !errors.Is(err, net.ErrClosed) {
			t.Logf("stranger %d: %v", i, err)
		}
		c.Close()
	}
	limit := 10 + int(time.Since(start)/time.Second) + 1
	if n := meshtest.CountMatching(got(), "rejected connection"); n == 0 || n > limit {
		t.Fatalf("%d WARN lines for 300 rejected strangers in %v (limit %d)", n, time.Since(start), limit)
	}
	ms, owners := meshtest.ConnectPair(t, ls, [][]*wire.Handle{hs, hs})
	putLands(t, ms, owners, 1)
}
