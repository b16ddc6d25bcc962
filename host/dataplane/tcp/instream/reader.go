// Package instream is the reading side of one incoming TCP stream, which
// two kinds of thread take turns at, never both at once: the transport's
// service goroutine, which may block, and a caller of test() or
// rmaProgress, which reads what the socket already holds on its own
// thread without blocking. It also reads the shared-memory stream a
// sender may switch to in place of the socket.
//
// It is a unit of its own because whose turn it is to read, and how each
// waits (the netpoller, naps, the socket's low-water mark, spinning), is
// delicate concurrency that knows nothing of what the bytes mean: the
// transport (host/dataplane/tcp) parses and serves the messages while it
// holds the turn this package gives it.
package instream

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/nap"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/rawio"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/spin"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// Reader is the reading side of one incoming stream: the bytes in stream
// order, and whose turn it is to read them (role). Two kinds of thread
// take turns at it, never both at once:
//
//   - the service goroutine, which serves the stream whether or not this
//     process calls the plugin again; it waits for input on the netpoller
//     without holding the role (Wait), and may block in the middle of a
//     message while it holds it;
//   - a caller of test() or rmaProgress (TakeTurn), which serves what the
//     socket already holds on its own thread, never blocking. On a
//     machine with few cores this is what makes a small exchange cheap:
//     the message is applied where the caller already waits, as a raw TCP
//     reader applies it, instead of after a netpoller wake-up of the
//     service goroutine on a busy core.
//
// The bytes go through one buffer in stream order whoever reads them (the
// transport's, over Read), so no byte is consumed twice and signals still
// apply after their payload. Init makes a Reader ready.
type Reader struct {
	p   link.Peer
	in  *net.TCPConn
	rc  syscall.RawConn
	blk io.Reader // the service's blocking reader (spins after traffic)

	// role is roleOwned while a thread serves the stream; roleGone once
	// the service returned (it keeps the role for good).
	role atomic.Uint32
	// left: a caller left bytes in the buffer it did not serve (a message
	// it does not serve on its thread, or one that is not whole): the
	// service serves them, woken by a kick (its nap) or a read deadline
	// in the past (its wait on the netpoller).
	left atomic.Bool
	// active: the service leaves the stream to callers, who look at its
	// socket (Wait). It is off while the stream is quiet, so a test() of
	// a one-way stream costs an atomic load, no clock and no system call.
	active atomic.Bool
	// polled: a caller called since the service last looked; while
	// callers keep calling, the service leaves the socket to them.
	polled atomic.Bool
	// rx is link.Now() when a message was last served (the service stops
	// leaving a quiet stream to callers after pollActive).
	rx atomic.Int64
	// tried is link.Now() when a caller last found the socket empty:
	// callers that poll in a tight loop look at most once per pollGap.
	tried atomic.Int64
	// fresh: rmaProgress looked last; the next test() does not look
	// (TakeTurn). A hint: at worst one call looks or skips in vain.
	fresh atomic.Bool
	// callerMsgs counts the messages callers served, handoffs the times a
	// caller left the stream to the service (tests read them).
	callerMsgs atomic.Uint64
	handoffs   atomic.Uint64

	// Owned by whoever holds the role.
	nb         bool  // reads never park (a caller; the service between messages)
	callerMode bool  // the holder is a caller
	stash      error // a read error a caller met, for the service's next read
	perr       error // an error a caller met serving a message, for the service

	// non-blocking reads through RawConn.Control (no read lock: the
	// service may be parked in the netpoller holding it); bound once so
	// that they allocate nothing
	b     []byte
	n     int
	errno syscall.Errno
	rdFn  func(fd uintptr)
	// the service's wait for input (a peek, so nothing is consumed)
	peek   [1]byte
	parked bool
	waitFn func(fd uintptr) bool
	// the service's naps while callers serve (Wait)
	napping atomic.Bool
	kick    chan struct{}
	nap     *nap.Napper // not a time.Timer: an idle process's sub-ms timer ends after ~1 ms (host/nap)
	lowat   bool        // SO_RCVLOWAT is raised (service only)
	lowOn   bool
	lowFn   func(fd uintptr)

	// The shared-memory stream the sender switched to (Attach): set by
	// the service, read by whoever holds the role. sockErr is the
	// socket's end the service met (set by the service, the first one
	// kept; read by a caller holding the role too, hence atomic); bells
	// its scratch.
	sring   ShmIn
	sview   ShmIn      // sring, for diagnostics from any thread (State, RingView), under smu
	smu     sync.Mutex // sview: Close unmaps the ring under it
	sockErr atomic.Pointer[error]
	bells   [64]byte
}

