package link

import (
	"sync/atomic"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/inbox"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
)

// Signal is a signal word: host memory updated atomically, or a word of
// device memory updated through the device runtime (staging.AddSignal).
// On an intra-node link with interprocess events or agent marks it also
// carries the ordering of the peer's mapped copies, done when it is
// applied: in sequence order, so a signal numbered after a mapped
// put+signal that another lane carried follows that put's bytes too.
type Signal struct {
	Host *uint64         // a host word, or nil
	Dev  uintptr         // a device word's address, or 0
	Ctx  uintptr         // the device context of Dev
	Sh   *staging.Shadow // the registration's never-reset shadow, or nil
	Pin  Pin             // the signal registration, held until the signal is applied
	Evs  Orderer         // the link's events, or nil: nothing to order
	Ev   uintptr         // the peer's event this put+signal named, or 0
	// Marks, MarkK and MarkV: the peer's mark page and the word and
	// number this put+signal named (wire.StatusMark); Marks nil: none.
	Marks *staging.PeerMarks
	MarkK uint8
	MarkV uint64
	// InboxRow and InboxPos: the row of our peer inbox and the position +
	// 1 of the entry this put+signal's sender wrote there
	// (wire.StatusInbox); InboxPos 0: none. InboxPid is the sender's
	// process.
	InboxRow uint8
	InboxPos uint64
	InboxPid int
	// Held is the put's payload, its copy held for this signal
	// (staging.LandHeld), or nil. Only a signal applied at once, on the
	// thread that read the payload, carries one.
	Held *staging.Held
}

// Valid reports whether s has something to apply (seqorder.Signal): a
// word, or the order of a mapped put whose signal was refused.
func (s Signal) Valid() bool { return s.Word() || s.Ev != 0 || s.Marks != nil || s.InboxPos != 0 }

// Word reports whether s names a signal word.
func (s Signal) Word() bool { return s.Host != nil || s.Dev != 0 }

// OnStream reports whether Apply writes s on its context's stream, after
// what is queued there.
func (s Signal) OnStream() bool { return s.Dev != 0 && staging.SignalStreamOrdered(s.Ctx, s.Sh) }

// Release lets go of the signal registration's pin.
func (s Signal) Release() { s.Pin.Release() }

// Apply adds v to the signal word, after the payload is visible.
func (s Signal) Apply(v uint64) error {
	if s.InboxPos != 0 {
		// Our agent adds the signal; later ones we apply follow it.
		if err := inbox.Wait(int(s.InboxRow), s.InboxPos, s.InboxPid); err != nil {
			return err
		}
	}
	if s.Evs != nil {
		if err := s.Evs.Order(s.Ev, s.Ctx, s.OnStream()); err != nil {
			return err
		}
	}
	if s.Marks != nil {
		// Our agent may wait for the mark itself, before the signal
		// (staging.AddSignalAfterMark); else the host waits.
		if s.Dev != 0 && s.Held == nil {
			if done, err := staging.AddSignalAfterMark(s.Ctx, s.Dev, v, s.Sh, s.Marks, int(s.MarkK), s.MarkV); done || err != nil {
				return err
			}
		}
		if err := s.Marks.Wait(int(s.MarkK), s.MarkV); err != nil {
			return err
		}
	}
	switch {
	case s.Host != nil:
		if err := s.Held.Flush(); err != nil {
			return err
		}
		// A device payload before it may still be queued on a stream:
		// the host word must not say it landed before it did.
		if err := staging.Fence(); err != nil {
			return err
		}
		atomic.AddUint64(s.Host, v)
		return nil
	case s.Dev != 0:
		return staging.AddSignalAfter(s.Ctx, s.Dev, v, s.Sh, s.Held)
	}
	return s.Held.Flush() // only the order of a refused signal's put
}

// DevAddr is the device address a registration base stands for.
func DevAddr(p unsafe.Pointer, off uint64) uintptr { return uintptr(p) + uintptr(off) }
