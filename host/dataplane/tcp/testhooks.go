package tcp

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
)

// Hooks into a TCP link for the integration tests (package tcp_test and
// the mesh's, which build whole meshes with host/dataplane/meshtest): they
// look at or pin the lanes, acks and readers underneath. Kept apart from
// the data path as the transport's exported test surface; test-only,
// nothing in the data path calls them.

// Lanes are the link's lanes, lane 0 first.
func (t *Link) Lanes() []*lane { return t.lanes }

// Acks are the acknowledgement state of the peer's incoming streams.
func (t *Link) Acks() []*acker { return t.acks }

// Ins are the peer's incoming streams (nil: not opened yet), under InMu.
func (t *Link) Ins() []*net.TCPConn { return t.ins }

// ResetIn resets the peer's incoming stream of lane i (an RST: linger 0),
// as a link that breaks does; false (and nothing done) while it is not
// open yet (lanes open when first used).
func (t *Link) ResetIn(i int) (bool, error) {
	t.inMu.Lock()
	c := t.ins[i]
	t.inMu.Unlock()
	if c == nil {
		return false, nil
	}
	if err := c.SetLinger(0); err != nil {
		return false, err
	}
	return true, c.Close()
}

// Mu guards the lane's queue and Writing.
func (l *lane) Mu() *sync.Mutex { return &l.mu }

// Writing reports that someone owns the stream (under Mu).
func (l *lane) Writing() *bool { return &l.writing }

// Out is the lane's stream, nil until it opens (under Mu).
func (l *lane) Out() *net.TCPConn { return l.out }

// Opening reports a dial in flight (under Mu).
func (l *lane) Opening() bool { return l.opening }

// StartOpen dials the lane (under Mu).
func (l *lane) StartOpen() { l.startOpen() }

// Idx is the lane's number.
func (l *lane) Idx() int { return l.idx }

// Side is the lane's side path (the intra-node side), or nil.
func (l *lane) Side() link.LaneSide { return l.ix }

// Writes counts the lane's stream writes.
func (l *lane) Writes() *atomic.Uint64 { return &l.writes }

// PendingGets counts the gets awaiting replies.
func (l *lane) PendingGets() int { return l.pendingGets() }

// PushGet makes the lane await the reply to a get of size bytes named tag.
func (l *lane) PushGet(tag, size uint64) { l.pushGet(getEntry{tag: tag, size: size}) }

// QueueState is the failover's words on the lane: whether it is down and
// its writer holds the stream, how many ops are queued and orphaned
// (under Mu).
func (l *lane) QueueState() (down, writing bool, queued, orphans int) {
	return l.down, l.writing, l.q.Len(), len(l.orphans)
}

// Rd is the stream's reader, once its service started.
func (a *acker) Rd() *atomic.Pointer[inReader] { return &a.rd }

// Get and Set read and change a delay.
func (d *delay) Get() time.Duration { return d.get() }

// Set changes the delay.
func (d *delay) Set(v time.Duration) { d.set(v) }

// SendDelay, HoldDelay, AckDelay and AckBound are the lanes' and ackers'
// delays.
func SendDelay() *delay { return sendDelay }

// HoldDelay is the delay of held (aggregated) operations.
func HoldDelay() *delay { return holdDelay }

// Test constants of the lanes and services.
const (
	LoneGap      = loneGap
	AckEvery     = ackEvery
	BackstopAsks = backstopAsks
)

// Lane and Delay name a lane and a delay for the tests' hooks and helpers.
type (
	Lane  = lane
	Delay = delay
)

// SetPlacedMax sets how many puts a lane lets complete before their ack
// while earlier ones await theirs; the returned func restores it.
func SetPlacedMax(n int) func() {
	old := placedMax.Swap(int64(n))
	return func() { placedMax.Store(old) }
}

// PendingPuts is how many puts of the lane's stream await their ack.
func (l *lane) PendingPuts() int { return l.pendingPuts() }
