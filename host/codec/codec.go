// Package codec is the wire compression of put payloads on the TCP
// transport (SPEC.md §8.10): s2 and zstd blocks of at most BlockSize raw
// bytes, each framed by a PrefixSize prefix, with the pooled arenas and
// buffers that keep the steady path free of allocations. host/dataplane's
// lanes encode with an Encoder and its services decode with a Decoder.
package codec

// Wire compression of put payloads on the TCP transport (SPEC.md §8.10).
// The sending lane compresses a payload block by block into an arena; the
// target's service reads each block into a buffer and decodes it straight
// into the registered range. Memory is bounded by what is busy, not by
// peers x lanes: arenas and block buffers come from process-wide pools for
// the length of one batch or one put, and zstd has one encoder per level
// and one decoder for the process, each used by at most GOMAXPROCS callers
// at once (klauspost's EncodeAll/DecodeAll are safe for concurrent use).
// Once the pools are warm the steady path allocates nothing per op.

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
)

const (
	// MinSize: smaller payloads are sent as they are (a block's framing
	// and the codec's own header would eat what compression saves).
	MinSize = 512
	// BlockSize is the largest raw block: it bounds the buffers of both
	// sides and lets a big put stream through them.
	BlockSize = 1 << 20
	// PrefixSize frames a block: u32 compressed length, u32 raw length.
	// A compressed length equal to the raw length means "stored": the raw
	// bytes follow (the codec did not make the block smaller).
	PrefixSize = 8
)

// Codec ids on the wire (header.status of a put), guestabi's numbers.
const (
	codecNone = guestabi.CodecNone
	codecS2   = guestabi.CodecS2
	codecZstd = guestabi.CodecZstd
)

// ErrCorrupt marks a block that does not decode to exactly its raw length.
var ErrCorrupt = errors.New("corrupt compressed block")

// Encoder is a lane's compression state; whoever owns the lane's stream
// uses it. Its zero value is ready.
type Encoder struct {
	arena []byte // compressed blocks of the batch being written, with their prefixes
	used  int
	// pooled is the pool's pointer to arena (Put takes it back as it came,
	// so returning the arena allocates nothing).
	pooled *[]byte
	// raw and wire count payload bytes before and after compression
	// (Counts).
	raw, wire atomic.Uint64
}

// arenaSize holds one block at the codec's worst case, prefix included.
var arenaSize = PrefixSize + s2.MaxEncodedLen(BlockSize)

// Room reports whether the arena can take one more block of n raw bytes
// (an Encoder without one takes an empty one from the pool).
func (e *Encoder) Room(n int) bool {
	return e.arena == nil || e.used+PrefixSize+s2.MaxEncodedLen(n) <= len(e.arena)
}

// Block compresses src into the arena and returns the framed block, or,
// when the codec did not make it smaller, just its prefix (the caller then
// sends src itself). The caller checked Room.
func (e *Encoder) Block(codec uint32, src []byte) (framed []byte, stored bool) {
	if e.arena == nil {
		e.pooled = arenaPool.Get().(*[]byte)
		e.arena = *e.pooled
	}
	n := len(src)
	start := e.used
	out := e.arena[start+PrefixSize : start+PrefixSize : start+PrefixSize+s2.MaxEncodedLen(n)]
	switch codec & guestabi.CodecIDMask {
	case codecS2:
		if codec>>guestabi.CodecLevelShift&0xff >= 2 {
			out = s2.EncodeBetter(out[:cap(out)], src)
		} else {
			out = s2.Encode(out[:cap(out)], src)
		}
	case codecZstd:
		out = zstdEncoder(codec).EncodeAll(src, out)
	}
	clen := len(out)
	if clen >= n || !sameStart(out, e.arena[start+PrefixSize:]) {
		clen = n // stored: no gain (or the codec outgrew its room)
	}
	PutPrefix(e.arena[start:], uint32(clen), uint32(n))
	e.raw.Add(uint64(n))
	e.wire.Add(uint64(PrefixSize + clen))
	if clen == n {
		e.used += PrefixSize
		return e.arena[start : start+PrefixSize], true
	}
	e.used += PrefixSize + clen
	return e.arena[start : start+PrefixSize+clen], false
}

