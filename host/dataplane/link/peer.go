package link

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/seqorder"
)

// Config is what a mesh tells its transports once, at connect: who it
// is, whom it answers to, and the tunables of Options they apply. The
// transports read it; nobody writes it after Connect.
type Config struct {
	Rank  int   // this rank
	Owner Owner // the communicator above the mesh
	// WG counts the transports' goroutines; the mesh's Close waits for it.
	WG *sync.WaitGroup
	// StageChunk is the size of the pieces device payloads are staged in.
	StageChunk uint64
	// LocalCompletion completes a put once the kernel has its bytes.
	LocalCompletion bool
	// PlacedCompletion completes a put whose payload the side path placed
	// in the peer's memory once its header was written (and its copy
	// executed), not on the target's ack (Route.Placed).
	PlacedCompletion bool
	// OrderWindow bounds how far a peer's sequence numbers may run ahead.
	OrderWindow uint64
	// SpinWait and Spinners tune the stream readers' spinning (host/spin).
	SpinWait time.Duration
	Spinners int
	// CloseTimeout bounds the teardown's waits.
	CloseTimeout time.Duration
	// NoIntraRing and NoIntraStream keep the intra-node path off its
	// staging ring and off shared-memory streams.
	NoIntraRing, NoIntraStream bool
	// GatherWriter hands a batch whose small device payloads are being
	// gathered from the caller's thread to the lane's writer goroutine,
	// which waits for the copies and writes it (NCCL_RMA_WASM_GATHER_WRITER).
	GatherWriter bool
	// FlushAskAtOnce lets a flush ask at once for acks the target keeps
	// holding, instead of waiting first (NCCL_RMA_WASM_FLUSH_ASK_AT_ONCE).
	FlushAskAtOnce bool
	// AckHoldAdapt holds an ack for a batch of ours only while holding
	// pays, instead of whenever a lane wrote since the stream last
	// drained (NCCL_RMA_WASM_ACK_HOLD_ADAPT).
	AckHoldAdapt bool
}

// Peer is what a transport asks of, and tells, the mesh about the rank it
// moves operations to: its identity, its liveness and teardown, its
// signals' orderer, and the operations it fails. The mesh's peer
// implements it; every method is cheap and allocates nothing.
type Peer interface {
	// Rank is the peer's rank; Mesh is the mesh's Config.
	Rank() int
	Mesh() *Config
	// Transport is the transport the mesh chose for the peer (the
	// outermost layer, which failover resubmits through).
	Transport() Transport
	// Lanes is how many lanes the mesh opens to the peer; Live is the
	// first lane at or after lane that has not failed.
	Lanes() int
	Live(lane int) int

	// Dead reports that the peer is gone; RaiseDead raises the flag
	// alone (the transport's stop), MarkDead tears the peer down once
	// and reports err; Quit is closed once it is torn down.
	Dead() bool
	RaiseDead()
	MarkDead(err error)
	Quit() <-chan struct{}
	// Closing reports that our Close began.
	Closing() bool
	// Fail completes op with an error without sending it; FailCause is
	// Fail for an op whose failure is about to mark the peer dead with
	// err. op is passed by value: a pointer through an interface call
	// escapes, and the paths that call it must not allocate.
	Fail(op Op)
	FailCause(op Op, err error)

	// ByeSeen reports that the peer said goodbye on one of its lanes;
	// SeeBye records it. AckBye counts one goodbye of ours the peer
	// acknowledged; ByeGone forgets one that never will be (its lane
	// failed).
	ByeSeen() bool
	SeeBye()
	AckBye()
	ByeGone()
	// DirectOff is set once an operation to the peer went without the
	// device agent's own add of its signal (Route.SigMapped): from then
	// on none does, as such an add could overtake that operation.
	DirectOff() *atomic.Bool
	// Down has bit i set once lane i failed over; Opened once lane i has
	// a stream. Both are shared with the mesh's lane choice.
	Down() *atomic.Uint32
	Opened() *atomic.Uint32
	// AskedAcks counts the peer's asks for our acks that we answered.
	AskedAcks() *atomic.Int64

	// Order is the orderer of the peer's signals (its sequence numbers).
	Order() *seqorder.Orderer[Signal]
	// Landed records that the peer's put numbered seq landed and applies
	// sig (when valid) in order; an error is a protocol violation.
	Landed(seq uint64, sig Signal, add uint64) error
	// SignalTarget resolves and checks the signal word a put with signal
	// updates, and the amount to add to it.
	SignalTarget(mrID uint32, off uint64, op uint8, value uint64) (Signal, uint64, abi.Result)

	// Gone is Dead, as the staging ring's liveness check asks it
	// (staging.Liveness).
	Gone() bool
	// DialLane opens lane of the connection to the peer (a lane opened
	// when first used): the mesh's dial and hello.
	DialLane(lane int) (*net.TCPConn, error)
}
