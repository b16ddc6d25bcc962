package tcp

import (
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/codec"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/handoff"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp/putack"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/ring"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

const (
	batchMax = 256 // ops written per writev
	// readBufSize is the receive buffer of every reader. It coalesces many
	// small messages per read, while a large payload is read straight into
	// registered memory except for what the buffer already holds, so it is
	// kept small: those bytes take an extra copy.
	readBufSize   = 16 << 10
	smallResponse = 4096 // get responses up to this size leave in one write
	// inlineMax is the most payload a caller writes on its own thread when
	// the stream is idle; larger work goes to the writer goroutine so that
	// a big put never holds NCCL's progress thread.
	inlineMax = 64 << 10
)

// sendDelay bounds how long a small or held operation waits in the queue
// for the caller's next test() before the writer goroutine sends it
// anyway. A variable so that tests can count batches without it.
var sendDelay = newDelay(200 * time.Microsecond)

// holdDelay is that bound for a queue of nothing but operations held by
// the aggregation hint, whose caller said more follow and then tests:
// long, so that a stream of them keeps the timer nearly idle.
var holdDelay = newDelay(2 * time.Millisecond)

// delay is a duration that tests change while the timers of meshes of
// earlier tests may still read it.
type delay struct{ ns atomic.Int64 }

func newDelay(d time.Duration) *delay {
	v := &delay{}
	v.set(d)
	return v
}
func (d *delay) get() time.Duration  { return time.Duration(d.ns.Load()) }
func (d *delay) set(v time.Duration) { d.ns.Store(int64(v)) }

// Link is the TCP transport to one peer: our outgoing lanes (requests
// and the replies to them) and the peer's incoming streams (its requests to
// our memory, served by tcp_service.go, and our replies).
type Link struct {
	p     link.Peer
	lanes []*lane
	ins   []*net.TCPConn // nil for a lane the peer has not opened yet (inMu)
	inMu  sync.Mutex     // guards ins and fenced once the link started (addIn)
	// fenced has bit i set when a resent operation named incoming lane i
	// before it ever opened: it may not open any more (fence).
	fenced uint32
	// markWaits adapts the polling caller's wait for agent marks
	// (tcp_caller.go).
	markWaits markWaits
	// side moves large payloads beside the streams (the intra-node
	// transport installs itself); nil for plain TCP.
	side SidePath
	// onReg hears of the peer's registrations (the fabric rail in the
	// header's sigOp, id, address, the key in sigValue) before the owner
	// does; the fabric transport installs it.
	onReg func(rail uint8, id uint32, base, key uint64, dev, direct bool)
	// onAcked runs when a lane's puts were acknowledged, before their
	// requests complete: the fabric transport releases the number window
	// its staged puts hold (host/dataplane/ofi's dev.go).
	onAcked func()

	// Lane failover, target side (tcp_failover.go): inDone[i] is closed
	// when the service of incoming lane i returned, inDown has bit i set
	// when that stream ended without a goodbye, fences closes a lane's
	// stream once for the first resent operation that names it.
	inDone []chan struct{}
	inDown atomic.Uint32
	// acks[i] acknowledges the puts of incoming stream i (tcp_service.go).
	acks []*acker
	ride bool // acks ride our lanes' batches (set by start)
	// ackDeferred counts acker timers that found the stream held and
	// left their acks to its holder (tests, the stall report).
	ackDeferred atomic.Uint64
	fences      [abi.MaxLanes]sync.Once
	fixed       bool // no failover: a broken stream fails the peer
	// placedSaid: the INFO line about placed completions was logged.
	placedSaid atomic.Bool
}

// SidePath moves a payload beside the stream, which still carries the
// header (or nothing, see writeBatch) in order. put and get report false
// when they did not move it: the stream carries it then.
type SidePath interface {
	InlineMax() uint64
	// Ringable reports whether op's payload should move through the
	// shared staging ring (ring.go): device memory at either end.
	Ringable(op *link.Op) bool
	// PeerEvents are the interprocess events that order the peer's mapped
	// put+signals (ipc_events.go).
	PeerEvents() link.Events
	// AttachStream maps the shared-memory stream the peer offered on one
	// of its lanes (wire.MsgStream), or says why not; AttachRing maps the
	// staging ring it offered (wire.MsgRing) into rx.
	AttachStream(h *wire.Header) (ShmIn, error)
	AttachRing(rx *staging.Receiver, h *wire.Header) error
}

func NewLink(p link.Peer, outs, ins []*net.TCPConn) *Link {
	t := &Link{p: p, ins: ins}
	for i, c := range outs {
		t.lanes = append(t.lanes, newLane(t, i, c))
	}
	for _, in := range ins {
		t.acks = append(t.acks, &acker{in: in})
	}
	return t
}

// Peer is the peer the link moves operations to.
func (t *Link) Peer() link.Peer { return t.p }

// LaneCount is how many lanes the link has.
func (t *Link) LaneCount() int { return len(t.lanes) }

// SetSide makes s the link's side path (the intra-node transport) and
// gives each lane the side side(l) makes for it; before Start.
func (t *Link) SetSide(s SidePath, side func(l link.LaneIO) link.LaneSide) {
	t.side = s
	for _, l := range t.lanes {
		l.ix = side(l)
	}
}

// Hear makes the link tell onReg of the peer's registrations (their
// rail, id, address, key, and whether device memory reached directly)
// and onAcked when a lane's puts were acknowledged (libfabric beside the
// lanes); before Start.
func (t *Link) Hear(onReg func(rail uint8, id uint32, base, key uint64, dev, direct bool), onAcked func()) {
	t.onReg, t.onAcked = onReg, onAcked
}

// InlineMax is the largest operation a TCP link's caller sends itself.
const InlineMax = inlineMax

func (t *Link) Props() link.Props {
	return link.Props{Name: Name, DeviceMemory: true, InlineMax: t.inlineMax(), Lanes: len(t.lanes)}
}

// inlineMax is the largest operation the caller's thread sends itself.
func (t *Link) inlineMax() uint64 {
	if t.side != nil {
		return t.side.InlineMax()
	}
	return inlineMax
}

func (t *Link) Start() {
	// Acks ride whichever of our lanes to the peer writes next (each
	// names the stream it acknowledges), never beside a fabric endpoint
	// (its staged puts' window is reaped by whichever reader acks them,
	// one at a time). An ack of its own travels back on the stream it
	// acknowledges, read by the initiator's replies goroutine: a wake-up
	// per ack, which on two cores costs a small exchange some 20 µs a
	// hop. A lane that fails over may take counts with it: the next
	// carry repeats them whole (rehomeAcks), and the initiator voids
	// acks of a lane it moved.
	if t.onAcked == nil {
		t.ride = true
		lanes := &putack.Lanes{Delay: &ackDelay.ns, Bound: &ackBound.ns, Alone: t.sendAcksAlone, Adapt: t.p.Mesh().AckHoldAdapt}
		for _, l := range t.lanes {
			lanes.Batches = append(lanes.Batches, &l.batches)
		}
		for _, a := range t.acks {
			a.Ride(lanes)
		}
	}
	// The lanes start once their acks are attached and every lane's
	// timers exist: a lane whose stream ends at once stops the link,
	// which reads them all.
	for _, l := range t.lanes {
		l.timers()
	}
	for _, l := range t.lanes {
		if l.out != nil {
			l.run()
		}
	}
	t.inDone = make([]chan struct{}, len(t.ins))
	for i := range t.ins {
		t.inDone[i] = make(chan struct{})
	}
	t.inMu.Lock()
	defer t.inMu.Unlock()
	for i, in := range t.ins {
		if in != nil { // lanes beyond the first arrive when the peer uses them (addIn)
			t.p.Mesh().WG.Add(1)
			go t.service(i, in)
		}
	}
}

func (t *Link) Submit(lane int, op link.Op, hold bool) { t.lanes[lane].enqueue(&op, hold) }

// SubmitCaller is submit for an operation the caller posts itself
// through peer.route, holding no lock. A signal is what the peer waits for: a
// small put with signal (or a bare signal) posted without the aggregation
// hint to an idle lane, with nothing of the lane in flight (no put
// awaiting its ack, no get its reply) and nothing posted for loneGap, is
// written at once on the caller's thread instead of at its next test() or
// rmaProgress. That is what a latency-bound exchange (a ping-pong) posts,
// and on few cores NCCL's proxy reaches its next rmaProgress only after a
// sched_yield that may give the core away. Streams keep their batches:
// plain puts always wait for the caller's next call, and a signal posted
// close behind other work, or while puts are in flight, queues behind it
// and leaves with it. Not over a side path (intra-node), whose writer
// copies payloads itself, unless the lane writes a shared-memory stream
// (stream.go): a lone signal is small, and its write there is a copy.
// With several lanes the caller numbers the op under its peer's lock and
// writes it (WriteLone) after letting go of the lock.
func (t *Link) SubmitCaller(lane int, op link.Op, hold bool) bool {
	l := t.lanes[lane]
	return l.enqueue(&op, hold) && (t.side == nil || l.ix.StreamLive())
}

func (t *Link) WriteLone(lane int) {
	if l := t.lanes[lane]; l.pendingPuts() == 0 && l.pendingGets() == 0 {
		l.flush()
	}
}

func (t *Link) Flush() { t.flushPoll(false) }

// Turn is flush for rmaProgress, which looks at the incoming sockets
// on every call: one Turn of a caller's loop calls it once (pollGap).
func (t *Link) Turn() { t.flushPoll(true) }

func (t *Link) flushPoll(progress bool) {
	// A lane with work queued (a reply the caller posted since its last
	// call, which the peer waits for) writes it first: a look at an empty
	// socket before it would hold it back by a system call. The others
	// come after the look, as before.
	var early uint32
	for i, l := range t.lanes {
		if l.queued() {
			l.flush()
			early |= 1 << i
		}
	}
	// What arrived: acks it carries and signals it applies may be what
	// the caller waits for, and the acks owed leave with the batch.
	for _, a := range t.acks {
		if r := a.rd.Load(); r != nil && r.TakeTurn(progress) {
			r.serveTurn(progress)
		}
	}
	for i, l := range t.lanes {
		if early&(1<<i) == 0 {
			l.flush()
		}
	}
}

func (t *Link) Kick() {
	for _, l := range t.lanes {
		l.kick()
	}
}

func (t *Link) Idle() bool {
	for _, l := range t.lanes {
		l.mu.Lock()
		busy := l.writing || l.q.Len() > 0
		l.mu.Unlock()
		if busy || l.pendingGets() > 0 || l.pendingPuts() > 0 {
			return false
		}
	}
	return true
}

func (t *Link) Stop() {
	for _, l := range t.lanes {
		l.mu.Lock()
	}
	t.p.RaiseDead()
	outs := make([]*net.TCPConn, len(t.lanes)) // teardown: allocating is fine
	for i, l := range t.lanes {
		outs[i] = l.out
		l.mu.Unlock()
	}
	for i, l := range t.lanes {
		if outs[i] != nil {
			outs[i].Close()
		}
		l.timer.Stop()
		l.due.Stop()
	}
	for _, a := range t.acks {
		a.Stop()
	}
	t.inMu.Lock()
	for _, in := range t.ins {
		if in != nil {
			in.Close()
		}
	}
	t.inMu.Unlock()
}

func (t *Link) Awaiting() int {
	n := 0
	for _, l := range t.lanes {
		n += l.pendingGets() + l.pendingPuts()
	}
	return n
}

func (t *Link) FailAll() {
	for _, l := range t.lanes {
		l.drainFailed()
		for {
			e, ok := l.popGet()
			if !ok {
				break
			}
			t.p.Mesh().Owner.Complete(e.tag, abi.RemoteError)
		}
		l.failPuts()
	}
}

// getEntry is an outstanding get; replies arrive in request order.
type getEntry struct {
	tag  uint64
	dst  unsafe.Pointer
	size uint64
	ctx  uintptr // non-zero: dst is device memory
	op   link.Op // the request as written, for a resend (lanes > 1)
}

// lane is one outgoing stream to a peer: a queue, the goroutine that writes
// it, and the goroutine that reads the peer's replies on the same socket.
type lane struct {
	p   link.Peer
	t   *Link
	idx int
	out *net.TCPConn // nil until the lane opens (lazy.go); set under mu
	// opening: the first op queued on an unopened lane started its dial.
	opening bool

	mu      sync.Mutex // guards the queue and writing
	writing bool       // someone owns the stream and the batch buffers
	q       ring.Ring[link.Op]
	qSince  int64 // Now() when the queue last became non-empty
	qUrgent bool  // it holds an op posted without the aggregation hint since
	wake    chan struct{}
	timer   *time.Timer // fires the writer for ops nobody tests
	armed   atomic.Bool
	work    atomic.Bool // ops may be queued (queued)
	long    atomic.Bool // the timer runs at holdDelay (only held ops queued)
	// due fires the writer when a paced op at the head of the queue
	// (Op.NotBefore) may leave.
	due *time.Timer
	// down: the lane failed and its work moved to the other lanes
	// (tcp_failover.go); enqueue forwards, nobody writes the stream again.
	// orphans are ops a failed write had taken from the queue but never
	// put on the stream.
	down    bool
	orphans []link.Op

	// owned by whoever holds writing
	batch  []link.Op
	hdrs   []byte
	iov    [][]byte
	bufs   net.Buffers
	ackHdr [abi.MaxLanes + 1][wire.HeaderSize]byte // piggybacked acks (wire.MsgAck), and an ask
	askAck atomic.Bool                             // the next batch asks the peer for its acks now (askAcks)
	askAt  atomic.Int64                            // when flush asks, if acks are still owed then (Now(); 0: no flush waits)
	asks   askPacer                                // how long a flush waits before it asks (askAfter, or none)
	enc    codec.Encoder                           // wire compression (host/codec)
	gather staging.Gather                          // small device payloads of the batch, copied asynchronously
	hand   handoff.Slot[handedBatch]               // a batch handed over with the stream (writeBatch, mayHand)
	ready  func() bool                             // gatherReady, bound once (a method value allocates)
	// WriteIov's raw writev: the stream's RawConn, the iovecs, the count
	// and the outcome (bound once so that a write allocates nothing)
	orc  syscall.RawConn
	wiov []unix.Iovec
	wcnt int
	wn   int
	werr syscall.Errno
	wvFn func(fd uintptr)

	gmu  sync.Mutex // guards the outstanding-get FIFO
	gets ring.Ring[getEntry]

	// Puts written on this stream whose arrival the target has not yet
	// acknowledged (wire.MsgPutAck), in stream order: their tags, and how many
	// puts the stream carried before the oldest of them.
	amu    sync.Mutex
	puts   ring.Ring[uint64]
	pAcked uint64
	// nputs mirrors puts.Len(), set under amu, read without it
	// (pendingPuts; placed completions' bound on the operations' path).
	nputs atomic.Int64
	moved bool // failed over: its puts went to another lane, and a late ack of them is void
	// The liveness backstop (backstop): since when the oldest put of the
	// FIFO has waited for an ack (Now(); 0: none waits), the slowest recent
	// wait (a decaying maximum: the round trip seen), and when the
	// backstop last asked (0: no ask outstanding).
	waitSince atomic.Int64
	ackWait   atomic.Int64
	bsAt      atomic.Int64
	bsN       atomic.Int32  // asks of the current wait (backstopAsks at most)
	bsAsks    atomic.Uint64 // asks the backstop sent
	bsRescued atomic.Uint64 // acks that came only after such an ask
	ptags     []uint64      // owned by whoever holds writing: puts not yet in the FIFO
	// later (owned by whoever holds writing) are the batch's ops whose
	// copies were gathered (SideGathered) and that complete once the
	// batch is written, by their index in it.
	later []int

	// ix is the lane's intra-node side (the staging ring and the
	// shared-memory stream, ring.go and stream.go); nil on a plain TCP
	// link.
	ix link.LaneSide

	// With several lanes (resend), every put and registration notice
	// written on the stream and not yet known to have been applied, as
	// written, in stream order, under amu: what a failover sends again.
	resend bool
	sent   ring.Ring[sentOp]
	pops   []link.Op // owned by whoever holds writing: parallel to ptags

	// batches counts the batches written and writes the writev calls
	// they took (tests count them; the ackers read batches: putack.Lanes).
	batches atomic.Uint64
	writes  atomic.Uint64
	carried atomic.Uint64 // acks of the peer's puts its batches carried (Mesh.Stats)
}

// sentOp is an entry of the resend ring: counts tells a put (counted by
// the target's acks) from a registration notice (not counted).
type sentOp struct {
	op     link.Op
	counts bool
}

func newLane(t *Link, idx int, out *net.TCPConn) *lane {
	l := &lane{p: t.p, t: t, idx: idx, out: out, wake: make(chan struct{}, 1)}
	l.ready = l.gatherReady
	if out != nil {
		t.p.Opened().Or(1 << idx)
	}
	l.resend = t.p.Lanes() > 1 && !t.p.Mesh().LocalCompletion
	if out == nil {
		// Not open yet (lazy.go): a small queue that grows, and the
		// buffers when it opens, so an unused lane costs little.
		l.q = ring.New[link.Op](16)
		return l
	}
	l.q = ring.New[link.Op](laneQueue)
	l.alloc()
	l.setOut(out)
	return l
}

// setOut binds WriteIov's raw writev to the lane's stream, once it is set.
func (l *lane) setOut(out *net.TCPConn) {
	if rc, err := out.SyscallConn(); err == nil {
		l.orc = rc
	}
}

// laneQueue is an open lane's initial queue (it grows on demand).
const laneQueue = 1024

// alloc gives the lane the buffers its writer and reply reader use;
// before the stream is set, so nobody uses them yet. The reply queues are
// set under their locks all the same: the watchdog reads their lengths
// (idle) while a lazy lane opens.
func (l *lane) alloc() {
	l.batch = make([]link.Op, batchMax)
	l.hdrs = make([]byte, batchMax*wire.HeaderSize)
	l.iov = make([][]byte, 0, 2*batchMax+len(l.ackHdr)) // + piggybacked acks
	l.wiov = make([]unix.Iovec, 2*batchMax+len(l.ackHdr))
	l.wvFn = l.writevFD
	gets := ring.New[getEntry](256)
	l.gmu.Lock()
	l.gets = gets
	l.gmu.Unlock()
	puts := ring.New[uint64](1024)
	l.amu.Lock()
	l.puts = puts
	if l.resend {
		l.sent = ring.New[sentOp](256)
		l.pops = make([]link.Op, 0, batchMax)
	}
	l.amu.Unlock()
	l.ptags = make([]uint64, 0, batchMax)
	l.later = make([]int, 0, batchMax)
}

// timers creates the lane's send and pacing timers, stopped.
func (l *lane) timers() {
	l.timer = time.AfterFunc(time.Hour, l.sendTimer)
	l.timer.Stop()
	l.due = time.AfterFunc(time.Hour, l.kick)
	l.due.Stop()
}

// run starts the lane's writer and reply reader on its open stream.
func (l *lane) run() {
	l.p.Mesh().WG.Add(2)
	go l.writer()
	go l.replies()
}

// WholeOp: TCP lanes are independent streams, so cutting pays off.
func (t *Link) WholeOp(link.Op) bool { return false }

// SignalApart: on TCP a signal rides its put's header.
func (t *Link) SignalApart(link.Op) bool { return false }

// Release frees the lanes' staging rings and shared-memory streams
// (intra-node links have them).
func (t *Link) Release() {
	for _, l := range t.lanes {
		if l.ix != nil {
			l.ix.Release()
		}
	}
}
