package tcp

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp/instream"
)

// Hooks that only this package's own tests use (package tcp_test builds
// with this file; nothing else sees these names).

// InMu guards Ins.
func (t *Link) InMu() *sync.Mutex { return &t.inMu }

// InDown has bit i set once the peer's lane i failed over.
func (t *Link) InDown() *atomic.Uint32 { return &t.inDown }

// AckDeferred counts the ack timers that found a stream held.
func (t *Link) AckDeferred() *atomic.Uint64 { return &t.ackDeferred }

// Batches counts the lane's batches.
func (l *lane) Batches() *atomic.Uint64 { return &l.batches }

// BsAsks counts the asks the backstop sent.
func (l *lane) BsAsks() *atomic.Uint64 { return &l.bsAsks }

// BackstopBound is how long the backstop waits for an ack.
func (l *lane) BackstopBound() int64 { return l.backstopBound() }

// AwaitPuts makes the lane await the acks of tags (ops: for a resend); an
// error when the peer is dead (the puts failed).
func (l *lane) AwaitPuts(tags []uint64, ops []link.Op) error { return l.awaitPuts(tags, ops) }

// Amu guards the lane's ack FIFO (Moved and LaneState's counts).
func (l *lane) Amu() *sync.Mutex { return &l.amu }

// Moved reports that the lane failed over (under Amu).
func (l *lane) Moved() bool { return l.moved }

// AckState is the lane's ack FIFO: ops sent and awaiting a resend, puts
// awaiting acks, and puts acknowledged (under Amu).
func (l *lane) AckState() (sent, puts int, acked uint64) {
	return l.sent.Len(), l.puts.Len(), l.pAcked
}

// AckDelay is how long an ack waits for a batch to ride.
func AckDelay() *delay { return ackDelay }

// AckBound bounds how long an ack waits at all.
func AckBound() *delay { return ackBound }

// SkipBackstop turns the liveness backstop off.
func SkipBackstop() *atomic.Bool { return &skipBackstop }

// LetGoHook runs as a lane's writer lets its stream go.
func LetGoHook() *atomic.Pointer[func(*lane)] { return &letGoHook }

// PollActive and CallerWindow pin the service to its naps when long.
func PollActive() *time.Duration { return instream.PollActive() }

// CallerWindow is how recently a caller must have called to be waited for.
func CallerWindow() *time.Duration { return instream.CallerWindow() }

// SkipRearm leaves owed acks unarmed as a stream is let go (the negative
// control of letGo's re-arming).
func SkipRearm() *atomic.Bool { return &skipRearm }

// SetSendDelay sets how long queued work waits for the caller before the
// writer goroutine takes it (and a handed batch's backstop); the returned
// func restores it.
func SetSendDelay(d time.Duration) (restore func()) {
	old := sendDelay.get()
	sendDelay.set(d)
	return func() { sendDelay.set(old) }
}
