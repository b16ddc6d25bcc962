package instream_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp/instream"
)

// peer is the little of a link.Peer a reader asks: its tunables, its
// liveness and its teardown (anything else panics).
type peer struct {
	link.Peer
	cfg  link.Config
	quit chan struct{}
}

func (p *peer) Mesh() *link.Config    { return &p.cfg }
func (p *peer) Quit() <-chan struct{} { return p.quit }
func (p *peer) Dead() bool            { return false }

// newReader is a reader of the target's end of a loopback connection and
// the sender's end, closed when the test ends.
func newReader(t *testing.T) (*instream.Reader, *bufio.Reader, *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	out, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	in, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	p := &peer{quit: make(chan struct{})}
	r := &instream.Reader{}
	if err := r.Init(p, in); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		close(p.quit)
		in.Close()
		out.Close()
	})
	return r, bufio.NewReaderSize(r, 4096), out
}

// peekNB peeks n bytes in a turn that may not block, until they came.
func peekNB(t *testing.T, br *bufio.Reader, n int) []byte {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Microsecond) {
		b, err := br.Peek(n)
		if err == nil {
			return b
		}
		if !errors.Is(err, instream.ErrWouldBlock) || time.Now().After(deadline) {
			t.Fatalf("peek %d bytes: %v", n, err)
		}
	}
}

// waitClosed fails unless ch closes in time.
func waitClosed(t *testing.T, ch chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(time.Minute):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestProbe: the service's look between messages never parks: it says
// when the socket is empty, lets what came be read, and meets the end.
func TestProbe(t *testing.T) {
	r, br, out := newReader(t)
	if err := r.Probe(br); !errors.Is(err, instream.ErrWouldBlock) {
		t.Fatalf("probe of an empty socket: %v, want ErrWouldBlock", err)
	}
	out.Write([]byte("hello"))
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Microsecond) {
		err := r.Probe(br)
		if err == nil {
			break
		}
		if !errors.Is(err, instream.ErrWouldBlock) || time.Now().After(deadline) {
			t.Fatalf("probe: %v", err)
		}
	}
	b := make([]byte, 5)
	if _, err := io.ReadFull(br, b); err != nil || string(b) != "hello" {
		t.Fatalf("read %q, %v; want hello", b, err)
	}
	out.Close()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Microsecond) {
		err := r.Probe(br)
		if errors.Is(err, io.EOF) {
			break
		}
		if !errors.Is(err, instream.ErrWouldBlock) || time.Now().After(deadline) {
			t.Fatalf("probe of an ended stream: %v, want EOF", err)
		}
	}
}

// TestServiceWaits: a service that let go of the role parks until input
// comes, then holds the role: no caller takes a turn meanwhile.
func TestServiceWaits(t *testing.T) {
	r, br, out := newReader(t)
	r.Release()
	done := make(chan struct{})
	go func() {
		r.Wait()
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("the service took the role with no input")
	case <-time.After(20 * time.Millisecond):
	}
	out.Write([]byte("x"))
	waitClosed(t, done, "the service to take the role")
	if r.TakeTurn(true) {
		t.Fatal("a caller took a turn while the service holds the role")
	}
	if c, err := br.ReadByte(); err != nil || c != 'x' {
		t.Fatalf("read %q, %v; want x", c, err)
	}
}

// TestCallerTurns: while callers poll a stream with traffic, the service
// naps and they serve it on their threads; a caller that leaves bytes
// wakes the service, which takes the role back.
func TestCallerTurns(t *testing.T) {
	pa, cw := instream.PollActive(), instream.CallerWindow()
	savedPA, savedCW := *pa, *cw
	*pa, *cw = time.Hour, time.Hour // the service naps until kicked
	t.Cleanup(func() { *pa, *cw = savedPA, savedCW })

	r, br, out := newReader(t)
	r.Served()
	if r.TakeTurn(true) {
		t.Fatal("a caller took a turn of a stream the service holds")
	}
	r.Release()
	done := make(chan struct{})
	go func() {
		r.Wait()
		close(done)
	}()
	for deadline := time.Now().Add(time.Minute); !r.Napping().Load(); time.Sleep(100 * time.Microsecond) {
		if time.Now().After(deadline) {
			t.Fatal("the service never napped for its callers")
		}
	}

	// A caller serves a whole message on its thread.
	out.Write([]byte("abc"))
	if !r.TakeTurn(true) {
		t.Fatal("no turn for a caller while the service naps")
	}
	if b := peekNB(t, br, 3); string(b) != "abc" {
		t.Fatalf("caller read %q, want abc", b)
	}
	br.Discard(3)
	r.ServedByCaller()
	r.EndTurn(true, true, false)
	if r.CallerMsgs().Load() != 1 || r.Handoffs().Load() != 0 {
		t.Fatalf("caller msgs %d, handoffs %d; want 1, 0", r.CallerMsgs().Load(), r.Handoffs().Load())
	}

	// A caller leaves what it does not serve: the service takes over.
	out.Write([]byte("d"))
	if !r.TakeTurn(true) {
		t.Fatal("no second turn for a caller")
	}
	peekNB(t, br, 1)
	r.EndTurn(true, false, true)
	waitClosed(t, done, "the service to take back what a caller left")
	if r.Handoffs().Load() != 1 {
		t.Fatalf("handoffs %d, want 1", r.Handoffs().Load())
	}
	if c, err := br.ReadByte(); err != nil || c != 'd' {
		t.Fatalf("service read %q, %v; want d", c, err)
	}
	r.Close()
	if r.TakeTurn(true) {
		t.Fatal("a caller took a turn of a closed reader")
	}
}