// endErr is the socket's end the service met, nil while open.
func (r *Reader) endErr() error {
	if p := r.sockErr.Load(); p != nil {
		return *p
	}
	return nil
}

// ended records err as the socket's end, unless one is recorded.
func (r *Reader) ended(err error) { r.sockErr.CompareAndSwap(nil, &err) }

const (
	roleOwned = 1
	roleGone  = 2
)

// pollActive is how long after a stream's last message the service keeps
// leaving it to callers; callerWindow how long the service naps before it
// looks whether callers still call (as endpoint.CallerGrace does for
// libfabric's completion queues). Variables so that tests can pin the
// service to its naps.
var (
	pollActive   = 2 * time.Millisecond
	callerWindow = 200 * time.Microsecond
)

// pollGap is the least time between two looks of test() callers that found
// the socket empty: a test() loop costs a system call per pollGap at most.
// One turn of a proxy's loop (rmaProgress, test() of what is in flight,
// sched_yield) takes about a microsecond on a small machine: rmaProgress
// looks on every call, once a turn, and a test() right after it does not
// (fresh), with no clock read (2 us made every other turn blind, about
// 0.5 us more per hop of an 8-byte ping-pong; the clock reads of the gap's
// check cost about as much again per turn).
const pollGap = 1 * time.Microsecond

// ErrWouldBlock: the socket is empty and the reader may not park (a
// caller's turn, or the service's Probe between messages).
var ErrWouldBlock = errors.New("would block")

// pastDeadline wakes the service from its wait (SetReadDeadline).
var pastDeadline = time.Unix(1, 0)

// Init makes r the reading side of stream in from peer p, held by the
// service until its first Wait.
func (r *Reader) Init(p link.Peer, in *net.TCPConn) error {
	rc, err := in.SyscallConn()
	if err != nil {
		return fmt.Errorf("raw access to the stream: %w", err)
	}
	r.p, r.in, r.rc = p, in, rc
	r.blk = spin.NewReader(in, p.Mesh().SpinWait, p.Mesh().Spinners, nil)
	r.rdFn = r.readFD
	r.waitFn = r.waitFD
	r.lowFn = r.lowatFD
	r.kick = make(chan struct{}, 1)
	r.role.Store(roleOwned) // the service's until its first wait
	return nil
}

// readFD is a caller's non-blocking read (rawio.ReadNB).
func (r *Reader) readFD(fd uintptr) {
	for {
		n, errno := rawio.ReadNB(int(fd), r.b)
		if errno == unix.EINTR {
			continue
		}
		r.n, r.errno = n, errno
		return
	}
}

// Read is the stream as the transport's buffer reads it (under its
// acknowledgements, which leave before each read): ErrWouldBlock where
// the holder may not park and nothing is there.
func (r *Reader) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	if err := r.stash; err != nil {
		r.stash = nil
		return 0, err
	}
	if r.sring != nil {
		return r.readStream(b)
	}
	if r.nb {
		r.b = b
		var err error
		if cerr := r.rc.Control(r.rdFn); cerr != nil {
			r.n, r.errno, err = 0, 0, cerr // closed
		}
		r.b = nil
		switch {
		case r.errno == unix.EAGAIN:
			return 0, ErrWouldBlock
		case err == nil && r.errno == 0 && r.n > 0:
			return r.n, nil
		}
		// The stream ended or broke: the error is the service's to handle
		// (failover, goodbye), as its own read would have met it.
		if r.errno != 0 {
			err = &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", r.errno)}
		} else if err == nil {
			err = io.EOF
		}
		if r.caller() {
			r.stash = err
			return 0, ErrWouldBlock
		}
		return 0, err
	}
	if r.lowat {
		// A blocking read: the netpoller must see every byte again.
		r.setLowat(false)
	}
	for {
		n, err := r.blk.Read(b)
		if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
			// A wake-up (EndTurn, Wake) met the service in a read.
			r.in.SetReadDeadline(time.Time{})
			if n > 0 {
				return n, nil
			}
			continue
		}
		return n, err
	}
}

// caller reports whether the role's holder is a caller (not the service).
// Only the service reads in blocking mode, and it sets nb only for the
// probe between messages, with callerMode false.
func (r *Reader) caller() bool { return r.callerMode }

// Probe is the service's look for input between messages, without
// parking: nil when some came, ErrWouldBlock when the socket is empty,
// or the stream's end. br is the transport's buffer over Read, empty. A
// read error a caller met is left for the read that follows (nil).
func (r *Reader) Probe(br *bufio.Reader) error {
	if r.stash != nil {
		return nil
	}
	r.nb = true
	_, err := br.Peek(1)
	r.nb = false
	return err
}

