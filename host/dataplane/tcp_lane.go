package dataplane

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/codec"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/profile"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/ring"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/shmstream"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/spin"
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

// tcpLink is the TCP transport to one peer: our outgoing lanes (requests
// and the replies to them) and the peer's incoming streams (its requests to
// our memory, served by tcp_service.go, and our replies).
type tcpLink struct {
	p     *peer
	lanes []*lane
	ins   []*net.TCPConn // nil for a lane the peer has not opened yet (inMu)
	inMu  sync.Mutex     // guards ins and fenced once the link started (addIn)
	// fenced has bit i set when a resent operation named incoming lane i
	// before it ever opened: it may not open any more (fence).
	fenced uint32
	// side moves large payloads beside the streams (the intra-node
	// transport installs itself); nil for plain TCP.
	side sidePath
	// onReg hears of the peer's registrations (the fabric rail in the
	// header's sigOp, id, address, the key in sigValue) before the owner
	// does; the fabric transport installs it.
	onReg func(rail uint8, id uint32, base, key uint64, dev, direct bool)
	// onAcked runs when a lane's puts were acknowledged, before their
	// requests complete: the fabric transport releases the number window
	// its staged puts hold (fabric_dev.go).
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
}

// sidePath moves a payload beside the stream, which still carries the
// header (or nothing, see writeBatch) in order. put and get report false
// when they did not move it: the stream carries it then.
type sidePath interface {
	inlineMax() uint64
	// peerPid is the peer's process, whose staging ring offers are mapped
	// through /proc/<pid>/fd.
	peerPid() int
	// ringable reports whether op's payload should move through the
	// shared staging ring (ring.go): device memory at either end.
	ringable(op *Op) bool
	put(l *lane, op *Op) sideMove
	get(l *lane, op *Op) sideMove
	// events are the interprocess events that order the peer's mapped
	// put+signals (ipc_events.go).
	events() *linkEvents
}

// tellsTarget reports whether op, its payload moved by a side path, still
// goes to the target as a header (which it acknowledges): a signal to
// apply, or a put's sequence number that landed. Gets are never numbered
// and complete where they are copied.
func tellsTarget(op *Op) bool {
	return op.Msg == wire.MsgPutSignal || (op.Msg == wire.MsgPut && op.Seq != 0)
}

// sideMove is what a side path did with an operation's payload.
type sideMove uint8

const (
	sideNo       sideMove = iota // nothing: the lane sends it
	sideMoved                    // the payload is there
	sideQueued                   // its copy is queued; the copy completes the request once more
	sideGathered                 // its copy is queued in the batch (staging.Gather.AddCopy): done once the batch waited for it
)

func newTCPLink(p *peer, outs, ins []*net.TCPConn) *tcpLink {
	t := &tcpLink{p: p, ins: ins}
	for i, c := range outs {
		t.lanes = append(t.lanes, newLane(t, i, c))
	}
	for _, in := range ins {
		t.acks = append(t.acks, &acker{in: in})
	}
	return t
}

func (t *tcpLink) props() Props {
	return Props{Name: nameTCP, DeviceMemory: true, InlineMax: t.inlineMax(), Lanes: len(t.lanes)}
}

// inlineMax is the largest operation the caller's thread sends itself.
func (t *tcpLink) inlineMax() uint64 {
	if t.side != nil {
		return t.side.inlineMax()
	}
	return inlineMax
}

func (t *tcpLink) start() {
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
		for _, a := range t.acks {
			a.link = t
			a.timer = time.AfterFunc(time.Hour, a.expire)
			a.timer.Stop()
			a.piggy.Store(piggyOn)
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
			t.p.m.wg.Add(1)
			go t.service(i, in)
		}
	}
}

func (t *tcpLink) submit(lane int, op Op, hold bool) { t.lanes[lane].enqueue(&op, hold) }

// submitCaller is submit for an operation the caller posts itself
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
// writes it (writeLone) after letting go of the lock.
func (t *tcpLink) submitCaller(lane int, op Op, hold bool) bool {
	l := t.lanes[lane]
	return l.enqueue(&op, hold) && (t.side == nil || l.sOn.Load())
}

func (t *tcpLink) writeLone(lane int) {
	if l := t.lanes[lane]; l.pendingPuts() == 0 && l.pendingGets() == 0 {
		l.flush()
	}
}

func (t *tcpLink) flush() { t.flushPoll(false) }

// turn is flush for rmaProgress, which looks at the incoming sockets
// on every call: one turn of a caller's loop calls it once (pollGap).
func (t *tcpLink) turn() { t.flushPoll(true) }

func (t *tcpLink) flushPoll(progress bool) {
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
		if r := a.rd.Load(); r != nil {
			r.poll(progress)
		}
	}
	for i, l := range t.lanes {
		if early&(1<<i) == 0 {
			l.flush()
		}
	}
}

func (t *tcpLink) kick() {
	for _, l := range t.lanes {
		l.kick()
	}
}

// askAcks asks the peer to acknowledge every lane's puts at once
// (lane.askAcks): the caller waits for them.
func (t *tcpLink) askAcks() {
	for _, l := range t.lanes {
		l.askAcks()
	}
}

func (t *tcpLink) idle() bool {
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

func (t *tcpLink) stop() {
	for _, l := range t.lanes {
		l.mu.Lock()
	}
	t.p.dead.Store(true)
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
		if a.timer != nil {
			a.timer.Stop()
		}
	}
	t.inMu.Lock()
	for _, in := range t.ins {
		if in != nil {
			in.Close()
		}
	}
	t.inMu.Unlock()
}

func (t *tcpLink) awaiting() int {
	n := 0
	for _, l := range t.lanes {
		n += l.pendingGets() + l.pendingPuts()
	}
	return n
}

