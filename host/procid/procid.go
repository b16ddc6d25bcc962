// Package procid tells the processes of this machine apart: HostID, which
// ranks on one host, in one network and pid namespace, share; and Watch,
// whether a local process has exited, asked through its pidfd.
package procid

import (
	"crypto/sha256"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

var (
	hostIDOnce sync.Once
	hostID     [8]byte
)

// HostID identifies this machine and boot, so ranks can tell which peers
// share the host (the intra-node transport needs the same kernel): 8 bytes
// of a hash of the host name, boot id and machine id, and of the network
// and pid namespaces (nsIdentity): ranks in different ones are not on one
// host for that path. It is computed once a process.
func HostID() [8]byte {
	hostIDOnce.Do(func() {
		h := sha256.New()
		name, _ := os.Hostname()
		h.Write([]byte(name))
		if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
			h.Write(b)
		}
		if b, err := os.ReadFile("/etc/machine-id"); err == nil {
			h.Write(b)
		}
		h.Write([]byte(nsIdentity()))
		copy(hostID[:], h.Sum(nil))
	})
	return hostID
}

// nsIdentity names the network and pid namespaces of this process
// ("net:[4026531840]pid:[4026531836]"). Two ranks of one machine in
// different network namespaces have different abstract sockets and
// loopbacks, and in different pid namespaces process_vm_writev cannot name
// the peer's pid, so they must not take the intra-node path; the host id
// hashes this in (the handle's format is unchanged). "" where /proc is
// not mounted: then namespaces cannot be told apart.
func nsIdentity() string {
	var id string
	for _, ns := range []string{"net", "pid"} {
		if l, err := os.Readlink("/proc/self/ns/" + ns); err == nil {
			id += l
		}
	}
	return id
}

// Watch is a pidfd on a process of this host. The zero value watches
// nothing; Exited may be called from any goroutine, alongside Close.
type Watch struct {
	fd atomic.Int32 // the pidfd + 1; 0: none
}

// Open starts watching pid. It reports false where it cannot: a pid that
// is not positive, or a kernel without pidfds (before 5.3).
func (w *Watch) Open(pid int) bool {
	if pid <= 0 {
		return false
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return false
	}
	w.fd.Store(int32(fd) + 1)
	return true
}

// Armed reports whether a process is watched.
func (w *Watch) Armed() bool { return w.fd.Load() != 0 }

// Exited reports that the watched process has exited (even before it is
// reaped): one poll(2) with a zero timeout, no allocation. False when
// nothing is watched.
func (w *Watch) Exited() bool {
	fd := w.fd.Load() - 1
	if fd < 0 {
		return false
	}
	pfd := [1]unix.PollFd{{Fd: fd, Events: unix.POLLIN}}
	n, err := unix.Poll(pfd[:], 0)
	return err == nil && n > 0
}

// Close stops watching and closes the pidfd.
func (w *Watch) Close() {
	if fd := w.fd.Swap(0) - 1; fd >= 0 {
		unix.Close(int(fd))
	}
}
