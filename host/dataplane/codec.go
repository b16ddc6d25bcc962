package dataplane

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
	// compMin: smaller payloads are sent as they are (a block's framing
	// and the codec's own header would eat what compression saves).
	compMin = 512
	// compBlock is the largest raw block: it bounds the buffers of both
	// sides and lets a big put stream through them.
	compBlock = 1 << 20
	// compPrefix frames a block: u32 compressed length, u32 raw length.
	// A compressed length equal to the raw length means "stored": the raw
	// bytes follow (the codec did not make the block smaller).
	compPrefix = 8
)

// Codec ids on the wire (header.status of a put), guestabi's numbers.
const (
	codecNone = guestabi.CodecNone
	codecS2   = guestabi.CodecS2
	codecZstd = guestabi.CodecZstd
)

// errCorrupt marks a block that does not decode to exactly its raw length.
var errCorrupt = errors.New("corrupt compressed block")

// compressible reports whether op's payload is compressed on the wire.
func compressible(op *Op) bool {
	return op.Codec&guestabi.CodecIDMask != codecNone && op.Size >= compMin && op.LocalCtx == 0 &&
		(op.Msg == MsgPut || op.Msg == MsgPutSignal)
}

// encoders is a lane's compression state; whoever owns the lane's stream
// (lane.writing) uses it.
type encoders struct {
	arena []byte // compressed blocks of the batch being written, with their prefixes
	used  int
	// pooled is the pool's pointer to arena (Put takes it back as it came,
	// so returning the arena allocates nothing).
	pooled *[]byte
	// raw and wire count payload bytes before and after compression
	// (Mesh.Compression).
	raw, wire atomic.Uint64
}

// arenaSize holds one block at the codec's worst case, prefix included.
var arenaSize = compPrefix + s2.MaxEncodedLen(compBlock)

// room reports whether the arena can take one more block of n raw bytes.
func (e *encoders) room(n int) bool {
	return e.used+compPrefix+s2.MaxEncodedLen(n) <= len(e.arena)
}

// block compresses src into the arena and returns the framed block, or,
// when the codec did not make it smaller, just its prefix (the caller then
// sends src itself). The caller checked room.
func (e *encoders) block(codec uint32, src []byte) (framed []byte, stored bool) {
	if e.arena == nil {
		e.pooled = arenaPool.Get().(*[]byte)
		e.arena = *e.pooled
	}
	n := len(src)
	start := e.used
	out := e.arena[start+compPrefix : start+compPrefix : start+compPrefix+s2.MaxEncodedLen(n)]
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
	if clen >= n || !sameStart(out, e.arena[start+compPrefix:]) {
		clen = n // stored: no gain (or the codec outgrew its room)
	}
	putPrefix(e.arena[start:], uint32(clen), uint32(n))
	e.raw.Add(uint64(n))
	e.wire.Add(uint64(compPrefix + clen))
	if clen == n {
		e.used += compPrefix
		return e.arena[start : start+compPrefix], true
	}
	e.used += compPrefix + clen
	return e.arena[start : start+compPrefix+clen], false
}

var (
	arenaPool = sync.Pool{New: func() any { b := make([]byte, arenaSize); return &b }}
	blockPool = sync.Pool{New: func() any { b := make([]byte, compBlock); return &b }}

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
		zstd.WithWindowSize(compBlock), zstd.WithEncoderCRC(false), zstd.WithSingleSegment(true))
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
	z, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(zstdProc), zstd.WithDecoderMaxMemory(compBlock),
		zstd.WithDecoderMaxWindow(compBlock), zstd.WithDecoderLowmem(true))
	if err != nil {
		return nil, fmt.Errorf("zstd decoder: %w", err)
	}
	zstdDec.Store(z)
	return z, nil
}

// reset empties the arena once its blocks are written.
func (e *encoders) reset() { e.used = 0 }

// release gives the arena back to the pool (the batch is written).
func (e *encoders) release() {
	if e.pooled != nil {
		arenaPool.Put(e.pooled)
		e.pooled, e.arena, e.used = nil, nil, 0
	}
}

func putPrefix(b []byte, clen, rawLen uint32) {
	_ = b[compPrefix-1]
	b[0], b[1], b[2], b[3] = byte(clen), byte(clen>>8), byte(clen>>16), byte(clen>>24)
	b[4], b[5], b[6], b[7] = byte(rawLen), byte(rawLen>>8), byte(rawLen>>16), byte(rawLen>>24)
}

func getPrefix(b []byte) (clen, rawLen uint32) {
	_ = b[compPrefix-1]
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24,
		uint32(b[4]) | uint32(b[5])<<8 | uint32(b[6])<<16 | uint32(b[7])<<24
}

