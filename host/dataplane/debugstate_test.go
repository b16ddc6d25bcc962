package dataplane_test

import (
	"strings"
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// TestWriteState: the stall report's lane dump names every peer and the
// lanes of its TCP streams (streamsOf), with the one put a held operation
// left queued.
func TestWriteState(t *testing.T) {
	os := meshtest.NewOwners(2, 4096)
	meshtest.SetDelays(t, time.Hour, tcp.SendDelay(), tcp.HoldDelay())
	ms := meshtest.Connect2(t, os, dataplane.Options{Timeout: 10 * time.Second, Lanes: 1})
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 1, Size: 0, Off: 64}}, true, 0)
	// An incoming stream is listed once its service started, which a
	// loaded machine may delay: the dump is taken again until it is.
	var out string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		var b strings.Builder
		ms[0].WriteState(&b)
		if out = b.String(); strings.Contains(out, "socket holds") || time.Now().After(deadline) {
			break
		}
	}
	for _, want := range []string{"=== NET/wasm mesh of rank 0: 2 peers (at ", "rank 1: tcp", "lane 0: open=true", "queued=1 head{msg ", "socket holds 0 bytes (low-water mark ", "socket unsent 0 bytes, unacknowledged by the peer's kernel "} {
		if !strings.Contains(out, want) {
			t.Fatalf("WriteState lacks %q:\n%s", want, out)
		}
	}
	ms[0].Flush(1)
	if st := meshtest.WaitDone(t, os[0], 1); st != abi.Success {
		t.Fatalf("the held put: %v", st)
	}
}
