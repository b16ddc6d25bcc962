package tcp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/codec"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp/instream"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp/putack"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/inbox"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/profile"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// acker is the acknowledgement side of one incoming stream: the acks of
// what it landed (putack.Acker, which decides when they leave), with the
// stream they are written on when they go alone and the stream's reader.
// It sits between the socket and the stream's buffered reader (inReader:
// the service or a polling caller reads through it), so an ack leaves just
// before each read from the socket, or is left for our lanes' next batch.
type acker struct {
	putack.Acker
	in *net.TCPConn             // the stream, which acks alone are written on
	r  io.Reader                // the stream's inReader (tcp_caller.go)
	rd atomic.Pointer[inReader] // set once its service started: callers read it
}

// ackDelay is how long a piggybacked ack waits for a batch of the lane
// before test() or rmaProgress sends it alone, and ackBound how long at
// most when neither is called (putack.Lanes). Variables so that tests can
// make a hold last.
var (
	ackDelay = newDelay(50 * time.Microsecond)
	ackBound = newDelay(500 * time.Microsecond)
)

func (a *acker) Read(b []byte) (int, error) {
	if err := a.drained(); err != nil {
		return 0, err
	}
	return a.r.Read(b)
}

// drained runs when the stream's reader has consumed everything it read
// (putack.Acker.Drained).
func (a *acker) drained() error { return a.Drained(a.in) }

// flush acknowledges what landed on the stream itself (putack.Acker.Flush).
func (a *acker) flush() error { return a.Flush(a.in) }

// nacked: a put of this stream is rejected (putack.Acker.Nacked).
func (a *acker) nacked() { a.Nacked() }

// ackEvery is the most puts the service lands before it acknowledges them,
// even with more of them already read (it acknowledges before each read
// from the socket too).
const ackEvery = 64

// service executes the peer's operations arriving on one incoming lane. It
// runs whether or not this process ever calls the plugin again. It serves
// while it holds the stream's reading role (inReader), blocking in the
// middle of a message if need be, and lets the role go while it waits for
// input, so that a caller polling in test() or rmaProgress can serve what
// arrives on its own thread (tcp_caller.go).
func (t *Link) service(lane int, in *net.TCPConn) {
	p := t.p
	defer p.Mesh().WG.Done()
	defer close(t.inDone[lane]) // after the last landing (fence waits for it)
	ack := t.acks[lane]
	r, err := newInReader(t, lane, in, ack)
	if err != nil {
		p.MarkDead(fmt.Errorf("serve rank %d: %w", p.Rank(), err))
		return
	}
	defer r.close() // holding the role: no caller touches the stream after this
	ack.rd.Store(r)
	for t.serveAll(r) {
		r.Release()
		r.Wait()
	}
}

// serveAll serves the stream holding the role until the socket is empty
// between two messages (true: wait for more) or the stream ended (false).
func (t *Link) serveAll(r *inReader) bool {
	p, lane, br := t.p, r.lane, r.br
	served := false
	for {
		if err := r.CallerErr(); err != nil {
			// A caller met it serving a message on its thread.
			if streamEnded(err) && t.inLaneEnded(lane, err) {
				return false
			}
			p.MarkDead(err)
			return false
		}
		var err error
		if br.Buffered() == 0 {
			// Between messages: look without parking.
			if err = r.Probe(br); err == instream.ErrWouldBlock {
				if served {
					r.Served() // once per batch: a clock read per message shows in the rate
				}
				return true
			}
		}
		if err == nil {
			_, err = io.ReadFull(br, r.hb[:])
		}
		if err != nil {
			if r.bye {
				// The lane ended in order. The peer's other lanes may
				// still carry operations: they end on their own, and
				// the replies stream notices when the peer is gone.
				return false
			}
			if t.inLaneEnded(lane, err) {
				return false // the lane failed alone: the peer fails it over
			}
			p.MarkDead(fmt.Errorf("receive from rank %d: %w", p.Rank(), err))
			return false
		}
		if r.bye {
			p.MarkDead(fmt.Errorf("protocol error: rank %d sent message type %d after its goodbye", p.Rank(), r.hb[0]))
			return false
		}
		r.h.Decode(r.hb[:])
		served = true
		if err = t.serveMsg(r); err != nil {
			if streamEnded(err) && t.inLaneEnded(lane, err) {
				return false // broke mid-message: the peer sends it again
			}
			p.MarkDead(err)
			return false
		}
	}
}

