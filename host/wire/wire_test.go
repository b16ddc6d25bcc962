package wire

import (
	"bytes"
	"errors"
	"net"
	"strings"
	"testing"
)

// TestHeaderRoundTrip: every field survives Encode and Decode.
func TestHeaderRoundTrip(t *testing.T) {
	in := Header{Typ: MsgPutSignal, SigOp: 2, Status: 6, MrID: 7, Tag: 1<<63 | 5, Off: 1 << 40, Size: 123,
		SigMrID: 9, Context: 3, SigOff: 64, SigValue: ^uint64(0)}
	var b [HeaderSize]byte
	in.Encode(b[:])
	var out Header
	out.Decode(b[:])
	if in != out {
		t.Fatalf("round trip: %+v != %+v", out, in)
	}
}

// TestHandleRoundTrip: a handle decodes to what was encoded; a foreign
// one or another version is refused.
func TestHandleRoundTrip(t *testing.T) {
	hi := HandleInfo{Addr: &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 4242}, Pid: 77, UID: 1000}
	hi.Key[0], hi.Key[31], hi.HostID[7] = 0xaa, 0xcc, 0xbb
	var h Handle
	hi.Encode(&h)
	got, err := DecodeHandle(&h)
	if err != nil || !got.Addr.IP.Equal(hi.Addr.IP) || got.Addr.Port != 4242 || got.Key != hi.Key || got.HostID != hi.HostID || got.Pid != 77 || got.UID != 1000 {
		t.Fatalf("decode: %+v %v", got, err)
	}
	h[0] = 'X'
	if _, err := DecodeHandle(&h); !errors.Is(err, ErrBadHandle) {
		t.Fatalf("foreign handle accepted: %v", err)
	}
	hi.Encode(&h)
	h[4] = 99
	if _, err := DecodeHandle(&h); err == nil || !strings.Contains(err.Error(), "version") {
		t.Fatalf("wrong version accepted: %v", err)
	}
}

// Fuzz targets for everything a peer's bytes reach before any check of ours
// has run. `make test` runs each briefly (FUZZTIME); the seeds below and
// testdata/fuzz/ are the committed corpus.

// FuzzHeader: any 64 bytes decode to a header that encodes back to the same
// bytes, so nothing a peer sends is silently reinterpreted.
func FuzzHeader(f *testing.F) {
	var b [HeaderSize]byte
	h := Header{Typ: MsgPutSignal, SigOp: 2, MrID: 7, Tag: 1 << 62, Off: 4096, Size: 1 << 20, SigMrID: 3, SigOff: 8, SigValue: 5, Seq: 9}
	h.Encode(b[:])
	f.Add(b[:])
	f.Add(make([]byte, HeaderSize))
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < HeaderSize {
			return
		}
		var h Header
		h.Decode(in[:HeaderSize])
		var out [HeaderSize]byte
		h.Encode(out[:])
		if !bytes.Equal(out[:], in[:HeaderSize]) {
			t.Fatalf("header %x decodes and encodes to %x", in[:HeaderSize], out)
		}
	})
}

// FuzzDecodeHandle: a handle from anywhere never panics the decoder, and
// what it accepts encodes to a handle that decodes to the same fields.
func FuzzDecodeHandle(f *testing.F) {
	seed := HandleInfo{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 4242}, Pid: 77, UID: 1000}
	seed.Key[0], seed.HostID[7] = 0xaa, 0xbb
	var h Handle
	seed.Encode(&h)
	f.Add(h[:])
	f.Add(make([]byte, len(Handle{})))
	// IPv6, the longest fabric name, and a version 1 handle (refused).
	hi, _ := DecodeHandle(&h)
	hi.Addr = &net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 65535}
	hi.FabricHash, hi.FabricName = 0xdeadbeef, bytes.Repeat([]byte{0xff}, FabNameMax)
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
