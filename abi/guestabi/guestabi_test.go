package guestabi

import (
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
)

// Guests build without package abi, so the lane limit is written twice.
func TestMaxLanesMatchesHost(t *testing.T) {
	if MaxLanes != abi.MaxLanes {
		t.Fatalf("guestabi.MaxLanes = %d, abi.MaxLanes = %d", MaxLanes, abi.MaxLanes)
	}
}
