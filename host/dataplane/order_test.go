package dataplane_test

import (
	"fmt"
	"strings"
	"testing"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// TestSequenceBeyondWindowDropsPeer writes, on an authenticated stream, one
// put header whose sequence number is 2^40 (before the bound the target's
// ring doubled until the process died of memory). The target must refuse
// it with a WARN, drop the peer and report the loss; the initiator's
// operations then fail with ncclRemoteError after its sticky error is set.
func TestSequenceBeyondWindowDropsPeer(t *testing.T) {
	got := meshtest.Warnings(t)
	ms, owners := meshtest.Mesh2(t, false)
	src := make([]byte, 64)
	for i := range src {
		src[i] = byte(i + 1)
	}
	// A healthy put first: the stream works and its bytes land.
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 1, Local: unsafe.Pointer(&src[0]), Size: 64}}, false, -1)
	if st := meshtest.WaitDone(t, owners[0], 1); st != abi.Success {
		t.Fatalf("healthy put: %v", st)
	}
	rawHeaderDrops(t, ms, owners, wire.Header{Typ: wire.MsgPut, MrID: 1, Size: 0, Seq: 1 << 40}, "protocol violation by rank 0", "beyond the window")
	if meshtest.CountMatching(got(), "protocol violation by rank 0") == 0 {
		t.Fatalf("no WARN for the violation: %q", got())
	}
	if n := ms[1].Peer(0).Order().Slots(); n > 1024 {
		t.Fatalf("the target's ring grew to %d slots", n)
	}
	// The initiator sees its connection go and fails what it posts.
	meshtest.WaitFor(t, "the initiator to see the peer gone", func() bool { return ms[0].Peer(1).Dead() })
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 2, Local: unsafe.Pointer(&src[0]), Size: 64}}, false, -1)
	if st := meshtest.WaitDone(t, owners[0], 2); st != abi.RemoteError {
		t.Fatalf("a put to the dropped peer: %v, want RemoteError", st)
	}
	owners[0].Mu.Lock()
	sticky := len(owners[0].Failed)
	owners[0].Mu.Unlock()
	if sticky == 0 {
		t.Fatal("the initiator's sticky error was not set")
	}
}

// TestUnsharedEventDropsPeer: a put+signal whose header orders it by an
// interprocess event the sender never shared (wire.StatusEvent) is a
// protocol error: the target drops the peer with a WARN, and applies
// nothing.
func TestUnsharedEventDropsPeer(t *testing.T) {
	for _, c := range []struct {
		typ  uint8
		want string
	}{{wire.MsgPutSignal, "by an event it never shared"}, {wire.MsgPut, "a put without signal by an event"}} {
		t.Run(fmt.Sprint("type", c.typ), func(t *testing.T) { unsharedEvent(t, c.typ, c.want) })
	}
}

func unsharedEvent(t *testing.T, typ uint8, want string) {
	got := meshtest.Warnings(t)
	ms, owners := meshtest.Mesh2(t, false)
	rawHeaderDrops(t, ms, owners, wire.Header{Typ: typ, MrID: 1, SigMrID: 1, SigOff: 0, SigOp: abi.SignalOpAdd, SigValue: 1, Status: wire.StatusEvent | 3}, want)
	if meshtest.CountMatching(got(), want) == 0 {
		t.Fatalf("no WARN for the violation: %q", got())
	}
	if w := *(*uint64)(unsafe.Pointer(&owners[1].Mem[0])); w != 0 {
		t.Fatalf("the signal word was updated to %d", w)
	}
}

// TestUnsharedMarkDropsPeer: a put+signal whose header orders it by an
// agent mark of a page the sender never handed over (wire.StatusMark), or
// names mark 0, is a protocol error: the target drops the peer with a
// WARN, and applies nothing.
func TestUnsharedMarkDropsPeer(t *testing.T) {
	for _, c := range []struct {
		name string
		h    wire.Header
	}{
		{"no page", wire.Header{Typ: wire.MsgPutSignal, MrID: 1, SigMrID: 1, SigOp: abi.SignalOpAdd, SigValue: 1, Status: wire.StatusMark | 2, Off: 7}},
		{"mark 0", wire.Header{Typ: wire.MsgPutSignal, MrID: 1, SigMrID: 1, SigOp: abi.SignalOpAdd, SigValue: 1, Status: wire.StatusMark}},
		{"put without signal", wire.Header{Typ: wire.MsgPut, MrID: 1, Status: wire.StatusMark | 1, Off: 3}},
	} {
		t.Run(c.name, func(t *testing.T) {
			const want = "by a mark it may not name"
			got := meshtest.Warnings(t)
			ms, owners := meshtest.Mesh2(t, false)
			rawHeaderDrops(t, ms, owners, c.h, want)
			if meshtest.CountMatching(got(), want) == 0 {
				t.Fatalf("no WARN for the violation: %q", got())
			}
			if w := *(*uint64)(unsafe.Pointer(&owners[1].Mem[0])); w != 0 {
				t.Fatalf("the signal word was updated to %d", w)
			}
		})
	}
}

// rawHeaderDrops writes h on rank 0's authenticated stream to rank 1 and
// waits until rank 1 failed the peer with an error containing every
// string in says.
func rawHeaderDrops(t *testing.T, ms []*dataplane.Mesh, owners []*meshtest.MemOwner, h wire.Header, says ...string) {
	t.Helper()
	var b [wire.HeaderSize]byte
	h.Encode(b[:])
	if _, err := ms[0].Peer(1).Transport().(*tcp.Link).Lanes()[0].Out().Write(b[:]); err != nil {
		t.Fatal(err)
	}
	meshtest.WaitFor(t, "the target to drop the peer", func() bool {
		owners[1].Mu.Lock()
		defer owners[1].Mu.Unlock()
		for _, e := range owners[1].Failed {
			all := true
			for _, w := range says {
				all = all && strings.Contains(e.Error(), w)
			}
			if all {
				return true
			}
		}
		return false
	})
}
