package share

import (
	"encoding/binary"
	"testing"
)

// A peer's answer is checked before anything is mapped.
func TestParseSegments(t *testing.T) {
	answer := func(n uint32, segs ...uint64) []byte {
		b := binary.LittleEndian.AppendUint32(nil, n)
		b = binary.LittleEndian.AppendUint32(b, segFds)
		for _, v := range segs {
			b = binary.LittleEndian.AppendUint64(b, v)
		}
		return b
	}
	good := answer(2, 0x200000, 0x200000, 0x400000, 0x200000)
	// handles(n): n HIP segments of 2 MiB, handle bytes 7.
	handles := func(n uint32) []byte {
		b := binary.LittleEndian.AppendUint32(nil, n)
		b = binary.LittleEndian.AppendUint32(b, segHandles)
		for i := uint32(0); i < n; i++ {
			b = binary.LittleEndian.AppendUint64(b, 0x200000*uint64(i+1))
			b = binary.LittleEndian.AppendUint64(b, 0x200000)
			for k := 0; k < 64; k++ {
				b = append(b, 7)
			}
		}
		return b
	}
	if segs, err := parseSegments(handles(1), nil); err != nil || len(segs) != 1 || segs[0].Fd != -1 || segs[0].Handle[63] != 7 {
		t.Fatalf("a handle answer: %v, %v", segs, err)
	}
	segs, err := parseSegments(good, []int{5, 6})
	if err != nil || len(segs) != 2 || segs[1].Fd != 6 || segs[1].Base != 0x400000 {
		t.Fatalf("a good answer: %v, %v", segs, err)
	}
	for name, c := range map[string]struct {
		p   []byte
		fds []int
	}{
		"short":           {[]byte{1, 0}, nil},
		"no segments":     {answer(0), nil},
		"fds missing":     {good, []int{5}},
		"extra bytes":     {append(good, 0), []int{5, 6}},
		"gap":             {answer(2, 0x200000, 0x200000, 0x600000, 0x200000), []int{5, 6}},
		"empty segment":   {answer(1, 0x200000, 0), []int{5}},
		"huge":            {answer(1, 0x200000, maxShareSpan+1), []int{5}},
		"too many":        {answer(65), make([]int, 65)},
		"count too large": {answer(3, 0x200000, 0x200000), []int{5, 6, 7}},
		"unknown kind":    {append(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, 1), 3), make([]byte, 16)...), []int{5}},
		"two handles":     {handles(2), nil},
		"handle and fd":   {handles(1), []int{5}},
	} {
		if _, err := parseSegments(c.p, c.fds); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// Any answer parses or is refused without a panic, and one that parses
// holds contiguous segments of bounded total size, each with its fd.
func FuzzParseSegments(f *testing.F) {
	seed := binary.LittleEndian.AppendUint32(nil, 1)
	seed = binary.LittleEndian.AppendUint32(seed, segFds)
	seed = binary.LittleEndian.AppendUint64(seed, 0x200000)
	seed = binary.LittleEndian.AppendUint64(seed, 0x200000)
	f.Add(seed, uint8(1))
	f.Add(seed[:8], uint8(0))
	f.Fuzz(func(t *testing.T, p []byte, nfds uint8) {
		fds := make([]int, nfds)
		for i := range fds {
			fds[i] = 100 + i
		}
		segs, err := parseSegments(p, fds)
		if err != nil {
			return
		}
		span := uint64(0)
		for i, s := range segs {
			if s.Size == 0 || (i > 0 && s.Base != segs[i-1].Base+segs[i-1].Size) || (s.Fd >= 0 && s.Fd != fds[i]) {
				t.Fatalf("segment %d accepted: %+v", i, s)
			}
			span += s.Size
		}
		if len(segs) == 0 || span > maxShareSpan {
			t.Fatalf("%d segments of %d bytes accepted", len(segs), span)
		}
	})
}