func (t *tcpLink) failAll() {
	for _, l := range t.lanes {
		l.drainFailed()
		for {
			e, ok := l.popGet()
			if !ok {
				break
			}
			t.p.m.owner.Complete(e.tag, abi.RemoteError)
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
	op   Op      // the request as written, for a resend (lanes > 1)
}

// lane is one outgoing stream to a peer: a queue, the goroutine that writes
// it, and the goroutine that reads the peer's replies on the same socket.
type lane struct {
	p   *peer
	t   *tcpLink
	idx int
	out *net.TCPConn // nil until the lane opens (lazy.go); set under mu
	// opening: the first op queued on an unopened lane started its dial.
	opening bool

	mu      sync.Mutex // guards the queue and writing
	writing bool       // someone owns the stream and the batch buffers
	q       ring.Ring[Op]
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
	orphans []Op

	// owned by whoever holds writing
	batch  []Op
	hdrs   []byte
	iov    [][]byte
	bufs   net.Buffers
	ackHdr [abi.MaxLanes + 1][wire.HeaderSize]byte // piggybacked acks (wire.MsgAck), and an ask
	askAck atomic.Bool                             // the next batch asks the peer for its acks now (askAcks)
	askAt  atomic.Int64                            // when flush asks, if acks are still owed then (Now(); 0: no flush waits)
	liov   [1]unix.Iovec                           // scratch for the side path
	riov   [1]unix.RemoteIovec                     // (process_vm_writev/readv)
	enc    codec.Encoder                           // wire compression (host/codec)
	gather staging.Gather                          // small device payloads of the batch, copied asynchronously
	// writeIov's raw writev: the stream's RawConn, the iovecs, the count
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
	moved  bool // failed over: its puts went to another lane, and a late ack of them is void
	// The liveness backstop (backstop): since when the oldest put of the
	// FIFO has waited for an ack (Now(); 0: none waits), the slowest recent
	// wait (a decaying maximum: the round trip seen), and when the
	// backstop last asked (0: no ask outstanding).
	waitSince atomic.Int64
	ackWait   atomic.Int64
	bsAt      atomic.Int64
	bsAsks    atomic.Uint64 // asks the backstop sent
	bsRescued atomic.Uint64 // acks that came only after such an ask
	ptags     []uint64      // owned by whoever holds writing: puts not yet in the FIFO
	// later (owned by whoever holds writing) are the batch's ops whose
	// copies were gathered (sideGathered) and that complete once the
	// batch is written, by their index in it.
	later []int

	// The intra-node staging ring (ring.go): state and fill count owned by
	// whoever holds writing; the mapping is read by replies too.
	ringState  int
	ringFilled uint32
	ring       atomic.Pointer[staging.Ring]
	ringNo     atomic.Bool // the target refused the ring

	// The intra-node shared-memory stream (stream.go): state owned by
	// whoever holds writing; the mapping is released with the lane.
	sState int
	sring  atomic.Pointer[shmstream.Ring]
	sNo    atomic.Bool // the target refused the stream
	sOn    atomic.Bool // sState is ringOn, for those who do not hold writing
	bellFn func(fd uintptr)
	sbuf   [1][]byte     // laneStream's iovec
	bells  atomic.Uint64 // bells rung (tests and the stall report)

	// With several lanes (resend), every put and registration notice
	// written on the stream and not yet known to have been applied, as
	// written, in stream order, under amu: what a failover sends again.
	resend bool
	sent   ring.Ring[sentOp]
	pops   []Op // owned by whoever holds writing: parallel to ptags

	// batches counts the batches written and writes the writev calls
	// they took (tests count them; the acker reads batches).
	batches atomic.Uint64
	writes  atomic.Uint64
	carried atomic.Uint64 // acks of the peer's puts its batches carried (Mesh.Stats)
}

// sentOp is an entry of the resend ring: counts tells a put (counted by
// the target's acks) from a registration notice (not counted).
type sentOp struct {
	op     Op
	counts bool
}

func newLane(t *tcpLink, idx int, out *net.TCPConn) *lane {
	l := &lane{p: t.p, t: t, idx: idx, out: out, wake: make(chan struct{}, 1)}
	if out != nil {
		t.p.opened.Or(1 << idx)
	}
	l.resend = t.p.lanes > 1 && !t.p.m.localComp
	if out == nil {
		// Not open yet (lazy.go): a small queue that grows, and the
		// buffers when it opens, so an unused lane costs little.
		l.q = ring.New[Op](16)
		return l
	}
	l.q = ring.New[Op](laneQueue)
	l.alloc()
	l.setOut(out)
	return l
}

// setOut binds writeIov's raw writev to the lane's stream, once it is set.
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
	l.batch = make([]Op, batchMax)
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
		l.pops = make([]Op, 0, batchMax)
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
	l.p.m.wg.Add(2)
	go l.writer()
	go l.replies()
}

// sendTimer is the send timer's turn: it wakes the writer only for work
// queued sendDelay (holdDelay) ago that nobody sent, sleeps again for
// younger work, and goes quiet on an empty queue (an enqueue re-arms it).
// So a busy lane updates its timer once per sendDelay, not per op, and a
// caller that tests in time never sees the writer.
func (l *lane) sendTimer() {
	l.mu.Lock()
	more := l.q.Len() > 0
	d := holdDelay.get()
	if l.qUrgent {
		d = sendDelay.get()
	}
	if wait := l.qSince + int64(d) - Now(); more && wait > 0 {
		l.timer.Reset(time.Duration(wait))
		l.mu.Unlock()
		return
	}
	l.armed.Store(false)
	l.long.Store(false)
	l.mu.Unlock()
	if more {
		l.kick()
	}
}

// loneGap is how long a lane must have had nothing posted for a signal to
// leave at once (submitCaller): dense bursts batch, sparse exchanges do not wait.
const loneGap = 10 * time.Microsecond

// enqueue appends op to the queue, growing it rather than failing. It
// reports whether op is a lone signal (submitCaller): a small put with signal or
// bare signal, not held or paced, queued on an empty, idle, open lane
// loneGap after the op before.
func (l *lane) enqueue(op *Op, hold bool) (lone bool) {
	l.mu.Lock()
	if l.p.dead.Load() {
		l.mu.Unlock()
		l.p.fail(op)
		return false
	}
	if l.down {
		l.mu.Unlock()
		l.forward(op, hold)
		return false
	}
	if l.q.Len() == 0 {
		now := Now()
		lone = !hold && !l.writing && l.out != nil && op.Msg == wire.MsgPutSignal && op.NotBefore == 0 &&
			op.Size <= smallResponse && now-l.qSince > int64(loneGap)
		l.qSince, l.qUrgent = now, false
	}
	if !hold {
		l.qUrgent = true
	}
	l.q.Push(*op) // grows the queue rather than failing
	l.work.Store(true)
	if l.out == nil && !l.opening {
		l.startOpen() // the first op on this lane: dial it (lazy.go)
	}
	l.mu.Unlock()
	switch {
	case op.Msg == wire.MsgReg || op.Msg == wire.MsgBye || op.NotBefore != 0:
		// Control messages go at once, nobody tests them; a paced op is
		// the writer's, on its timer.
		l.kick()
	case op.Size > l.t.inlineMax() && !hold:
		// Big payloads are sent by the writer goroutine, never the caller.
		l.kick()
	case hold:
		// Held by the aggregation hint (more ops follow): the caller's
		// next test() or rmaProgress sends it with everything queued by
		// then, in one writev, or hands a big one to the writer then
		// (flush); the timer, at holdDelay, covers callers that never
		// test, so nothing held is stranded.
		if !l.armed.Swap(true) {
			l.long.Store(true)
			l.timer.Reset(holdDelay.get())
		}
	case !l.armed.Swap(true) || l.long.Load():
		// Small: the same, with the timer at sendDelay (which also
		// covers a lone signal that submitCaller could not write after all).
		l.long.Store(false)
		l.timer.Reset(sendDelay.get())
	}
	return lone
}

// flush writes what is queued on the caller's thread when the stream is
// idle and the work is small. test() calls it: a hand-off to the writer
// goroutine costs a scheduler wake-up, which from a foreign C thread can take
// a hundred microseconds on a busy machine, while a caller that posts a burst
// and then tests gets the whole burst in one writev. The send timer, armed
// at post time, remains the guarantee that nothing waits for a test.
func (l *lane) flush() {
	limit := l.t.inlineMax()
	l.backstop()
	if l.t.ackStale() && l.sendAck(true) {
		return // nothing queued to carry an owed ack: it left alone, on this thread
	}
	l.askDue()
	l.sendAsk() // an ask for the peer's acks that no batch carried yet
	l.mu.Lock()
	if l.writing || l.q.Len() == 0 || l.down || l.out == nil || l.q.At(0).NotBefore != 0 || l.p.dead.Load() {
		// A paced op at the head is the writer's, on its timer; an
		// unopened lane's ops wait for it to open (lazy.go).
		l.mu.Unlock()
		return
	}
	if l.q.At(0).Size > limit {
		// A big op the aggregation hint held (enqueue kicks the others):
		// the writer sends it, never the caller's thread.
		l.mu.Unlock()
		l.kick()
		return
	}
	l.writing = true
	n := l.takeLocked(limit)
	l.mu.Unlock()
	ok := l.writeBatch(l.batch[:n])
	// The send timer keeps running when everything left: it goes quiet
	// by itself (sendTimer), and stopping it here would make the next
	// post re-arm it, a timer update per op.
	if more := l.letGo(); ok && more {
		l.kick()
	}
}

// queued reports whether ops may wait in the queue (flush), without the
// lock: a hint, set when an op is queued and cleared when a batch takes
// the last one. Stale either way it only changes the order of flush's two
// steps, each of which looks again under the lock.
func (l *lane) queued() bool { return l.work.Load() }

// carryAck appends the acks this link owes the peer (acker.drained) to
// the batch about to be written, the first things in it, and an ask for
// the peer's acks of this lane's puts when one is due (the first header
// carries it, or one of its own).
func (l *lane) carryAck(iov [][]byte) [][]byte {
	ask := l.askAck.Load() && l.askAck.Swap(false)
	k := 0
	if l.t.ride {
		for i, a := range l.t.acks {
			n := a.owed()
			if n == 0 || !a.claim(n) {
				continue
			}
			// MrID names the peer's lane (our incoming stream i) whose
			// puts n acknowledges.
			h := wire.Header{Typ: wire.MsgAck, MrID: uint32(i), Seq: n}
			if ask && k == 0 {
				h.Status = wire.StatusAckNow
			}
			h.Encode(l.ackHdr[k][:])
			iov = append(iov, l.ackHdr[k][:])
			k++
		}
		if k > 0 {
			l.carried.Add(uint64(k))
		}
	}
	if ask && k == 0 {
		// Only asking: with Seq 0 the peer's counts are unchanged.
		h := wire.Header{Typ: wire.MsgAck, MrID: uint32(l.idx), Status: wire.StatusAckNow}
		h.Encode(l.ackHdr[0][:])
		iov = append(iov, l.ackHdr[0][:])
	}
	return iov
}

// ackStale reports an owed ack that waited ackDelay for a batch in vain.
func (t *tcpLink) ackStale() bool {
	if !t.ride {
		return false
	}
	for _, a := range t.acks {
		if a.stale() {
			return true
		}
	}
	return false
}

// acksOwed reports whether any ack waits for a batch to carry it.
func (t *tcpLink) acksOwed() bool {
	if !t.ride {
		return false
	}
	for _, a := range t.acks {
		if a.owed() != 0 {
			return true
		}
	}
	return false
}

// batchesWritten counts the batches our lanes to the peer wrote: a change
// since an incoming stream last drained means traffic flows both ways
// (acker.drained).
func (t *tcpLink) batchesWritten() uint64 {
	var n uint64
	for _, l := range t.lanes {
		n += l.batches.Load()
	}
	return n
}

// sendAcksAlone writes the owed acks with no batch, on the first open
// lane that did not fail (the acker's timer).
func (t *tcpLink) sendAcksAlone() {
	for _, l := range t.lanes {
		if l.isOpen() {
			if !l.sendAck(false) {
				// Someone holds the stream: its letGo re-arms the timer.
				t.ackDeferred.Add(1)
			}
			return
		}
	}
}

// isOpen reports whether the lane's stream is open and did not fail.
func (l *lane) isOpen() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.out != nil && !l.down
}

