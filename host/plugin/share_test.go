package plugin

import (
	"encoding/binary"
	"testing"
)

// A peer's answer is checked before anything is mapped.
func TestParseSegments(t *testing.T) {
	answer := func(n uint32, segs ...uint64) []byte {
		b := binary.LittleEndian.AppendUint32(nil, n)
		for _, v := range segs {
			b = binary.LittleEndian.AppendUint64(b, v)
		}
		return b
	}
	good := answer(2, 0x200000, 0x200000, 0x400000, 0x200000)
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
	} {
		if _, err := parseSegments(c.p, c.fds); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
