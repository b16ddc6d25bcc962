package sandbox

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/sandbox/meter"
)

// pinnedModule: a loop, a global, a call and a block; enough for every kind
// of charge meter() inserts.
const pinnedModule = "0061736d0100000001090260017f017f60000003030200010504010101040606017f0141000b070e02066d656d6f72790200016600000a26021d01017f0340200141016a210120012000490d000b20012400100120010b06000240010b0b"

// pinnedMetered is sha256(meter(pinnedModule)) for meterVersion 2.
const pinnedMetered = "143eab332b6e0438ccaa62a321f2f49289a49ea3d7940eb80a75f581b247eb91"

// TestMeterVersionPinned fails when meter.Rewrite emits something new: bump
// meterVersion (so stale cached entries are not used) and update
// pinnedMetered.
func TestMeterVersionPinned(t *testing.T) {
	in, _ := hex.DecodeString(pinnedModule)
	out, err := meter.Rewrite(in)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(out)
	if got := hex.EncodeToString(sum[:]); got != pinnedMetered || meterVersion != 3 {
		t.Fatalf("meter output is %s (meterVersion %d): if package meter changed, bump meterVersion and set pinnedMetered to it", got, meterVersion)
	}
}

// padded returns wasm with a custom section that makes it at least n bytes,
// so that meterCached uses the disk.
func padded(t *testing.T, wasm []byte, n int) []byte {
	t.Helper()
	name := "pad"
	body := append([]byte{byte(len(name))}, name...)
	body = append(body, make([]byte, n)...)
	out := append([]byte(nil), wasm...)
	out = append(out, 0)
	out = binary.AppendUvarint(out, uint64(len(body))) // unsigned LEB128, as Wasm sizes are
	return append(out, body...)
}

func TestMeterCache(t *testing.T) {
	small, _ := hex.DecodeString(pinnedModule)
	wasm := padded(t, small, meterCacheMinSize)
	want, err := meter.Rewrite(wasm)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(wasm)
	dir := t.TempDir()
	path := meterCachePath(dir, sum)
	get := func(what string) {
		t.Helper()
		got, free, err := meterCached(dir, wasm, sum)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: metered bytes differ", what)
		}
		free()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%s: no entry: %v", what, err)
		}
		if _, ok := parseMeterEntry(b, sum); !ok {
			t.Fatalf("%s: entry left damaged", what)
		}
	}
	get("miss")
	get("hit")
	// Damaged entries are ignored and rewritten.
	good, _ := os.ReadFile(path)
	for name, bad := range map[string][]byte{
		"empty":     nil,
		"short":     good[:meterHeaderLen-1],
		"truncated": good[:len(good)-7],
		"longer":    append(append([]byte(nil), good...), 0),
		"flipped":   func() []byte { b := append([]byte(nil), good...); b[len(b)/2] ^= 1; return b }(),
		"magic":     append([]byte("XXXXXXXX"), good[8:]...),
		"other key": func() []byte { b := append([]byte(nil), good...); b[8] ^= 1; return b }(),
	} {
		writeFile(t, path, bad)
		get(name)
	}
	// Small modules never touch the disk.
	ssum := sha256.Sum256(small)
	if _, _, err := meterCached(dir, small, ssum); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(meterCachePath(dir, ssum)); !os.IsNotExist(err) {
		t.Fatalf("small module cached: %v", err)
	}
	// A module the meter refuses is not cached either.
	broken := padded(t, []byte("\x00asm\x01\x00\x00\x00\x0a\x05\x01\x03\x00\xff\x0b"), meterCacheMinSize)
	bsum := sha256.Sum256(broken)
	if _, _, err := meterCached(dir, broken, bsum); err == nil {
		t.Fatal("broken module metered")
	}
	if _, err := os.Stat(meterCachePath(dir, bsum)); !os.IsNotExist(err) {
		t.Fatalf("refused module cached: %v", err)
	}
}

// TestMeterCacheConcurrent: writers racing on one entry (as processes do)
// all get the right bytes and leave one intact entry and no temp files.
func TestMeterCacheConcurrent(t *testing.T) {
	small, _ := hex.DecodeString(pinnedModule)
	wasm := padded(t, small, 256<<10)
	want, _ := meter.Rewrite(wasm)
	sum := sha256.Sum256(wasm)
	dir := t.TempDir()
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 10; j++ {
				got, free, err := meterCached(dir, wasm, sum)
				if err != nil || !bytes.Equal(got, want) {
					t.Errorf("meterCached: %v (equal %v)", err, bytes.Equal(got, want))
				}
				free()
				if j%3 == 0 {
					os.Remove(meterCachePath(dir, sum))
				}
			}
		}()
	}
	wg.Wait()
	ents, _ := os.ReadDir(filepath.Join(dir, meterCacheSubdir))
	for _, e := range ents {
		if e.Name() != filepath.Base(meterCachePath(dir, sum)) {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}

// TestOpenUsesMeterCache: Open with a cache dir stores the metered module
// and a later Open in a "new process" loads it, also over a damaged entry.
func TestOpenUsesMeterCache(t *testing.T) {
	src, err := os.ReadFile(cguest(t, "planner"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "big.wasm")
	writeFile(t, path, padded(t, src, meterCacheMinSize))
	o := testOptions(t, path, "")
	o.CacheDir = t.TempDir()
	sum := sha256.Sum256(padded(t, src, meterCacheMinSize))
	for i, damage := range []bool{false, false, true} {
		forgetProcessState(o.CacheDir)
		if damage {
			writeFile(t, meterCachePath(o.CacheDir, sum), []byte("junk"))
		}
		b := mustOpen(t, o)
		c, err := b.NewContext(info)
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
		if _, err := planOp(c, 8); err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
		c.Close()
		b.Close()
		if _, err := os.Stat(meterCachePath(o.CacheDir, sum)); err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
	}
	forgetProcessState(o.CacheDir)
}