// rehomeAcks: a lane failed over, and a count it had taken may have died
// with it. Every riding acker's next carry repeats its whole count (the
// peer keeps the highest it saw), on a live lane; the timer covers a link
// that stays quiet.
func (t *tcpLink) rehomeAcks() {
	if !t.ride {
		return
	}
	for _, a := range t.acks {
		if a.rides() {
			a.sent.Store(0)
			a.arm()
		}
	}
}

// askAfter is how long a flush waits for the acks of its puts before it
// asks for them: acks that come by themselves (most do, within a few µs)
// cost no ask. A variable so that tests can ask at once.
var askAfter = 10 * time.Microsecond

// askAcks notes that the caller waits for the completions of our puts
// (iflush): if acks are still owed askAfter from now, the next flush (the
// caller's test()) makes the lane's next batch ask the target to
// acknowledge them at once (wire.StatusAckNow), and writes that batch
// when the stream is free. A target that wrote to us since it last
// drained holds its acks for its next batch (acker.drained), and in a GIN
// round that batch comes only after our wait ends, so without asking both
// sides waited out ackDelay. Nothing is asked when every put was
// acknowledged, or on a lane whose target cannot hold acks (one with
// resend acks each on the reply stream as it lands). A busy stream
// carries the ask in its next batch.
func (l *lane) askAcks() {
	if l.unacked() == 0 {
		return
	}
	l.askAt.CompareAndSwap(0, Now()+int64(askAfter))
}

