package rawio

import (
	"syscall"
	"testing"
)

// TestReadNB: an empty non-blocking socket answers EAGAIN at once; bytes
// written are read back whole; a closed peer reads as 0 bytes.
func TestReadNB(t *testing.T) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fds[0])
	b := make([]byte, 16)
	if n, e := ReadNB(fds[0], b); n != 0 || e != syscall.EAGAIN {
		t.Fatalf("empty socket: %d bytes, errno %v; want 0, EAGAIN", n, e)
	}
	if _, err := syscall.Write(fds[1], []byte("rma-wasm")); err != nil {
		t.Fatal(err)
	}
	if n, e := ReadNB(fds[0], b); n != 8 || e != 0 || string(b[:n]) != "rma-wasm" {
		t.Fatalf("read %d bytes %q, errno %v; want the 8 written", n, b[:n], e)
	}
	syscall.Close(fds[1])
	if n, e := ReadNB(fds[0], b); n != 0 || e != 0 {
		t.Fatalf("closed peer: %d bytes, errno %v; want 0, none", n, e)
	}
}