// serveMsg executes one message whose header (r.h) was read; its body
// follows in the buffer. The holder of the role calls it: the service, or
// a caller for the messages inReader.serveReady lets it serve, whole in
// the buffer.
func (t *Link) serveMsg(r *inReader) error {
	p, lane, ack, br, h := t.p, r.lane, r.ack, r.br, &r.h
	in, resp := r.in, r.resp
	var err error
	switch h.Typ {
	case wire.MsgPut, wire.MsgPutSignal:
		switch {
		case h.Status&wire.StatusResent == 0:
			err = t.servePut(ack, br, h, resp, r.dec, r.rxr, &r.held)
		case h.Seq == 0:
			err = fmt.Errorf("protocol error: rank %d resent a put without a sequence number", p.Rank())
		default:
			// Sent again after lane From failed: only once nothing of
			// that lane is still landing, and only if it never landed.
			if err = t.fence(lane, int(h.Status&wire.StatusFromMask)>>8); err == nil {
				if p.Order().Seen(h.Seq) {
					err = t.dropPut(br, h, r.dec)
				} else {
					err = t.servePut(ack, br, h, resp, r.dec, r.rxr, &r.held)
				}
			}
		}
		ack.Land()
		if err == nil && ack.Unacked() >= ackEvery {
			// A read buffer of small puts holds hundreds: acknowledge
			// part of it now so the initiator refills its window while
			// the rest lands.
			err = ack.flush()
		}
	case wire.MsgAck:
		if h.Seq != 0 || h.Status&wire.StatusAckNow == 0 {
			err = t.piggyAck(h) // (an ask alone acknowledges nothing)
		}
		if err == nil && h.Status&wire.StatusAckNow != 0 {
			t.p.AskedAcks().Add(1)
			err = ack.flush() // the sender waits: no holding for a batch of ours
		}
	case wire.MsgGet:
		err = t.serveGet(in, h, resp)
	case wire.MsgRing:
		err = t.attachRing(in, r.rxr, h, resp)
	case wire.MsgStream:
		err = t.attachStream(r, h)
	case wire.MsgReg:
		// sigOp: the fabric rail whose key sigValue is (ofi.Link's
		// submit sends rails 1.. first); rail 0's also tells the owner.
		// context 1: device memory its provider registered (FI_HMEM).
		if t.onReg != nil {
			t.onReg(h.SigOp, h.MrID, h.Off, h.SigValue, h.Status == 1, h.Context == 1)
		}
		if h.SigOp == 0 {
			r := link.PeerReg{MrID: h.MrID, Size: h.Size, Base: h.Off, Dev: h.Status == 1}
			if h.SigMrID == link.ShareOffer {
				r.Share = h.Tag
			}
			// sigOff: 1<<63 | the peer inbox's table entry (host/devmem/inbox).
			if h.SigOff>>63 == 1 && h.SigOff&^(1<<63) < 64 {
				r.Inbox = uint8(h.SigOff&63) + 1
			}
			p.Mesh().Owner.PeerRegistered(p.Rank(), r)
		}
	case wire.MsgBye:
		// Everything this lane carried before the goodbye has been
		// applied (signals included: a signal held for an earlier
		// sequence number of another lane is applied when that one
		// lands, and that lane's goodbye comes after it).
		// The puts it carried are acknowledged before the goodbye.
		p.SeeBye()
		r.bye = true
		if err = ack.flush(); err == nil {
			err = t.reply(in, wire.MsgByeAck, h, abi.Success, nil, resp)
		}
	default:
		err = fmt.Errorf("protocol error: message type %d from rank %d", h.Typ, p.Rank())
	}
	return err
}

