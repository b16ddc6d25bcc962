package dataplane

import (
	"sync/atomic"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/intranode"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
)

// The contract's types live in host/dataplane/link, where the transport
// packages reach them without importing the core; these aliases keep the
// names host/plugin and the tests use.

// Owner is link.Owner: what the dataplane needs from the communicator.
type Owner = link.Owner

// PartOwner is link.PartOwner.
type PartOwner = link.PartOwner

// ShadowOwner is link.ShadowOwner.
type ShadowOwner = link.ShadowOwner

// SharedOwner is link.SharedOwner.
type SharedOwner = link.SharedOwner

// StrongOwner is link.StrongOwner.
type StrongOwner = link.StrongOwner

// LaneObserver is link.LaneObserver.
type LaneObserver = link.LaneObserver

// PeerReg is link.PeerReg: a peer's announcement of a registration.
type PeerReg = link.PeerReg

// Pin is link.Pin: a registration the target side holds.
type Pin = link.Pin

// Op is link.Op: one operation to post.
type Op = link.Op

// Request, Plan and Route are Op's three parts (link.Op).
type (
	Request = link.Request
	Plan    = link.Plan
	Route   = link.Route
)

// DeviceMemory is link.DeviceMemory: a device registration for
// RegisterDevice.
type DeviceMemory = link.DeviceMemory

// Props is link.Props: what a transport to one peer can do.
type Props = link.Props

// NewPin is link.NewPin.
func NewPin(n *atomic.Int32) Pin { return link.NewPin(n) }

// Now is link.Now, the clock of Op.NotBefore.
func Now() int64 { return link.Now() }

// Span is link.Span: whether [off, off+n) lies inside size bytes.
func Span(off, n, size uint64) bool { return link.Span(off, n, size) }

// ShareOffer is link.ShareOffer: a MsgReg whose tag names the sender's
// descriptor server (PeerReg.Share).
const ShareOffer = link.ShareOffer

// StatusRing is link.StatusRing: a put header whose payload is in the
// intra-node staging ring.
const StatusRing = link.StatusRing

// StreamRingSize is intranode.StreamRingSize: the data size of a lane's
// shared-memory stream.
const StreamRingSize = intranode.StreamRingSize
