package dataplane

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"sync"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
)

// service executes the peer's operations arriving on one incoming lane. It
// runs whether or not this process ever calls the plugin again.
func (p *peer) service(in *net.TCPConn) {
	defer p.m.wg.Done()
	br := bufio.NewReaderSize(in, readBufSize)
	var hb [hdrSize]byte
	var h header
	resp := make([]byte, hdrSize+smallResponse)
	var stage []byte // for device memory, allocated on first use
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
			err = p.servePut(in, br, &h, resp, &stage)
		case MsgGet:
			err = p.serveGet(in, &h, resp, &stage)
		case MsgReg:
			p.m.owner.PeerRegistered(p.rank, h.mrID, h.size, h.off, h.status == 1)
		case msgBye:
			// Everything this lane carried before the goodbye has been
			// applied (signals included: a signal held for an earlier
			// sequence number of another lane is applied when that one
			// lands, and that lane's goodbye comes after it).
			p.peerBye.Store(true)
			bye = true
			err = p.reply(in, msgByeAck, &h, abi.Success, nil, resp)
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

// stageBuf returns the goroutine's staging buffer for device memory.
func stageBuf(stage *[]byte) []byte {
	if *stage == nil {
		*stage = make([]byte, stageChunk)
	}
	return *stage
}

func (p *peer) servePut(in *net.TCPConn, br *bufio.Reader, h *header, resp []byte, stage *[]byte) error {
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
			if err := readToDevice(br, ctx, devAddr(base, h.off), h.size, stageBuf(stage)); err != nil {
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
		sig, add, status = p.signalTarget(h)
	}
	switch {
	case h.seq == 0: // one lane: stream order is the order
		if sig.valid() {
			if err := sig.apply(add); err != nil {
				p.m.owner.PeerFailed(p.rank, fmt.Errorf("signal from rank %d: %w", p.rank, err))
			}
		}
	default:
		p.order.done(h.seq, sig, add)
	}
	if status != abi.Success {
		return p.reply(in, msgNack, h, status, nil, resp)
	}
	return nil
}

// signalTarget resolves and checks the 64-bit signal word and the amount to
// add to it.
func (p *peer) signalTarget(h *header) (sigRef, uint64, abi.Result) {
	base, size, ctx, ok := p.m.owner.Resolve(h.sigMrID)
	if !ok || !Span(h.sigOff, 8, size) || (uintptr(base)+uintptr(h.sigOff))%8 != 0 {
		return sigRef{}, 0, abi.InvalidArgument
	}
	var ref sigRef
	if ctx != 0 {
		ref = sigRef{dev: devAddr(base, h.sigOff), ctx: ctx}
	} else {
		ref = sigRef{host: (*uint64)(unsafe.Add(base, h.sigOff))}
	}
	switch h.sigOp {
	case abi.SignalOpInc:
		return ref, 1, abi.Success
	case abi.SignalOpAdd:
		return ref, h.sigValue, abi.Success
	}
	return sigRef{}, 0, abi.InvalidArgument
}

func (p *peer) serveGet(in *net.TCPConn, h *header, resp []byte, stage *[]byte) error {
	base, size, ctx, ok := p.m.owner.Resolve(h.mrID)
	if !ok || !Span(h.off, h.size, size) {
		return p.reply(in, msgGetResp, h, abi.InvalidArgument, nil, resp)
	}
	if ctx != 0 {
		// The reply header promises the bytes; a failing device copy after
		// it can only end the stream, which fails the get at the initiator.
		if err := p.reply(in, msgGetResp, h, abi.Success, nil, resp); err != nil {
			return err
		}
		if err := writeFromDevice(in, ctx, devAddr(base, h.off), h.size, stageBuf(stage)); err != nil {
			return fmt.Errorf("serve get from device memory to rank %d: %w", p.rank, err)
		}
		return nil
	}
	var data []byte
	if h.size > 0 {
		data = unsafe.Slice((*byte)(unsafe.Add(base, h.off)), h.size)
	}
	return p.reply(in, msgGetResp, h, abi.Success, data, resp)
}

// reply answers on an incoming lane, which only its service goroutine writes.
func (p *peer) reply(in *net.TCPConn, typ uint8, req *header, status abi.Result, data []byte, buf []byte) error {
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
		return fmt.Errorf("reply to rank %d: %w", p.rank, err)
	}
	return nil
}

// orderer applies a peer's signals in sequence order when its operations
// arrive over several lanes: a signal becomes visible only after every put
// with a smaller sequence number has landed, which keeps signals strong.
// Sequence numbers start at 1; puts and signals each take one.
type orderer struct {
	onErr func(error) // reports a signal that could not be applied
	mu    sync.Mutex
	next  uint64 // every sequence number below next has been applied
	ring  []orderSlot
}

type orderSlot struct {
	state uint8 // 0 not yet, 1 landed, 2 signal waiting
	sig   sigRef
	add   uint64
}

// done records that seq landed; sig, when valid, is the signal word that
// seq adds add to once everything before it has landed.
func (o *orderer) done(seq uint64, sig sigRef, add uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.next == 0 {
		o.next = 1
	}
	if seq < o.next {
		return // a duplicate cannot happen on a healthy stream; ignore it
	}
	for seq-o.next >= uint64(len(o.ring)) {
		o.grow()
	}
	s := &o.ring[seq%uint64(len(o.ring))]
	s.state, s.sig, s.add = 1, sig, add
	if sig.valid() {
		s.state = 2
	}
	for {
		s := &o.ring[o.next%uint64(len(o.ring))]
		if s.state == 0 {
			return
		}
		if s.state == 2 {
			if err := s.sig.apply(s.add); err != nil && o.onErr != nil {
				o.onErr(err)
			}
		}
		*s = orderSlot{}
		o.next++
	}
}

// grow doubles the window of sequence numbers that may land out of order.
func (o *orderer) grow() {
	n := max(2*len(o.ring), 1024)
	nr := make([]orderSlot, n)
	for i, s := range o.ring {
		if s.state != 0 {
			// slot i held the sequence number congruent to i within the
			// current window [next, next+len)
			seq := o.next + (uint64(i)-o.next%uint64(len(o.ring))+uint64(len(o.ring)))%uint64(len(o.ring))
			nr[seq%uint64(n)] = s
		}
	}
	o.ring = nr
}
