//go:build race

package rawio

import "syscall"

// ReadNB reads through syscall.Read, which tells the race detector that
// what was written before the bytes were sent happened before (as the net
// package's reads do).
func ReadNB(fd int, b []byte) (int, syscall.Errno) {
	n, err := syscall.Read(fd, b)
	if err != nil {
		if e, ok := err.(syscall.Errno); ok {
			return 0, e
		}
		return 0, syscall.EIO
	}
	return n, 0
}
