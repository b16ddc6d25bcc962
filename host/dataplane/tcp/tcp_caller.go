package tcp

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

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/codec"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/nap"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/rawio"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/spin"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// inReader is the reading side of one incoming stream: its buffer and the
// state of the message being served. Two kinds of thread take turns at it,
// never both at once (role):
//
//   - the service goroutine (tcp_service.go), which serves the stream
//     whether or not this process calls the plugin again; it waits for
//     input on the netpoller without holding the role, and may block in
//     the middle of a message while it holds it;
//   - a caller of test() or rmaProgress (poll, through Link.flush),
//     which serves what the socket already holds on its own thread, never
//     blocking. On a machine with few cores this is what makes a small
//     exchange cheap: the message is applied where the caller already
//     waits, as a raw TCP reader applies it, instead of after a netpoller
//     wake-up of the service goroutine on a busy core.
//
// The bytes go through one buffer in stream order whoever reads them, so
// no byte is consumed twice and signals still apply after their payload.
type inReader struct {
	t    *Link
	lane int
	in   *net.TCPConn
	rc   syscall.RawConn
	ack  *acker
	br   *bufio.Reader
	blk  io.Reader // the service's blocking reader (spins after traffic)

	// role is roleOwned while a thread serves the stream; roleGone once
	// the service returned (it keeps the role for good).
	role atomic.Uint32
	// left: a caller left bytes in the buffer it did not serve (a message
	// it does not serve on its thread, or one that is not whole): the
	// service serves them, woken by a kick (its nap) or a read deadline
	// in the past (its wait on the netpoller).
	left atomic.Bool
	// active: the service leaves the stream to callers, who look at its
	// socket (wait). It is off while the stream is quiet, so a test() of
	// a one-way stream costs an atomic load, no clock and no system call.
	active atomic.Bool
	// polled: a caller called since the service last looked; while
	// callers keep calling, the service leaves the socket to them.
	polled atomic.Bool
	// rx is Now() when a message was last served (the service stops
	// leaving a quiet stream to callers after pollActive).
	rx atomic.Int64
	// tried is Now() when a caller last found the socket empty: callers
	// that poll in a tight loop look at most once per pollGap.
	tried atomic.Int64
	// fresh: rmaProgress looked last; the next test() does not look
	// (poll). A hint: at worst one call looks or skips in vain.
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
	bye        bool  // the peer said goodbye on this stream
	hb         [wire.HeaderSize]byte
	h          wire.Header
	resp       []byte
	dec        *codec.Decoder
	rxr        *staging.Receiver

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
	// the service's naps while callers serve (wait)
	napping atomic.Bool
	kick    chan struct{}
	nap     *nap.Napper // not a time.Timer: an idle process's sub-ms timer ends after ~1 ms (host/nap)
	lowat   bool        // SO_RCVLOWAT is raised (service only)
	lowOn   bool
	lowFn   func(fd uintptr)

	// The shared-memory stream the sender switched to (below): set
	// by the service, read by whoever holds the role. sockErr is the
	// socket's end the service met (set by the service, the first one
	// kept; read by a caller holding the role too, hence atomic); bells
	// its scratch.
	sring   ShmIn
	sview   ShmIn      // sring, for diagnostics from any thread (WriteState), under smu
	smu     sync.Mutex // sview: close unmaps the ring under it
	sockErr atomic.Pointer[error]
	bells   [64]byte
}

// endErr is the socket's end the service met, nil while open.
func (r *inReader) endErr() error {
	if p := r.sockErr.Load(); p != nil {
		return *p
	}
	return nil
}

// ended records err as the socket's end, unless one is recorded.
func (r *inReader) ended(err error) { r.sockErr.CompareAndSwap(nil, &err) }

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

// errWouldBlock: the socket is empty and the reader may not park.
var errWouldBlock = errors.New("would block")

// pastDeadline wakes the service from its wait (SetReadDeadline).
var pastDeadline = time.Unix(1, 0)

func newInReader(t *Link, lane int, in *net.TCPConn, ack *acker) (*inReader, error) {
	rc, err := in.SyscallConn()
	if err != nil {
		return nil, err
	}
	r := &inReader{t: t, lane: lane, in: in, rc: rc, ack: ack,
		blk:  spin.NewReader(in, t.p.Mesh().SpinWait, t.p.Mesh().Spinners, nil),
		resp: make([]byte, wire.HeaderSize+smallResponse), dec: &codec.Decoder{}, rxr: &staging.Receiver{}}
	r.rdFn = r.readFD
	r.waitFn = r.waitFD
	r.lowFn = r.lowatFD
	r.kick = make(chan struct{}, 1)
	r.role.Store(roleOwned) // the service's until its first wait
	ack.r = r
	r.br = bufio.NewReaderSize(ack, readBufSize) // acks leave before each read
	return r, nil
}

