package tcp

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/codec"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp/instream"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp/waitpolicy"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/inbox"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/profile"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// inReader is one incoming stream as its service and polling callers
// serve it: the reading side (instream.Reader: the bytes, and whose turn
// it is to read them) and the state of the message being served, which
// whoever holds the turn owns. The service goroutine (tcp_service.go)
// serves the stream whether or not this process calls the plugin again;
// a caller of test() or rmaProgress (serveTurn, through Link.Flush) serves
// what the socket already holds on its own thread, never blocking.
type inReader struct {
	instream.Reader
	t    *Link
	lane int
	in   *net.TCPConn // the stream, which the service replies on
	ack  *acker
	br   *bufio.Reader // over ack, over the Reader: acks leave before each read

	// Owned by whoever holds the turn.
	bye  bool // the peer said goodbye on this stream
	hb   [wire.HeaderSize]byte
	h    wire.Header
	resp []byte
	dec  *codec.Decoder
	rxr  *staging.Receiver
	held staging.Held // a put's payload held for its signal (servePut)
}

// ShmIn is the shared-memory stream an incoming lane reads its requests
// from once the sender switched (instream.ShmIn; the side path maps it).
type ShmIn = instream.ShmIn

func newInReader(t *Link, lane int, in *net.TCPConn, ack *acker) (*inReader, error) {
	r := &inReader{t: t, lane: lane, in: in, ack: ack,
		resp: make([]byte, wire.HeaderSize+smallResponse), dec: &codec.Decoder{}, rxr: &staging.Receiver{}}
	if err := r.Init(t.p, in); err != nil {
		return nil, err
	}
	ack.r = &r.Reader
	r.br = bufio.NewReaderSize(ack, readBufSize) // acks leave before each read
	return r, nil
}

// serveTurn is a caller's turn, once it took one (instream.Reader.TakeTurn:
// nobody held the stream and it carried traffic lately): serve what the
// socket holds, on this thread, without blocking. test() and rmaProgress
// (progress) take turns through Link.Flush and Link.Turn.
func (r *inReader) serveTurn(progress bool) {
	served, left := r.serveReady()
	r.EndTurn(progress, served, left)
}

// serveReady serves the whole messages the buffer and the socket hold that
// a caller may serve (puts without resend, compression or staging ring,
// marked ones whose mark is there, and piggybacked acks), until the
// socket is empty. left reports bytes
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
				r.SetCallerErr(err)
				return served, true
			}
			return served, false
		}
		if br.Buffered() < wire.HeaderSize {
			if _, err := br.Peek(wire.HeaderSize); err != nil {
				if err != instream.ErrWouldBlock {
					r.SetCallerErr(err) // an ack the drain wrote did not leave
					return served, true
				}
				// Part of a header: the rest has not arrived, and its
				// arrival wakes the service.
				return served, br.Buffered() > 0 || r.Stashed()
			}
		}
		hb, _ := br.Peek(wire.HeaderSize)
		r.h.Decode(hb)
		h := &r.h
		var need uint64
		switch h.Typ {
		case wire.MsgPut, wire.MsgPutSignal:
			if (h.Status != 0 && !t.markReached(h) && !t.inboxReached(h)) || h.Size > uint64(br.Size()-wire.HeaderSize) {
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
				if err != instream.ErrWouldBlock {
					r.SetCallerErr(err)
				}
				return served, true
			}
		}
		br.Discard(wire.HeaderSize)
		if !served {
			r.Served()
		}
		served = true
		r.ServedByCaller()
		if err := t.serveMsg(r); err != nil {
			r.SetCallerErr(err)
			return served, true
		}
	}
	return served, false
}

// close gives up the role for good: the service returned, and no caller
// may touch the stream any more.
func (r *inReader) close() {
	r.Close()
	r.dec.Release()
	r.rxr.Close()
}

// An incoming lane's requests through a shared-memory stream: the lane's
// sender (an intra-node peer) offers one in-band, the side path maps it
// (SidePath.AttachStream, stream.go), and the reader reads from it in
// place of the socket, whose bytes are then bells (instream).

