package fdpass

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func name(t *testing.T) string {
	return fmt.Sprintf("rccl-rma-wasm-test/%d/%s/%d", os.Getpid(), t.Name(), time.Now().UnixNano())
}

// memfd returns a new memfd holding b.
func memfd(t *testing.T, b []byte) int {
	fd, err := unix.MemfdCreate("fdpass-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Write(fd, b); err != nil {
		t.Fatal(err)
	}
	return fd
}

func TestFetch(t *testing.T) {
	s, err := Listen(name(t), func(pid int) bool { return pid == os.Getpid() }, func(pid int, key uint64) ([]byte, []int, error) {
		if key != 7 {
			return nil, nil, errors.New("no such key")
		}
		return []byte("seg"), []int{memfd(t, []byte("first")), memfd(t, []byte("second"))}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	payload, fds, err := Fetch(s.Name(), 7, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(fds)
	if string(payload) != "seg" || len(fds) != 2 {
		t.Fatalf("payload %q, %d fds; want \"seg\" and 2", payload, len(fds))
	}
	for i, want := range []string{"first", "second"} {
		b := make([]byte, 16)
		n, err := unix.Pread(fds[i], b, 0)
		if err != nil || string(b[:n]) != want {
			t.Fatalf("fd %d reads %q (%v), want %q", i, b[:n], err, want)
		}
	}
	if _, _, err := Fetch(s.Name(), 8, os.Getpid()); !errors.Is(err, ErrRefused) {
		t.Fatalf("unknown key: %v, want ErrRefused", err)
	}
}

func TestFetchNotAllowed(t *testing.T) {
	served := false
	s, err := Listen(name(t), func(pid int) bool { return false }, func(int, uint64) ([]byte, []int, error) {
		served = true
		return nil, nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := Fetch(s.Name(), 1, os.Getpid()); !errors.Is(err, ErrRefused) {
		t.Fatalf("a process not allowed: %v, want ErrRefused", err)
	}
	s.Close()
	if served {
		t.Fatal("a process not allowed was served")
	}
}

// A client that sends garbage or nothing gets refused and holds nothing.
func TestBadRequests(t *testing.T) {
	s, err := Listen(name(t), func(int) bool { return true }, func(int, uint64) ([]byte, []int, error) { return []byte("x"), nil, nil })
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: "@" + s.Name(), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("short"))
	b := make([]byte, 8)
	n, _ := c.Read(b)
	c.Close()
	if n != 1 || b[0] != answerRefused {
		t.Fatalf("a short request got %q, want a refusal", b[:n])
	}
	if p, _, err := Fetch(s.Name(), 3, os.Getpid()); err != nil || string(p) != "x" {
		t.Fatalf("after a bad client: %q, %v", p, err)
	}
	if _, _, err := Fetch(name(t)+"-absent", 3, os.Getpid()); err == nil {
		t.Fatal("no server: no error")
	}
	// A server that is not the process named: nothing is asked.
	if _, _, err := Fetch(s.Name(), 3, os.Getpid()+1); err == nil || errors.Is(err, ErrRefused) {
		t.Fatalf("a server of another pid: %v", err)
	}
}

// At most maxAnswering requests are served at once; the rest wait their
// turn and are served too.
func TestAnsweringBound(t *testing.T) {
	var mu sync.Mutex
	now, most := 0, 0
	release := make(chan struct{})
	s, err := Listen(name(t), func(int) bool { return true }, func(int, uint64) ([]byte, []int, error) {
		mu.Lock()
		now++
		most = max(most, now)
		mu.Unlock()
		<-release
		mu.Lock()
		now--
		mu.Unlock()
		return []byte("ok"), nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const askers = maxAnswering + 8
	errs := make(chan error, askers)
	for i := 0; i < askers; i++ {
		go func() {
			_, _, err := Fetch(s.Name(), 1, os.Getpid())
			errs <- err
		}()
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		mu.Lock()
		n := now
		mu.Unlock()
		if n == maxAnswering || time.Now().After(deadline) {
			break
		}
	}
	time.Sleep(20 * time.Millisecond) // the others would have started by now
	close(release)
	for i := 0; i < askers; i++ {
		if err := <-errs; err != nil {
			t.Fatalf("asker %d: %v", i, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if most != maxAnswering {
		t.Fatalf("%d requests served at once, want %d", most, maxAnswering)
	}
}

// An answer larger than MaxPayload, or with more than MaxFds descriptors,
// is refused, not sent.
func TestAnswerBounds(t *testing.T) {
	s, err := Listen(name(t), func(int) bool { return true }, func(_ int, key uint64) ([]byte, []int, error) {
		if key == 1 {
			return make([]byte, MaxPayload+1), nil, nil
		}
		fds := make([]int, MaxFds+1)
		for i := range fds {
			fds[i] = memfd(t, nil)
		}
		return nil, fds, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, key := range []uint64{1, 2} {
		if _, _, err := Fetch(s.Name(), key, os.Getpid()); !errors.Is(err, ErrRefused) {
			t.Fatalf("key %d: %v, want ErrRefused", key, err)
		}
	}
}
