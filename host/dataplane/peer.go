package dataplane

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
)

const (
	batchMax = 256 // ops written per writev
	// readBufSize is the receive buffer of both readers. It coalesces many
	// small messages per read, while a large payload is read straight into
	// registered memory except for what the buffer already holds, so it is
	// kept small: those bytes take an extra copy.
	readBufSize   = 16 << 10
	byeWait       = 250 * time.Millisecond
	smallResponse = 4096 // get responses up to this size leave in one write
	// inlineMax is the most payload a caller writes on its own thread when
	// the stream is idle; larger work goes to the writer goroutine so that
	// a big put never holds NCCL's progress thread.
	inlineMax = 64 << 10
	// intraInlineMax is the same bound for a peer on the intra-node path,
	// where sending is a memory copy like any other the caller makes; the
	// caller spinning in test() does it itself instead of waiting for a
	// second thread, which matters when cores are few.
	intraInlineMax = 4 << 20
	// intraMin is the smallest payload worth a process_vm_writev of its own;
	// smaller puts ride the coalesced TCP stream, which is cheaper per op.
	intraMin = 16 << 10
	// sendDelay bounds how long a small operation waits in the queue for
	// the caller's next test() before the writer goroutine sends it anyway.
	sendDelay = 200 * time.Microsecond
)

// getEntry is an outstanding get; replies arrive in request order.
type getEntry struct {
	tag  uint64
	dst  unsafe.Pointer
	size uint64
}

// peer is one rank's pair of streams: out carries our requests and their
// replies, in carries the peer's requests to our memory and our replies.
type peer struct {
	m    *Mesh
	rank int
	out  *net.TCPConn
	in   *net.TCPConn

	mu       sync.Mutex // guards the queue and writing
	writing  bool       // someone owns the stream and the batch buffers
	q        []Op
	qHead    int
	qLen     int
	wake     chan struct{}
	timer    *time.Timer // fires the writer for ops nobody tests
	armed    atomic.Bool
	quit     chan struct{}
	byeSent  chan struct{}
	intra    atomic.Bool // the single-copy path is usable for this peer
	pid      int
	liov     [1]unix.Iovec
	riov     [1]unix.RemoteIovec
	dead     atomic.Bool
	peerBye  atomic.Bool
	closing  atomic.Bool
	deadOnce sync.Once

	// writer goroutine state
	batch []Op
	hdrs  []byte
	iov   [][]byte
	bufs  net.Buffers

	gmu   sync.Mutex // guards the outstanding-get FIFO
	gets  []getEntry
	gHead int
	gLen  int
}

func newPeer(m *Mesh, rank int, out, in *net.TCPConn) *peer {
	return &peer{
		m: m, rank: rank, out: out, in: in,
		q:       make([]Op, 1024),
		wake:    make(chan struct{}, 1),
		quit:    make(chan struct{}),
		byeSent: make(chan struct{}),
		batch:   make([]Op, batchMax),
		hdrs:    make([]byte, batchMax*hdrSize),
		iov:     make([][]byte, 0, 2*batchMax),
		gets:    make([]getEntry, 256),
	}
}

func (p *peer) start() {
	p.timer = time.AfterFunc(time.Hour, func() {
		p.armed.Store(false)
		p.kick()
	})
	p.timer.Stop()
	p.m.wg.Add(3)
	go p.writer()
	go p.replies()
	go p.service()
}

// post appends op to the queue, growing it rather than failing.
func (p *peer) post(op *Op, hold bool) {
	p.mu.Lock()
	if p.dead.Load() {
		p.mu.Unlock()
		p.fail(op)
		return
	}
	if p.qLen == len(p.q) {
		p.growQueue()
	}
	p.q[(p.qHead+p.qLen)%len(p.q)] = *op
	p.qLen++
	p.mu.Unlock()
	switch {
	case hold:
	case op.Size > p.inlineLimit() || op.Kind == OpReg || op.Kind == msgBye:
		// Big payloads are sent by the writer goroutine, never the caller;
		// control messages go at once, nobody tests them.
		p.kick()
	case !p.armed.Swap(true):
		// Small: the caller's next test() sends it with everything else
		// queued by then, in one writev; the timer covers callers that
		// post and never test.
		p.timer.Reset(sendDelay)
	}
}

// inlineLimit is the largest operation the caller's thread sends itself.
func (p *peer) inlineLimit() uint64 {
	if p.intra.Load() {
		return intraInlineMax
	}
	return inlineMax
}

