package endpoint

import (
	"fmt"
	"io"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
)

// A communicator with several rails (one endpoint per NIC) names the
// endpoints of rails 1.. to each peer in a rails frame (rail 0's name
// rides the listen handle):
//
//	"RAIL" | rails u8 (1..abi.MaxLanes) | 3 zero bytes
//	then for rails 1..rails-1: name length u8 (1..nameMax) | name

const railMagic = "RAIL"

// RailFrame is the rails frame of rails 1.. named names (of rails 0..:
// len(names)+1).
func RailFrame(names [][]byte) []byte {
	b := append([]byte(railMagic), byte(len(names)+1), 0, 0, 0)
	for _, n := range names {
		b = append(b, byte(len(n)))
		b = append(b, n...)
	}
	return b
}

// ReadRailFrame reads a peer's rails frame, whose names are at most
// nameMax bytes, and returns the endpoint names of its rails 1.. (none
// with one rail).
func ReadRailFrame(r io.Reader, nameMax int) ([][]byte, error) {
	var h [8]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	n := int(h[4])
	if string(h[:4]) != railMagic || n < 1 || n > abi.MaxLanes || h[5]|h[6]|h[7] != 0 {
		return nil, fmt.Errorf("protocol error: bad rails frame % x", h)
	}
	names := make([][]byte, n-1)
	for i := range names {
		var ln [1]byte
		if _, err := io.ReadFull(r, ln[:]); err != nil {
			return nil, err
		}
		if ln[0] == 0 || int(ln[0]) > nameMax {
			return nil, fmt.Errorf("protocol error: rail %d name of %d bytes", i+1, ln[0])
		}
		names[i] = make([]byte, ln[0])
		if _, err := io.ReadFull(r, names[i]); err != nil {
			return nil, err
		}
	}
	return names, nil
}