// readFD is a caller's non-blocking read (rawio.ReadNB).
func (r *inReader) readFD(fd uintptr) {
	for {
		n, errno := rawio.ReadNB(int(fd), r.b)
		if errno == unix.EINTR {
			continue
		}
		r.n, r.errno = n, errno
		return
	}
}

// Read is the stream as the buffer reads it (under the acker, which sends
// acks before each read).
func (r *inReader) Read(b []byte) (int, error) {
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
			return 0, errWouldBlock
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
			return 0, errWouldBlock
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
			// A caller's wake-up (wake) met the service in a read.
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
func (r *inReader) caller() bool { return r.callerMode }

// waitFD is the service's wait for input: true once the socket holds
// bytes (or an end or error, which the read then meets), a caller left
// bytes in the buffer, or the netpoller woke it; false parks on the
// netpoller. It looks (a peek, nothing is consumed) after RawConn.Read
// cleared the readiness the netpoller had noted, so a message that came
// before is not missed. After traffic it
// spins first, as the blocking reader does, when a spin slot is free.
func (r *inReader) waitFD(fd uintptr) bool {
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
		m := r.t.p.Mesh()
		if !spinning {
			if r.parked || m.SpinWait <= 0 || Now()-r.rx.Load() > int64(m.SpinWait) || !spin.Acquire(int32(m.Spinners)) {
				r.parked = true
				return false
			}
			spinning, start = true, Now()
		} else if Now()-start > int64(m.SpinWait) {
			spin.Release()
			r.parked = true
			return false
		}
		runtime.Gosched()
	}
}