var (
	arenaPool = sync.Pool{New: func() any { b := make([]byte, arenaSize); return &b }}
	blockPool = sync.Pool{New: func() any { b := make([]byte, BlockSize); return &b }}

	zstdMu   sync.Mutex
	zstdEnc  [guestabi.MaxZstdLevel + 1]atomic.Pointer[zstd.Encoder]
	zstdDec  atomic.Pointer[zstd.Decoder]
	zstdProc = max(runtime.GOMAXPROCS(0), 1)
)

// zstdEncoder is the process's encoder of codec's level, made on first use.
func zstdEncoder(codec uint32) *zstd.Encoder {
	level := codec >> guestabi.CodecLevelShift & 0xff
	if level == 0 {
		level = 1
	}
	if z := zstdEnc[level].Load(); z != nil {
		return z
	}
	zstdMu.Lock()
	defer zstdMu.Unlock()
	if z := zstdEnc[level].Load(); z != nil {
		return z
	}
	// One block per frame, independent of the others: a window the size of
	// a block is all it can use; no checksum (the lengths are checked
	// exactly and TCP checksums the bytes).
	z, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.EncoderLevel(level)), zstd.WithEncoderConcurrency(zstdProc),
		zstd.WithWindowSize(BlockSize), zstd.WithEncoderCRC(false), zstd.WithSingleSegment(true))
	if err != nil {
		panic(fmt.Sprintf("zstd encoder level %d: %v", level, err)) // options are constants
	}
	zstdEnc[level].Store(z)
	return z
}

// zstdDecoder is the process's decoder, made on first use.
func zstdDecoder() (*zstd.Decoder, error) {
	if z := zstdDec.Load(); z != nil {
		return z, nil
	}
	zstdMu.Lock()
	defer zstdMu.Unlock()
	if z := zstdDec.Load(); z != nil {
		return z, nil
	}
	z, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(zstdProc), zstd.WithDecoderMaxMemory(BlockSize),
		zstd.WithDecoderMaxWindow(BlockSize), zstd.WithDecoderLowmem(true))
	if err != nil {
		return nil, fmt.Errorf("zstd decoder: %w", err)
	}
	zstdDec.Store(z)
	return z, nil
}

// Reset empties the arena once its blocks are written.
func (e *Encoder) Reset() { e.used = 0 }

// Counts reports the payload bytes compressed so far and what they took
// on the wire (framing included).
func (e *Encoder) Counts() (raw, wire uint64) { return e.raw.Load(), e.wire.Load() }

// Release gives the arena back to the pool (the batch is written).
func (e *Encoder) Release() {
	if e.pooled != nil {
		arenaPool.Put(e.pooled)
		e.pooled, e.arena, e.used = nil, nil, 0
	}
}

// PutPrefix writes a block's prefix: its compressed and raw lengths.
func PutPrefix(b []byte, clen, rawLen uint32) {
	_ = b[PrefixSize-1]
	b[0], b[1], b[2], b[3] = byte(clen), byte(clen>>8), byte(clen>>16), byte(clen>>24)
	b[4], b[5], b[6], b[7] = byte(rawLen), byte(rawLen>>8), byte(rawLen>>16), byte(rawLen>>24)
}

// GetPrefix reads a block's prefix: its compressed and raw lengths.
func GetPrefix(b []byte) (clen, rawLen uint32) {
	_ = b[PrefixSize-1]
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24,
		uint32(b[4]) | uint32(b[5])<<8 | uint32(b[6])<<16 | uint32(b[7])<<24
}

// sameStart reports whether a and b start at the same byte (the codec
// wrote where it was told rather than into a buffer of its own).
func sameStart(a, b []byte) bool {
	return len(a) == 0 || len(b) == 0 || unsafe.SliceData(a) == unsafe.SliceData(b)
}

// Decoder is an incoming stream's decompression state, used by its
// service goroutine only. Its zero value is ready.
type Decoder struct {
	Prefix [PrefixSize]byte // where the reader puts a block's prefix
	Buf    []byte           // one compressed block, from blockPool between Take and Release
	pooled *[]byte
}

