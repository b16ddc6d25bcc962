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