// flush writes what is queued on the caller's thread when the stream is
// idle and the work is small. test() calls it: a hand-off to the writer
// goroutine costs a scheduler wake-up, which from a foreign C thread can take
// a hundred microseconds on a busy machine, while a caller that posts a burst
// and then tests gets the whole burst in one writev. The send timer, armed
// at post time, remains the guarantee that nothing waits for a test.
func (p *peer) flush() {
	limit := p.inlineLimit()
	p.mu.Lock()
	if p.writing || p.qLen == 0 || p.q[p.qHead].Size > limit || p.dead.Load() {
		p.mu.Unlock()
		return
	}
	p.writing = true
	n := p.takeLocked(limit)
	p.mu.Unlock()
	ok := p.writeBatch(p.batch[:n])
	p.mu.Lock()
	p.writing = false
	more := p.qLen > 0
	p.mu.Unlock()
	if ok && more {
		p.kick()
	}
}

// growQueue doubles the ring; called with p.mu held. Growth is the only
// allocation on the posting path and stops once the ring fits the workload.
func (p *peer) growQueue() {
	nq := make([]Op, 2*len(p.q))
	for i := 0; i < p.qLen; i++ {
		nq[i] = p.q[(p.qHead+i)%len(p.q)]
	}
	p.q, p.qHead = nq, 0
}

func (p *peer) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// fail completes op with an error without sending it.
func (p *peer) fail(op *Op) {
	// The sticky error is set before the request completes, so whoever sees
	// the failed request also sees queryLastError report it.
	if !p.closing.Load() && op.Kind != msgBye {
		p.m.owner.PeerFailed(p.rank, fmt.Errorf("%w: operation to rank %d failed", ErrPeerGone, p.rank))
	}
	if op.Kind != OpReg && op.Tag != 0 {
		p.m.owner.Complete(op.Tag, abi.RemoteError)
	}
}

// takeLocked moves queued ops into the batch, at most len(p.batch) of them
// and, past the first, no more than maxPayload bytes of payload. The caller
// holds p.mu and owns the stream.
func (p *peer) takeLocked(maxPayload uint64) int {
	n, bytes := 0, uint64(0)
	for n < len(p.batch) && p.qLen > 0 {
		op := &p.q[p.qHead]
		if n > 0 && bytes+op.Size > maxPayload {
			break
		}
		bytes += op.Size
		p.batch[n] = *op
		*op = Op{}
		p.qHead = (p.qHead + 1) % len(p.q)
		p.qLen--
		n++
	}
	return n
}

func (p *peer) writer() {
	defer p.m.wg.Done()
	for {
		select {
		case <-p.wake:
		case <-p.quit:
			return
		}
		for {
			p.mu.Lock()
			if p.writing || p.qLen == 0 {
				// An inline writer owns the stream; it kicks us when it
				// leaves work behind.
				p.mu.Unlock()
				break
			}
			p.writing = true
			n := p.takeLocked(^uint64(0))
			p.mu.Unlock()
			ok := p.writeBatch(p.batch[:n])
			p.mu.Lock()
			p.writing = false
			p.mu.Unlock()
			if !ok {
				return
			}
		}
	}
}

// writeBatch sends headers and payloads with one writev, straight from the
// registered memory, then completes the puts: their source is reusable once
// the kernel has the bytes.
func (p *peer) writeBatch(ops []Op) bool {
	iov := p.iov[:0]
	bye := false
	for i := range ops {
		op := &ops[i]
		if op.Size >= intraMin && op.Remote != 0 && p.intra.Load() {
			switch {
			case op.Kind == OpPut && p.directPut(op):
				op.Kind = opDone // nothing to tell the target
				p.m.owner.Complete(op.Tag, abi.Success)
				continue
			case op.Kind == OpPutSignal && p.directPut(op):
				op.Size = 0 // the payload is there; send the signal alone
			case op.Kind == OpGet && p.directGet(op):
				op.Kind = opDone
				p.m.owner.Complete(op.Tag, abi.Success)
				continue
			}
		}
		h := header{typ: op.Kind, sigOp: op.SigOp, mrID: op.MrID, tag: op.Tag, off: op.Off,
			size: op.Size, sigMrID: op.SigMrID, context: op.Context, sigOff: op.SigOff, sigValue: op.SigValue}
		hb := p.hdrs[i*hdrSize : (i+1)*hdrSize]
		h.encode(hb)
		iov = append(iov, hb)
		switch op.Kind {
		case OpPut, OpPutSignal:
			if op.Size > 0 {
				iov = append(iov, unsafe.Slice((*byte)(op.Local), op.Size))
			}
		case OpGet:
			p.pushGet(getEntry{tag: op.Tag, dst: op.Local, size: op.Size})
		case msgBye:
			bye = true
		}
	}
	var err error
	if len(iov) > 0 {
		p.bufs = iov
		_, err = p.bufs.WriteTo(p.out)
		p.bufs = nil
	}
	clear(iov)
	if err != nil {
		for i := range ops {
			if ops[i].Kind == OpPut || ops[i].Kind == OpPutSignal {
				p.fail(&ops[i])
			}
		}
		p.markDead(fmt.Errorf("send to rank %d: %w", p.rank, err))
		return false
	}
	for i := range ops {
		if ops[i].Kind == OpPut || ops[i].Kind == OpPutSignal {
			p.m.owner.Complete(ops[i].Tag, abi.Success)
		}
	}
	if bye {
		close(p.byeSent)
	}
	return true
}