func (l *lane) unacked() int {
	l.amu.Lock()
	defer l.amu.Unlock()
	return l.puts.Len()
}

// The liveness backstop. Every put is acknowledged by the normal paths
// (an ack that rides a batch, one written alone when no batch comes, the
// acker's timer); a bug in them would leave a put that landed
// unacknowledged and its request pending for ever, which hangs a job. So
// the caller's test() and rmaProgress (flush) also look at how long the
// oldest put of each lane has waited for its ack: past backstopBound, the
// lane asks the target to acknowledge at once (wire.StatusAckNow, which
// the target answers on the acknowledged stream itself, apart from every
// lane's hold), again each bound while none comes. An ack that then comes
// is counted (Mesh.Stats().AcksRescued) and reported in a rate-limited
// INFO line: the normal path failed to deliver it in time, which the
// operator (and the soak) should see. NCCL's proxies call test() on every
// pending request, so a waiting caller always runs it.

// backstopBound is how long a put may wait for its ack before the
// backstop asks: four times the longest a held ack waits by design
// (ackDelay for a batch, then ackBound for the timer), plus twice the
// slowest wait seen lately, so that a slow machine or link (a starved CPU
// makes round trips of tens of milliseconds) is not taken for a lost ack.
func (l *lane) backstopBound() int64 {
	return 4*int64(ackDelay.get()+ackBound.get()) + 2*l.ackWait.Load()
}

// ackedPuts records that an ack completed puts of the FIFO (amu held; empty:
// none is left): how long the oldest waited, and an answer to the
// backstop's ask.
func (l *lane) ackedPuts(empty bool) {
	now := Now()
	if since := l.waitSince.Load(); since != 0 {
		// The round trip seen: a maximum that decays by an eighth per ack.
		w, old := now-since, l.ackWait.Load()
		l.ackWait.Store(max(w, old-old/8))
	}
	if empty {
		l.waitSince.Store(0)
	} else {
		l.waitSince.Store(now) // the next put's wait starts no earlier than this
	}
	if at := l.bsAt.Load(); at != 0 && l.bsAt.CompareAndSwap(at, 0) {
		n := l.bsRescued.Add(1)
		backstopInfo.Info(abi.SubsysNet, "NET/wasm: rank %d: puts to rank %d on lane %d were acknowledged only after the liveness backstop asked (they waited over %v; %d times on this lane)",
			l.p.m.rank, l.p.rank, l.idx, time.Duration(l.backstopBound()), n)
	}
}

// backstopInfo limits the backstop's INFO lines.
var backstopInfo = logx.Limited{Burst: 5, Every: 10 * time.Second}

// backstop asks for the acks of puts that waited past backstopBound
// (flush, the caller's thread): one atomic load when none waits.
func (l *lane) backstop() {
	since := l.waitSince.Load()
	if since == 0 || skipBackstop.Load() {
		return
	}
	now, bound := Now(), l.backstopBound()
	if now-since < bound {
		return
	}
	if at := l.bsAt.Load(); at != 0 && now-at < bound {
		return // asked already: ask again only when that ask went unanswered as long
	}
	l.bsAt.Store(now)
	l.bsAsks.Add(1)
	l.askAck.Store(true)
}

// skipBackstop switches the backstop off (tests that must see the normal
// path alone deliver every ack).
var skipBackstop atomic.Bool

// askDue turns a flush's wait that outlasted askAfter into an ask.
func (l *lane) askDue() {
	at := l.askAt.Load()
	if at == 0 || Now() < at || !l.askAt.CompareAndSwap(at, 0) {
		return
	}
	if l.unacked() > 0 {
		l.askAck.Store(true)
	}
}

// sendAsk writes a batch of nothing but what carryAck adds, when an ask
// is pending, nothing is queued (a batch would carry it) and the stream
// is free.
func (l *lane) sendAsk() {
	if !l.askAck.Load() {
		return
	}
	l.mu.Lock()
	if l.writing || l.down || l.out == nil || l.p.dead.Load() || l.q.Len() > 0 {
		l.mu.Unlock()
		return
	}
	l.writing = true
	l.mu.Unlock()
	l.writeAlone()
}

// writeAlone writes a batch of nothing but what carryAck adds and lets
// the stream go; the caller took it (l.writing).
func (l *lane) writeAlone() {
	ok := l.writeBatch(l.batch[:0])
	if more := l.letGo(); ok && more {
		l.kick()
	}
}

