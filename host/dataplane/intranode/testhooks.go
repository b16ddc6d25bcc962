package intranode

import (
	"sync/atomic"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/shmstream"
)

// Hooks into an intra-node link for the integration tests (package
// intranode_test and the mesh's, which build whole meshes with
// host/dataplane/meshtest): they look at or steer a lane's ring and
// stream. Test-only: nothing in the data path calls them.

// Lane names a lane's intra-node side (tcp.Lane.Side's value).
type Lane = intraLane

// The states of a lane's ring and stream.
const (
	RingOn  = ringOn
	RingOff = ringOff
)

// RingState is the lane's staging ring state (its writer's).
func (x *intraLane) RingState() int { return x.ringState }

// SState is the lane's shared-memory stream state (its writer's).
func (x *intraLane) SState() int { return x.sState }

// Sring is the lane's shared-memory stream, once on.
func (x *intraLane) Sring() *atomic.Pointer[shmstream.Ring] { return &x.sring }

// SNo reports that the target refused the stream.
func (x *intraLane) SNo() *atomic.Bool { return &x.sNo }

// Bells counts the bells the lane rang.
func (x *intraLane) Bells() *atomic.Uint64 { return &x.bells }

// On reports the single-copy path usable for the peer.
func (x *Link) On() *atomic.Bool { return &x.on }

// Selfs counts operations to this very rank moved by a device copy.
func (x *Link) Selfs() *atomic.Int64 { return &x.selfs }

// Mapped counts operations moved through a mapping.
func (x *Link) Mapped() *atomic.Int64 { return &x.mapped }

// AttachHook, when set, refuses a staging ring's attach with its error.
func AttachHook() *func() error { return &attachHook }

// NewStreamRing makes a lane's shared-memory stream.
func NewStreamRing() *func(size uint64) (*shmstream.Ring, error) { return &newStreamRing }

// StreamRefusal, when set, makes the target refuse streams with it.
func StreamRefusal() *atomic.Pointer[error] { return &streamRefusal }

// AddrPtr turns an address in this process into a pointer.
func AddrPtr(a uint64) unsafe.Pointer { return addrPtr(a) }

// NewEvents makes a link's events whose peer's were opened in peerCtx.
func NewEvents(peerCtx uintptr) *Events { return &linkEvents{peerCtx: peerCtx} }

// DropBells makes every bell of every shared-memory stream a lost one
// (on) or rings them again (off): the wake backstop's test.
func DropBells(on bool) { dropBells.Store(on) }
