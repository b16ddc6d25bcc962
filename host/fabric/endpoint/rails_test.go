package endpoint

import (
	"bytes"
	"testing"
)

// TestRailFrame: the rails frame round-trips and bad frames are refused.
func TestRailFrame(t *testing.T) {
	const nameMax = 51
	good := RailFrame([][]byte{[]byte("one"), bytes.Repeat([]byte{7}, nameMax)})
	names, err := ReadRailFrame(bytes.NewReader(good), nameMax)
	if err != nil || len(names) != 2 || string(names[0]) != "one" || len(names[1]) != nameMax {
		t.Fatalf("round trip: %q %v", names, err)
	}
	if names, err := ReadRailFrame(bytes.NewReader(RailFrame(nil)), nameMax); err != nil || len(names) != 0 {
		t.Fatalf("one rail: %q %v", names, err)
	}
	for name, b := range map[string][]byte{
		"magic":     append([]byte("RAIX"), good[4:]...),
		"no rails":  append([]byte("RAIL\x00\x00\x00\x00"), good[8:]...),
		"too many":  append([]byte("RAIL\x09\x00\x00\x00"), good[8:]...),
		"reserved":  append([]byte("RAIL\x03\x00\x01\x00"), good[8:]...),
		"empty":     []byte("RAIL\x02\x00\x00\x00\x00"),
		"too long":  append([]byte("RAIL\x02\x00\x00\x00"), append([]byte{nameMax + 1}, bytes.Repeat([]byte{1}, nameMax+1)...)...),
		"truncated": good[:len(good)-1],
	} {
		if _, err := ReadRailFrame(bytes.NewReader(b), nameMax); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
