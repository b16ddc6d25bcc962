package dataplane

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// The target side every transport shares: a put (or a piece of one) has
// landed in our memory; its signal, if any, becomes visible once everything
// the peer numbered before it has landed too (the peer's orderer,
// host/seqorder).

// sigRef is a signal word: host memory updated atomically, or a word of
// device memory updated through the device runtime (staging.AddSignal).
// On an intra-node link with interprocess events it also carries the
// ordering of the peer's mapped copies (ipc_events.go), done when it is
// applied: in sequence order, so a signal numbered after a mapped
// put+signal that another lane carried follows that put's bytes too.
type sigRef struct {
	host *uint64
	dev  uintptr
	ctx  uintptr
	sh   *staging.Shadow // the registration's never-reset shadow, or nil
	pin  Pin             // the signal registration, held until the signal is applied
	evs  link.Orderer    // the link's events, or nil: nothing to order
	ev   uintptr         // the peer's event this put+signal named, or 0
}

// Valid reports whether s has something to apply (seqorder.Signal): a
// word, or the order of a mapped put whose signal was refused.
func (s sigRef) Valid() bool { return s.word() || s.ev != 0 }

// word reports whether s names a signal word.
func (s sigRef) word() bool { return s.host != nil || s.dev != 0 }

// onStream reports whether Apply writes s on its context's stream, after
// what is queued there.
func (s sigRef) onStream() bool { return s.dev != 0 && staging.SignalStreamOrdered(s.ctx, s.sh) }

// Release lets go of the signal registration's pin.
func (s sigRef) Release() { s.pin.Release() }

// Apply adds v to the signal word, after the payload is visible.
func (s sigRef) Apply(v uint64) error {
	if s.evs != nil {
		if err := s.evs.Order(s.ev, s.ctx, s.onStream()); err != nil {
			return err
		}
	}
	switch {
	case s.host != nil:
		// A device payload before it may still be queued on a stream:
		// the host word must not say it landed before it did.
		if err := staging.Fence(); err != nil {
			return err
		}
		atomic.AddUint64(s.host, v)
		return nil
	case s.dev != 0:
		return staging.AddSignal(s.ctx, s.dev, v, s.sh)
	}
	return nil // only the order of a refused signal's put
}

// devAddr is the device address a registration base stands for.
func devAddr(p unsafe.Pointer, off uint64) uintptr { return uintptr(p) + uintptr(off) }

// landed records that the put numbered seq landed and applies sig (when
// valid) in order. seq 0 means one ordered channel: apply at once. A
// number the orderer refuses (a duplicate, or beyond the window) is a
// protocol violation: the caller drops the peer with the error returned.
func (p *peer) landed(seq uint64, sig sigRef, add uint64) error {
	if seq != 0 {
		if err := p.order.Done(seq, sig, add); err != nil {
			sig.pin.Release()
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
		sig.pin.Release()
	}
	return nil
}

// signalTarget resolves and checks the 64-bit signal word a put with
// signal updates, and the amount to add to it.
func (p *peer) signalTarget(mrID uint32, off uint64, op uint8, value uint64) (sigRef, uint64, abi.Result) {
	base, size, ctx, pin, ok := p.m.owner.Resolve(mrID)
	if !ok {
		return sigRef{}, 0, abi.InvalidArgument
	}
	if !Span(off, 8, size) || (uintptr(base)+uintptr(off))%8 != 0 || (op != abi.SignalOpInc && op != abi.SignalOpAdd) {
		pin.Release()
		return sigRef{}, 0, abi.InvalidArgument
	}
	ref := sigRef{pin: pin}
	if ctx != 0 {
		ref.dev, ref.ctx = devAddr(base, off), ctx
		if so, ok := p.m.owner.(ShadowOwner); ok {
			ref.sh = so.SignalShadow(mrID)
		}
	} else {
		ref.host = (*uint64)(unsafe.Add(base, off))
	}
	if op == abi.SignalOpInc {
		return ref, 1, abi.Success
	}
	return ref, value, abi.Success
}