// Stashed reports a read error a caller met, which the service's next
// read meets.
func (r *Reader) Stashed() bool { return r.stash != nil }

// Served notes that the holder served a message now: the service leaves
// the stream to callers for pollActive after the last one, and spins
// after traffic.
func (r *Reader) Served() { r.rx.Store(link.Now()) }

// ServedByCaller counts a message a caller served on its thread (tests
// read the count).
func (r *Reader) ServedByCaller() { r.callerMsgs.Add(1) }

// SetCallerErr leaves err, which a caller met serving the stream, to the
// service (CallerErr).
func (r *Reader) SetCallerErr(err error) { r.perr = err }

// CallerErr takes the error a caller met serving the stream, nil if none.
func (r *Reader) CallerErr() error {
	err := r.perr
	r.perr = nil
	return err
}

// waitFD is the service's wait for input: true once the socket holds
// bytes (or an end or error, which the read then meets), a caller left
// bytes in the buffer, or the netpoller woke it; false parks on the
// netpoller. It looks (a peek, nothing is consumed) after RawConn.Read
// cleared the readiness the netpoller had noted, so a message that came
// before is not missed. After traffic it
// spins first, as the blocking reader does, when a spin slot is free.
func (r *Reader) waitFD(fd uintptr) bool {
	if r.sring != nil {
		return r.waitStream(fd)
	}
	if r.parked {
		// Woken by the netpoller: input came (or an end, or a deadline,
		// which the read meets). A rare wake-up for nothing costs one
		// empty read; a look here would cost one on every wake-up.
		return true
	}
	spinning := false
	var start int64
	for {
		if r.left.Load() {
			if spinning {
				spin.Release()
			}
			return true
		}
		_, _, e := syscall.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&r.peek[0])), 1, unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != unix.EAGAIN {
			if spinning {
				spin.Release()
			}
			return true
		}
		m := r.p.Mesh()
		if !spinning {
			if r.parked || m.SpinWait <= 0 || link.Now()-r.rx.Load() > int64(m.SpinWait) || !spin.Acquire(int32(m.Spinners)) {
				r.parked = true
				return false
			}
			spinning, start = true, link.Now()
		} else if link.Now()-start > int64(m.SpinWait) {
			spin.Release()
			r.parked = true
			return false
		}
		runtime.Gosched()
	}
}

// Wait is the service's wait: not holding the role, until there is input,
// then it takes the role; a caller holding it lets go within one poll.
//
// While callers poll a stream with traffic they serve it, and the service
// stays off the socket: it naps, and the socket's low-water mark is raised
// (lowat) so that an arriving message wakes no thread at all (the
// netpoller's included: it would take the core from the caller). Each nap
// ends with a look at the socket, so nothing waits for a caller that
// stopped calling longer than a nap.
func (r *Reader) Wait() {
	for {
		// Callers that called since the last look still poll: while the
		// stream carries traffic, they serve it.
		if r.polled.Swap(false) && link.Now()-r.rx.Load() < int64(pollActive) {
			if !r.lowat && r.sring == nil {
				r.setLowat(true)
			}
			r.active.Store(true)
			r.napping.Store(true)
			if !r.left.Load() {
				if r.nap == nil {
					r.nap = nap.New()
				}
				r.nap.Start(callerWindow)
				select {
				case <-r.kick:
				case <-r.nap.C():
				case <-r.p.Quit(): // the streams are closed: the read ends the service
				}
				r.nap.Stop()
			}
			r.napping.Store(false)
			if !r.left.Load() && !r.p.Dead() {
				continue
			}
		} else {
			r.active.Store(false)
			if r.lowat {
				r.setLowat(false) // a message already there wakes the netpoller now
			}
			r.parked = false
			if err := r.rc.Read(r.waitFn); err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
				r.in.SetReadDeadline(time.Time{})
			} else if err != nil && r.sring != nil {
				r.ended(err) // the stream's reads meet it once the ring is drained
			}
			// Any other error (closed, reset) is met by the read that follows.
		}
		for i := 0; ; i++ {
			if r.role.CompareAndSwap(0, roleOwned) {
				r.left.Store(false)
				return
			}
			if i >= 64 {
				break // the holder may be descheduled: look again later
			}
			runtime.Gosched()
		}
		if r.nap == nil {
			r.nap = nap.New()
		}
		r.nap.Sleep(20 * time.Microsecond)
	}
}