// sendAck writes an ack that no batch carried in time, alone (test() or
// rmaProgress through flush, idle set: only when nothing is queued, which
// would carry it; or the acker's timer). When someone holds the stream,
// that one re-arms the timer as it lets go (letGo), so the ack is never
// stranded. It reports whether it took the stream.
func (l *lane) sendAck(idle bool) bool {
	l.mu.Lock()
	if l.writing || l.down || l.out == nil || l.p.dead.Load() || !l.t.acksOwed() || (idle && l.q.Len() > 0) {
		l.mu.Unlock()
		return false
	}
	l.writing = true
	l.mu.Unlock()
	l.writeAlone()
	return true
}

// letGo ends a hold of the stream (l.writing = true, taken under mu by
// flush, sendAsk, sendAck or the writer): every holder lets go through
// here and nowhere else. It re-arms the acks still owed (ackLeft): an
// acker's timer that fired while the stream was held found it busy and
// left its ack to the holder (tcpLink.sendAcksAlone), so a holder that
// let go without re-arming would strand it, and the put it acknowledges
// would never complete. It reports whether ops are left queued.
func (l *lane) letGo() (more bool) {
	if h := letGoHook.Load(); h != nil {
		(*h)(l) // tests: widen the window between the write and letting go
	}
	l.mu.Lock()
	l.writing = false
	more = l.q.Len() > 0
	l.mu.Unlock()
	if !skipRearm.Load() {
		l.ackLeft()
	}
	return more
}

// letGoHook and skipRearm are test knobs (unset in production: an atomic
// load each): letGoHook runs as a holder is about to let go, after its
// write (a test sleeps there to open the window in which an acker's timer
// finds the stream busy); skipRearm leaves owed acks unarmed as the
// stream is let go (the bug letGo exists to prevent), for the negative
// control.
var (
	letGoHook atomic.Pointer[func(*lane)]
	skipRearm atomic.Bool
)

// ackLeft re-arms the ack timers of acks still owed as the stream is let
// go (letGo): a timer may have fired while the stream was held.
func (l *lane) ackLeft() {
	if !l.t.ride {
		return
	}
	for _, a := range l.t.acks {
		if a.owed() != 0 {
			a.arm()
		}
	}
}

func (l *lane) kick() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// takeLocked moves queued ops into the batch, at most len(l.batch) of them
// and, past the first, no more than maxPayload bytes of payload. It stops at
// a paced op that is not due yet (everything behind it waits, to keep the
// order). The caller holds l.mu and owns the stream.
func (l *lane) takeLocked(maxPayload uint64) int {
	n, bytes := 0, uint64(0)
	var now int64
	for n < len(l.batch) && l.q.Len() > 0 {
		op := l.q.At(0)
		if n > 0 && bytes+op.Size > maxPayload {
			break
		}
		if op.NotBefore != 0 {
			if now == 0 {
				now = Now()
			}
			if op.NotBefore > now {
				break
			}
		}
		bytes += op.Size
		l.batch[n] = *op
		l.q.Drop()
		n++
	}
	if l.q.Len() == 0 {
		l.work.Store(false)
	}
	return n
}

// drainFailed fails every queued op; the peer is dead.
func (l *lane) drainFailed() {
	l.mu.Lock()
	orphans := l.orphans
	l.orphans = nil
	l.mu.Unlock()
	for i := range orphans {
		l.p.fail(&orphans[i])
	}
	for {
		l.mu.Lock()
		op, ok := l.q.Pop()
		l.mu.Unlock()
		if !ok {
			return
		}
		l.p.fail(&op)
	}
}

func (l *lane) writer() {
	defer l.p.m.wg.Done()
	for {
		select {
		case <-l.wake:
		case <-l.p.quit:
			return
		}
		for {
			l.mu.Lock()
			if l.writing || l.q.Len() == 0 || l.down {
				// An inline writer owns the stream; it kicks us when it
				// leaves work behind.
				l.mu.Unlock()
				break
			}
			l.writing = true
			n := l.takeLocked(^uint64(0))
			if n == 0 {
				// A paced op heads the queue: come back when it is due.
				wait := l.q.At(0).NotBefore - Now()
				l.mu.Unlock()
				l.letGo()
				l.due.Reset(time.Duration(max(wait, 1)))
				break
			}
			l.mu.Unlock()
			ok := l.writeBatch(l.batch[:n])
			l.letGo()
			if !ok {
				return
			}
		}
	}
}