func (p *peer) pushGet(e getEntry) {
	p.gmu.Lock()
	if p.gLen == len(p.gets) {
		ng := make([]getEntry, 2*len(p.gets))
		for i := 0; i < p.gLen; i++ {
			ng[i] = p.gets[(p.gHead+i)%len(p.gets)]
		}
		p.gets, p.gHead = ng, 0
	}
	p.gets[(p.gHead+p.gLen)%len(p.gets)] = e
	p.gLen++
	p.gmu.Unlock()
}

func (p *peer) popGet() (getEntry, bool) {
	p.gmu.Lock()
	defer p.gmu.Unlock()
	if p.gLen == 0 {
		return getEntry{}, false
	}
	e := p.gets[p.gHead]
	p.gHead = (p.gHead + 1) % len(p.gets)
	p.gLen--
	return e, true
}

// replies reads what the peer sends back on our outgoing stream: get data,
// written straight into the destination registration, and rejections.
func (p *peer) replies() {
	defer p.m.wg.Done()
	br := bufio.NewReaderSize(p.out, readBufSize)
	var hb [hdrSize]byte
	var h header
	for {
		if _, err := io.ReadFull(br, hb[:]); err != nil {
			p.markDead(fmt.Errorf("receive from rank %d: %w", p.rank, err))
			return
		}
		h.decode(hb[:])
		switch h.typ {
		case msgGetResp:
			e, ok := p.popGet()
			if !ok || e.tag != h.tag || (h.status == 0 && e.size != h.size) {
				p.markDead(fmt.Errorf("rank %d answered a get we did not ask for (tag %#x)", p.rank, h.tag))
				return
			}
			if h.status != 0 {
				p.m.owner.PeerFailed(p.rank, fmt.Errorf("rank %d rejected a get of %d bytes at offset %d of registration %d: %v",
					p.rank, e.size, h.off, h.mrID, abi.Result(h.status)))
				p.m.owner.Complete(e.tag, abi.Result(h.status))
				continue
			}
			if e.size > 0 {
				if _, err := io.ReadFull(br, unsafe.Slice((*byte)(e.dst), e.size)); err != nil {
					p.markDead(fmt.Errorf("receive get data from rank %d: %w", p.rank, err))
					p.m.owner.Complete(e.tag, abi.RemoteError)
					return
				}
			}
			p.m.owner.Complete(e.tag, abi.Success)
		case msgNack:
			p.m.owner.PeerFailed(p.rank, fmt.Errorf("rank %d rejected a put of %d bytes at offset %d of registration %d (signal registration %d offset %d): %v",
				p.rank, h.size, h.off, h.mrID, h.sigMrID, h.sigOff, abi.Result(h.status)))
		default:
			p.markDead(fmt.Errorf("protocol error: message type %d from rank %d", h.typ, p.rank))
			return
		}
	}
}

// service executes the peer's operations on our memory. It runs whether or
// not this process ever calls the plugin again.
func (p *peer) service() {
	defer p.m.wg.Done()
	br := bufio.NewReaderSize(p.in, readBufSize)
	var hb [hdrSize]byte
	var h header
	resp := make([]byte, hdrSize+smallResponse)
	for {
		if _, err := io.ReadFull(br, hb[:]); err != nil {
			p.markDead(fmt.Errorf("receive from rank %d: %w", p.rank, err))
			return
		}
		h.decode(hb[:])
		var err error
		switch h.typ {
		case msgPut, msgPutSig:
			err = p.servePut(br, &h, resp)
		case msgGet:
			err = p.serveGet(&h, resp)
		case msgReg:
			p.m.owner.PeerRegistered(p.rank, h.mrID, h.size, h.off)
		case msgBye:
			p.peerBye.Store(true)
		default:
			err = fmt.Errorf("protocol error: message type %d from rank %d", h.typ, p.rank)
		}
		if err != nil {
			p.markDead(err)
			return
		}
	}
}

