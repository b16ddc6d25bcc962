package tcp_test

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/codec"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/codec/codectest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

func randomData(n int, seed uint64) []byte {
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)})
	b := make([]byte, n)
	_, _ = r.Read(b)
	return b
}

// TestCompressedPuts moves compressible and incompressible payloads with
// every codec over real sockets (one and three lanes, blocks and pieces),
// checks every byte, that the signal comes after its payload, that the
// codec did shrink what it could, and that nothing landed outside.
func TestCompressedPuts(t *testing.T) {
	const size = 1<<20 + 4321 // two blocks
	codecs := []uint32{guestabi.Codec(guestabi.CodecS2, 0), guestabi.Codec(guestabi.CodecS2, 2),
		guestabi.Codec(guestabi.CodecZstd, 1), guestabi.Codec(guestabi.CodecZstd, 3)}
	for _, lanes := range []int{1, 3} {
		// Every put has its own range: the race detector cannot see the
		// order a signal gives across a socket, so no range is reused.
		const slot = size + 4096
		_, mem, intact := codectest.Guarded(8 + 24*slot)
		owners := []*meshtest.MemOwner{{Mem: make([]byte, 64), Done: map[uint64]abi.Result{}}, {Mem: mem, Done: map[uint64]abi.Result{}}}
		ms := meshtest.Connect2(t, owners, dataplane.Options{Timeout: 10 * time.Second, Lanes: lanes, StripeThreshold: 1 << 20, ChunkSize: 64 << 10})
		sig := (*uint64)(unsafe.Pointer(&mem[0]))
		tag, signals := uint64(1), uint64(0) // tag 0 completes nothing
		for ci, cw := range codecs {
			for di, data := range [][]byte{codectest.CompressibleData(size, uint64(ci)), randomData(size, uint64(ci))} {
				// Sizes: under codec.MinSize (sent raw), one block, several.
				for _, n := range []int{codec.MinSize - 1, 70000, size} {
					off := 8 + int(tag-1)*slot
					src := data[:n]
					ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, SigMrID: 1, SigOp: abi.SignalOpInc, Tag: tag, Local: unsafe.Pointer(&src[0]), Size: uint64(n), Off: uint64(off)}, Plan: dataplane.Plan{Codec: cw}}, false, -1)
					signals++
					tag++
					deadline := time.Now().Add(20 * time.Second)
					for atomic.LoadUint64(sig) != signals {
						if time.Now().After(deadline) {
							t.Fatalf("lanes %d codec %#x data %d size %d: signal never arrived (failures %v)", lanes, cw, di, n, owners[0].Failed)
						}
						time.Sleep(100 * time.Microsecond)
					}
					if !bytes.Equal(mem[off:off+n], src) {
						t.Fatalf("lanes %d codec %#x data %d size %d: bytes differ after the signal", lanes, cw, di, n)
					}
					if st := meshtest.WaitDone(t, owners[0], tag-1); st != abi.Success {
						t.Fatalf("put completed with %v", st)
					}
				}
			}
		}
		if !intact() {
			t.Fatalf("lanes %d: bytes landed outside the registration", lanes)
		}
		ms[0].Close()
		ms[1].Close()
		st := ms[0].Stats()
		raw, wire := st.CompressedRaw, st.CompressedWire
		// Half of the data compresses well, half not at all (stored).
		if raw == 0 || wire > raw*3/4 || wire < raw/2 {
			t.Fatalf("lanes %d: %d raw bytes went as %d on the wire", lanes, raw, wire)
		}
		if len(owners[0].Failed) > 0 || len(owners[1].Failed) > 0 {
			t.Fatalf("failures: %v %v", owners[0].Failed, owners[1].Failed)
		}
	}
}

// frame builds a compressed put as a hostile peer could write it.
func frame(mrID uint32, off, size uint64, cid uint8, blocks ...[]byte) []byte {
	h := wire.Header{Typ: wire.MsgPut, Status: uint16(cid), MrID: mrID, Tag: 1, Off: off, Size: size}
	b := make([]byte, wire.HeaderSize)
	h.Encode(b)
	return append(b, bytes.Join(blocks, nil)...)
}

func block(clen, raw uint32, data []byte) []byte {
	b := make([]byte, codec.PrefixSize)
	codec.PutPrefix(b, clen, raw)
	return append(b, data...)
}

