package link

import (
	"errors"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
)

// Owner is what the dataplane needs from the communicator above it.
type Owner interface {
	// Resolve maps a registration id to its local memory, for the target
	// side. ctx is non-zero for device memory (base is then a device address
	// that must never be dereferenced). It must be lock-free: it runs once
	// per incoming operation.
	// On success the registration is pinned: deregMrSym waits until the
	// returned Pin is released, so memory being landed into, served from or
	// holding a pending signal word is never handed back mid-operation.
	Resolve(mrID uint32) (base unsafe.Pointer, size uint64, ctx uintptr, pin Pin, ok bool)
	// PeerRegistered records a peer's registration (MsgReg).
	PeerRegistered(peer int, r PeerReg)
	// Complete finishes the request named by tag.
	Complete(tag uint64, status abi.Result)
	// PeerFailed reports a lost peer or an operation the peer rejected.
	PeerFailed(peer int, err error)
}

// PeerReg is a peer's announcement of a registration (MsgReg).
type PeerReg struct {
	MrID       uint32
	Size, Base uint64 // its size, and its address in the peer's process
	Dev        bool   // device memory
	// Share, non-zero, names the peer's descriptor server (host/fdpass)
	// from which an intra-node peer may fetch the registration's device
	// allocations to map them (SPEC.md §4, "Device windows mapped").
	Share uint64
	// Inbox, non-zero, is 1 + the entry of the peer's inbox table that
	// holds the registration (host/devmem/inbox): the peer's agent adds
	// our inbox entries' signals to its words.
	Inbox uint8
}

// PartOwner is implemented by an Owner whose requests can wait for one
// completion more than they were posted with: an operation of a rank to
// itself whose device copy is queued (staging.CopySelfAsync) and which the
// target also acknowledges completes once both happened. Without it such
// an operation waits for its copy.
type PartOwner interface {
	// AddPart makes the request named by tag wait for one more Complete;
	// it is called before the request can complete.
	AddPart(tag uint64)
}

// Pin holds a registration the target side is using (see Owner.Resolve).
// The zero Pin holds nothing. Releasing is one atomic add.
type Pin struct{ n *atomic.Int32 }

// NewPin pins by adding one to n; Release takes it back.
func NewPin(n *atomic.Int32) Pin { n.Add(1); return Pin{n} }

// Release gives the registration back.
func (p Pin) Release() {
	if p.n != nil {
		p.n.Add(-1)
	}
}

// Op is one operation to post. It is copied into the peer's queue, so posting
// allocates nothing. Its three parts say who decided what: the caller
// (Request), the backend's plan (Plan), and the mesh and the transport on
// the way to the wire (Route). Their fields are promoted: op.Size is
// op.Request.Size.
type Op struct {
	Request
	Plan
	Route
}

// Request is what the caller asked: the operation, its registrations, its
// bytes and its signal, as NCCL's proxy posted them.
type Request struct {
	Msg      uint8 // the request's wire message type: MsgPut, MsgPutSignal, MsgGet or MsgReg
	SigOp    uint8
	MrID     uint32 // target registration (dst for puts, src for gets)
	SigMrID  uint32
	Context  uint32
	Tag      uint64         // request handle, echoed back on errors
	Local    unsafe.Pointer // put: source bytes; get: destination bytes
	LocalMr  uint32         // the registration Local lies in (its fabric descriptor)
	LocalCtx uintptr        // non-zero: Local is device memory of this context
	Dev      bool           // MsgReg: the registration is device memory
	Size     uint64
	Off      uint64 // offset in the target registration (MsgReg: its address)
	SigOff   uint64
	SigValue uint64 // MsgReg: the registration's fabric key
	// Posted is when the op was issued (host/profile's clock), 0 unless
	// NCCL_RMA_WASM_PROFILE is on.
	Posted int64
}

// Plan is what the backend's plan decided for the operation (SPEC.md
// §8.10).
type Plan struct {
	Chunk     uint64 // non-zero: stripe over the lanes in pieces of this size
	NotBefore int64  // non-zero: not sent before this Now() (pacing)
	Codec     uint32 // guestabi codec word of a put's payload on TCP
}

