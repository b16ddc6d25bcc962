package dataplane

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// The target side every transport shares: a put (or a piece of one) has
// landed in our memory; its signal, if any, becomes visible once everything
// the peer numbered before it has landed too.

// ShadowOwner is implemented by an Owner whose device registrations may
// carry a never-reset signal shadow (staging.Shadow): signals to their
// words are written, not read and written.
type ShadowOwner interface {
	// SignalShadow returns registration mrID's shadow, or nil; the caller
	// holds a Pin of the registration.
	SignalShadow(mrID uint32) *staging.Shadow
}

// sigRef is a signal word: host memory updated atomically, or a word of
// device memory updated through the device runtime (staging.AddSignal).
type sigRef struct {
	host *uint64
	dev  uintptr
	ctx  uintptr
	sh   *staging.Shadow // the registration's never-reset shadow, or nil
	pin  Pin             // the signal registration, held until the signal is applied
}

func (s sigRef) valid() bool { return s.host != nil || s.dev != 0 }

// apply adds v to the signal word, after the payload is visible.
func (s sigRef) apply(v uint64) error {
	if s.host != nil {
		atomic.AddUint64(s.host, v)
		return nil
	}
	return staging.AddSignal(s.ctx, s.dev, v, s.sh)
}

// devAddr is the device address a registration base stands for.
func devAddr(p unsafe.Pointer, off uint64) uintptr { return uintptr(p) + uintptr(off) }

// landed records that the put numbered seq landed and applies sig (when
// valid) in order. seq 0 means one ordered channel: apply at once. A
// number the orderer refuses (a duplicate, or beyond the window) is a
// protocol violation: the caller drops the peer with the error returned.
func (p *peer) landed(seq uint64, sig sigRef, add uint64) error {
	if seq != 0 {
		if err := p.order.done(seq, sig, add); err != nil {
			sig.pin.Release()
			err = fmt.Errorf("protocol violation by rank %d: %w", p.rank, err)
			logx.Warn(abi.SubsysNet, "NET/wasm: %v; dropping its connections", err)
			return err
		}
		return nil
	}
	if sig.valid() {
		if err := sig.apply(add); err != nil {
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

// orderer applies a peer's signals in sequence order when its operations
// arrive over several lanes: a signal becomes visible only after every put
// with a smaller sequence number has landed, which keeps signals strong.
// Sequence numbers start at 1; puts and signals each take one.
type orderer struct {
	onErr  func(error) // reports a signal that could not be applied
	window uint64      // numbers may land at most this far past next (0: DefaultOrderWindow)
	mu     sync.Mutex
	next   uint64 // every sequence number below next has been applied
	ring   []orderSlot
}

type orderSlot struct {
	state uint8 // 0 not yet, 1 landed, 2 signal waiting
	sig   sigRef
	add   uint64
}

// done records that seq landed; sig, when valid, is the signal word that
// seq adds add to once everything before it has landed. It refuses, and
// changes nothing, a number that already landed or lies window or more
// past the first missing one: neither happens on a healthy stream, and the
// window bounds the ring (and its memory) whatever a peer sends.
func (o *orderer) done(seq uint64, sig sigRef, add uint64) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.next == 0 {
		o.next = 1
	}
	if seq < o.next {
		return fmt.Errorf("sequence number %d arrived again (every number below %d has landed)", seq, o.next)
	}
	window := o.window
	if window == 0 {
		window = DefaultOrderWindow
	}
	if seq-o.next >= window {
		return fmt.Errorf("sequence number %d is %d past the first missing one (%d), beyond the window of %d", seq, seq-o.next, o.next, window)
	}
	for seq-o.next >= uint64(len(o.ring)) {
		o.grow()
	}
	s := &o.ring[seq%uint64(len(o.ring))]
	if s.state != 0 {
		return fmt.Errorf("sequence number %d arrived again", seq)
	}
	s.state, s.sig, s.add = 1, sig, add
	if sig.valid() {
		s.state = 2
	}
	for {
		s := &o.ring[o.next%uint64(len(o.ring))]
		if s.state == 0 {
			return nil
		}
		if s.state == 2 {
			if err := s.sig.apply(s.add); err != nil && o.onErr != nil {
				o.onErr(err)
			}
			s.sig.pin.Release()
		}
		*s = orderSlot{}
		o.next++
	}
}

// seen reports whether seq already landed (a resent put that did must not
// be applied again, tcp_failover.go).
func (o *orderer) seen(seq uint64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	next := max(o.next, 1)
	if seq < next {
		return true
	}
	if seq-next >= uint64(len(o.ring)) {
		return false
	}
	return o.ring[seq%uint64(len(o.ring))].state != 0
}

// grow doubles the window of sequence numbers that may land out of order.
func (o *orderer) grow() {
	n := max(2*len(o.ring), 1024)
	nr := make([]orderSlot, n)
	for i, s := range o.ring {
		if s.state != 0 {
			// slot i held the sequence number congruent to i within the
			// current window [next, next+len)
			seq := o.next + (uint64(i)-o.next%uint64(len(o.ring))+uint64(len(o.ring)))%uint64(len(o.ring))
			nr[seq%uint64(n)] = s
		}
	}
	o.ring = nr
}

// passed reports whether every sequence number up to seq was applied
// (the fabric transport acknowledges a goodbye then).
func (o *orderer) passed(seq uint64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.next > seq
}

// unwrap turns the low bits of a sequence number (the CQ data of a
// provider with 4 bytes of it) back into the number: every number that can
// still arrive is at least next, and fewer than 1<<bits are outstanding.
func (o *orderer) unwrap(w uint64, bits uint) uint64 {
	if bits >= 64 {
		return w
	}
	o.mu.Lock()
	next := max(o.next, 1)
	o.mu.Unlock()
	return next + (w-next)&(1<<bits-1)
}