// TestHostileCompressedFrames writes corrupt and oversized compressed puts
// straight onto an authenticated stream. A block that does not decode to
// its declared length is rejected (nack, WARN) and the stream stays in
// step; a framing lie drops the peer. Nothing lands outside the put's range.
func TestHostileCompressedFrames(t *testing.T) {
	good := codectest.CompressibleData(4096, 7)
	s2big := s2.Encode(nil, codectest.CompressibleData(8192, 8)) // decodes to twice the declared size
	z, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
	zbig := z.EncodeAll(codectest.CompressibleData(8192, 9), nil)
	zgood := z.EncodeAll(good, nil)
	zlie := append([]byte(nil), zgood...)
	zlie[len(zlie)/2] ^= 0xff // content corrupted, lengths intact
	s2short := s2.Encode(nil, good[:4000])
	cases := []struct {
		name   string
		wire   []byte
		broken bool // the stream cannot be trusted after it
	}{
		{"s2 decodes past its block", frame(1, 0, 4096, guestabi.CodecS2, block(uint32(len(s2big)), 4096, s2big)), false},
		{"s2 decodes short", frame(1, 0, 4096, guestabi.CodecS2, block(uint32(len(s2short)), 4096, s2short)), false},
		{"s2 garbage", frame(1, 0, 4096, guestabi.CodecS2, block(100, 4096, bytes.Repeat([]byte{0xff}, 100))), false},
		{"zstd declares more", frame(1, 0, 4096, guestabi.CodecZstd, block(uint32(len(zbig)), 4096, zbig)), false},
		{"zstd corrupt content", frame(1, 0, 4096, guestabi.CodecZstd, block(uint32(len(zlie)), 4096, zlie)), false},
		{"unknown codec", frame(1, 0, 4096, 9, block(uint32(len(zgood)), 4096, zgood)), false},
		{"zstd into a range past the end", frame(1, 8192, 4096, guestabi.CodecZstd, block(uint32(len(zgood)), 4096, zgood)), false},
		{"compressed larger than raw", frame(1, 0, 4096, guestabi.CodecS2, block(5000, 4096, make([]byte, 5000))), true},
		{"block beyond the put", frame(1, 0, 100, guestabi.CodecS2, block(10, 4096, make([]byte, 10))), true},
		{"block above the block size", frame(1, 0, 4<<20, guestabi.CodecS2, block(10, 2<<20, make([]byte, 10))), true},
		{"empty block", frame(1, 0, 4096, guestabi.CodecS2, block(0, 0, nil)), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, mem, intact := codectest.Guarded(8192)
			owners := []*meshtest.MemOwner{{Mem: make([]byte, 64), Done: map[uint64]abi.Result{}}, {Mem: mem, Done: map[uint64]abi.Result{}}}
			ms := meshtest.Connect2(t, owners, dataplane.Options{Timeout: 10 * time.Second, Lanes: 1, CloseTimeout: time.Second})
			l := ms[0].Peer(1).Transport().(*tcp.Link).Lanes()[0]
			l.AwaitPuts([]uint64{1}, nil) // the target acknowledges (or rejects) it like any put
			if _, err := l.Out().Write(c.wire); err != nil {
				t.Fatal(err)
			}
			// A good compressed put behind it, on the same stream.
			ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 2, Local: unsafe.Pointer(&good[0]), Size: 4096, Off: 4096}, Plan: dataplane.Plan{Codec: guestabi.CodecZstd}}, false, -1)
			st := meshtest.WaitDone(t, owners[0], 2)
			owners[0].Mu.Lock()
			failed := append([]error(nil), owners[0].Failed...)
			owners[0].Mu.Unlock()
			if c.broken {
				if st == abi.Success {
					t.Fatalf("the put behind a framing lie completed: the stream stayed open")
				}
			} else {
				if st != abi.Success || !bytes.Equal(mem[4096:], good) {
					t.Fatalf("the put behind the bad frame: %v, bytes equal %v (failures %v)", st, bytes.Equal(mem[4096:], good), failed)
				}
				if len(failed) == 0 || !strings.Contains(failed[0].Error(), "rejected a put") {
					t.Fatalf("no rejection reported: %v", failed)
				}
				if st, ok := owners[0].Status(1); !ok || st == abi.Success {
					t.Fatalf("the rejected put's request: %v (done %v), want a failure", st, ok)
				}
			}
			if !intact() {
				t.Fatal("a hostile frame wrote outside the registration")
			}
		})
	}
}
