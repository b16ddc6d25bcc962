package shmstream

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

type alive struct{ gone atomic.Bool }

func (a *alive) Gone() bool { return a.gone.Load() }

type bell struct{ rung atomic.Int64 }

func (b *bell) Ring() { b.rung.Add(1) }

// pair makes a writer's ring and maps it as this process's reader would.
func pair(t *testing.T, size uint64) (w, r *Ring) {
	t.Helper()
	w, err := New(size)
	if err != nil {
		t.Fatal(err)
	}
	fd, sz := w.Offer()
	r, err = Attach(os.Getpid(), fd, sz)
	if err != nil {
		w.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return w, r
}

// TestStream: a writer pushes 4 MiB in writes of random sizes through a
// 4 KiB ring (wrapping, waiting for room hundreds of times) while a reader
// polls it into buffers of random sizes: every byte arrives, in order.
func TestStream(t *testing.T) {
	w, r := pair(t, MinSize)
	src := make([]byte, 4<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	var a alive
	var b bell
	done := make(chan error, 1)
	go func() {
		for off := 0; off < len(src); {
			n := 1 + rng.IntN(9000)
			if off+n > len(src) {
				n = len(src) - off
			}
			// Two iovecs per write, as a header and its payload.
			k := n / 3
			if err := w.Write([][]byte{src[off : off+k], src[off+k : off+n]}, &b, &a); err != nil {
				done <- err
				return
			}
			off += n
		}
		done <- nil
	}()
	got := make([]byte, 0, len(src))
	buf := make([]byte, 7000)
	rrng := rand.New(rand.NewPCG(3, 4))
	deadline := time.Now().Add(time.Minute)
	for len(got) < len(src) {
		n, err := r.Read(buf[:1+rrng.IntN(len(buf)-1)])
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
		if time.Now().After(deadline) {
			t.Fatalf("stalled after %d bytes", len(got))
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, src) {
		t.Fatal("bytes differ")
	}
	if n, _ := r.Read(buf); n != 0 {
		t.Fatalf("%d bytes more than were written", n)
	}
}

// TestBell: a reader that sleeps (Sleep true) is rung by the next write,
// once; one that is awake or finds bytes is not.
func TestBell(t *testing.T) {
	w, r := pair(t, MinSize)
	var a alive
	var b bell
	if err := w.Write([][]byte{[]byte("x")}, &b, &a); err != nil || b.rung.Load() != 0 {
		t.Fatalf("awake reader rung (%d) or %v", b.rung.Load(), err)
	}
	if r.Sleep() {
		t.Fatal("Sleep with a byte in the ring")
	}
	buf := make([]byte, 8)
	if n, _ := r.Read(buf); n != 1 {
		t.Fatalf("read %d", n)
	}
	if !r.Sleep() {
		t.Fatal("Sleep on an empty ring said no")
	}
	w.Write([][]byte{[]byte("ab")}, &b, &a)
	w.Write([][]byte{[]byte("cd")}, &b, &a)
	if b.rung.Load() != 1 {
		t.Fatalf("rung %d times for a sleeping reader, want 1", b.rung.Load())
	}
	r.Awake()
	if n, _ := r.Read(buf); n != 4 || string(buf[:4]) != "abcd" {
		t.Fatalf("read %q", buf[:n])
	}
}

// TestFullRingWakesSleeper: a writer with more than the ring holds rings
// a sleeping reader before it waits for room (else both would wait), and
// a writer waiting for room gives up when its Liveness says gone.
func TestFullRingWakesSleeper(t *testing.T) {
	w, r := pair(t, MinSize)
	var a alive
	var b bell
	if !r.Sleep() {
		t.Fatal("Sleep")
	}
	done := make(chan error, 1)
	go func() { done <- w.Write([][]byte{make([]byte, 3*MinSize)}, &b, &a) }()
	for b.rung.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	buf := make([]byte, MinSize)
	for total := 0; total < 3*MinSize; {
		n, err := r.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		total += n
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	go func() { done <- w.Write([][]byte{make([]byte, 2*MinSize)}, &b, &a) }()
	time.Sleep(30 * time.Millisecond)
	a.gone.Store(true)
	if err := <-done; !errors.Is(err, ErrGone) {
		t.Fatalf("writer on a full ring of a gone reader: %v", err)
	}
}

// TestCorruptTail: a tail moved back, or further ahead than the ring
// holds, is a corrupt stream, and stays one.
func TestCorruptTail(t *testing.T) {
	for _, tail := range []uint64{MinSize + 1, ^uint64(0)} {
		w, r := pair(t, MinSize)
		*w.u64(offTail) = tail
		if r.Sleep() {
			t.Fatal("Sleep with a corrupt tail: the reader would not read and fail")
		}
		buf := make([]byte, 8)
		if _, err := r.Read(buf); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("tail %d: %v", tail, err)
		}
		*w.u64(offTail) = 0
		if _, err := r.Read(buf); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("tail %d, then sane: %v", tail, err)
		}
	}
}

// TestAttachChecks: offers that do not describe a sealed ring of that
// size are refused before anything is mapped.
func TestAttachChecks(t *testing.T) {
	w, err := New(MinSize)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	fd, size := w.Offer()
	pid := os.Getpid()
	for _, c := range []struct {
		name     string
		fd, size uint64
		pid      int
	}{
		{"size", fd, 2 * size, pid},
		{"not a power of two", fd, size + 1, pid},
		{"fd", 1 << 40, size, pid},
		{"pid", fd, size, 0},
		{"no such fd", 9999, size, pid},
	} {
		if r, err := Attach(c.pid, c.fd, c.size); err == nil {
			r.Close()
			t.Errorf("%s: attached", c.name)
		}
	}
	// An unsealed file of the right size: it could shrink under the mapping.
	f, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(f)
	unix.Ftruncate(f, hdrSize+MinSize)
	if r, err := Attach(pid, uint64(f), MinSize); err == nil {
		r.Close()
		t.Error("unsealed file attached")
	}
	if _, err := New(MinSize + 1); err == nil {
		t.Error("New of a size not a power of two")
	}
}

// TestAwaitAttach: the writer's wait ends when the reader attaches, or
// refuses, or the stream is gone.
func TestAwaitAttach(t *testing.T) {
	w, r := pair(t, MinSize)
	var a alive
	var once sync.Once
	go func() { time.Sleep(5 * time.Millisecond); once.Do(r.SetAttached) }()
	if on, err := w.AwaitAttach(func() bool { return false }, &a); !on || err != nil {
		t.Fatalf("attach: %v %v", on, err)
	}
	w2, err := New(MinSize)
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	var refused atomic.Bool
	go func() { time.Sleep(5 * time.Millisecond); refused.Store(true); w2.WakeAttach() }()
	if on, err := w2.AwaitAttach(refused.Load, &a); on || err != nil {
		t.Fatalf("refusal: %v %v", on, err)
	}
	a.gone.Store(true)
	if on, err := w2.AwaitAttach(func() bool { return false }, &a); on || err == nil {
		t.Fatalf("gone: %v %v", on, err)
	}
}

// TestPathAllocatesNothing: Write, Read, Sleep and Awake allocate nothing.
func TestPathAllocatesNothing(t *testing.T) {
	w, r := pair(t, MinSize)
	var a alive
	var b bell
	iov := [][]byte{make([]byte, 64), make([]byte, 8)}
	buf := make([]byte, 128)
	if n := testing.AllocsPerRun(1000, func() {
		w.Write(iov, &b, &a)
		r.Read(buf)
		r.Sleep()
		r.Awake()
	}); n != 0 {
		t.Fatalf("%v allocations per write and read", n)
	}
}
