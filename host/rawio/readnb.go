//go:build !race

package rawio

import (
	"syscall"
	"unsafe"
)

// ReadNB is a read of a non-blocking socket (a polling caller's). It
// never blocks (a microsecond at most), so it goes in as a raw system
// call: no hand-off of the P (entersyscall/exitsyscall), about a tenth of
// an empty poll turn.
// The race build reads through syscall.Read instead (readnb_race.go).
func ReadNB(fd int, b []byte) (int, syscall.Errno) {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	n, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(p), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(n), 0
}