// orderMapped makes the signal sig of the put+signal h follow the peer's
// copies into our memory through a mapping: the one h names by its event
// (wire.StatusEvent), and any whose event one of our streams waits for
// that sig's application would not follow (ipc_events.go). It returns sig
// carrying that order, which its Apply keeps (in sequence order, with
// several lanes); a refused signal (sig invalid) still carries h's event,
// so that later signals follow that put's bytes. A header that names an
// event it may not is a protocol error.
func (t *Link) orderMapped(h *wire.Header, sig link.Signal) (link.Signal, error) {
	var evs link.Events
	if t.side != nil {
		evs = t.side.PeerEvents()
	}
	if h.Status&wire.StatusInbox != 0 && h.Status&(wire.StatusEvent|wire.StatusMark|link.StatusRing) == 0 {
		return t.orderInbox(h, sig, evs)
	}
	if h.Status&wire.StatusMark != 0 && h.Status&(wire.StatusEvent|link.StatusRing) == 0 {
		return t.orderMarked(h, sig, evs)
	}
	if h.Status&wire.StatusEvent == 0 {
		if evs != nil && sig.Word() && evs.PeerOpened() {
			sig.Evs = evs // an event waited for on a stream may be pending
		}
		return sig, nil
	}
	if evs != nil && h.Typ == wire.MsgPutSignal && h.Size == 0 {
		sig.Ev = evs.PeerEvent(int(h.Status & 0xff))
	}
	if sig.Ev == 0 {
		what := "a put+signal by an event it never shared"
		if h.Typ != wire.MsgPutSignal {
			what = "a put without signal by an event"
		}
		err := fmt.Errorf("protocol error: rank %d ordered %s (status %#x, %d bytes, seq %d)", t.p.Rank(), what, h.Status, h.Size, h.Seq)
		logx.Warn(abi.SubsysNet, "NET/wasm: %v; dropping its connections", err)
		return sig, err
	}
	sig.Evs = evs
	return sig, nil
}

// orderMarked makes the signal sig of the put+signal h follow the
// peer's device agent's copy into our memory, marked on the peer's mark
// page (wire.StatusMark: word in the status's low byte, number in off),
// and whatever a stream of ours waits for (orderMapped). A header that
// names a mark it may not is a protocol error.
func (t *Link) orderMarked(h *wire.Header, sig link.Signal, evs link.Events) (link.Signal, error) {
	var pm *staging.PeerMarks
	if evs != nil && h.Typ == wire.MsgPutSignal && h.Size == 0 {
		pm = evs.PeerMarks()
	}
	if k := int(h.Status & 0xff); pm == nil || k >= staging.MarkWords || h.Off == 0 {
		err := fmt.Errorf("protocol error: rank %d ordered a put+signal by a mark it may not name (status %#x, %d bytes, mark %d, seq %d)", t.p.Rank(), h.Status, h.Size, h.Off, h.Seq)
		logx.Warn(abi.SubsysNet, "NET/wasm: %v; dropping its connections", err)
		return sig, err
	}
	// The caller's thread may have looked at it first (markReached); a
	// trace takes the first look.
	profile.Mark(profile.PtRead)
	sig.Marks, sig.MarkK, sig.MarkV = pm, uint8(h.Status), h.Off
	if evs.PeerOpened() {
		sig.Evs = evs // an event waited for on a stream may be pending
	}
	return sig, nil
}

// orderInbox makes the put+signal h, whose signal the peer's agent had
// ours add through our peer inbox (wire.StatusInbox: row in the status's
// low byte, the entry's position + 1 in off), wait in sequence order until
// our agent took that entry, so that every signal applied after it
// follows its payload. A header that names a row the peer was not given,
// or that carries a payload or a signal of its own, is a protocol error.
func (t *Link) orderInbox(h *wire.Header, sig link.Signal, evs link.Events) (link.Signal, error) {
	row, pid := -1, 0
	if evs != nil {
		row, pid = evs.InboxRow()
	}
	if !inboxHeaderOK(h, row) {
		err := fmt.Errorf("protocol error: rank %d named an inbox entry it may not (status %#x, %d bytes, position %d, seq %d)", t.p.Rank(), h.Status, h.Size, h.Off, h.Seq)
		logx.Warn(abi.SubsysNet, "NET/wasm: %v; dropping its connections", err)
		return sig, err
	}
	sig.InboxRow, sig.InboxPos, sig.InboxPid = uint8(h.Status&0xff), h.Off, pid
	if evs.PeerOpened() {
		sig.Evs = evs // an event waited for on a stream may be pending
	}
	return sig, nil
}

