package tcp

import (
	"fmt"
	"io"
	"net"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"golang.org/x/sys/unix"
)

// What a TCP link tells of itself: its lanes and incoming streams for the
// stall report (Mesh.WriteState), and its counters for Mesh.Stats.

// Streams: a TCP link carries its own lanes (and the intra-node and
// libfabric links, which embed it, carry theirs).
func (t *Link) Streams() *Link { return t }

// WriteState writes, per TCP lane, whether it is open, its queue, whether
// someone holds the stream, the puts written and not yet acknowledged, and
// the gets awaiting replies; then the incoming streams. It takes each
// lane's locks briefly; it allocates.
func (t *Link) WriteState(w io.Writer) {
	for _, l := range t.lanes {
		l.mu.Lock()
		out, opening, qlen, writing, down := l.out, l.opening, l.q.Len(), l.writing, l.down
		open := out != nil
		var head string
		if qlen > 0 {
			op := l.q.At(0)
			head = fmt.Sprintf(" head{msg %d size %d seq %d notBefore %d}", op.Msg, op.Size, op.Seq, op.NotBefore)
		}
		l.mu.Unlock()
		outq := socketOutq(out) // system calls: not under the lane's lock
		var shm string
		if l.ix != nil {
			shm = l.ix.ShmState()
		}
		var wait string
		if since := l.waitSince.Load(); since != 0 {
			wait = fmt.Sprintf(" oldest ack wait %d µs", (Now()-since)/1000)
		}
		fmt.Fprintf(w, "    lane %d: open=%v opening=%v queued=%d%s writing=%v down=%v armed=%v unacked puts=%d%s gets=%d batches=%d backstop asks %d rescued %d%s%s\n",
			l.idx, open, opening, qlen, head, writing, down, l.armed.Load(), l.pendingPuts(), wait, l.pendingGets(), l.batches.Load(),
			l.bsAsks.Load(), l.bsRescued.Load(), outq, shm)
	}
	// The incoming streams: what their ackers owe, who serves them, and
	// what their rings hold.
	if n := t.ackDeferred.Load(); n > 0 {
		fmt.Fprintf(w, "    ack timers that found a stream held (left to its holder): %d\n", n)
	}
	for i, a := range t.acks {
		pub, sent, armed := a.State()
		fmt.Fprintf(w, "    acker %d: pub %d sent %d owed %d armed %v rides %v alone %d\n",
			i, pub, sent, a.Owed(), armed, a.Rides(), a.Alone())
		if r := a.rd.Load(); r != nil {
			fmt.Fprintf(w, "    in %d: %s\n", i, r.State())
		}
	}
}

// AddStats adds the link's counters to st: the payload bytes its lanes
// compressed and what they took on the wire, and its acknowledgements.
// Compression is counted for plain TCP links only.
func (t *Link) AddStats(st *link.Stats) {
	for _, l := range t.lanes {
		r, w := l.enc.Counts()
		st.CompressedRaw, st.CompressedWire = st.CompressedRaw+r, st.CompressedWire+w
	}
	t.AddAcks(st)
}

// AddAcks adds the acknowledgements of the peer's puts sent so far to st:
// carried in a batch of ours, or written alone on the acknowledged stream;
// the backstop's asks and the acks that came only after one; the flushes'
// asks; batches handed over; what the polling caller did with headers
// ordered by agent marks.
func (t *Link) AddAcks(st *link.Stats) {
	for _, l := range t.lanes {
		st.AcksCarried += l.carried.Load()
		st.Handed += l.hand.Handed()
		st.HandedByCaller += l.hand.Polled()
		st.BackstopAsks += l.bsAsks.Load()
		st.AcksRescued += l.bsRescued.Load()
		st.FlushAsks += l.asks.asks.Load()
		st.FlushAsksAtOnce += l.asks.early.Load()
	}
	for _, a := range t.acks {
		st.AcksAlone += a.Alone()
		st.AcksAtOnce += a.AtOnce()
	}
	st.MarksAtOnce += t.markWaits.atOnce.Load()
	st.MarksWaited += t.markWaits.waited.Load()
	st.MarksLeft += t.markWaits.left.Load()
	st.MarksToDevice += t.markWaits.device.Load()
}

// streamer is a transport that carries TCP lanes: TCP's own link, and
// the intra-node and libfabric links built over it.
type streamer interface{ Streams() *Link }

// Found by assertion only, like the side links' promoted Streams.
var _ streamer = (*Link)(nil)

// Of returns the TCP lanes a transport carries: its own, or those
// under the intra-node and libfabric links; nil for none.
func Of(tr link.Transport) *Link {
	if s, ok := tr.(streamer); ok {
		return s.Streams()
	}
	return nil
}

// Progress sums what the kernel moved on every stream to and from the
// peer: bytes the peer acknowledged and bytes it sent us.
func (t *Link) Progress() (uint64, bool) {
	var sum uint64
	ok := false
	add := func(fd uintptr) {
		info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if err == nil {
			sum += info.Bytes_acked + info.Bytes_received
			ok = true
		}
	}
	for _, l := range t.lanes {
		l.mu.Lock()
		out := l.out
		l.mu.Unlock()
		if out == nil {
			continue // not opened yet
		}
		if rc, err := out.SyscallConn(); err == nil {
			_ = rc.Control(add)
		}
	}
	t.inMu.Lock()
	defer t.inMu.Unlock()
	for _, in := range t.ins {
		if in == nil {
			continue
		}
		if rc, err := in.SyscallConn(); err == nil {
			_ = rc.Control(add)
		}
	}
	return sum, ok
}

// socketOutq tells what a lane's socket has not sent yet, and what the
// peer's kernel has not acknowledged: bytes our writes left there that
// never leave are the kernel's (or a peer that stopped reading), not ours.
func socketOutq(c *net.TCPConn) string {
	if c == nil {
		return ""
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return ""
	}
	unsent, unacked := -1, -1
	_ = rc.Control(func(fd uintptr) {
		if n, err := unix.IoctlGetInt(int(fd), unix.SIOCOUTQNSD); err == nil {
			unsent = n
		}
		if n, err := unix.IoctlGetInt(int(fd), unix.SIOCOUTQ); err == nil {
			unacked = n
		}
	})
	return fmt.Sprintf(" socket unsent %d bytes, unacknowledged by the peer's kernel %d", unsent, unacked)
}
