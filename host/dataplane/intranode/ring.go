package intranode

import (
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// The lanes' side of the intra-node staging ring (SPEC.md §4, "Device
// memory"; the ring itself is host/devmem/staging's): a put between two
// processes of one host whose source or target is device memory moves
// through a shared ring of slots while the stream carries its header, in
// order with everything else, and the target applies the signal only after
// its last copy completed.

// The sending lane's ring state, kept by whoever holds the stream.
const (
	ringUnknown = iota // not tried yet
	ringOn             // attached by the target
	ringOff            // refused, disabled or failed: the stream carries it
)

// intraLane is the intra-node side of one of our lanes (LaneSide): its
// payloads moved beside the stream (intranode.go), its staging ring and
// its shared-memory stream (stream.go). It reaches the lane only through
// LaneIO.
type intraLane struct {
	x *Link
	l link.LaneIO
	p link.Peer
	laneRing
	laneShm
	liov [1]unix.Iovec       // scratch for process_vm_writev/readv
	riov [1]unix.RemoteIovec // (vm)
}

// Put and get move op's payload beside the stream (Link.Put, get).
func (x *intraLane) Put(op *link.Op) link.SideMove { return x.x.put(x, op) }
func (x *intraLane) Get(op *link.Op) link.SideMove { return x.x.get(x, op) }

// Release frees the lane's ring and shared-memory stream once its
// goroutines ended.
func (x *intraLane) Release() {
	x.releaseRing()
	x.releaseStream()
}

// laneRing is a lane's side of the intra-node staging ring: state and
// fill count owned by whoever holds writing; the mapping is read by
// replies too.
type laneRing struct {
	ringState  int
	ringFilled uint32
	ring       atomic.Pointer[staging.Ring]
	ringNo     atomic.Bool // the target refused the ring
}

// RingReady reports whether this lane's put goes through the staging ring,
// offering one to the target on the first call and waiting for its answer
// (the ring's attached word, or wire.MsgRingNo on the reply stream). Called by
// whoever holds the stream, after what was gathered before was written.
func (x *intraLane) RingReady() (bool, error) {
	switch x.ringState {
	case ringOn:
		return true, nil
	case ringOff:
		return false, nil
	}
	x.ringState = ringOff
	if x.p.Mesh().NoIntraRing {
		return false, nil
	}
	r, err := staging.NewRing(staging.RingSlots, x.p.Mesh().StageChunk)
	if err != nil {
		logx.Info(abi.SubsysNet, "NET/wasm: intra-node path to rank %d: no staging ring (%v); device payloads ride the TCP lanes", x.p.Rank(), err)
		return false, nil
	}
	x.ring.Store(r)
	o := r.Offer()
	h := wire.Header{Typ: wire.MsgRing, Off: o.FD, Size: o.Size, Context: o.Slots, SigValue: o.Chunk}
	var hb [wire.HeaderSize]byte
	h.Encode(hb[:])
	if err := x.l.WriteIov([][]byte{hb[:]}); err != nil {
		return false, err
	}
	if on, err := r.AwaitAttach(x.ringNo.Load, x.l.Gone); !on {
		return false, err
	}
	x.ringState = ringOn
	logx.Info(abi.SubsysNet, "NET/wasm: intra-node path to rank %d, lane %d: device payloads through a shared staging ring (%d slots of %d KiB)",
		x.p.Rank(), x.l.Index(), r.Slots(), r.Chunk()>>10)
	return true, nil
}

// RingOff reports that the ring is refused, disabled or failed: the
// stream carries the lane's device payloads.
func (x *intraLane) RingOff() bool { return x.ringState == ringOff }

// RingRefused is the reply stream's wire.MsgRingNo: wake the offer's wait.
func (x *intraLane) RingRefused() {
	x.ringNo.Store(true)
	if r := x.ring.Load(); r != nil {
		r.WakeAttach()
	}
}

// RingSend moves op's payload through the ring; its header (wire.StatusRing) is
// on the stream already.
func (x *intraLane) RingSend(op *link.Op) error {
	k, err := x.ring.Load().Send(x.ringFilled, op.LocalCtx, op.Local, op.Size, x.l)
	if err == nil {
		x.ringFilled = k
	}
	return err
}

// releaseRing frees the lane's ring once its goroutines ended.
func (x *intraLane) releaseRing() {
	if r := x.ring.Swap(nil); r != nil {
		r.Close()
	}
}

// attachHook, when set (tests), refuses every ring offer with its error.
var attachHook func() error

// AttachRing maps the staging ring the peer offered on one of its lanes
// (SidePath) into rx.
func (x *Link) AttachRing(rx *staging.Receiver, h *wire.Header) error {
	if attachHook != nil {
		return attachHook()
	}
	return rx.Attach(x.PeerPid(), staging.Offer{FD: h.Off, Size: h.Size, Slots: h.Context, Chunk: h.SigValue})
}
