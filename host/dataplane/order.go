package dataplane

import (
	"fmt"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// The target side every transport shares: a put (or a piece of one) has
// landed in our memory; its signal, if any, becomes visible once everything
// the peer numbered before it has landed too (the peer's orderer,
// host/seqorder).

// sigRef is link.Signal: a signal word, and the order of mapped copies it
// follows.
type sigRef = link.Signal

// devAddr is link.DevAddr.
func devAddr(p unsafe.Pointer, off uint64) uintptr { return link.DevAddr(p, off) }

// landed records that the put numbered seq landed and applies sig (when
// valid) in order. seq 0 means one ordered channel: apply at once. A
// number the orderer refuses (a duplicate, or beyond the window) is a
// protocol violation: the caller drops the peer with the error returned.
func (p *peer) landed(seq uint64, sig sigRef, add uint64) error {
	if seq != 0 {
		if err := p.order.Done(seq, sig, add); err != nil {
			sig.Pin.Release()
			err = fmt.Errorf("protocol violation by rank %d: %w", p.rank, err)
			logx.Warn(abi.SubsysNet, "NET/wasm: %v; dropping its connections", err)
			return err
		}
		return nil
	}
	if sig.Valid() {
		if err := sig.Apply(add); err != nil {
			p.m.owner.PeerFailed(p.rank, fmt.Errorf("signal from rank %d: %w", p.rank, err))
		}
		sig.Pin.Release()
	}
	return nil
}

// signalTarget resolves and checks the 64-bit signal word a put with
// signal updates, and the amount to add to it.
func (p *peer) signalTarget(mrID uint32, off uint64, op uint8, value uint64) (sigRef, uint64, abi.Result) {
	if op&wire.SigApplied != 0 {
		return sigRef{}, 0, abi.Success // added by the sender's agent (wire.SigApplied)
	}
	base, size, ctx, pin, ok := p.m.owner.Resolve(mrID)
	if !ok {
		return sigRef{}, 0, abi.InvalidArgument
	}
	if !Span(off, 8, size) || (uintptr(base)+uintptr(off))%8 != 0 || (op != abi.SignalOpInc && op != abi.SignalOpAdd) {
		pin.Release()
		return sigRef{}, 0, abi.InvalidArgument
	}
	ref := sigRef{Pin: pin}
	if ctx != 0 {
		ref.Dev, ref.Ctx = devAddr(base, off), ctx
		if so, ok := p.m.owner.(ShadowOwner); ok {
			ref.Sh = so.SignalShadow(mrID)
		}
	} else {
		ref.Host = (*uint64)(unsafe.Add(base, off))
	}
	if op == abi.SignalOpInc {
		return ref, 1, abi.Success
	}
	return ref, value, abi.Success
}
