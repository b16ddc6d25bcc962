// Package spin holds the readers that spin briefly on an empty socket
// before they park, and the process-wide budget of spinning readers that
// host/dataplane's TCP streams and libfabric completion loops share.
package spin

import (
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// spinReader reads a TCP socket as net.Conn does, except that when the
// socket is empty right after traffic it keeps trying for a short while
// (host/dataplane's Options.SpinWait) before parking the goroutine on the netpoller. A
// parked reader costs a thread wake-up when the next message comes (several
// µs, more on a VM), the one step a raw TCP ping-pong does not pay twice:
// its reader is the application. A peer in a request/response exchange
// answers within a round trip, so a short spin catches the answer on the
// running thread. The spin only follows traffic and is bounded, and at most
// Options.Spinners readers of the process spin at once (none on a machine
// with few cores, where a spinner takes the CPU from the thread it waits
// for): an idle socket parks and costs nothing.
type spinReader struct {
	rc    syscall.RawConn
	spin  time.Duration
	slots int32
	// want, when set, says whether a spin is worthwhile now (the replies
	// reader spins only while it awaits an answer).
	want func() bool

	// per call; fn is bound once so that Read allocates nothing
	b      []byte
	n      int
	err    error
	parked bool
	fn     func(fd uintptr) bool
}

// spinners counts the readers of this process spinning now.
var spinners atomic.Int32

// NewReader returns a reader of c that spins for up to spin after traffic
// while one of slots process-wide spin slots is free and want (nil:
// always) says a message is due; c itself when spinning is off.
func NewReader(c *net.TCPConn, spin time.Duration, slots int, want func() bool) io.Reader {
	if spin <= 0 || slots <= 0 {
		return c
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return c
	}
	s := &spinReader{rc: rc, spin: spin, slots: int32(slots), want: want}
	s.fn = s.readFD
	return s
}

func (s *spinReader) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	s.b, s.n, s.err, s.parked = b, 0, nil, false
	err := s.rc.Read(s.fn)
	s.b = nil
	if err != nil {
		return 0, err
	}
	return s.n, s.err
}

// readFD runs with the descriptor's read lock held (RawConn.Read), so a
// concurrent Close cannot recycle the fd under it; Close waits for the
// spin, which is bounded. Returning false parks until the socket is
// readable; readFD is then called again and does not spin.
func (s *spinReader) readFD(fd uintptr) bool {
	spinning := false
	var start time.Time
	for {
		n, err := unix.Read(int(fd), s.b)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			if !spinning {
				if s.parked || (s.want != nil && !s.want()) || !Acquire(s.slots) {
					s.parked = true
					return false
				}
				spinning, start = true, time.Now()
			} else if time.Since(start) > s.spin {
				spinners.Add(-1)
				s.parked = true
				return false
			}
			runtime.Gosched()
			continue
		case err != nil:
			s.err = err
		case n == 0:
			s.err = io.EOF
		}
		if spinning {
			spinners.Add(-1)
		}
		s.n = max(n, 0)
		return true
	}
}

// Acquire takes one of the process's spin slots, if fewer than slots are
// taken; Release gives it back.
func Acquire(slots int32) bool {
	for {
		n := spinners.Load()
		if n >= slots {
			return false
		}
		if spinners.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Release gives back a slot Acquire took.
func Release() { spinners.Add(-1) }

// Spinning counts the readers (and completion loops) spinning now.
func Spinning() int32 { return spinners.Load() }

// DefaultSlots is host/dataplane's Options.Spinners for NCCL_RMA_WASM_SPIN_US's default:
// one spinning reader per four cores, so none on a machine of fewer than
// four (a spinner there takes the core from the thread it waits for).
func DefaultSlots() int { return runtime.NumCPU() / 4 }
