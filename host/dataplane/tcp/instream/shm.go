package instream

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/spin"
)

// An incoming stream's requests through a shared-memory stream: the
// lane's sender (an intra-node peer) offers one in-band, the transport's
// side path maps it, and the reader reads from it in place of the
// socket, whose bytes are then bells.

// ShmIn is the shared-memory stream an incoming lane reads its requests
// from once the sender switched (*shmstream.Ring, which the side path
// maps).
type ShmIn interface {
	Read(b []byte) (int, error)
	// Pending reports bytes to read; Sleep marks the reader asleep (false:
	// bytes came meanwhile) and Awake awake again.
	Pending() bool
	Sleep() bool
	Awake()
	// SetAttached tells the sender that the reader reads the ring now.
	SetAttached()
	// State is what the stall report shows of the ring.
	State() (tail, head uint64, sleeping, waiting bool)
	Close() error
}

// Attached reports that the stream reads a shared-memory stream.
func (r *Reader) Attached() bool { return r.sring != nil }

// Attach makes the reader read s in place of the socket, from the next
// read on, and tells the sender (the holder of the role, which answered
// the offer that was the socket's last byte).
func (r *Reader) Attach(s ShmIn) {
	if r.lowat {
		r.setLowat(false)
	}
	r.sring = s
	r.smu.Lock()
	r.sview = s
	r.smu.Unlock()
	s.SetAttached()
}

// RingView is what the shared ring holds now: bytes written and read,
// ever, and whether the reader marked itself asleep; ok is false while
// the stream reads no ring (or is gone). Any thread may ask.
func (r *Reader) RingView() (tail, head uint64, sleeping, ok bool) {
	r.smu.Lock()
	defer r.smu.Unlock()
	if r.sview == nil {
		return 0, 0, false, false
	}
	tail, head, sleeping, _ = r.sview.State()
	return tail, head, sleeping, true
}

// readStream is Reader.Read from the shared ring: what it holds, or for
// a caller (nb) ErrWouldBlock; the service sleeps on the socket, whose
// bytes are bells, until the ring has bytes. The socket's end (or a
// reset) ends the stream once the ring is drained.
func (r *Reader) readStream(b []byte) (int, error) {
	s := r.sring
	for {
		n, err := s.Read(b)
		if n > 0 || err != nil {
			return n, err
		}
		if err := r.endErr(); err != nil && !r.caller() {
			return 0, err // the ring is drained: the stream ended
		}
		if r.nb {
			return 0, ErrWouldBlock
		}
		if !s.Sleep() {
			continue
		}
		_, err = r.in.Read(r.bells[:]) // bells: the ring says what came
		s.Awake()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				// A wake-up (EndTurn, Wake): look again.
				r.in.SetReadDeadline(time.Time{})
				continue
			}
			r.ended(err) // after what the ring still holds
		}
	}
}

// waitStream is waitFD for a stream in the shared ring: true once the ring
// holds bytes, a caller left some in the buffer, or the socket woke the
// netpoller (a bell, or its end: the read meets it); false parks on the
// netpoller, the ring marked asleep so that the next write rings. After
// traffic it spins on the ring first, as waitFD does on the socket.
func (r *Reader) waitStream(fd uintptr) bool {
	s := r.sring
	if r.parked {
		s.Awake()
		r.drainBells(fd)
		return true
	}
	spinning := false
	var start int64
	for {
		// Pending, not Avail: a caller may hold the role and read.
		if s.Pending() || r.left.Load() || r.endErr() != nil {
			if spinning {
				spin.Release()
			}
			return true
		}
		m := r.p.Mesh()
		if !spinning {
			if m.SpinWait <= 0 || link.Now()-r.rx.Load() > int64(m.SpinWait) || !spin.Acquire(int32(m.Spinners)) {
				break
			}
			spinning, start = true, link.Now()
		} else if link.Now()-start > int64(m.SpinWait) {
			spin.Release()
			break
		}
		runtime.Gosched()
	}
	if !r.drainBells(fd) || !s.Sleep() {
		return true
	}
	r.parked = true
	return false
}

// drainBells reads the bells the socket holds, without waiting; false
// when the socket ended or failed (recorded for readStream).
func (r *Reader) drainBells(fd uintptr) bool {
	for {
		n, _, e := syscall.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&r.bells[0])), uintptr(len(r.bells)), unix.MSG_DONTWAIT, 0, 0)
		switch {
		case e == unix.EINTR:
			continue
		case e == unix.EAGAIN:
			return true
		case e != 0:
			r.ended(&net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("recvfrom", e)})
			return false
		case n == 0:
			r.ended(io.EOF)
			return false
		}
	}
}
