package seqorder

import (
	"bytes"
	"strings"
	"sync/atomic"
	"testing"
)

// hostWord is a Signal on a host word, counting the pins it holds.
type hostWord struct {
	p    *uint64
	pins *atomic.Int32
}

func (w hostWord) Valid() bool { return w.p != nil }

func (w hostWord) Apply(v uint64) error {
	atomic.AddUint64(w.p, v)
	return nil
}

func (w hostWord) Release() {
	if w.pins != nil {
		w.pins.Add(-1)
	}
}

// hold counts one more pin held.
func hold(pins *atomic.Int32) *atomic.Int32 {
	pins.Add(1)
	return pins
}

// TestOrderer lands sequence numbers out of order: a signal is applied only
// once every smaller sequence number has landed, and the window grows.
func TestOrderer(t *testing.T) {
	var o Orderer[hostWord]
	var sig uint64
	o.Done(3, hostWord{p: &sig}, 10) // signal waiting for 1 and 2
	o.Done(2, hostWord{}, 0)
	if sig != 0 {
		t.Fatal("signal applied before sequence 1 landed")
	}
	o.Done(1, hostWord{}, 0)
	if sig != 10 {
		t.Fatalf("signal = %d after its prefix landed, want 10", sig)
	}
	// A window far wider than the ring: everything but 4 lands first.
	for s := uint64(5000); s >= 5; s-- {
		if s%1000 == 0 {
			o.Done(s, hostWord{p: &sig}, 1)
		} else {
			o.Done(s, hostWord{}, 0)
		}
	}
	if sig != 10 {
		t.Fatalf("signals applied across a gap: %d", sig)
	}
	o.Done(4, hostWord{}, 0)
	if sig != 15 || o.Next() != 5001 {
		t.Fatalf("after the gap closed: signal %d (want 15), next %d (want 5001)", sig, o.Next())
	}
}

// TestOrdererPassed: a goodbye is acknowledged only once everything
// numbered before it was applied.
func TestOrdererPassed(t *testing.T) {
	var o Orderer[hostWord]
	o.Done(2, hostWord{}, 0)
	if o.Passed(2) || o.Passed(1) {
		t.Fatal("passed with 1 missing")
	}
	o.Done(1, hostWord{}, 0)
	if !o.Passed(2) || o.Passed(3) {
		t.Fatal("passed wrong after 1 and 2")
	}
}

// TestUnwrap: the low bits of a number come back as the smallest number
// at or above the orderer's next one.
func TestUnwrap(t *testing.T) {
	var o Orderer[hostWord]
	for s := uint64(1); s < 1000; s++ {
		if got := o.Unwrap(s&0xff, 8); got != s {
			t.Fatalf("unwrap(%d) = %d", s, got)
		}
		o.Done(s, hostWord{}, 0)
	}
	if got := o.Unwrap((1000+200)&0xff, 8); got != 1200 {
		t.Fatalf("ahead by 200: %d", got)
	}
}

// TestOrdererWindow: a number at the edge of the window is taken, one past
// it and any repeat are refused without changing anything, and the ring
// never grows past the window.
func TestOrdererWindow(t *testing.T) {
	o := Orderer[hostWord]{Window: 4096}
	var pins atomic.Int32
	var word uint64
	if err := o.Done(4096, hostWord{p: &word, pins: hold(&pins)}, 1); err != nil {
		t.Fatalf("the last number inside the window: %v", err)
	}
	for _, seq := range []uint64{4097, 1 << 40, ^uint64(0)} {
		if err := o.Done(seq, hostWord{}, 0); err == nil || !strings.Contains(err.Error(), "beyond the window of 4096") {
			t.Fatalf("number %d past the window: %v", seq, err)
		}
	}
	if err := o.Done(4096, hostWord{}, 0); err == nil || !strings.Contains(err.Error(), "again") {
		t.Fatalf("a repeated pending number: %v", err)
	}
	if o.Slots() > 4096 {
		t.Fatalf("ring grew to %d slots for a window of 4096", o.Slots())
	}
	for s := uint64(1); s < 4096; s++ {
		if err := o.Done(s, hostWord{}, 0); err != nil {
			t.Fatal(err)
		}
	}
	if word != 1 || pins.Load() != 0 || o.Next() != 4097 {
		t.Fatalf("after the gap closed: signal %d, pins %d, next %d", word, pins.Load(), o.Next())
	}
	if err := o.Done(7, hostWord{}, 0); err == nil || !strings.Contains(err.Error(), "again") {
		t.Fatalf("a number that already landed: %v", err)
	}
}

// FuzzOrderer delivers sequence numbers 1..n in the order the input gives
// (a permutation built from its bytes), some carrying signals: a signal
// must be applied exactly once, and only after every smaller number landed.
func FuzzOrderer(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7}, uint16(0xa5a5))
	f.Add([]byte{7, 6, 5, 4, 3, 2, 1, 0, 9, 8}, uint16(0xffff))
	f.Add(bytes.Repeat([]byte{200, 3, 77, 1}, 64), uint16(0x1234))
	f.Fuzz(func(t *testing.T, perm []byte, sigMask uint16) {
		n := len(perm)
		if n == 0 || n > 2048 {
			return
		}
		// Fisher-Yates driven by the input: order[i] is the i-th delivery.
		order := make([]uint64, n)
		for i := range order {
			order[i] = uint64(i + 1)
		}
		for i := n - 1; i > 0; i-- {
			j := int(perm[i]) % (i + 1)
			order[i], order[j] = order[j], order[i]
		}
		words := make([]uint64, n+1)
		landed := make([]bool, n+1)
		var o Orderer[hostWord]
		prefix := 0 // numbers 1..prefix have all landed
		for _, seq := range order {
			var sig hostWord
			if sigMask>>(seq%16)&1 == 1 {
				sig = hostWord{p: &words[seq]}
			}
			landed[seq] = true
			if err := o.Done(seq, sig, 1); err != nil {
				t.Fatalf("a permutation refused: %v", err)
			}
			for prefix < n && landed[prefix+1] {
				prefix++
			}
			// O(n) per delivery (a loop over every earlier number made one
			// 2048-long input take tens of seconds, near the fuzz engine's
			// hang detector).
			for s := 1; s <= n; s++ {
				if words[s] == 0 {
					continue
				}
				if words[s] != 1 {
					t.Fatalf("signal of %d applied %d times", s, words[s])
				}
				if prefix < s-1 {
					t.Fatalf("signal of %d applied before %d landed", s, prefix+1)
				}
			}
		}
		for s := 1; s <= n; s++ {
			if want := sigMask >> (s % 16) & 1; words[s] != uint64(want) {
				t.Fatalf("after every delivery, signal word %d is %d, want %d", s, words[s], want)
			}
		}
	})
}