// inboxHeaderOK reports whether h may name an entry of row, the row of
// our inbox its sender was given (-1: none): a put+signal without payload
// whose signal is marked applied, naming that row and a position (sent
// again after a lane failed, or not).
func inboxHeaderOK(h *wire.Header, row int) bool {
	return row >= 0 && inboxRowOK(int(h.Status&0xff), row) && h.Status&^(0xff|wire.StatusResent|wire.StatusFromMask) == wire.StatusInbox && h.Typ == wire.MsgPutSignal &&
		h.Size == 0 && h.SigOp&wire.SigApplied != 0 && h.Off != 0
}

// inboxRowOK reports whether a header's row r is the row of our inbox
// its sender was given, or that row's twin among our host rows.
func inboxRowOK(r, row int) bool {
	return r == row || (r == row+inbox.Rows && inbox.RowsInHost())
}

func (t *Link) servePut(ack *acker, br *bufio.Reader, h *wire.Header, resp []byte, dec *codec.Decoder, rx *staging.Receiver, held *staging.Held) error {
	p := t.p
	var heldPin link.Pin // the registration of a held payload, kept until its copy is queued
	status := abi.Success
	var t0 int64
	var dev bool
	if profile.On() {
		t0 = profile.Now()
		defer func() {
			if dev {
				profile.TargetDev.Since(t0)
			} else {
				profile.TargetHost.Since(t0)
			}
		}()
	}
	if h.Size > 0 {
		base, size, ctx, pin, ok := p.Mesh().Owner.Resolve(h.MrID)
		if !ok || !link.Span(h.Off, h.Size, size) {
			status = abi.InvalidArgument
		}
		dev = ctx != 0
		var err error
		switch cid := uint8(h.Status); {
		case h.Status&link.StatusRing != 0:
			// The payload is in the staging ring: emptied even when
			// the put is rejected, so the ring stays in step.
			if cid != guestabi.CodecNone {
				err = fmt.Errorf("protocol error: rank %d sent a compressed put through the staging ring", p.Rank())
				break
			}
			if err = rx.Drain(p.Rank(), ctx, unsafe.Add(base, h.Off), h.Size, status == abi.Success, p); err != nil {
				err = fmt.Errorf("receive put payload from rank %d through the staging ring: %w", p.Rank(), err)
			}
		case cid != guestabi.CodecNone:
			// Compressed (SPEC.md §8.10): decoded into the range only.
			var dst []byte
			if status == abi.Success && ctx == 0 {
				dst = unsafe.Slice((*byte)(unsafe.Add(base, h.Off)), h.Size)
			}
			var bad error
			if bad, err = t.readCompressed(br, cid, h.Size, dst, dec); err == nil && (bad != nil || (status == abi.Success && dst == nil)) {
				if bad == nil {
					bad = errors.New("compressed payload for device memory")
				}
				// Rate-limited: a peer sending nothing but bad frames
				// must not flood NCCL's log (each also fails its put).
				codecWarn.Warn(abi.SubsysNet, "NET/wasm: protocol error from rank %d: put of %d bytes at offset %d of registration %d rejected: %v",
					p.Rank(), h.Size, h.Off, h.MrID, bad)
				status = abi.RemoteError
			}
		case status != abi.Success:
			if _, err = br.Discard(int(h.Size)); err != nil {
				err = fmt.Errorf("receive put payload from rank %d: %w", p.Rank(), err)
			}
		case ctx != 0:
			land := staging.LandOnDevice
			if so, ok := p.Mesh().Owner.(link.StrongOwner); ok && so.StronglyOrdered(h.MrID) {
				land = staging.ReadToDevice
			} else if sh, ok := p.Mesh().Owner.(link.SharedOwner); ok && sh.Shared(h.MrID) {
				land = staging.ReadToDevice
			} else if fusable(p, h) {
				// Held for its signal, which lands it (staging.LandHeld).
				var ok bool
				if ok, err = staging.LandHeld(br, ctx, link.DevAddr(base, h.Off), h.Size, held); ok {
					if err != nil {
						err = fmt.Errorf("receive put payload from rank %d into device memory: %w", p.Rank(), err)
					} else {
						heldPin, pin = pin, link.Pin{}
					}
					break
				}
			}
			if err = land(br, ctx, link.DevAddr(base, h.Off), h.Size, p.Mesh().StageChunk); err != nil {
				err = fmt.Errorf("receive put payload from rank %d into device memory: %w", p.Rank(), err)
			}
		default:
			if _, err = io.ReadFull(br, unsafe.Slice((*byte)(unsafe.Add(base, h.Off)), h.Size)); err != nil {
				err = fmt.Errorf("receive put payload from rank %d: %w", p.Rank(), err)
			}
		}
		pin.Release() // the payload is in (or the stream is broken)
		if err != nil {
			return err
		}
	}
	var sig link.Signal
	var add uint64
	if h.Typ == wire.MsgPutSignal && status == abi.Success {
		sig, add, status = p.SignalTarget(h.SigMrID, h.SigOff, h.SigOp, h.SigValue)
	}
	sig, err := t.orderMapped(h, sig)
	if err != nil {
		sig.Pin.Release()
		return errors.Join(err, settleHeld(held, heldPin, p.Rank()))
	}
	if held.Pending() && sig.Word() {
		sig.Held = held
	}
	if err := p.Landed(h.Seq, sig, add); err != nil {
		return errors.Join(err, settleHeld(held, heldPin, p.Rank()))
	}
	if err := settleHeld(held, heldPin, p.Rank()); err != nil {
		return err
	}
	if status != abi.Success {
		ack.nacked()
		return t.reply(ack.in, wire.MsgNack, h, status, nil, resp)
	}
	return nil
}