// writeBatch sends headers and payloads with one writev, straight from the
// registered memory. A put completes when the target acknowledges that it
// landed (wire.MsgPutAck, read by replies), not when the kernel has the bytes:
// completion means arrival, as an RDMA write completion does. With a side
// path (intra-node) payloads it takes are copied into the peer first, and a
// put that needs nothing more from the target completes here; only what the
// target must act on is sent.
func (l *lane) writeBatch(ops []Op) bool {
	p := l.p
	iov := l.carryAck(l.iov[:0])
	pend := l.ptags[:0]
	pops := l.pops[:0]
	later := l.later[:0]
	if len(ops) > 0 {
		l.batches.Add(1) // an ack alone is no sign of traffic (acker.drained)
	}
	l.enc.Reset()
	defer l.enc.Release() // the arena goes back to the pool once the batch is written
	defer l.gather.Done() // slots of copies gathered for a batch that failed
	var err error
	n := 0 // ops handled so far; a device copy failure stops the batch
	for ; n < len(ops) && err == nil; n++ {
		i, op := n, &ops[n]
		if side := l.t.side; side != nil {
			var mv sideMove
			switch op.Msg {
			case wire.MsgPut, wire.MsgPutSignal:
				mv = side.put(l, op)
			case wire.MsgGet:
				mv = side.get(l, op)
			}
			switch {
			case mv == sideNo:
			case tellsTarget(op):
				op.Size = 0 // the payload is there: send the signal (or the number that landed) alone
			default:
				op.Msg = opDone // nothing to tell the target
				switch mv {
				case sideMoved:
					p.m.owner.Complete(op.Tag, abi.Success)
				case sideGathered:
					later = append(later, i)
				}
				continue
			}
		}
		ringed := false
		// A resent put goes on the stream: the target may drop its
		// payload unread (tcp_failover.go), which a ring cannot do.
		if (op.Msg == wire.MsgPut || op.Msg == wire.MsgPutSignal) && !op.Resent && l.ringState != ringOff && l.t.side != nil && l.t.side.ringable(op) {
			// What is gathered goes first: the first ring offer waits
			// for the target's answer.
			l.awaitPuts(pend, pops)
			pend, pops = pend[:0], pops[:0]
			if err = l.writeIov(iov); err != nil {
				break // this op never left
			}
			iov = iov[:0]
			if ringed, err = l.ringReady(); err != nil {
				break
			}
		}
		h := wire.Header{Typ: op.Msg, SigOp: op.SigOp, MrID: op.MrID, Tag: op.Tag, Off: op.Off,
			Size: op.Size, SigMrID: op.SigMrID, Context: op.Context, SigOff: op.SigOff, SigValue: op.SigValue, Seq: op.Seq}
		if op.Msg == wire.MsgReg && op.Dev {
			h.Status = 1
		}
		if op.Event != 0 {
			h.Status = wire.StatusEvent | uint16(op.Event-1)
		}
		if ringed {
			h.Status = StatusRing
		}
		// Compression is TCP's alone: a side path (intra-node) copies.
		comp := l.t.side == nil && compressible(op)
		if comp {
			h.Status = uint16(op.Codec & guestabi.CodecIDMask) // requests: the payload's codec
		}
		if op.Resent {
			h.Status |= wire.StatusResent | uint16(op.From)<<8
		}
		hb := l.hdrs[i*wire.HeaderSize : (i+1)*wire.HeaderSize]
		h.Encode(hb)
		iov = append(iov, hb)
		if l.resend && (op.Msg == wire.MsgPut || op.Msg == wire.MsgPutSignal || op.Msg == wire.MsgReg) {
			pops = append(pops, *op)
		}
		switch op.Msg {
		case wire.MsgPut, wire.MsgPutSignal:
			if p.m.localComp {
				// Completed below, once written. The FIFO still counts
				// the put against the target's acks; tag 0 completes
				// nothing when the ack comes.
				pend = append(pend, 0)
			} else {
				pend = append(pend, op.Tag)
			}
			if ringed {
				// The header goes now; the payload through the ring.
				l.awaitPuts(pend, pops)
				pend, pops = pend[:0], pops[:0]
				if err = l.writeIov(iov); err == nil {
					err = l.ringSend(op)
				}
				iov = iov[:0]
			} else if b, gerr := l.gatherDev(op, len(iov)); b != nil {
				// A small device payload, its copy queued: the
				// bytes join iov, written after writeIov waited.
				iov = append(iov, b)
			} else if gerr != nil {
				// As a failed synchronous copy: the put is in the
				// FIFO, failed (or resent) with the lane.
				l.awaitPuts(pend, pops)
				pend, pops = pend[:0], pops[:0]
				err = gerr
			} else if op.Size > 0 && op.LocalCtx != 0 {
				// Device source: what is queued goes first, then the
				// payload is staged through host memory chunk by chunk.
				l.awaitPuts(pend, pops)
				pend, pops = pend[:0], pops[:0]
				if err = l.writeIov(iov); err == nil {
					err = staging.WriteFromDevice(l.streamWriter(), op.LocalCtx, uintptr(op.Local), op.Size, l.p.m.stageChunk)
				}
				iov = iov[:0]
			} else if comp {
				iov, pend, pops, err = l.compress(iov, pend, pops, op)
			} else if op.Size > 0 {
				iov = append(iov, unsafe.Slice((*byte)(op.Local), op.Size))
			}
		case wire.MsgGet:
			e := getEntry{tag: op.Tag, dst: op.Local, size: op.Size, ctx: op.LocalCtx}
			if l.resend {
				e.op = *op
			}
			l.pushGet(e)
		}
	}
	if err == nil {
		// Into the FIFO before the bytes leave: the ack may come back
		// before writev returns.
		l.awaitPuts(pend, pops)
		err = l.writeIov(iov)
	}
	clear(iov)
	clear(pops)
	if err != nil {
		// Copies the batch queued may still run: they finish before
		// their requests fail (and the caller may free or unmap).
		l.gather.Done()
	}
	for _, i := range later {
		// Their copies were waited for by a writeIov that succeeded, or
		// the batch failed.
		if err == nil {
			p.m.owner.Complete(ops[i].Tag, abi.Success)
		} else {
			p.fail(&ops[i])
		}
	}
	if err != nil && l.canFailover() {
		// The lane failed alone: what the loop did not reach goes to the
		// other lanes with the rest of its work (tcp_failover.go).
		l.keep(ops[n:])
		l.broken(fmt.Errorf("send to rank %d on lane %d: %w", p.rank, l.idx, err))
		return false
	}
	if err != nil {
		for i := range ops {
			// The puts and gets the loop reached are in the FIFOs, which
			// markDead fails (but tag 0 there in local mode); the rest
			// never left.
			put := ops[i].Msg == wire.MsgPut || ops[i].Msg == wire.MsgPutSignal
			if (i >= n && (put || ops[i].Msg == wire.MsgGet)) || (put && p.m.localComp) {
				p.fail(&ops[i])
			}
		}
		p.markDead(fmt.Errorf("send to rank %d: %w", p.rank, err))
		return false
	}
	if p.m.localComp {
		for i := range ops {
			if ops[i].Msg == wire.MsgPut || ops[i].Msg == wire.MsgPutSignal {
				p.m.owner.Complete(ops[i].Tag, abi.Success)
			}
		}
	}
	if profile.On() {
		for i := range ops {
			profile.Queued.Since(ops[i].Posted)
		}
	}
	return true
}

