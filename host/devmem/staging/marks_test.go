package staging

import (
	"errors"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/shmstream"
)

// markFile is a page as a sender makes it: its fd, and the sender's
// read-write view of its words.
func markFile(t *testing.T) (int, *[MarkWords]atomic.Uint64) {
	t.Helper()
	fd, mem, err := shmstream.CreateSealed("marks-test", markPageSize)
	if err != nil {
		t.Skipf("sealed memfd: %v", err)
	}
	t.Cleanup(func() { unix.Munmap(mem); unix.Close(fd) })
	return fd, (*[MarkWords]atomic.Uint64)(unsafe.Pointer(&mem[0]))
}

// A wait returns once the sender's word reached the number, not before,
// whichever word it names; a word past the number passes at once.
func TestPeerMarksWait(t *testing.T) {
	fd, w := markFile(t)
	m, err := OpenPeerMarks(fd, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Reached(5, 9) {
		t.Fatal("an unwritten word reached 9")
	}
	w[5].Store(9)
	if err := m.Wait(5, 9); err != nil {
		t.Fatal(err)
	}
	if !m.Reached(5, 9) || !m.Reached(5, 1) || m.Reached(5, 10) || m.Reached(5, 0) || m.Reached(64, 1) || m.Reached(-1, 1) {
		t.Fatal("Reached does not tell a word's number, or takes an index or number no header may name")
	}
	var reached atomic.Bool
	done := make(chan error)
	go func() { done <- m.Wait(63, 4) }()
	for _, v := range []uint64{1, 3} { // below the number: still waiting
		w[63].Store(v)
		select {
		case err := <-done:
			t.Fatalf("the wait ended at %d (want 4): %v", v, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	reached.Store(true)
	w[63].Store(6)
	if err := <-done; err != nil || !reached.Load() {
		t.Fatalf("wait: %v", err)
	}
}

// ReachedWithin answers at once for a word already there, waits for one
// written while it polls, and gives up (false) on one never written.
func TestPeerMarksReachedWithin(t *testing.T) {
	fd, w := markFile(t)
	m, err := OpenPeerMarks(fd, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.ReachedWithin(3, 1, 0) || m.ReachedWithin(3, 1, time.Millisecond) {
		t.Fatal("an unwritten word reached 1")
	}
	if m.ReachedWithin(64, 1, time.Millisecond) || m.ReachedWithin(-1, 1, 0) || m.ReachedWithin(3, 0, 0) {
		t.Fatal("ReachedWithin takes an index or number no header may name")
	}
	w[3].Store(2)
	if !m.ReachedWithin(3, 2, 0) || m.ReachedWithin(3, 3, 0) {
		t.Fatal("ReachedWithin does not tell a word's number")
	}
	go func() {
		time.Sleep(time.Millisecond)
		w[3].Store(7)
	}()
	// A bound no loaded machine reaches: the word is written while it polls.
	if !m.ReachedWithin(3, 7, time.Minute) {
		t.Fatal("a word written during the wait was not seen")
	}
}

// A page of the wrong size is refused; a wait on a process that exited
// fails instead of waiting for a mark that never comes, and so does one
// past markTimeout.
func TestPeerMarksNoHang(t *testing.T) {
	fd, _ := markFile(t)
	small, err := unix.MemfdCreate("marks-small", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(small)
	if _, err := OpenPeerMarks(small, os.Getpid()); err == nil {
		t.Fatal("an empty page was mapped")
	}
	if err := unix.Ftruncate(small, markPageSize); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenPeerMarks(small, os.Getpid()); err == nil {
		t.Fatal("a page its sender could shrink under our mapping was mapped")
	}
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skipf("no process to outlive: %v", err)
	}
	gone, err := OpenPeerMarks(fd, cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer gone.Close()
	if err := gone.Wait(0, 1); !errors.Is(err, ErrMarkPeerGone) {
		t.Fatalf("wait on an exited process: %v", err)
	}
	live, err := OpenPeerMarks(fd, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	old := markTimeout
	markTimeout = 50 * time.Millisecond
	defer func() { markTimeout = old }()
	if err := live.Wait(1, 1); err == nil || errors.Is(err, ErrMarkPeerGone) {
		t.Fatalf("wait past the timeout: %v", err)
	}
}
