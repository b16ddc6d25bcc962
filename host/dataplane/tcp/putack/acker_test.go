package putack_test

import (
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp/putack"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// tcpPair is a loopback connection: the stream an acker writes on and the
// initiator's end that reads its acks.
func tcpPair(t *testing.T) (target, initiator *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	initiator, err = net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	target, err = ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { target.Close(); initiator.Close() })
	return target, initiator
}

// readAck reads one header from c and returns its count, failing unless
// it is a put acknowledgement.
func readAck(t *testing.T, c *net.TCPConn) uint64 {
	t.Helper()
	var b [wire.HeaderSize]byte
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, b[:]); err != nil {
		t.Fatalf("read an ack: %v", err)
	}
	var h wire.Header
	h.Decode(b[:])
	if h.Typ != wire.MsgPutAck {
		t.Fatalf("message type %d, want a put ack (%d)", h.Typ, wire.MsgPutAck)
	}
	return h.Seq
}

// nothingToRead fails if c carries a byte within a short wait.
func nothingToRead(t *testing.T, c *net.TCPConn) {
	t.Helper()
	var b [1]byte
	c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if n, err := c.Read(b[:]); n > 0 || err == nil {
		t.Fatal("an ack was written alone")
	}
	c.SetReadDeadline(time.Time{})
}

// TestAloneOnDrain: an acker that does not ride writes one cumulative ack
// per drain with news, on the stream itself, and none without news.
func TestAloneOnDrain(t *testing.T) {
	in, out := tcpPair(t)
	var a putack.Acker
	a.Land()
	a.Land()
	a.Land()
	if a.Unacked() != 3 {
		t.Fatalf("unacked %d, want 3", a.Unacked())
	}
	if err := a.Drained(in); err != nil {
		t.Fatal(err)
	}
	if n := readAck(t, out); n != 3 {
		t.Fatalf("ack of %d puts, want 3", n)
	}
	if err := a.Drained(in); err != nil {
		t.Fatal(err)
	}
	nothingToRead(t, out)
	if a.Unacked() != 0 || a.Alone() != 1 || a.Owed() != 0 {
		t.Fatalf("unacked %d, alone %d, owed %d; want 0, 1, 0", a.Unacked(), a.Alone(), a.Owed())
	}
}

// riding returns an Acker riding one lane whose batch count it returns,
// with the given delay and bound, alone called for an ack sent alone; it
// stops at the test's end.
func riding(t *testing.T, delay, bound time.Duration, alone func()) (*putack.Acker, *atomic.Uint64) {
	var d, b atomic.Int64
	written := new(atomic.Uint64)
	d.Store(int64(delay))
	b.Store(int64(bound))
	a := new(putack.Acker)
	a.Ride(&putack.Lanes{Batches: []*atomic.Uint64{written}, Delay: &d, Bound: &b, Alone: alone})
	t.Cleanup(a.Stop)
	return a, written
}

// TestRideAndClaim: after a lane wrote, a drain leaves the ack to the
// lanes (owed, stale once Delay passed); the lane that claims it carries
// it, and nobody can claim that count again.
func TestRideAndClaim(t *testing.T) {
	in, out := tcpPair(t)
	a, written := riding(t, time.Hour, time.Hour, func() {})
	written.Add(1) // a lane wrote since the last drain: traffic both ways
	a.Land()
	a.Land()
	if err := a.Drained(in); err != nil {
		t.Fatal(err)
	}
	nothingToRead(t, out)
	if n := a.Owed(); n != 2 {
		t.Fatalf("owed %d, want 2", n)
	}
	if a.Stale() {
		t.Fatal("stale before its delay passed")
	}
	if !a.Claim(2) || a.Claim(2) || a.Owed() != 0 {
		t.Fatal("a count claimed twice, or still owed once claimed")
	}
	if pub, sent, armed := a.State(); pub != 2 || sent != 2 || !armed {
		t.Fatalf("pub %d sent %d armed %v; want 2, 2, true", pub, sent, armed)
	}
	// A failover may have lost the carried count: it is owed again.
	a.Rehome()
	if n := a.Owed(); n != 2 {
		t.Fatalf("owed %d after a rehome, want 2", n)
	}
}

// TestStaleAndNoBatch: a drain with no lane writing since the last one
// acknowledges alone; an ack left for the lanes goes stale after Delay.
func TestStaleAndNoBatch(t *testing.T) {
	in, out := tcpPair(t)
	a, written := riding(t, 0, time.Hour, func() {})
	a.Land()
	if err := a.Drained(in); err != nil {
		t.Fatal(err)
	}
	if n := readAck(t, out); n != 1 {
		t.Fatalf("ack of %d puts, want 1", n)
	}
	written.Add(1)
	a.Land()
	if err := a.Drained(in); err != nil {
		t.Fatal(err)
	}
	if !a.Stale() { // Delay 0: a caller sends it alone at once
		t.Fatal("an owed ack past its delay is not stale")
	}
}

// TestTimerSendsAlone: an ack left for lanes that never write leaves
// through Lanes.Alone once Bound passed, with nobody calling.
func TestTimerSendsAlone(t *testing.T) {
	in, _ := tcpPair(t)
	alone := make(chan struct{}, 1)
	a, written := riding(t, time.Hour, time.Millisecond, func() {
		select {
		case alone <- struct{}{}:
		default:
		}
	})
	written.Add(1)
	a.Land()
	if err := a.Drained(in); err != nil {
		t.Fatal(err)
	}
	select {
	case <-alone:
	case <-time.After(5 * time.Second):
		t.Fatal("the timer never sent the owed ack")
	}
	if _, _, armed := a.State(); armed {
		t.Fatal("the timer is still armed after it fired")
	}
}

// TestNackedBarsRiding: after a nack the stream's acks follow it on the
// stream itself, even when a lane wrote.
func TestNackedBarsRiding(t *testing.T) {
	in, out := tcpPair(t)
	a, written := riding(t, time.Hour, time.Hour, func() {})
	a.Nacked()
	if a.Rides() {
		t.Fatal("acks still ride after a nack")
	}
	written.Add(1)
	a.Land()
	if err := a.Drained(in); err != nil {
		t.Fatal(err)
	}
	if n := readAck(t, out); n != 1 {
		t.Fatalf("ack of %d puts, want 1", n)
	}
}

// TestHold: a held acker acknowledges nothing, alone or on the lanes.
func TestHold(t *testing.T) {
	in, out := tcpPair(t)
	var a putack.Acker
	a.Hold().Store(true)
	a.Land()
	if err := a.Flush(in); err != nil {
		t.Fatal(err)
	}
	nothingToRead(t, out)
	if a.Owed() != 0 || a.Unacked() != 1 {
		t.Fatalf("owed %d, unacked %d; want 0, 1", a.Owed(), a.Unacked())
	}
	a.Hold().Store(false)
	if err := a.Flush(in); err != nil {
		t.Fatal(err)
	}
	if n := readAck(t, out); n != 1 {
		t.Fatalf("ack of %d puts, want 1", n)
	}
}