// compress appends op's payload to iov as compressed blocks in the lane's
// arena (a block the codec cannot shrink is sent as it is, from the source).
// When the arena or iov is full, what is gathered is written first; pend's
// tags go to the FIFO before that, as the acks may race the write.
func (l *lane) compress(iov [][]byte, pend []uint64, pops []Op, op *Op) ([][]byte, []uint64, []Op, error) {
	e := &l.enc
	src := unsafe.Slice((*byte)(op.Local), op.Size)
	for len(src) > 0 {
		n := min(len(src), codec.BlockSize)
		if !e.Room(n) || len(iov)+2 > cap(iov) {
			l.awaitPuts(pend, pops)
			pend, pops = pend[:0], pops[:0]
			err := l.writeIov(iov)
			clear(iov)
			iov = iov[:0]
			e.Reset()
			if err != nil {
				return iov, pend, pops, err
			}
		}
		framed, stored := e.Block(op.Codec, src[:n])
		iov = append(iov, framed)
		if stored {
			iov = append(iov, src[:n])
		}
		src = src[n:]
	}
	return iov, pend, pops, nil
}

// compressible reports whether op's payload is compressed on the wire.
func compressible(op *Op) bool {
	return op.Codec&guestabi.CodecIDMask != guestabi.CodecNone && op.Size >= codec.MinSize && op.LocalCtx == 0 &&
		(op.Msg == wire.MsgPut || op.Msg == wire.MsgPutSignal)
}

// awaitingReply: the lane has sent something the peer answers (a put to
// acknowledge, a get to serve), so its replies reader spins for it.
func (l *lane) awaitingReply() bool { return l.pendingPuts() > 0 || l.pendingGets() > 0 }

// wholeOp: TCP lanes are independent streams, so cutting pays off.
func (t *tcpLink) wholeOp(Op) bool { return false }

// signalApart: on TCP a signal rides its put's header.
func (t *tcpLink) signalApart(Op) bool { return false }

// release frees the lanes' staging rings and shared-memory streams
// (intra-node links have them).
func (t *tcpLink) release() {
	for _, l := range t.lanes {
		l.releaseRing()
		l.releaseStream()
	}
}

// awaitPuts appends the tags of puts about to be written to the FIFO that
// the target's acks complete. If the peer is already dead (failAll may have
// emptied the FIFO), they fail here instead, so none is left behind.
func (l *lane) awaitPuts(tags []uint64, ops []Op) {
	if len(tags) == 0 && len(ops) == 0 {
		return
	}
	l.amu.Lock()
	if l.p.dead.Load() {
		l.amu.Unlock()
		for _, tag := range tags {
			l.p.fail(&Op{Msg: wire.MsgPut, Tag: tag})
		}
		return
	}
	if l.resend {
		l.logSent(ops)
	}
	if l.puts.Len() == 0 && len(tags) > 0 {
		l.waitSince.Store(Now())
	}
	for _, tag := range tags {
		l.puts.Push(tag)
	}
	l.amu.Unlock()
}

// ackPuts completes the puts a cumulative ack covers: the first n puts of
// the stream. It reports false when n is more than the stream carried.
func (l *lane) ackPuts(n uint64) bool {
	var done [64]uint64 // completed outside the lock, a few at a time
	for {
		l.amu.Lock()
		if l.moved {
			// Its puts went to another lane, whose acks complete them;
			// this count was on its way before the failover.
			l.amu.Unlock()
			return true
		}
		if n < l.pAcked {
			// Stale: a piggybacked ack and one on the reply stream
			// travel apart, and a higher count came first.
			l.amu.Unlock()
			return true
		}
		if n-l.pAcked > uint64(l.puts.Len()) {
			l.amu.Unlock()
			return false
		}
		k := min(int(n-l.pAcked), len(done))
		for i := 0; i < k; i++ {
			done[i], _ = l.puts.Pop()
		}
		l.pAcked += uint64(k)
		if l.resend {
			l.popSent(k)
		}
		if k > 0 {
			l.ackedPuts(l.puts.Len() == 0)
		}
		l.amu.Unlock()
		if l.t.onAcked != nil {
			l.t.onAcked() // before the requests complete
		}
		for _, tag := range done[:k] {
			if tag != 0 {
				l.p.m.owner.Complete(tag, abi.Success)
			}
		}
		if k < len(done) {
			return true
		}
	}
}

// failPut fails the oldest put of request tag awaiting its ack (a nack
// names it; nacks come in stream order, so the oldest is the one) and
// leaves 0 in its place. In local-completion mode the put completed when
// written: only the sticky error reports the rejection then.
func (l *lane) failPut(tag uint64, st abi.Result) {
	if tag == 0 {
		return
	}
	found := false
	l.amu.Lock()
	for i := 0; i < l.puts.Len(); i++ {
		if p := l.puts.At(i); *p == tag {
			*p, found = 0, true
			break
		}
	}
	if found && l.resend {
		// A resend must not complete the failed request again.
		for i := 0; i < l.sent.Len(); i++ {
			if e := l.sent.At(i); e.counts && e.op.Tag == tag {
				e.op.Tag = 0
				break
			}
		}
	}
	l.amu.Unlock()
	if found {
		l.p.m.owner.Complete(tag, st)
	}
}

// rejected is the status a peer's rejection carries, as a failure: a
// status that is not one (0, or beyond the codes) reads as a remote error.
func rejected(status uint16) abi.Result {
	if st := abi.Result(status); st != abi.Success && st <= abi.RemoteError {
		return st
	}
	return abi.RemoteError
}

// failPuts fails every put awaiting its ack; the peer is dead.
func (l *lane) failPuts() {
	l.amu.Lock()
	var tags []uint64
	for tag, ok := l.puts.Pop(); ok; tag, ok = l.puts.Pop() {
		tags = append(tags, tag)
	}
	l.sent.Clear() // failed here: never sent again
	l.waitSince.Store(0)
	l.amu.Unlock()
	for _, tag := range tags {
		if tag != 0 {
			l.p.m.owner.Complete(tag, abi.RemoteError)
		}
	}
}

func (l *lane) pendingPuts() int {
	l.amu.Lock()
	defer l.amu.Unlock()
	return l.puts.Len()
}

