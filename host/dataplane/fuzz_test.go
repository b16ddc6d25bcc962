package dataplane

import (
	"bytes"
	"net"
	"testing"
)

// Fuzz targets for everything a peer's bytes reach before any check of ours
// has run. `make test` runs each briefly (FUZZTIME); the seeds below and
// testdata/fuzz/ are the committed corpus.

// FuzzHeader: any 64 bytes decode to a header that encodes back to the same
// bytes, so nothing a peer sends is silently reinterpreted.
func FuzzHeader(f *testing.F) {
	var b [hdrSize]byte
	h := header{typ: MsgPutSignal, sigOp: 2, mrID: 7, tag: 1 << 62, off: 4096, size: 1 << 20, sigMrID: 3, sigOff: 8, sigValue: 5, seq: 9}
	h.encode(b[:])
	f.Add(b[:])
	f.Add(make([]byte, hdrSize))
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < hdrSize {
			return
		}
		var h header
		h.decode(in[:hdrSize])
		var out [hdrSize]byte
		h.encode(out[:])
		if !bytes.Equal(out[:], in[:hdrSize]) {
			t.Fatalf("header %x decodes and encodes to %x", in[:hdrSize], out)
		}
	})
}

// FuzzDecodeHandle: a handle from anywhere never panics the decoder, and
// what it accepts encodes to a handle that decodes to the same fields.
func FuzzDecodeHandle(f *testing.F) {
	l, h, err := Listen(ListenOptions{Addr: "127.0.0.1"})
	if err != nil {
		f.Fatal(err)
	}
	l.Close()
	f.Add(h[:])
	f.Add(make([]byte, len(Handle{})))
	// IPv6, the longest fabric name, and a version 1 handle (refused).
	hi, _ := DecodeHandle(h)
	hi.Addr = &net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 65535}
	hi.FabricHash, hi.FabricName = 0xdeadbeef, bytes.Repeat([]byte{0xff}, fabNameMax)
	var h6 Handle
	hi.Encode(&h6)
	f.Add(h6[:])
	h6[4] = 1
	f.Add(h6[:])
	f.Fuzz(func(t *testing.T, in []byte) {
		var hd Handle
		copy(hd[:], in)
		hi, err := DecodeHandle(&hd)
		if err != nil {
			return
		}
		var again Handle
		hi.Encode(&again)
		hi2, err := DecodeHandle(&again)
		if err != nil {
			t.Fatalf("re-encoded handle refused: %v", err)
		}
		if !hi2.Addr.IP.Equal(hi.Addr.IP) || hi2.Addr.Port != hi.Addr.Port || hi2.Key != hi.Key ||
			hi2.HostID != hi.HostID || hi2.Pid != hi.Pid || hi2.UID != hi.UID ||
			hi2.FabricHash != hi.FabricHash || !bytes.Equal(hi2.FabricName, hi.FabricName) {
			t.Fatalf("round trip changed the handle: %+v -> %+v", hi, hi2)
		}
	})
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
		var o orderer
		prefix := 0 // numbers 1..prefix have all landed
		for _, seq := range order {
			var sig sigRef
			if sigMask>>(seq%16)&1 == 1 {
				sig = sigRef{host: &words[seq]}
			}
			landed[seq] = true
			if err := o.done(seq, sig, 1); err != nil {
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