// wait waits, not holding the role, until there is input, then takes the
// role; a caller holding it lets go within one poll.
//
// While callers poll a stream with traffic they serve it, and the service
// stays off the socket: it naps, and the socket's low-water mark is raised
// (lowat) so that an arriving message wakes no thread at all (the
// netpoller's included: it would take the core from the caller). Each nap
// ends with a look at the socket, so nothing waits for a caller that
// stopped calling longer than a nap.
func (r *inReader) wait() {
	for {
		// Callers that called since the last look still poll: while the
		// stream carries traffic, they serve it.
		if r.polled.Swap(false) && Now()-r.rx.Load() < int64(pollActive) {
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
				case <-r.t.p.Quit(): // the streams are closed: the read ends the service
				}
				r.nap.Stop()
			}
			r.napping.Store(false)
			if !r.left.Load() && !r.t.p.Dead() {
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
func (r *inReader) setLowat(on bool) {
	r.lowat, r.lowOn = on, on
	if err := r.rc.Control(r.lowFn); err != nil {
		r.lowat = false
	}
}

func (r *inReader) lowatFD(fd uintptr) {
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

// release lets go of the role (the service, going back to wait).
func (r *inReader) release() { r.role.Store(0) }

// poll is a caller's turn: when nobody holds the stream and it carried
// traffic lately, serve what its socket holds, on this thread, without
// blocking. test() and rmaProgress (progress) call it through
// Link.flush and Link.turn.
func (r *inReader) poll(progress bool) {
	if !r.polled.Load() {
		r.polled.Store(true) // written only when it changes: the line stays shared
	}
	if !r.active.Load() || r.role.Load() != 0 {
		return
	}
	if !progress {
		if r.fresh.Load() {
			// rmaProgress looked just before, in this turn of the
			// caller's loop: this test() does not, and reads no clock.
			r.fresh.Store(false)
			return
		}
		if Now()-r.tried.Load() < int64(pollGap) {
			return
		}
	}
	if !r.role.CompareAndSwap(0, roleOwned) {
		return
	}
	if r.stash != nil || r.perr != nil || r.left.Load() {
		r.role.Store(0) // the service's to handle; it was woken
		return
	}
	r.callerMode, r.nb = true, true
	served, left := r.serveReady()
	r.callerMode, r.nb = false, false
	if left {
		r.left.Store(true)
	}
	if !served {
		r.tried.Store(Now())
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

// serveReady serves the whole messages the buffer and the socket hold that
// a caller may serve (puts without resend, compression or staging ring,
// and piggybacked acks), until the socket is empty. left reports bytes
// left in the buffer, or an error stashed, for the service.
func (r *inReader) serveReady() (served, left bool) {
	t, br := r.t, r.br
	for !r.bye {
		if served && br.Buffered() == 0 {
			// What was read is served: the caller returns to what it
			// waits for at once rather than pay another read to find the
			// socket empty (its next poll reads). The acks of what landed
			// are published (or sent) as before a read.
			if err := r.ack.drained(); err != nil {
				r.perr = err
				return served, true
			}
			return served, false
		}
		if br.Buffered() < wire.HeaderSize {
			if _, err := br.Peek(wire.HeaderSize); err != nil {
				if err != errWouldBlock {
					r.perr = err // an ack the drain wrote did not leave
					return served, true
				}
				// Part of a header: the rest has not arrived, and its
				// arrival wakes the service.
				return served, br.Buffered() > 0 || r.stash != nil
			}
		}
		hb, _ := br.Peek(wire.HeaderSize)
		r.h.Decode(hb)
		h := &r.h
		var need uint64
		switch h.Typ {
		case wire.MsgPut, wire.MsgPutSignal:
			if h.Status != 0 || h.Size > uint64(br.Size()-wire.HeaderSize) {
				return served, true
			}
			need = wire.HeaderSize + h.Size
		case wire.MsgAck:
			need = wire.HeaderSize
		default:
			return served, true
		}
		if uint64(br.Buffered()) < need {
			if _, err := br.Peek(int(need)); err != nil {
				if err != errWouldBlock {
					r.perr = err
				}
				return served, true
			}
		}
		br.Discard(wire.HeaderSize)
		if !served {
			r.rx.Store(Now())
		}
		served = true
		r.callerMsgs.Add(1)
		if err := t.serveMsg(r); err != nil {
			r.perr = err
			return served, true
		}
	}
	return served, false
}

// close gives up the role for good: the service returned, and no caller
// may touch the stream any more.
func (r *inReader) close() {
	r.role.Store(roleGone | roleOwned)
	r.dec.Release()
	r.rxr.Close()
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

// An incoming lane's requests through a shared-memory stream: the lane's
// sender (an intra-node peer) offers one in-band, the side path maps it
// (SidePath.AttachStream, stream.go), and the reader reads from it in
// place of the socket, whose bytes are then bells.

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

// attachStream answers a lane's offer: map its ring and read the stream
// from there, or refuse on the reply stream (the sender keeps the socket).
// The offer must be the last byte the socket carries.
func (t *Link) attachStream(r *inReader, h *wire.Header) error {
	p := t.p
	if r.sring != nil {
		return fmt.Errorf("protocol error: rank %d offered a second shared-memory stream on one lane", p.Rank())
	}
	if r.br.Buffered() != 0 {
		return fmt.Errorf("protocol error: rank %d wrote %d bytes on its socket after offering a shared-memory stream", p.Rank(), r.br.Buffered())
	}
	var err error
	var s ShmIn
	if t.side == nil {
		err = errors.New("not an intra-node link")
	} else {
		s, err = t.side.AttachStream(h)
	}
	if err != nil {
		logx.Info(abi.SubsysNet, "NET/wasm: refusing rank %d's shared-memory stream (%v); its requests ride the socket", p.Rank(), err)
		return t.reply(r.in, wire.MsgStreamNo, h, abi.InternalError, nil, r.resp)
	}
	if r.lowat {
		r.setLowat(false)
	}
	r.sring = s
	r.smu.Lock()
	r.sview = s
	r.smu.Unlock()
	s.SetAttached()
	return nil
}

// readStream is inReader.Read from the shared ring: what it holds, or for
// a caller (nb) errWouldBlock; the service sleeps on the socket, whose
// bytes are bells, until the ring has bytes. The socket's end (or a
// reset) ends the stream once the ring is drained.
func (r *inReader) readStream(b []byte) (int, error) {
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
			return 0, errWouldBlock
		}
		if !s.Sleep() {
			continue
		}
		_, err = r.in.Read(r.bells[:]) // bells: the ring says what came
		s.Awake()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				// A caller's wake-up (poll): look again.
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
func (r *inReader) waitStream(fd uintptr) bool {
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
		m := r.t.p.Mesh()
		if !spinning {
			if m.SpinWait <= 0 || Now()-r.rx.Load() > int64(m.SpinWait) || !spin.Acquire(int32(m.Spinners)) {
				break
			}
			spinning, start = true, Now()
		} else if Now()-start > int64(m.SpinWait) {
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
func (r *inReader) drainBells(fd uintptr) bool {
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
