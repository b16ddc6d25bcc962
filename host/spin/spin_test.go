package spin

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a.(*net.TCPConn), b.(*net.TCPConn)
}

// TestSpinReader reads bytes that arrive in pieces with pauses shorter and
// longer than the spin, an idle socket (the reader must park: no spin slot
// held), the peer's close (EOF) and a local close during a read.
func TestSpinReader(t *testing.T) {
	w, c := tcpPair(t)
	r := NewReader(c, 2*time.Millisecond, 1, nil)
	if _, ok := r.(*spinReader); !ok {
		t.Fatalf("newSpinReader returned %T, want a spinReader", r)
	}
	if plain := NewReader(c, 0, 1, nil); plain != io.Reader(c) {
		t.Fatal("spin 0 must read the connection itself")
	}
	if plain := NewReader(c, time.Millisecond, 0, nil); plain != io.Reader(c) {
		t.Fatal("no spin slots must read the connection itself")
	}
	want := make([]byte, 64<<10)
	for i := range want {
		want[i] = byte(i*7 + i>>8)
	}
	go func() {
		for i, off := 0, 0; off < len(want); i++ {
			n := min(1000+i*97, len(want)-off)
			w.Write(want[off : off+n])
			off += n
			switch i % 3 {
			case 1:
				time.Sleep(100 * time.Microsecond) // within the spin
			case 2:
				time.Sleep(5 * time.Millisecond) // past it: parked
			}
		}
	}()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(r, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("bytes differ")
	}

	// Idle: after the spin the reader parks and gives its slot back.
	res := make(chan error, 1)
	buf := make([]byte, 16)
	go func() {
		n, err := r.Read(buf)
		if err == nil && (n != 3 || string(buf[:3]) != "abc") {
			err = errors.New("wrong bytes after a park: " + string(buf[:n]))
		}
		res <- err
	}()
	deadline := time.Now().Add(time.Minute)
	time.Sleep(20 * time.Millisecond)
	for Spinning() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("an idle reader still holds a spin slot")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-res:
		t.Fatalf("read returned with nothing sent: %v", err)
	default:
	}
	w.Write([]byte("abc"))
	if err := <-res; err != nil {
		t.Fatal(err)
	}

	// The peer closes: EOF.
	w.Close()
	if _, err := r.Read(buf); err != io.EOF {
		t.Fatalf("after the peer closed: %v, want EOF", err)
	}
	if Spinning() != 0 {
		t.Fatal("spin slot leaked")
	}
}

// TestSpinReaderCloseAndSlots: a local Close ends a read that spins or
// sleeps, and no more readers spin at once than there are slots, and a
// reader that does not want to spin never takes one.
func TestSpinReaderCloseAndSlots(t *testing.T) {
	const readers = 4
	var conns []*net.TCPConn
	res := make(chan error, readers+1)
	for i := 0; i < readers; i++ {
		_, c := tcpPair(t)
		conns = append(conns, c)
		r := NewReader(c, 50*time.Millisecond, 2, nil)
		go func() {
			_, err := r.Read(make([]byte, 8))
			res <- err
		}()
	}
	_, c := tcpPair(t)
	never := NewReader(c, time.Second, 8, func() bool { return false })
	go func() {
		_, err := never.Read(make([]byte, 8))
		res <- err
	}()
	end := time.Now().Add(30 * time.Millisecond)
	for time.Now().Before(end) {
		if n := Spinning(); n > 2 {
			t.Fatalf("%d readers spin at once, 2 slots", n)
		}
		time.Sleep(100 * time.Microsecond)
	}
	c.Close()
	for _, c := range conns {
		c.Close()
	}
	for i := 0; i < readers+1; i++ {
		select {
		case err := <-res:
			if err == nil {
				t.Fatal("a read on a closed connection succeeded")
			}
		case <-time.After(time.Minute):
			t.Fatal("a read did not end after Close")
		}
	}
	if n := Spinning(); n != 0 {
		t.Fatalf("%d spin slots held after every reader ended", n)
	}
}

// TestSpinReaderAllocs: a read through the spin reader allocates nothing
// (the service and replies readers are on the per-operation path).
func TestSpinReaderAllocs(t *testing.T) {
	w, c := tcpPair(t)
	r := NewReader(c, time.Millisecond, 1, func() bool { return true })
	msg := make([]byte, 8)
	buf := make([]byte, 8)
	if n := testing.AllocsPerRun(200, func() {
		w.Write(msg)
		if _, err := io.ReadFull(r, buf); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("%v allocations per read", n)
	}
}