// sameStart reports whether a and b start at the same byte (the codec
// wrote where it was told rather than into a buffer of its own).
func sameStart(a, b []byte) bool {
	return len(a) == 0 || len(b) == 0 || unsafe.SliceData(a) == unsafe.SliceData(b)
}

// Compression reports the payload bytes this mesh's TCP lanes compressed
// so far and what they took on the wire (framing included).
func (m *Mesh) Compression() (raw, wire uint64) {
	for _, p := range m.peers {
		if t, ok := p.t.(*tcpLink); ok {
			for _, l := range t.lanes {
				raw += l.enc.raw.Load()
				wire += l.enc.wire.Load()
			}
		}
	}
	return raw, wire
}

// decoders is an incoming stream's decompression state, used by its
// service goroutine only.
type decoders struct {
	prefix [compPrefix]byte
	buf    []byte // one compressed block, from blockPool while a put is read
	pooled *[]byte
}

// checkFrame validates a block's prefix against what is left of the put:
// a raw length of 1..min(left, compBlock) and a compressed length no
// larger than it. An error here means the stream cannot be trusted.
func checkFrame(clen, rawLen uint32, left uint64) error {
	if rawLen == 0 || rawLen > compBlock || uint64(rawLen) > left {
		return fmt.Errorf("compressed block of %d raw bytes (%d left in the put, blocks hold at most %d)", rawLen, left, compBlock)
	}
	if clen > rawLen {
		return fmt.Errorf("compressed block of %d bytes for %d raw bytes", clen, rawLen)
	}
	return nil
}

// decode decompresses src into dst, which must be exactly the block's raw
// length. It never writes outside dst: the codec is handed dst with no
// spare capacity and a result anywhere else, or of another length, is an
// error (errCorrupt).
func (d *decoders) decode(codec uint8, dst, src []byte) error {
	switch codec {
	case codecS2:
		n, err := s2.DecodedLen(src)
		if err != nil || n != len(dst) {
			return fmt.Errorf("%w: s2 block declares %d bytes, want %d (%v)", errCorrupt, n, len(dst), err)
		}
		out, err := s2.Decode(dst[:len(dst):len(dst)], src)
		if err != nil || len(out) != len(dst) || !sameStart(out, dst) {
			return fmt.Errorf("%w: s2: %v", errCorrupt, err)
		}
		return nil
	case codecZstd:
		var h zstd.Header
		if err := h.Decode(src); err != nil || !h.HasFCS || h.FrameContentSize != uint64(len(dst)) {
			return fmt.Errorf("%w: zstd frame declares %d bytes, want %d (%v)", errCorrupt, h.FrameContentSize, len(dst), err)
		}
		z, err := zstdDecoder()
		if err != nil {
			return err
		}
		out, err := z.DecodeAll(src, dst[:0:len(dst)])
		if err != nil || len(out) != len(dst) || !sameStart(out, dst) {
			return fmt.Errorf("%w: zstd: %v", errCorrupt, err)
		}
		return nil
	}
	return fmt.Errorf("%w: unknown codec %d", errCorrupt, codec)
}

// take gets a block buffer for the put being read; release returns it.
func (d *decoders) take() {
	if d.pooled == nil {
		d.pooled = blockPool.Get().(*[]byte)
		d.buf = *d.pooled
	}
}

func (d *decoders) release() {
	if d.pooled != nil {
		blockPool.Put(d.pooled)
		d.pooled, d.buf = nil, nil
	}
}

// MeasureCodec times the wire codec on data exactly as a lane and a
// stream run it (blocks of at most 1 MiB, the same encoder settings, stored
// blocks included), rounds times over, and checks the round trip: the
// benchmark reports the codec's own speed beside the transfer rates. wire
// is the bytes one round puts on the wire (block framing included).
func MeasureCodec(codec uint32, data []byte, rounds int) (enc, dec time.Duration, wire uint64, err error) {
	if !guestabi.ValidCodec(codec) || codec&guestabi.CodecIDMask == codecNone {
		return 0, 0, 0, fmt.Errorf("codec word %#x does not compress", codec)
	}
	var e encoders
	var d decoders
	defer e.release()
	defer d.release()
	dst := make([]byte, len(data))
	for r := 0; r < rounds; r++ {
		wire = 0
		for off := 0; off < len(data); off += compBlock {
			n := min(len(data)-off, compBlock)
			e.reset()
			t0 := time.Now()
			framed, stored := e.block(codec, data[off:off+n])
			t1 := time.Now()
			if stored {
				copy(dst[off:off+n], data[off:off+n]) // what the target's read does
			} else if err := d.decode(uint8(codec), dst[off:off+n], framed[compPrefix:]); err != nil {
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
