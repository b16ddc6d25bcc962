package tcp

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"golang.org/x/sys/unix"
)

// Raw I/O: the lane's writes to its stream, a socket's writev or a
// shared-memory stream, and the device payloads gathered into host memory.

// WriteIov sends the gathered headers and payloads: into the shared-memory
// stream of an intra-node lane (stream.go), else with one writev.
func (l *lane) WriteIov(iov [][]byte) error {
	if l.gather.Pending() {
		// Device payloads gathered in iov: their copies first; the slots
		// go back once the bytes were written.
		defer l.gather.Done()
		if err := l.gather.Wait(); err != nil {
			return err
		}
	}
	if len(iov) == 0 {
		return nil
	}
	l.writes.Add(1)
	if l.ix != nil && l.ix.StreamOn() {
		return l.ix.WriteStream(iov)
	}
	return l.WriteSocket(iov)
}

// WriteSocket writes iov on the lane's socket, with one writev where the
// socket takes it all.
func (l *lane) WriteSocket(iov [][]byte) error {
	if total := iovLen(iov); l.orc != nil && len(iov) <= len(l.wiov) && total <= rawWriteMax {
		// A first try without the connection's write lock and poller
		// bookkeeping: one non-blocking writev as a raw system call. The
		// holder of writing is the stream's only writer, and Control keeps
		// the descriptor from being closed under it. What it could not
		// write (a full socket) goes through the connection, which waits.
		for i, b := range iov {
			l.wiov[i] = unix.Iovec{Base: unsafe.SliceData(b)}
			l.wiov[i].SetLen(len(b))
		}
		l.wcnt, l.wn, l.werr = len(iov), 0, 0
		err := l.orc.Control(l.wvFn)
		clear(l.wiov[:len(iov)])
		if err != nil {
			return err // closed
		}
		if l.werr != 0 && l.werr != unix.EAGAIN {
			// As the connection's own write reports it (the failure path
			// alone allocates).
			return &net.OpError{Op: "write", Net: "tcp", Source: l.out.LocalAddr(), Addr: l.out.RemoteAddr(),
				Err: os.NewSyscallError("writev", l.werr)}
		}
		if l.wn == total {
			return nil
		}
		// What left is skipped; the rest goes through the connection.
		for n := l.wn; n > 0; {
			if n >= len(iov[0]) {
				n -= len(iov[0])
				iov = iov[1:]
			} else {
				iov[0] = iov[0][n:]
				n = 0
			}
		}
	}
	l.bufs = iov
	_, err := l.bufs.WriteTo(l.out)
	l.bufs = nil
	return err
}

// Settle waits for the device copies the batch gathered so far, before a
// synchronous copy that must not overtake them (a strongly-ordered put's
// completion means everything before it landed; a get may read what an
// earlier put writes). A failure is the batch's: its write reports it.
func (l *lane) Settle() {
	if l.gather.Pending() {
		l.gather.Wait()
	}
}

// gatherDev queues the copy of op's device payload into a bounce slot
// when iov has room (staging.Gather.Add says whether it is small enough):
// the bytes to append to iov, or nil to stage it synchronously.
func (l *lane) gatherDev(op *link.Op, niov int) ([]byte, error) {
	if op.LocalCtx == 0 || niov+1 >= cap(l.iov) {
		return nil, nil
	}
	return l.gather.Add(op.LocalCtx, uintptr(op.Local), op.Size)
}

// rawWriteMax is the most a raw writev (WriteIov) takes: a raw system call
// keeps its P, so a long copy would hold the goroutines queued on it.
const rawWriteMax = inlineMax

func iovLen(iov [][]byte) int {
	n := 0
	for _, b := range iov {
		n += len(b)
	}
	return n
}

// writevFD is WriteIov's raw writev (through the connection's Control).
func (l *lane) writevFD(fd uintptr) {
	for {
		n, _, e := syscall.RawSyscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&l.wiov[0])), uintptr(l.wcnt))
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			l.wn, l.werr = 0, e
		} else {
			l.wn, l.werr = int(n), 0
		}
		return
	}
}

// streamWriter is what staging writes a device payload to: the lane's
// shared-memory stream when it has one, else the socket.
func (l *lane) streamWriter() io.Writer {
	if l.ix != nil {
		if w := l.ix.StreamWriter(); w != nil {
			return w
		}
	}
	return l.out
}

// Gone is the staging ring's liveness check of a sending lane.
func (l *lane) Gone() bool { return l.p.Dead() || l.isDown() }

// Raw, Control, Index and Gathered are the lane's LaneIO for its side.
func (l *lane) Raw() bool                         { return l.orc != nil }
func (l *lane) Control(fn func(fd uintptr)) error { return l.orc.Control(fn) }
func (l *lane) Index() int                        { return l.idx }
func (l *lane) Gathered() *staging.Gather         { return &l.gather }
