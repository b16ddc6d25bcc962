package link

import (
	"io"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/inbox"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// The side path's contract with a TCP lane: a transport that moves
// payloads beside TCP's streams (the intra-node path) answers LaneSide
// for each lane, and reaches the lane back through LaneIO.

// Events are an intra-node link's interprocess events as the service
// orders the peer's mapped put+signals with them.
type Events interface {
	Orderer
	// PeerOpened reports that the peer's events were opened here.
	PeerOpened() bool
	// PeerEvent is the peer's event i, 0 when there is none such.
	PeerEvent(i int) uintptr
	// PeerMarks is the peer's mark page mapped here, nil when it was
	// never handed over (staging's marks.go).
	PeerMarks() *staging.PeerMarks
	// PeerInbox is the peer's inbox row mapped here (we send), nil when
	// none was handed over; InboxRow is the row of ours the peer was
	// given (-1: none) and the peer's process (host/devmem/inbox).
	PeerInbox() *inbox.Peer
	InboxRow() (row, pid int)
}

// LaneIO is what a lane offers its side (LaneSide): writes on its
// stream, its liveness, and the device copies its batch gathers.
type LaneIO interface {
	// WriteIov writes iov on the lane's stream (the shared-memory one
	// once on); writeSocket on its socket.
	WriteIov(iov [][]byte) error
	WriteSocket(iov [][]byte) error
	// Raw reports that the socket's RawConn is at hand; control runs fn
	// on its descriptor (a bell).
	Raw() bool
	Control(fn func(fd uintptr)) error
	// Gone reports the peer dead or the lane down.
	Gone() bool
	// Index is the lane's number.
	Index() int
	// Settle waits for the copies the batch gathered so far; Gathered
	// is the batch's gather, which copies (AddCopy) and a device agent's
	// adds (AddAdd) join.
	Settle()
	Gathered() *staging.Gather
}

// LaneSide is what a side path does for one of our lanes (the intra-node
// transport's intraLane): a staging ring for device payloads beside the
// stream, and a shared-memory stream in place of the socket. Only whoever
// holds writing calls it, but for StreamLive, refusals and release.
type LaneSide interface {
	// Put and get move op's payload beside the stream, or report SideNo
	// (the stream carries it).
	Put(op *Op) SideMove
	Get(op *Op) SideMove
	// RingOff reports that the ring is refused, disabled or failed.
	RingOff() bool
	// RingReady reports whether the lane's put goes through the ring,
	// offering one on the first call; RingSend moves op's payload through
	// it once its header is on the stream; RingRefused is the reply
	// stream's wire.MsgRingNo.
	RingReady() (bool, error)
	RingSend(op *Op) error
	RingRefused()
	// StreamOn reports whether the lane writes its requests into a shared
	// ring, offering one on the first call; WriteStream writes them there;
	// StreamWriter is that ring as an io.Writer, nil while the socket
	// carries the requests; StreamLive is StreamOn for those who do not
	// hold writing; StreamRefused is the reply stream's wire.MsgStreamNo.
	StreamOn() bool
	WriteStream(iov [][]byte) error
	StreamWriter() io.Writer
	StreamLive() bool
	StreamRefused()
	// ShmState is the stall report's words on the shared-memory stream,
	// "" for none.
	ShmState() string
	// Release frees the mappings once the lane's goroutines ended.
	Release()
}

// TellsTarget reports whether op, its payload moved by a side path, still
// goes to the target as a header (which it acknowledges): a signal to
// apply, or a put's sequence number that landed. Gets are never numbered
// and complete where they are copied.
func TellsTarget(op *Op) bool {
	return op.Msg == wire.MsgPutSignal || (op.Msg == wire.MsgPut && op.Seq != 0)
}

// SideMove is what a side path did with an operation's payload.
type SideMove uint8

const (
	SideNo       SideMove = iota // nothing: the lane sends it
	SideMoved                    // the payload is there
	SideQueued                   // its copy is queued; the copy completes the request once more
	SideGathered                 // its copy is queued in the batch (staging.Gather.AddCopy): done once the batch waited for it
)