// attachStream answers a lane's offer: map its ring and read the stream
// from there, or refuse on the reply stream (the sender keeps the socket).
// The offer must be the last byte the socket carries (instream.Reader.Attach).
func (t *Link) attachStream(r *inReader, h *wire.Header) error {
	p := t.p
	if r.Attached() {
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
	r.Attach(s)
	return nil
}

// callerMarkWait is how long a polling caller waits for a mark its header
// arrived ahead of: the agent's copy is usually a few microseconds behind
// the header, while handing the header to the service costs a goroutine's
// wake-up from a foreign thread (tens of microseconds).
const callerMarkWait = 25 * time.Microsecond

// markWaits adapts the polling caller's wait for marks on one link
// (waitpolicy.Policy): where the peer's marks keep arriving later than
// callerMarkWait (its agent time-sliced without MPS, a busy device),
// waiting only holds NCCL's proxy thread, so the caller then only looks.
type markWaits struct {
	waitpolicy.Policy
	// What became of the headers (link.Stats): served with the mark
	// there at once, served after a wait, left to the service, served
	// before it for our device agent to wait for it.
	atOnce, waited, left, device atomic.Uint64
}

// bound is how long a caller waits for the next mark.
func (m *markWaits) bound() time.Duration {
	if m.Waiting() {
		return callerMarkWait
	}
	return 0
}

// record notes whether a caller's wait of d saw its mark.
func (m *markWaits) record(d time.Duration, reached bool) {
	switch {
	case reached:
		m.Paid()
	case d > 0:
		m.Vain()
	}
}

// inboxReached reports whether h is a put+signal whose signal our agent
// added from our peer inbox (wire.StatusInbox) and took, or takes within
// inbox.CallerWait (25 µs by default: the sender's request waits for our
// acknowledgement, which the service, woken for the header, sends later):
// a caller serves it. Others are the service's, which acknowledges them
// once the entry was taken.
func (t *Link) inboxReached(h *wire.Header) bool {
	if h.Status&^0xff != wire.StatusInbox || h.Typ != wire.MsgPutSignal || h.Size != 0 || t.side == nil {
		return false
	}
	evs := t.side.PeerEvents()
	if evs == nil {
		return false
	}
	row, _ := evs.InboxRow()
	r := int(h.Status & 0xff)
	return row >= 0 && inboxRowOK(r, row) && inbox.Reached(r, h.Off, inbox.CallerWait())
}

// signalCtxWaits reports whether h's signal word is device memory of the
// context our agent waits for pm's marks in: otherwise its signal would
// take the host's wait, which the caller must not start unbounded.
func (t *Link) signalCtxWaits(h *wire.Header, pm *staging.PeerMarks) bool {
	_, _, ctx, pin, ok := t.p.Mesh().Owner.Resolve(h.SigMrID)
	if !ok {
		return false
	}
	pin.Release()
	return pm.DeviceWaitsIn(ctx)
}

// markReached reports whether h is a put+signal ordered by an agent mark
// alone (wire.StatusMark) whose mark the peer's page holds, or does within
// the caller's wait (markWaits): a caller serves it. Others, and one whose
// copy is still running after that, are the service's, which may wait for
// the mark.
func (t *Link) markReached(h *wire.Header) bool {
	if h.Status&^0xff != wire.StatusMark || h.Typ != wire.MsgPutSignal || h.Size != 0 || t.side == nil {
		return false
	}
	evs := t.side.PeerEvents()
	if evs == nil {
		return false
	}
	pm := evs.PeerMarks()
	if pm == nil {
		return false
	}
	k, v := int(h.Status&0xff), h.Off
	profile.Mark(profile.PtRead)
	if pm.Reached(k, v) {
		profile.Mark(profile.PtMark)
		t.markWaits.record(0, true)
		t.markWaits.atOnce.Add(1)
		return true
	}
	if pm.DeviceWaits() && t.signalCtxWaits(h, pm) {
		// Our agent can wait for the mark before the signal
		// (staging.AddSignalAfterMark): served now, NCCL's thread free.
		t.markWaits.device.Add(1)
		return true
	}
	d := t.markWaits.bound()
	ok := pm.ReachedWithin(k, v, d)
	t.markWaits.record(d, ok)
	if ok {
		profile.Mark(profile.PtMark)
		t.markWaits.waited.Add(1)
	} else {
		t.markWaits.left.Add(1)
	}
	return ok
}