// CheckFrame validates a block's prefix against what is left of the put:
// a raw length of 1..min(left, BlockSize) and a compressed length no
// larger than it. An error here means the stream cannot be trusted.
func CheckFrame(clen, rawLen uint32, left uint64) error {
	if rawLen == 0 || rawLen > BlockSize || uint64(rawLen) > left {
		return fmt.Errorf("compressed block of %d raw bytes (%d left in the put, blocks hold at most %d)", rawLen, left, BlockSize)
	}
	if clen > rawLen {
		return fmt.Errorf("compressed block of %d bytes for %d raw bytes", clen, rawLen)
	}
	return nil
}

// Decode decompresses src into dst, which must be exactly the block's raw
// length. It never writes outside dst: the codec is handed dst with no
// spare capacity and a result anywhere else, or of another length, is an
// error (ErrCorrupt).
func (d *Decoder) Decode(codec uint8, dst, src []byte) error {
	switch codec {
	case codecS2:
		n, err := s2.DecodedLen(src)
		if err != nil || n != len(dst) {
			return fmt.Errorf("%w: s2 block declares %d bytes, want %d (%v)", ErrCorrupt, n, len(dst), err)
		}
		out, err := s2.Decode(dst[:len(dst):len(dst)], src)
		if err != nil || len(out) != len(dst) || !sameStart(out, dst) {
			return fmt.Errorf("%w: s2: %v", ErrCorrupt, err)
		}
		return nil
	case codecZstd:
		var h zstd.Header
		if err := h.Decode(src); err != nil || !h.HasFCS || h.FrameContentSize != uint64(len(dst)) {
			return fmt.Errorf("%w: zstd frame declares %d bytes, want %d (%v)", ErrCorrupt, h.FrameContentSize, len(dst), err)
		}
		z, err := zstdDecoder()
		if err != nil {
			return err
		}
		out, err := z.DecodeAll(src, dst[:0:len(dst)])
		if err != nil || len(out) != len(dst) || !sameStart(out, dst) {
			return fmt.Errorf("%w: zstd: %v", ErrCorrupt, err)
		}
		return nil
	}
	return fmt.Errorf("%w: unknown codec %d", ErrCorrupt, codec)
}

// Take gets a block buffer (Buf) for the put being read; Release returns
// it.
func (d *Decoder) Take() {
	if d.pooled == nil {
		d.pooled = blockPool.Get().(*[]byte)
		d.Buf = *d.pooled
	}
}

// Release returns the block buffer to the pool.
func (d *Decoder) Release() {
	if d.pooled != nil {
		blockPool.Put(d.pooled)
		d.pooled, d.Buf = nil, nil
	}
}

// Measure times the wire codec on data exactly as a lane and a
// stream run it (blocks of at most 1 MiB, the same encoder settings, stored
// blocks included), rounds times over, and checks the round trip: the
// benchmark reports the codec's own speed beside the transfer rates. wire
// is the bytes one round puts on the wire (block framing included).
func Measure(codec uint32, data []byte, rounds int) (enc, dec time.Duration, wire uint64, err error) {
	if !guestabi.ValidCodec(codec) || codec&guestabi.CodecIDMask == codecNone {
		return 0, 0, 0, fmt.Errorf("codec word %#x does not compress", codec)
	}
	var e Encoder
	var d Decoder
	defer e.Release()
	defer d.Release()
	dst := make([]byte, len(data))
	for r := 0; r < rounds; r++ {
		wire = 0
		for off := 0; off < len(data); off += BlockSize {
			n := min(len(data)-off, BlockSize)
			e.Reset()
			t0 := time.Now()
			framed, stored := e.Block(codec, data[off:off+n])
			t1 := time.Now()
			if stored {
				copy(dst[off:off+n], data[off:off+n]) // what the target's read does
			} else if err := d.Decode(uint8(codec), dst[off:off+n], framed[PrefixSize:]); err != nil {
				return 0, 0, 0, err
			}
			enc += t1.Sub(t0)
			dec += time.Since(t1)
			wire += uint64(len(framed))
			if stored {
				wire += uint64(n)
			}
		}
	}
	if !bytes.Equal(dst, data) {
		return 0, 0, 0, errors.New("codec round trip differs")
	}
	return enc, dec, wire, nil
}