// fusable reports whether the put+signal h may hold its device payload for
// its signal (staging.LandHeld): the signal is the target's to apply, and
// will be at once, on this thread, as every operation numbered before it
// has landed (or it is unnumbered); nothing else then waits for the held
// copy, which settleHeld queues at the latest.
func fusable(p link.Peer, h *wire.Header) bool {
	return staging.FusedLanding() && h.Typ == wire.MsgPutSignal && h.SigOp&wire.SigApplied == 0 &&
		(h.Seq == 0 || p.Order().Next() == h.Seq) // the orderer's lock, only where holding is on
}

// settleHeld queues what of a held payload its signal did not take, then
// lets its registration go: deregistration waits for queued copies only.
func settleHeld(held *staging.Held, pin link.Pin, rank int) error {
	err := held.Flush()
	pin.Release()
	if err != nil {
		return fmt.Errorf("land put payload from rank %d into device memory: %w", rank, err)
	}
	return nil
}

// piggyAck applies an acknowledgement the peer's lane carried for our
// outgoing lane h.mrID (wire.MsgAck). One for a lane that failed over
// meanwhile is void (lane.ackPuts).
func (t *Link) piggyAck(h *wire.Header) error {
	if int(h.MrID) >= len(t.lanes) {
		return fmt.Errorf("protocol error: rank %d acknowledged puts of lane %d, which does not exist", t.p.Rank(), h.MrID)
	}
	if !t.lanes[h.MrID].ackPuts(h.Seq) {
		return fmt.Errorf("protocol error: rank %d acknowledged %d puts on lane %d, more than it was sent", t.p.Rank(), h.Seq, h.MrID)
	}
	return nil
}

func (t *Link) serveGet(in *net.TCPConn, h *wire.Header, resp []byte) error {
	p := t.p
	base, size, ctx, pin, ok := p.Mesh().Owner.Resolve(h.MrID)
	defer pin.Release() // the bytes are on the socket when this returns
	if !ok || !link.Span(h.Off, h.Size, size) {
		return t.reply(in, wire.MsgGetResp, h, abi.InvalidArgument, nil, resp)
	}
	if ctx != 0 {
		// The reply header promises the bytes; a failing device copy after
		// it can only end the stream, which fails the get at the initiator.
		if err := t.reply(in, wire.MsgGetResp, h, abi.Success, nil, resp); err != nil {
			return err
		}
		if err := staging.WriteFromDevice(in, ctx, link.DevAddr(base, h.Off), h.Size, p.Mesh().StageChunk); err != nil {
			return fmt.Errorf("serve get from device memory to rank %d: %w", p.Rank(), err)
		}
		return nil
	}
	var data []byte
	if h.Size > 0 {
		data = unsafe.Slice((*byte)(unsafe.Add(base, h.Off)), h.Size)
	}
	return t.reply(in, wire.MsgGetResp, h, abi.Success, data, resp)
}

