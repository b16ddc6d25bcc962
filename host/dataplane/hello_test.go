package dataplane

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
)

// pair is two listeners of a 2-rank communicator and their handles.
func pair(t *testing.T) ([]*Listener, []*Handle, []HandleInfo) {
	t.Helper()
	ls := make([]*Listener, 2)
	hs := make([]*Handle, 2)
	his := make([]HandleInfo, 2)
	for i := range ls {
		l, h, err := Listen("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		ls[i], hs[i] = l, h
		his[i], _ = DecodeHandle(h)
	}
	return ls, hs, his
}

// connectPair runs Connect for both ranks (rank r sees handles views[r])
// and returns the meshes with their 64-byte registrations.
func connectPair(t *testing.T, ls []*Listener, views [][]*Handle) ([]*Mesh, []*memOwner) {
	t.Helper()
	owners := []*memOwner{{mem: make([]byte, 64), done: map[uint64]abi.Result{}}, {mem: make([]byte, 64), done: map[uint64]abi.Result{}}}
	ms := make([]*Mesh, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range ms {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			ms[i], errs[i] = Connect(ls[i], views[i], i, owners[i], Options{Timeout: 10 * time.Second, Lanes: 1, CloseTimeout: time.Second})
		}(i)
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("connect: rank 0: %v; rank 1: %v", errs[0], errs[1])
	}
	t.Cleanup(func() { ms[0].Close(); ms[1].Close() })
	return ms, owners
}

// putLands sends 64 bytes from rank 1 to rank 0 and checks they arrived.
func putLands(t *testing.T, ms []*Mesh, owners []*memOwner, seed byte) {
	t.Helper()
	src := make([]byte, 64)
	for i := range src {
		src[i] = seed + byte(i)
	}
	tag := uint64(seed) + 100
	ms[1].Post(0, &Op{Msg: MsgPut, MrID: 1, Tag: tag, Local: unsafe.Pointer(&src[0]), Size: 64}, false, -1)
	if st := waitDone(t, owners[1], tag); st != abi.Success {
		t.Fatalf("put from rank 1: %v", st)
	}
	if !bytes.Equal(owners[0].mem, src) {
		t.Fatalf("rank 0's memory holds %x, want %x", owners[0].mem[:8], src[:8])
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
	got := warnings(t)
	resetLimits()
	ls, hs, his := pair(t)
	relay, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	// Rank 1 reaches rank 0 through the relay (same key, another port).
	via := his[0]
	via.Addr = relay.Addr().(*net.TCPAddr)
	var h0 Handle
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
		rec := make([]byte, helloSize+proofSize)
		if _, err := io.ReadFull(a, rec[:helloSize]); err != nil {
			return
		}
		u.Write(rec[:helloSize])
		if _, err := io.ReadFull(a, rec[helloSize:]); err != nil {
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
		u.Write(rec[helloSize:])
		io.Copy(u, a)
	}()
	ms, owners := connectPair(t, ls, [][]*Handle{hs, {&h0, hs[1]}})
	answer := <-replayGot
	if len(answer) != challengeSize || string(answer[:4]) != challengeMagic {
		t.Fatalf("the replay got %d bytes %q, want a challenge and nothing after it", len(answer), answer)
	}
	if countMatching(got(), "claims rank 1 of 2 lane 0 but its signature does not verify") != 1 {
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
	got := warnings(t)
	resetLimits()
	ls, hs, his := pair(t)
	evil, err := newIdentity()
	if err != nil {
		t.Fatal(err)
	}
	// It may even present rank 1's public key as its own: the proof is
	// checked with the key in rank 1's handle, which it cannot sign for.
	posing := evil
	posing.pub = his[1].Key
	impostor := make(chan error, 2)
	for _, id := range []*identity{&evil, &posing} {
		c, err := net.DialTCP("tcp", nil, his[0].Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		go func(id *identity) {
			_, err := hello(c, &his[0].Key, id, claim{rank: 1, nranks: 2, lane: 0, lanes: 1}, time.Now().Add(15*time.Second))
			impostor <- err
		}(id)
	}
	waitFor(t, "the impostors to wait for connect", func() bool { return ls[0].strangers.Load() == 2 })
	ms, owners := connectPair(t, ls, [][]*Handle{hs, hs})
	for i := 0; i < 2; i++ {
		if err := <-impostor; err == nil {
			t.Fatal("an impostor was admitted as rank 1")
		}
	}
	if n := countMatching(got(), "claims rank 1 of 2 lane 0 but its signature does not verify"); n != 2 {
		t.Fatalf("%d WARN lines for 2 impostors: %q", n, got())
	}
	putLands(t, ms, owners, 3)
}

// dialerSteps runs the dialer's side of the hello by hand so a test can
// tamper with each message; it returns the listener's answer to the proof.
func dialerSteps(t *testing.T, addr *net.TCPAddr, key *[KeySize]byte, id *identity, said, signed claim, tamper func(proof []byte)) []byte {
	t.Helper()
	c, err := net.DialTCP("tcp", nil, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(15 * time.Second))
	var nonceD [nonceSize]byte
	nonceD[0] = 42
	var hb [helloSize]byte
	var eph [ephSize]byte
	encodeHello(&hb, said, &nonceD, &eph)
	c.Write(hb[:])
	var ch [challengeSize]byte
	if _, err := io.ReadFull(c, ch[:]); err != nil {
		return nil // refused at the hello
	}
	var nonceL [nonceSize]byte
	copy(nonceL[:], ch[4:])
	pb := make([]byte, proofSize)
	copy(pb, proofMagic)
	copy(pb[4:], ed25519.Sign(id.priv, transcript(domainDialer, &nonceL, &nonceD, key, &id.pub, &eph, &eph, signed)))
	if tamper != nil {
		tamper(pb)
	}
	c.Write(pb)
	// An ack, or whatever came before the listener closed.
	answer := make([]byte, ackSize)
	n, _ := io.ReadFull(c, answer)
	return answer[:n]
}

// TestHelloRefusals: every way a proof can be wrong is refused with a
// rate-limited WARN and never reaches connect, which then succeeds.
func TestHelloRefusals(t *testing.T) {
	got := warnings(t)
	resetLimits()
	ls, hs, his := pair(t)
	ls[0].setPeers(his, false)
	other, _, err := Listen("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	r1 := &ls[1].id
	good := claim{rank: 1, nranks: 2, lane: 0, lanes: 1}
	for _, c := range []struct {
		name        string
		key         *[KeySize]byte // the listener key the dialer signs for
		said, signd claim
		tamper      func([]byte)
		warn        string
	}{
		{"bit flipped in the signature", &his[0].Key, good, good, func(p []byte) { p[20] ^= 1 }, "signature does not verify"},
		{"signed for lane 1, claims lane 0", &his[0].Key, good, claim{rank: 1, nranks: 2, lane: 1, lanes: 2}, nil, "signature does not verify"},
		{"fabric flag flipped on the way", &his[0].Key, claim{rank: 1, nranks: 2, lane: 0, lanes: 1, noFab: true}, good, nil, "signature does not verify"},
		{"signed for another listener", &other.info.Key, good, good, nil, "signature does not verify"},
		{"claims a 3-rank communicator", &his[0].Key, claim{rank: 1, nranks: 3, lane: 0, lanes: 1}, claim{rank: 1, nranks: 3, lane: 0, lanes: 1}, nil, "this communicator has 2 ranks"},
		{"no proof magic", &his[0].Key, good, good, func(p []byte) { copy(p, "XXXX") }, "sent no proof"},
		{"rank outside nranks", &his[0].Key, claim{rank: 2, nranks: 2, lane: 0, lanes: 1}, good, nil, "hello claims rank 2 of 2"},
		{"lane outside lanes", &his[0].Key, claim{rank: 1, nranks: 2, lane: 1, lanes: 1}, good, nil, "lane 1 of 1"},
	} {
		before := len(got())
		answer := dialerSteps(t, his[0].Addr, c.key, r1, c.said, c.signd, c.tamper)
		if len(answer) != 0 {
			t.Fatalf("%s: the listener answered the proof with %q", c.name, answer)
		}
		waitFor(t, c.name+" WARN", func() bool { return len(got()) > before })
		if line := got()[before]; !strings.Contains(line, c.warn) || !strings.Contains(line, "rejected connection") {
			t.Fatalf("%s: WARN %q, want it to say %q", c.name, line, c.warn)
		}
	}
	// The right proof on the same listener is acknowledged with the
	// listener's own signature.
	answer := dialerSteps(t, his[0].Addr, &his[0].Key, r1, good, good, nil)
	if len(answer) != ackSize || string(answer[:4]) != ackMagic {
		t.Fatalf("a correct proof got %q", answer)
	}
	// That stream is rank 1 lane 0 now; connect takes it as such and
	// refuses the real one as a second proven stream for the same lane.
	if in := <-ls[0].conns; in.claim != good {
		t.Fatalf("admitted %+v", in.claim)
	}
	if len(ls[0].conns) != 0 {
		t.Fatal("a refused connection reached connect")
	}
	ms, owners := connectPair(t, ls, [][]*Handle{hs, hs})
	putLands(t, ms, owners, 9)
}

// TestDuplicateProvenStream: two authenticated streams for one rank and
// lane are an error of connect, not silently parked.
func TestDuplicateProvenStream(t *testing.T) {
	ls, hs, his := pair(t)
	ls[1].setPeers(his, false) // rank 1's listener answers rank 0's dial
	done := make(chan error, 2)
	for i := 0; i < 2; i++ {
		extra, err := net.DialTCP("tcp", nil, his[0].Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer extra.Close()
		go func() {
			_, err := hello(extra, &his[0].Key, &ls[1].id, claim{rank: 1, nranks: 2, lane: 0, lanes: 1}, time.Now().Add(10*time.Second))
			done <- err
		}()
	}
	// Both are proven and queued before connect looks, so it sees them
	// ahead of rank 0's own stream.
	ls[0].setPeers(his, false)
	waitFor(t, "both streams admitted", func() bool { return len(ls[0].conns) == 2 })
	_, err := Connect(ls[0], hs, 0, &memOwner{mem: make([]byte, 64), done: map[uint64]abi.Result{}}, Options{Timeout: 5 * time.Second, Lanes: 1})
	if err == nil || !strings.Contains(err.Error(), "two connections claim rank 1 lane 0") {
		t.Fatalf("connect with two proven streams for rank 1 lane 0: %v", err)
	}
	for i := 0; i < 2; i++ {
		if err := <-done; err != nil {
			t.Fatalf("a proven stream was refused: %v", err)
		}
	}
}

// TestDialerChecksListener: a listener at the dialled address that does
// not hold the key in the handle cannot complete the hello.
func TestDialerChecksListener(t *testing.T) {
	fake, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	real, err := newIdentity()
	if err != nil {
		t.Fatal(err)
	}
	evil, err := newIdentity()
	if err != nil {
		t.Fatal(err)
	}
	me, _ := newIdentity()
	go func() {
		c, err := fake.AcceptTCP()
		if err != nil {
			return
		}
		defer c.Close()
		var hb [helloSize]byte
		io.ReadFull(c, hb[:])
		cl, nonceD, ephD, _ := decodeHello(hb[:])
		var nonceL [nonceSize]byte
		var ephL [ephSize]byte
		c.Write(append(append([]byte(challengeMagic), nonceL[:]...), ephL[:]...))
		var pb [proofSize]byte
		io.ReadFull(c, pb[:])
		// It answers with a well-formed ack, signed with its own key.
		c.Write(append([]byte(ackMagic), ed25519.Sign(evil.priv, transcript(domainListener, &nonceL, &nonceD, &real.pub, &me.pub, &ephL, &ephD, cl))...))
		io.ReadAll(c)
	}()
	c, err := net.DialTCP("tcp", nil, fake.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = hello(c, &real.pub, &me, claim{rank: 0, nranks: 2, lane: 0, lanes: 1}, time.Now().Add(5*time.Second))
	if err == nil || !strings.Contains(err.Error(), "did not prove it holds the key") {
		t.Fatalf("a listener without the handle's key: %v", err)
	}
}

// TestStrangerFloodQuiet: 300 connections with garbage hellos produce a
// bounded number of WARN lines, and a real connect still works.
func TestStrangerFloodQuiet(t *testing.T) {
	got := warnings(t)
	resetLimits()
	ls, hs, his := pair(t)
	start := time.Now()
	garbage := bytes.Repeat([]byte{0x5a}, helloSize)
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
	if n := countMatching(got(), "rejected connection"); n == 0 || n > limit {
		t.Fatalf("%d WARN lines for 300 rejected strangers in %v (limit %d)", n, time.Since(start), limit)
	}
	ms, owners := connectPair(t, ls, [][]*Handle{hs, hs})
	putLands(t, ms, owners, 1)
}
