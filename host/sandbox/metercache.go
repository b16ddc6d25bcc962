package sandbox

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/sandbox/meter"
)

// On-disk cache of metered modules (SPEC.md §8.7).
//
// wazero's compilation cache is keyed on the bytes handed to CompileModule,
// and it decodes and validates those bytes even on a hit, so the host must
// have the metered module in hand in every process. Rewriting a large Go
// module takes tens of milliseconds (BENCH.md, "Figures behind the code"),
// so the result is kept next to wazero's entries:
//
//	<cache dir>/rmaw-metered/v<meterVersion>-<sha256 of the input module>.wasm
//
// An entry is a header (magic, the input's hash, the body's length and
// CRC-32C) and the metered module. Entries are written to a temp file in the
// same directory and renamed into place, so processes sharing the directory
// see a whole entry or none; an entry that is short, torn or does not match
// its header is ignored and rewritten. The cache directory is trusted as
// much as wazero's (which holds machine code): the checks catch accidents,
// not tampering.

// meterVersion names the output of meter.Rewrite. Bump it whenever package
// meter changes what it emits or what it refuses (3: declared counts are
// bounded, so an entry cached by an older rewriter could hold a module it now
// refuses); TestMeterVersionPinned fails until you do.
const meterVersion = 3

const (
	meterCacheSubdir = "rmaw-metered"
	meterCacheMagic  = "RMAWMTR\x01"
	meterHeaderLen   = 8 + 32 + 8 + 4 // magic, input sha256, body length, body CRC-32C
	// meterCacheMinSize: smaller modules are metered in less time than a
	// file read takes (the embedded default in microseconds), so they are
	// not cached.
	meterCacheMinSize = 64 << 10
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func meterCachePath(dir string, sum [32]byte) string {
	return filepath.Join(dir, meterCacheSubdir, fmt.Sprintf("v%d-%x.wasm", meterVersion, sum))
}

// meterCached returns meter.Rewrite(wasm), from dir when an intact entry
// for sum is there, and stores what it computes otherwise. dir "" means no disk cache.
// The caller calls free once it no longer uses the bytes (an entry read from
// disk lives outside the Go heap, see readFileOffHeap).
func meterCached(dir string, wasm []byte, sum [32]byte) (metered []byte, free func(), err error) {
	if dir == "" || len(wasm) < meterCacheMinSize {
		metered, err = meter.Rewrite(wasm)
		return metered, func() {}, err
	}
	path := meterCachePath(dir, sum)
	if b, free, err := readFileOffHeap(path, 2*MaxModuleBytes); err == nil {
		if body, ok := parseMeterEntry(b, sum); ok {
			return body, free, nil
		}
		free()
		logx.Info(0, "wasm: ignoring damaged metered-module cache entry %s; rebuilding it", path)
	}
	metered, err = meter.Rewrite(wasm)
	if err != nil {
		return nil, nil, err
	}
	if err := writeMeterEntry(path, sum, metered); err != nil {
		logx.Info(0, "wasm: cannot store metered module in the cache (%v)", err)
	}
	return metered, func() {}, nil
}

func parseMeterEntry(b []byte, sum [32]byte) ([]byte, bool) {
	if len(b) < meterHeaderLen || string(b[:8]) != meterCacheMagic || !bytes.Equal(b[8:40], sum[:]) {
		return nil, false
	}
	n := binary.LittleEndian.Uint64(b[40:48])
	body := b[meterHeaderLen:]
	if uint64(len(body)) != n || crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(b[48:52]) {
		return nil, false
	}
	return body, true
}

func writeMeterEntry(path string, sum [32]byte, body []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return err
	}
	var h [meterHeaderLen]byte
	copy(h[:8], meterCacheMagic)
	copy(h[8:40], sum[:])
	binary.LittleEndian.PutUint64(h[40:48], uint64(len(body)))
	binary.LittleEndian.PutUint32(h[48:52], crc32.Checksum(body, castagnoli))
	_, err = f.Write(h[:])
	if err == nil {
		_, err = f.Write(body)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}