// codecWarn limits the WARN lines about bad compressed frames.
var codecWarn logx.Limited

// readCompressed reads a compressed payload of size raw bytes, block by
// block, decoding into dst (nil: discard). bad reports a block that did
// not decode (the put is rejected, the stream stays in step: the blocks
// after it are read and dropped); err a broken stream or framing.
func (t *Link) readCompressed(br *bufio.Reader, cid uint8, size uint64, dst []byte, dec *codec.Decoder) (bad, err error) {
	left, done := size, uint64(0)
	for left > 0 {
		if _, err := io.ReadFull(br, dec.Prefix[:]); err != nil {
			return bad, fmt.Errorf("receive compressed put from rank %d: %w", t.p.Rank(), err)
		}
		clen, rawLen := codec.GetPrefix(dec.Prefix[:])
		if err := codec.CheckFrame(clen, rawLen, left); err != nil {
			return bad, fmt.Errorf("protocol error from rank %d: %w", t.p.Rank(), err)
		}
		switch {
		case dst == nil || bad != nil:
			if _, err := br.Discard(int(clen)); err != nil {
				return bad, fmt.Errorf("receive compressed put from rank %d: %w", t.p.Rank(), err)
			}
		case clen == rawLen: // stored
			if _, err := io.ReadFull(br, dst[done:done+uint64(rawLen)]); err != nil {
				return bad, fmt.Errorf("receive put payload from rank %d: %w", t.p.Rank(), err)
			}
		default:
			dec.Take()
			if _, err := io.ReadFull(br, dec.Buf[:clen]); err != nil {
				return bad, fmt.Errorf("receive compressed put from rank %d: %w", t.p.Rank(), err)
			}
			bad = dec.Decode(cid, dst[done:done+uint64(rawLen)], dec.Buf[:clen])
		}
		left -= uint64(rawLen)
		done += uint64(rawLen)
	}
	dec.Release() // held for one put only: idle streams keep no buffer
	return bad, nil
}

// reply answers on an incoming lane, which only its service goroutine writes.
func (t *Link) reply(in *net.TCPConn, typ uint8, req *wire.Header, status abi.Result, data []byte, buf []byte) error {
	h := *req
	h.Typ = typ
	h.Status = uint16(status)
	h.Encode(buf[:wire.HeaderSize])
	var err error
	if len(data) <= smallResponse {
		n := copy(buf[wire.HeaderSize:], data)
		_, err = in.Write(buf[:wire.HeaderSize+n])
	} else if _, err = in.Write(buf[:wire.HeaderSize]); err == nil {
		_, err = in.Write(data)
	}
	if err != nil {
		return fmt.Errorf("reply to rank %d: %w", t.p.Rank(), err)
	}
	return nil
}

// attachRing answers the sender's offer: map the ring and say so in it, or
// refuse on the reply stream (the sender then uses the stream).
func (t *Link) attachRing(in *net.TCPConn, rx *staging.Receiver, h *wire.Header, resp []byte) error {
	p := t.p
	if rx.Attached() {
		return fmt.Errorf("protocol error: rank %d offered a second staging ring on one stream", p.Rank())
	}
	var err error
	if t.side == nil {
		err = errors.New("not an intra-node link")
	} else {
		err = t.side.AttachRing(rx, h)
	}
	if err != nil {
		logx.Info(abi.SubsysNet, "NET/wasm: refusing rank %d's intra-node staging ring (%v); its device payloads ride the TCP lanes", p.Rank(), err)
		return t.reply(in, wire.MsgRingNo, h, abi.InternalError, nil, resp)
	}
	return nil
}
