package dataplane

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
)

// service executes the peer's operations arriving on one incoming lane. It
// runs whether or not this process ever calls the plugin again.
func (t *tcpLink) service(in *net.TCPConn) {
	p := t.p
	defer p.m.wg.Done()
	br := bufio.NewReaderSize(in, readBufSize)
	var hb [hdrSize]byte
	var h header
	resp := make([]byte, hdrSize+smallResponse)
	bye := false
	for {
		if _, err := io.ReadFull(br, hb[:]); err != nil {
			if bye {
				// The lane ended in order. The peer's other lanes may
				// still carry operations: they end on their own, and
				// the replies stream notices when the peer is gone.
				return
			}
			p.markDead(fmt.Errorf("receive from rank %d: %w", p.rank, err))
			return
		}
		if bye {
			p.markDead(fmt.Errorf("protocol error: rank %d sent message type %d after its goodbye", p.rank, hb[0]))
			return
		}
		h.decode(hb[:])
		var err error
		switch h.typ {
		case MsgPut, MsgPutSignal:
			err = t.servePut(in, br, &h, resp)
		case MsgGet:
			err = t.serveGet(in, &h, resp)
		case MsgReg:
			p.m.owner.PeerRegistered(p.rank, h.mrID, h.size, h.off, h.status == 1)
		case msgBye:
			// Everything this lane carried before the goodbye has been
			// applied (signals included: a signal held for an earlier
			// sequence number of another lane is applied when that one
			// lands, and that lane's goodbye comes after it).
			p.peerBye.Store(true)
			bye = true
			err = t.reply(in, msgByeAck, &h, abi.Success, nil, resp)
		default:
			err = fmt.Errorf("protocol error: message type %d from rank %d", h.typ, p.rank)
		}
		if err != nil {
			p.markDead(err)
			return
		}
	}
}

// Span reports whether [off, off+n) lies inside a registration of size
// bytes, without overflowing. Initiator and target check with the same rule.
func Span(off, n, size uint64) bool { return off <= size && n <= size-off }

func (t *tcpLink) servePut(in *net.TCPConn, br *bufio.Reader, h *header, resp []byte) error {
	p := t.p
	status := abi.Success
	if h.size > 0 {
		base, size, ctx, ok := p.m.owner.Resolve(h.mrID)
		if !ok || !Span(h.off, h.size, size) {
			status = abi.InvalidArgument
		}
		switch {
		case status != abi.Success:
			if _, err := br.Discard(int(h.size)); err != nil {
				return fmt.Errorf("receive put payload from rank %d: %w", p.rank, err)
			}
		case ctx != 0:
			if err := readToDevice(br, ctx, devAddr(base, h.off), h.size); err != nil {
				return fmt.Errorf("receive put payload from rank %d into device memory: %w", p.rank, err)
			}
		default:
			if _, err := io.ReadFull(br, unsafe.Slice((*byte)(unsafe.Add(base, h.off)), h.size)); err != nil {
				return fmt.Errorf("receive put payload from rank %d: %w", p.rank, err)
			}
		}
	}
	var sig sigRef
	var add uint64
	if h.typ == MsgPutSignal && status == abi.Success {
		sig, add, status = p.signalTarget(h.sigMrID, h.sigOff, h.sigOp, h.sigValue)
	}
	p.landed(h.seq, sig, add)
	if status != abi.Success {
		return t.reply(in, msgNack, h, status, nil, resp)
	}
	return nil
}

func (t *tcpLink) serveGet(in *net.TCPConn, h *header, resp []byte) error {
	p := t.p
	base, size, ctx, ok := p.m.owner.Resolve(h.mrID)
	if !ok || !Span(h.off, h.size, size) {
		return t.reply(in, msgGetResp, h, abi.InvalidArgument, nil, resp)
	}
	if ctx != 0 {
		// The reply header promises the bytes; a failing device copy after
		// it can only end the stream, which fails the get at the initiator.
		if err := t.reply(in, msgGetResp, h, abi.Success, nil, resp); err != nil {
			return err
		}
		if err := writeFromDevice(in, ctx, devAddr(base, h.off), h.size); err != nil {
			return fmt.Errorf("serve get from device memory to rank %d: %w", p.rank, err)
		}
		return nil
	}
	var data []byte
	if h.size > 0 {
		data = unsafe.Slice((*byte)(unsafe.Add(base, h.off)), h.size)
	}
	return t.reply(in, msgGetResp, h, abi.Success, data, resp)
}

// reply answers on an incoming lane, which only its service goroutine writes.
func (t *tcpLink) reply(in *net.TCPConn, typ uint8, req *header, status abi.Result, data []byte, buf []byte) error {
	h := *req
	h.typ = typ
	h.status = uint16(status)
	h.encode(buf[:hdrSize])
	var err error
	if len(data) <= smallResponse {
		n := copy(buf[hdrSize:], data)
		_, err = in.Write(buf[:hdrSize+n])
	} else if _, err = in.Write(buf[:hdrSize]); err == nil {
		_, err = in.Write(data)
	}
	if err != nil {
		return fmt.Errorf("reply to rank %d: %w", t.p.rank, err)
	}
	return nil
}
