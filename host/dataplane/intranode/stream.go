package intranode

import (
	"fmt"
	"io"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/shmstream"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// The intra-node request stream (SPEC.md §4, "Shared-memory streams"): a
// lane to a peer on the same host writes its requests into a shared ring
// (host/shmstream) instead of its socket, and the peer's reader parses the
// same bytes from there. The socket stays, for the replies, for the
// reader's sleep (a writer that finds it asleep sends one byte, its bell)
// and for the end of the stream (a closed socket is a closed stream).
//
// The switch is a message: the lane's first write offers the ring on the
// socket (wire.MsgStream) and waits until the target mapped it (the ring's
// attached word) or refused (wire.MsgStreamNo on the reply stream); from
// the offer on, every byte of the request stream is in the ring, and the
// target reads the ring from the message after the offer. Nothing else is
// written on the socket in between, so no byte can be on the wrong side.

// StreamRingSize is the data size of a lane's shared-memory stream: room
// for a batch of small puts and their headers, a fraction of a socket's
// buffer (payloads of intraMin and up move by process_vm_writev, device
// payloads through the staging ring).
const StreamRingSize = 256 << 10

// laneShm is a lane's side of the intra-node shared-memory stream: state
// owned by whoever holds writing; the mapping is released with the lane.
type laneShm struct {
	sState int
	sring  atomic.Pointer[shmstream.Ring]
	sNo    atomic.Bool // the target refused the stream
	sOn    atomic.Bool // sState is ringOn, for those who do not hold writing
	bellFn func(fd uintptr)
	sbuf   [1][]byte     // laneStream's iovec
	bells  atomic.Uint64 // bells rung (tests and the stall report)
}

// StreamOn reports whether this lane writes its requests into a shared
// ring, offering one on the first call: to a peer on this host, where the
// mesh allows it. Called by whoever holds writing, before its write.
func (x *intraLane) StreamOn() bool {
	switch x.sState {
	case ringOn:
		return true
	case ringOff:
		return false
	}
	x.sState = ringOff
	if x.p.Mesh().NoIntraStream || !x.l.Raw() {
		return false
	}
	s, err := newStreamRing(StreamRingSize)
	if err != nil {
		logx.Info(abi.SubsysNet, "NET/wasm: intra-node path to rank %d: no shared-memory stream (%v); requests ride the socket", x.p.Rank(), err)
		return false
	}
	x.sring.Store(s)
	fd, size := s.Offer()
	h := wire.Header{Typ: wire.MsgStream, Off: fd, Size: size}
	var hb [wire.HeaderSize]byte
	h.Encode(hb[:])
	if err := x.l.WriteSocket([][]byte{hb[:]}); err != nil {
		return false // the lane fails at its next write, as it would have
	}
	if on, _ := s.AwaitAttach(x.sNo.Load, x.l); !on {
		return false
	}
	x.sState = ringOn
	x.sOn.Store(true)
	x.bellFn = x.bellFD
	logx.Info(abi.SubsysNet, "NET/wasm: intra-node path to rank %d, lane %d: requests through a shared-memory stream (%d KiB)",
		x.p.Rank(), x.l.Index(), size>>10)
	return true
}

// StreamRefused is the reply stream's wire.MsgStreamNo: wake the offer's wait.
func (x *intraLane) StreamRefused() {
	x.sNo.Store(true)
	if s := x.sring.Load(); s != nil {
		s.WakeAttach()
	}
}

// WriteStream writes iov into the lane's shared ring.
func (x *intraLane) WriteStream(iov [][]byte) error {
	return x.sring.Load().Write(iov, x, x.l)
}

// Ring is the stream's bell: one byte on the socket wakes the target's
// reader from its sleep in the netpoller. A full socket already wakes it.
func (x *intraLane) Ring() {
	x.bells.Add(1)
	if dropBells.Load() {
		return // tests: a lost wake-up (the wake backstop's test)
	}
	if err := x.l.Control(x.bellFn); err != nil {
		return // closed: the reader meets the end instead
	}
}

func (x *intraLane) bellFD(fd uintptr) {
	b := [1]byte{0xdb}
	for {
		_, _, e := syscall.RawSyscall(unix.SYS_WRITE, fd, uintptr(unsafe.Pointer(&b[0])), 1)
		if e != unix.EINTR {
			return
		}
	}
}

// dropBells makes every bell a lost one (a test knob, DropBells: the
// wake backstop's test; unset in production, an atomic load per bell).
var dropBells atomic.Bool

// StreamWriter is what staging writes a device payload to: the ring's
// writer when the lane has one, else nil (the socket).
func (x *intraLane) StreamWriter() io.Writer {
	if x.sState == ringOn {
		return (*laneStream)(x)
	}
	return nil
}

// StreamLive reports that the lane writes a shared-memory stream, for
// those who do not hold writing.
func (x *intraLane) StreamLive() bool { return x.sOn.Load() }

// ShmState is the stall report's words on the lane's shared-memory
// stream: where its writer and reader are, and the bells rung.
func (x *intraLane) ShmState() string {
	if s := x.sring.Load(); s != nil {
		tail, read, sleeping, waiting := s.State()
		return fmt.Sprintf(" shm{written %d read %d sleeping %v waiting %v bells %d}", tail, read, sleeping, waiting, x.bells.Load())
	}
	return ""
}

// laneStream is a lane's shared ring as an io.Writer.
type laneStream intraLane

func (s *laneStream) Write(b []byte) (int, error) {
	x := (*intraLane)(s)
	x.sbuf[0] = b
	err := x.WriteStream(x.sbuf[:])
	x.sbuf[0] = nil
	if err != nil {
		return 0, err
	}
	return len(b), nil
}

// releaseStream frees the lane's ring once its goroutines ended.
func (x *intraLane) releaseStream() {
	if s := x.sring.Swap(nil); s != nil {
		s.Close()
	}
}

// newStreamRing makes a lane's ring (a variable: a test keeps a hostile
// writer's handle on one).
var newStreamRing = shmstream.New

// streamRefusal, when set (tests), refuses every stream offer with its
// error (atomic: a service of another test's mesh may still look).
var streamRefusal atomic.Pointer[error]

// AttachStream maps the shared-memory stream a lane of the peer offered
// (SidePath): its requests come through it from now on.
func (x *Link) AttachStream(h *wire.Header) (tcp.ShmIn, error) {
	if err := streamRefusal.Load(); err != nil {
		return nil, *err
	}
	s, err := shmstream.Attach(x.PeerPid(), h.Off, h.Size)
	if err != nil {
		return nil, err
	}
	return s, nil
}