// setLowat raises the socket's receive low-water mark (SO_RCVLOWAT) so that
// small messages wake nobody, or sets it back to one byte. A non-blocking
// read still returns whatever arrived. The raised mark is a quarter of the
// receive buffer: the kernel would grow the buffer and clamp the window to
// a mark near its size, and a backlog that large is the service's anyway.
func (r *Reader) setLowat(on bool) {
	r.lowat, r.lowOn = on, on
	if err := r.rc.Control(r.lowFn); err != nil {
		r.lowat = false
	}
}

func (r *Reader) lowatFD(fd uintptr) {
	v := 1
	if r.lowOn {
		b, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
		if err != nil || b < 8*wire.HeaderSize {
			r.lowOn = false
			return
		}
		v = b / 4
	}
	if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVLOWAT, v) != nil && r.lowOn {
		r.lowOn = false
	}
}

// Release lets go of the role (the service, going back to Wait).
func (r *Reader) Release() { r.role.Store(0) }

// TakeTurn begins a caller's turn (test() or rmaProgress, progress): when
// nobody holds the stream and it carried traffic lately, it takes the
// role, reading without blocking, and reports true; the caller then
// serves what the socket holds and ends the turn with EndTurn.
func (r *Reader) TakeTurn(progress bool) bool {
	if !r.polled.Load() {
		r.polled.Store(true) // written only when it changes: the line stays shared
	}
	if !r.active.Load() || r.role.Load() != 0 {
		return false
	}
	if !progress {
		if r.fresh.Load() {
			// rmaProgress looked just before, in this turn of the
			// caller's loop: this test() does not, and reads no clock.
			r.fresh.Store(false)
			return false
		}
		if link.Now()-r.tried.Load() < int64(pollGap) {
			return false
		}
	}
	if !r.role.CompareAndSwap(0, roleOwned) {
		return false
	}
	if r.stash != nil || r.perr != nil || r.left.Load() {
		r.role.Store(0) // the service's to handle; it was woken
		return false
	}
	r.callerMode, r.nb = true, true
	return true
}

// EndTurn ends a caller's turn: served, it served messages; left, it left
// bytes in the buffer (or an error) for the service, which it wakes.
func (r *Reader) EndTurn(progress, served, left bool) {
	r.callerMode, r.nb = false, false
	if left {
		r.left.Store(true)
	}
	if !served {
		r.tried.Store(link.Now())
	}
	if progress != r.fresh.Load() {
		r.fresh.Store(progress)
	}
	r.role.Store(0)
	if left {
		r.handoffs.Add(1)
		// The service naps or parks on the netpoller, which may not see
		// these bytes again: the kick ends a nap, a past deadline the
		// netpoller's wait (left is stored before napping is read, and
		// the service stores napping before it reads left: one of the two
		// sees the other).
		select {
		case r.kick <- struct{}{}:
		default:
		}
		if !r.napping.Load() {
			r.in.SetReadDeadline(pastDeadline)
		}
	}
}

// Wake wakes the service as a caller that left it bytes does: a read
// deadline in the past, which every read of the service takes as a
// wake-up (a spurious one costs a look at an empty socket).
func (r *Reader) Wake() { r.in.SetReadDeadline(pastDeadline) }

// Close gives up the role for good: the service returned, and no caller
// may touch the stream any more. It unmaps the shared-memory stream.
func (r *Reader) Close() {
	r.role.Store(roleGone | roleOwned)
	if r.sring != nil {
		r.smu.Lock()
		r.sview = nil
		r.sring.Close()
		r.smu.Unlock()
	}
	if r.nap != nil {
		r.nap.Stop()
	}
}

// State is what the stall report shows of the reader: the role, whose
// turn it is, when it last served, the socket's end and the shared ring.
// It allocates.
func (r *Reader) State() string {
	var shm string
	r.smu.Lock()
	if s := r.sview; s != nil {
		tail, read, sleeping, waiting := s.State()
		shm = fmt.Sprintf(" shm{written %d read %d sleeping %v waiting %v}", tail, read, sleeping, waiting)
	}
	r.smu.Unlock()
	// What the socket holds unread and its low-water mark: bytes there
	// that nobody reads are a wake-up lost.
	inq, lowat := -1, -1
	_ = r.rc.Control(func(fd uintptr) {
		if n, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ); err == nil {
			inq = n
		}
		if n, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVLOWAT); err == nil {
			lowat = n
		}
	})
	return fmt.Sprintf("role=%#x active=%v napping=%v left=%v polled=%v rx %d µs ago, caller msgs %d, handoffs %d, socket holds %d bytes (low-water mark %d), ended=%v%s",
		r.role.Load(), r.active.Load(), r.napping.Load(), r.left.Load(), r.polled.Load(), (link.Now()-r.rx.Load())/1000,
		r.callerMsgs.Load(), r.handoffs.Load(), inq, lowat, r.endErr(), shm)
}