// writeIov sends the gathered headers and payloads: into the shared-memory
// stream of an intra-node lane (stream.go), else with one writev.
func (l *lane) writeIov(iov [][]byte) error {
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
	if l.streamOn() {
		return l.writeStream(iov)
	}
	return l.writeSocket(iov)
}

// writeSocket writes iov on the lane's socket, with one writev where the
// socket takes it all.
func (l *lane) writeSocket(iov [][]byte) error {
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

// settle waits for the device copies the batch gathered so far, before a
// synchronous copy that must not overtake them (a strongly-ordered put's
// completion means everything before it landed; a get may read what an
// earlier put writes). A failure is the batch's: its write reports it.
func (l *lane) settle() {
	if l.gather.Pending() {
		l.gather.Wait()
	}
}

// gatherDev queues the copy of op's device payload into a bounce slot
// when iov has room (staging.Gather.Add says whether it is small enough):
// the bytes to append to iov, or nil to stage it synchronously.
func (l *lane) gatherDev(op *Op, niov int) ([]byte, error) {
	if op.LocalCtx == 0 || niov+1 >= cap(l.iov) {
		return nil, nil
	}
	return l.gather.Add(op.LocalCtx, uintptr(op.Local), op.Size)
}

// rawWriteMax is the most a raw writev (writeIov) takes: a raw system call
// keeps its P, so a long copy would hold the goroutines queued on it.
const rawWriteMax = inlineMax

func iovLen(iov [][]byte) int {
	n := 0
	for _, b := range iov {
		n += len(b)
	}
	return n
}

// writevFD is writeIov's raw writev (through the connection's Control).
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

// pushGet records a get whose request is about to leave. A writer can get
// here after the peer died and markDead already emptied the FIFO (the
// intra-node read it tried first failed because the peer is gone, and the
// get fell back to the stream): then the get fails now instead of waiting
// for a reply that never comes. dead is raised before markDead drains the
// FIFO, and both sides look under gmu, so every get is failed exactly once.
func (l *lane) pushGet(e getEntry) {
	l.gmu.Lock()
	if l.p.dead.Load() {
		l.gmu.Unlock()
		l.p.fail(&Op{Msg: wire.MsgGet, Tag: e.tag})
		return
	}
	l.gets.Push(e)
	l.gmu.Unlock()
}

func (l *lane) popGet() (getEntry, bool) {
	l.gmu.Lock()
	defer l.gmu.Unlock()
	return l.gets.Pop()
}

func (l *lane) pendingGets() int {
	l.gmu.Lock()
	defer l.gmu.Unlock()
	return l.gets.Len()
}

// replies reads what the peer sends back on this lane: get data, written
// straight into the destination registration, put acknowledgements, and
// rejections (a nack comes before the ack that covers its put, so the
// sticky error is set before the put completes).
func (l *lane) replies() {
	p := l.p
	defer p.m.wg.Done()
	br := bufio.NewReaderSize(spin.NewReader(l.out, p.m.spinWait, p.m.spinners, l.awaitingReply), readBufSize)
	var hb [wire.HeaderSize]byte
	var h wire.Header
	for {
		if _, err := io.ReadFull(br, hb[:]); err != nil {
			l.replyStreamEnded(fmt.Errorf("receive from rank %d on lane %d: %w", p.rank, l.idx, err))
			return
		}
		h.Decode(hb[:])
		switch h.Typ {
		case wire.MsgGetResp:
			e, ok := l.popGet()
			if !ok || e.tag != h.Tag || (h.Status == 0 && e.size != h.Size) {
				p.markDead(fmt.Errorf("rank %d answered a get we did not ask for (tag %#x)", p.rank, h.Tag))
				return
			}
			if h.Status != 0 {
				p.m.owner.PeerFailed(p.rank, fmt.Errorf("rank %d rejected a get of %d bytes at offset %d of registration %d: %v",
					p.rank, e.size, h.Off, h.MrID, abi.Result(h.Status)))
				p.m.owner.Complete(e.tag, abi.Result(h.Status))
				continue
			}
			if e.size > 0 && e.ctx != 0 {
				if err := staging.ReadToDevice(br, e.ctx, uintptr(e.dst), e.size, p.m.stageChunk); err != nil {
					p.markDead(fmt.Errorf("receive get data from rank %d into device memory: %w", p.rank, err))
					p.m.owner.Complete(e.tag, abi.RemoteError)
					return
				}
			} else if e.size > 0 {
				if _, err := io.ReadFull(br, unsafe.Slice((*byte)(e.dst), e.size)); err != nil {
					if l.canFailover() {
						// The get goes again on another lane, whole.
						l.unpopGet(e)
						l.replyStreamEnded(fmt.Errorf("receive get data from rank %d on lane %d: %w", p.rank, l.idx, err))
						return
					}
					p.markDead(fmt.Errorf("receive get data from rank %d: %w", p.rank, err))
					p.m.owner.Complete(e.tag, abi.RemoteError)
					return
				}
			}
			p.m.owner.Complete(e.tag, abi.Success)
		case wire.MsgPutAck:
			if !l.ackPuts(h.Seq) {
				p.markDead(fmt.Errorf("protocol error: rank %d acknowledged %d puts on lane %d, more than it was sent", p.rank, h.Seq, l.idx))
				return
			}
		case wire.MsgByeAck:
			p.ackBye()
		case wire.MsgRingNo:
			l.ringRefused()
		case wire.MsgStreamNo:
			l.streamRefused()
		case wire.MsgNack:
			st := rejected(h.Status)
			p.m.owner.PeerFailed(p.rank, fmt.Errorf("rank %d rejected a put of %d bytes at offset %d of registration %d (signal registration %d offset %d): %v",
				p.rank, h.Size, h.Off, h.MrID, h.SigMrID, h.SigOff, st))
			// The nack comes before the ack that covers its put: the
			// request fails now, and the ack completes nothing for it.
			l.failPut(h.Tag, st)
		default:
			p.markDead(fmt.Errorf("protocol error: message type %d from rank %d", h.Typ, p.rank))
			return
		}
	}
}
