package dataplane

import (
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
)

// TestOrdererWindow: a number at the edge of the window is taken, one past
// it and any repeat are refused without changing anything, and the ring
// never grows past the window.
func TestOrdererWindow(t *testing.T) {
	o := orderer{window: 4096}
	var pins atomic.Int32
	var word uint64
	if err := o.done(4096, sigRef{host: &word, pin: NewPin(&pins)}, 1); err != nil {
		t.Fatalf("the last number inside the window: %v", err)
	}
	for _, seq := range []uint64{4097, 1 << 40, ^uint64(0)} {
		if err := o.done(seq, sigRef{}, 0); err == nil || !strings.Contains(err.Error(), "beyond the window of 4096") {
			t.Fatalf("number %d past the window: %v", seq, err)
		}
	}
	if err := o.done(4096, sigRef{}, 0); err == nil || !strings.Contains(err.Error(), "again") {
		t.Fatalf("a repeated pending number: %v", err)
	}
	if len(o.ring) > 4096 {
		t.Fatalf("ring grew to %d slots for a window of 4096", len(o.ring))
	}
	for s := uint64(1); s < 4096; s++ {
		if err := o.done(s, sigRef{}, 0); err != nil {
			t.Fatal(err)
		}
	}
	if word != 1 || pins.Load() != 0 || o.next != 4097 {
		t.Fatalf("after the gap closed: signal %d, pins %d, next %d", word, pins.Load(), o.next)
	}
	if err := o.done(7, sigRef{}, 0); err == nil || !strings.Contains(err.Error(), "again") {
		t.Fatalf("a number that already landed: %v", err)
	}
}

// TestSequenceBeyondWindowDropsPeer writes, on an authenticated stream, one
// put header whose sequence number is 2^40 (before the bound the target's
// ring doubled until the process died of memory). The target must refuse
// it with a WARN, drop the peer and report the loss; the initiator's
// operations then fail with ncclRemoteError after its sticky error is set.
func TestSequenceBeyondWindowDropsPeer(t *testing.T) {
	got := warnings(t)
	ms, owners := mesh2(t, false)
	src := make([]byte, 64)
	for i := range src {
		src[i] = byte(i + 1)
	}
	// A healthy put first: the stream works and its bytes land.
	ms[0].Post(1, &Op{Msg: MsgPut, MrID: 1, Tag: 1, Local: unsafe.Pointer(&src[0]), Size: 64}, false, -1)
	if st := waitDone(t, owners[0], 1); st != abi.Success {
		t.Fatalf("healthy put: %v", st)
	}
	var b [hdrSize]byte
	h := header{typ: MsgPut, mrID: 1, size: 0, seq: 1 << 40}
	h.encode(b[:])
	if _, err := ms[0].peers[1].t.(*tcpLink).lanes[0].out.Write(b[:]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the target to drop the peer", func() bool {
		owners[1].mu.Lock()
		defer owners[1].mu.Unlock()
		for _, e := range owners[1].failed {
			if strings.Contains(e.Error(), "protocol violation by rank 0") && strings.Contains(e.Error(), "beyond the window") {
				return true
			}
		}
		return false
	})
	if countMatching(got(), "protocol violation by rank 0") == 0 {
		t.Fatalf("no WARN for the violation: %q", got())
	}
	if n := len(ms[1].peers[0].order.ring); n > 1024 {
		t.Fatalf("the target's ring grew to %d slots", n)
	}
	// The initiator sees its connection go and fails what it posts.
	waitFor(t, "the initiator to see the peer gone", func() bool { return ms[0].peers[1].dead.Load() })
	ms[0].Post(1, &Op{Msg: MsgPut, MrID: 1, Tag: 2, Local: unsafe.Pointer(&src[0]), Size: 64}, false, -1)
	if st := waitDone(t, owners[0], 2); st != abi.RemoteError {
		t.Fatalf("a put to the dropped peer: %v, want RemoteError", st)
	}
	owners[0].mu.Lock()
	sticky := len(owners[0].failed)
	owners[0].mu.Unlock()
	if sticky == 0 {
		t.Fatal("the initiator's sticky error was not set")
	}
}
