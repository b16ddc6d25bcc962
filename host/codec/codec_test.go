package codec

import (
	"bytes"
	"testing"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/codec/codectest"
)

// FuzzDecodeBlock: whatever the block, decoding writes only into dst and
// succeeds only with exactly len(dst) bytes.
func FuzzDecodeBlock(f *testing.F) {
	d := codectest.CompressibleData(3000, 1)
	z, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithSingleSegment(true))
	f.Add(uint8(codecS2), uint16(3000), s2.Encode(nil, d))
	f.Add(uint8(codecS2), uint16(100), s2.Encode(nil, d))
	f.Add(uint8(codecZstd), uint16(3000), z.EncodeAll(d, nil))
	f.Add(uint8(codecZstd), uint16(2999), z.EncodeAll(d, nil))
	f.Add(uint8(codecZstd), uint16(3000), z.EncodeAll(d[:10], z.EncodeAll(d[:2990], nil)))
	var dec Decoder
	f.Fuzz(func(t *testing.T, codec uint8, n uint16, src []byte) {
		whole, dst, intact := codectest.Guarded(int(n))
		_ = whole
		err := dec.Decode(codec, dst, src)
		if !intact() {
			t.Fatalf("codec %d: decoding %d bytes into %d wrote outside the destination", codec, len(src), n)
		}
		if err == nil {
			var ref []byte
			var rerr error
			switch codec {
			case codecS2:
				ref, rerr = s2.Decode(nil, src)
			case codecZstd:
				zd, _ := zstd.NewReader(nil)
				ref, rerr = zd.DecodeAll(src, nil)
				zd.Close()
			}
			if rerr != nil || !bytes.Equal(ref, dst) {
				t.Fatalf("codec %d: accepted a block that does not decode to its %d bytes (%v)", codec, n, rerr)
			}
		}
	})
}

// TestCodecSteadyAllocs: once a lane's encoders and a stream's decoders
// exist, compressing and decompressing allocate nothing.
func TestCodecSteadyAllocs(t *testing.T) {
	data := codectest.CompressibleData(200000, 3)
	dst := make([]byte, len(data))
	for _, codec := range []uint32{guestabi.Codec(guestabi.CodecS2, 0), guestabi.Codec(guestabi.CodecS2, 2), guestabi.Codec(guestabi.CodecZstd, 1), guestabi.Codec(guestabi.CodecZstd, 2)} {
		var e Encoder
		var d Decoder
		run := func() {
			e.Reset()
			framed, stored := e.Block(codec, data)
			if stored {
				t.Fatalf("codec %#x did not compress", codec)
			}
			clen, raw := GetPrefix(framed)
			if err := CheckFrame(clen, raw, uint64(len(data))); err != nil {
				t.Fatal(err)
			}
			if err := d.Decode(uint8(codec), dst, framed[PrefixSize:]); err != nil {
				t.Fatalf("codec %#x: %v", codec, err)
			}
		}
		run()
		if !bytes.Equal(dst, data) {
			t.Fatalf("codec %#x: round trip differs", codec)
		}
		if a := testing.AllocsPerRun(20, run); a != 0 && !raceOn {
			t.Errorf("codec %#x: %v allocations per block", codec, a)
		}
		e.Release()
		d.Release()
	}
}