// Route is where the operation goes and how it got there: set by the mesh
// (Seq), the intra-node path (Remote, Mapped, MapCtx, Event, Mark) and a lane
// failover (Resent, From).
type Route struct {
	Remote uint64 // address of Off in the target process (intra-node path)
	// Mapped, when non-zero, is the address of Off in this process: the
	// target's device memory mapped here (intra-node IPC), reachable from
	// MapCtx's device; the payload is copied straight into (or, for a
	// get, out of) it.
	Mapped uint64
	MapCtx uintptr
	// Event, set by the lane (1 + an index), names our interprocess event
	// recorded after the mapped copy, which the target waits for before
	// it applies the signal (ipc_events.go).
	Event uint8
	// Mark, set by the lane (1 + a word of our mark page), and MarkV: the
	// device agent writes MarkV to that word after the mapped copy, and
	// the target waits for it before it applies the signal
	// (staging.CopyMappedMark).
	Mark  uint8
	MarkV uint64
	// SigMapped, when non-zero, is the address here of the target's
	// signal word, mapped: the device agent of the payload's context (or,
	// for a signal alone, of MapCtx) may add the signal itself
	// (NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL; the intra-node link's direct).
	SigMapped uint64
	// InboxIdx, when non-zero, is 1 + the entry of the target's peer inbox
	// table that holds the signal registration (the caller's, from the
	// target's MsgReg); the intra-node link's direct path then has our
	// agent write an entry into the target's inbox (host/devmem/inbox)
	// after the copy, and sets Inbox (1 + our row there) and InboxPos (the
	// entry's position + 1), which the header carries.
	InboxIdx uint8
	Inbox    uint8
	InboxPos uint64
	// Direct: the caller found op fit for the direct path (SigMapped
	// set, or a put into mapped device memory from device memory); the
	// mesh's directRoute confirms or clears it.
	Direct bool
	// Placed, set by the lane: the side path placed the payload in the
	// target's memory and Config.PlacedCompletion is on; the header tells
	// the target (its signal, its number), and the request completes
	// once that header was written, not on the target's ack.
	Placed bool
	Seq    uint64 // set by the mesh when lanes > 1 (signal order; completion counts per lane)
	// Set by a lane failover (tcp_failover.go): the op is sent again on
	// another lane; From is the lane that carried it first.
	Resent bool
	From   uint8
}

// Now is the dataplane's clock for Op.NotBefore: monotonic nanoseconds.
func Now() int64 { return int64(time.Since(epoch)) }

var epoch = time.Now()

// OpDone replaces Op.Msg when the writer completed the operation itself
// (the intra-node path): nothing to send.
const OpDone = 0

// ShadowOwner is implemented by an Owner whose device registrations may
// carry a never-reset signal shadow (staging.Shadow): signals to their
// words are written, not read and written.
type ShadowOwner interface {
	// SignalShadow returns registration mrID's shadow, or nil; the caller
	// holds a Pin of the registration.
	SignalShadow(mrID uint32) *staging.Shadow
}

// SharedOwner is implemented by an Owner whose device registrations may
// be mapped into peers on this host (SPEC.md §4, "Device windows mapped"):
// such a peer reads and writes them without this target's service, so a
// put this target acknowledges must have landed already, not merely be
// queued behind the stream's other work.
type SharedOwner interface {
	// Shared reports whether registration mrID was handed to a peer.
	Shared(mrID uint32) bool
}

// StrongOwner is implemented by an Owner whose registrations may be
// flagged strongly ordered (NCCL_NET_MR_FLAG_FORCE_SO): a device payload
// put into one lands with synchronous copies, after every asynchronous
// copy queued before it, so that its completion says everything before
// it landed (NCCL's RMA proxy flushes with such a put to its own rank).
type StrongOwner interface {
	// StronglyOrdered reports whether registration mrID is flagged so;
	// the caller holds a Pin of it.
	StronglyOrdered(mrID uint32) bool
}

// LaneObserver is an Owner that wants to hear of a lane failover: lane
// of the connection to peer failed and moved operations went to the
// others. It is called once per lane, from the lane's reader goroutine, before
// any moved operation is resubmitted.
type LaneObserver interface {
	LaneFailed(peer, lane, moved int, err error)
}

// Span reports whether [off, off+n) lies inside a registration of size
// bytes, without overflowing. Initiator and target check with the same rule.
func Span(off, n, size uint64) bool { return off <= size && n <= size-off }

// DeviceMemory describes a device registration for RegisterDevice.
type DeviceMemory struct {
	Iface, Device int    // devmem.IfaceCUDA or IfaceROCR, and the ordinal
	DMABUFFd      int    // a DMA-BUF of the range (-1: none); read during the call only
	DMABUFOff     uint64 // the range's offset in it
	// Export, when not nil, makes a DMA-BUF of the range (an fd the
	// caller closes, and the offset): used when no fd came with the
	// registration and the loaded libfabric imports DMA-BUFs, which is how
	// NICs reach memory they cannot pin by address (ROCm without a
	// peer-memory module, for one).
	Export func() (fd int, off uint64, err error)
}

// ErrPeerGone is the status of operations to a peer that closed or failed.
var ErrPeerGone = errors.New("peer connection lost")

// StatusRing marks a put header whose payload is in the intra-node
// staging ring, not on the stream (requests use status for the payload's
// codec otherwise).
const StatusRing = 0x8000

// ShareOffer in a MsgReg's sigMrID says that its tag names the sender's
// descriptor server (PeerReg.Share).
const ShareOffer = 1