// span checks that [off, off+n) lies inside a registration of size bytes.
func span(off, n, size uint64) bool { return off <= size && n <= size-off }

func (p *peer) servePut(br *bufio.Reader, h *header, resp []byte) error {
	status := abi.Success
	if h.size > 0 {
		base, size, ok := p.m.owner.Resolve(h.mrID)
		switch {
		case !ok:
			status = abi.InvalidArgument
		case !span(h.off, h.size, size):
			status = abi.InvalidArgument
		}
		if status == abi.Success {
			if _, err := io.ReadFull(br, unsafe.Slice((*byte)(unsafe.Add(base, h.off)), h.size)); err != nil {
				return fmt.Errorf("receive put payload from rank %d: %w", p.rank, err)
			}
		} else if _, err := br.Discard(int(h.size)); err != nil {
			return fmt.Errorf("receive put payload from rank %d: %w", p.rank, err)
		}
	}
	if h.typ == msgPutSig && status == abi.Success {
		status = p.applySignal(h)
	}
	if status != abi.Success {
		return p.reply(msgNack, h, status, nil, resp)
	}
	return nil
}

// applySignal adds to the 64-bit signal word after the payload has landed.
func (p *peer) applySignal(h *header) abi.Result {
	base, size, ok := p.m.owner.Resolve(h.sigMrID)
	if !ok || !span(h.sigOff, 8, size) {
		return abi.InvalidArgument
	}
	addr := unsafe.Add(base, h.sigOff)
	if uintptr(addr)%8 != 0 {
		return abi.InvalidArgument
	}
	var v uint64
	switch h.sigOp {
	case abi.SignalOpInc:
		v = 1
	case abi.SignalOpAdd:
		v = h.sigValue
	default:
		return abi.InvalidArgument
	}
	atomic.AddUint64((*uint64)(addr), v)
	return abi.Success
}

func (p *peer) serveGet(h *header, resp []byte) error {
	base, size, ok := p.m.owner.Resolve(h.mrID)
	if !ok || !span(h.off, h.size, size) {
		return p.reply(msgGetResp, h, abi.InvalidArgument, nil, resp)
	}
	var data []byte
	if h.size > 0 {
		data = unsafe.Slice((*byte)(unsafe.Add(base, h.off)), h.size)
	}
	return p.reply(msgGetResp, h, abi.Success, data, resp)
}

// reply answers on the incoming stream, which only the service writes.
func (p *peer) reply(typ uint8, req *header, status abi.Result, data []byte, buf []byte) error {
	h := *req
	h.typ = typ
	h.status = uint16(status)
	h.encode(buf[:hdrSize])
	var err error
	if len(data) <= smallResponse {
		n := copy(buf[hdrSize:], data)
		_, err = p.in.Write(buf[:hdrSize+n])
	} else if _, err = p.in.Write(buf[:hdrSize]); err == nil {
		_, err = p.in.Write(data)
	}
	if err != nil {
		return fmt.Errorf("reply to rank %d: %w", p.rank, err)
	}
	return nil
}

// markDead tears the streams down once, fails everything in flight, and
// reports the loss unless it was an orderly goodbye or our own close.
func (p *peer) markDead(err error) {
	p.deadOnce.Do(func() {
		p.mu.Lock()
		p.dead.Store(true)
		p.mu.Unlock()
		close(p.quit)
		p.out.Close()
		p.in.Close()
		for {
			p.mu.Lock()
			if p.qLen == 0 {
				p.mu.Unlock()
				break
			}
			op := p.q[p.qHead]
			p.q[p.qHead] = Op{}
			p.qHead = (p.qHead + 1) % len(p.q)
			p.qLen--
			p.mu.Unlock()
			p.fail(&op)
		}
		p.gmu.Lock()
		lost := p.gLen
		p.gmu.Unlock()
		if !p.closing.Load() && (!p.peerBye.Load() || lost > 0) {
			p.m.owner.PeerFailed(p.rank, fmt.Errorf("%w: %v", ErrPeerGone, err))
		}
		for {
			e, ok := p.popGet()
			if !ok {
				break
			}
			p.m.owner.Complete(e.tag, abi.RemoteError)
		}
	})
}

// close sends a goodbye, gives it a moment to leave, and drops the streams.
func (p *peer) close() error {
	p.closing.Store(true)
	if !p.dead.Load() {
		p.post(&Op{Kind: msgBye}, false)
		select {
		case <-p.byeSent:
		case <-p.quit:
		case <-time.After(byeWait):
		}
	}
	p.markDead(nil)
	p.timer.Stop()
	return nil
}
