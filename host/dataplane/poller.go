package dataplane

import (
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

var (
	pollerOnce sync.Once
	pollerErr  error
)

// EnsurePoller makes the Go runtime's network poller exist, or reports why
// it cannot. The runtime creates it (an epoll descriptor and an eventfd) the
// first time any file or socket is opened, and it aborts the whole process
// when no descriptor is left for it (RLIMIT_NOFILE reached): a host that
// calls init with its descriptors exhausted would crash instead of getting
// an error. So init calls this first: it reserves two descriptors (a
// probe epoll and eventfd), frees them and at once opens a pipe through
// package os, which creates the poller in the slots just freed. Once the
// poller exists, running out of descriptors is an ordinary error. The
// outcome is kept: the poller lives as long as the process.
func EnsurePoller() error {
	pollerOnce.Do(func() { pollerErr = initPoller() })
	return pollerErr
}

func initPoller() error {
	var r, w int
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return fmt.Errorf("cannot open descriptors (RLIMIT_NOFILE reached?): pipe2: %w", err)
	}
	r, w = p[0], p[1]
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		unix.Close(r)
		unix.Close(w)
		return fmt.Errorf("cannot open descriptors (RLIMIT_NOFILE reached?): epoll_create1: %w", err)
	}
	ev, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	unix.Close(ep)
	if err != nil {
		unix.Close(r)
		unix.Close(w)
		return fmt.Errorf("cannot open descriptors (RLIMIT_NOFILE reached?): eventfd: %w", err)
	}
	unix.Close(ev)
	// A non-blocking descriptor handed to os is registered with the
	// poller, which is created now, in the two slots just freed.
	f := os.NewFile(uintptr(r), "poller-probe")
	unix.Close(w)
	return f.Close()
}
