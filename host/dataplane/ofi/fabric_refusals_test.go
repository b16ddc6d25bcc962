package ofi_test

import (
	"bytes"
	"encoding/binary"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/ofi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric/endpoint"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// What a libfabric peer refuses or declines: the fabric itself, a signal,
// hostile messages, posts the provider refuses.

// TestFabricDeclined: when either rank's connection plan declines
// libfabric, both choose TCP for the pair (the hello carries the choice),
// and bytes and signals still arrive.
func TestFabricDeclined(t *testing.T) {
	for _, noFab := range [][2]bool{{false, false}, {true, false}, {false, true}} {
		ms, os := meshtest.FabMesh2NoFab(t, "tcp;ofi_rxm", 1<<16, 1, noFab)
		for i, m := range ms {
			want := 0 // a rank reaches itself too
			if !noFab[i] {
				want++
				if !noFab[1-i] {
					want++
				}
			}
			if got := m.Stats().FabricPeers; got != want {
				t.Fatalf("decline %v: rank %d reaches %d peers over libfabric, want %d", noFab, i, got, want)
			}
		}
		src := fabric.Alloc(4096)
		b := unsafe.Slice((*byte)(src), 4096)
		for i := range b {
			b[i] = byte(i * 3)
		}
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: 1, Local: src, Size: 4096, Off: 64, SigMrID: 1, SigOp: abi.SignalOpInc}}, false, -1)
		os[0].WaitN(t, 1, ms[0].PeerParts(1, wire.MsgPutSignal, 4096))
		deadline := time.Now().Add(10 * time.Second)
		for atomic.LoadUint64((*uint64)(os[1].Mem)) != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("decline %v: signal never arrived", noFab)
			}
			time.Sleep(100 * time.Microsecond)
		}
		if !bytes.Equal(unsafe.Slice((*byte)(unsafe.Add(os[1].Mem, 64)), 4096), b) {
			t.Fatalf("decline %v: bytes differ", noFab)
		}
		fabric.Free(src)
	}
}

// TestFabricRejectedSignal: a signal whose word the target rejects (an
// unknown registration, an offset outside it or unaligned) fails the
// sender's request with the target's code and sets the sender's sticky
// error; the request completes exactly as many times as it has parts, and
// the link stays usable.
func TestFabricRejectedSignal(t *testing.T) {
	const size = 1 << 16
	ms, os := meshtest.FabMesh2(t, "tcp;ofi_rxm", size, 1)
	src := fabric.Alloc(4096)
	defer fabric.Free(src)
	bad := []dataplane.Op{
		{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: 1, Local: src, Size: 4096, SigMrID: 9, SigOp: abi.SignalOpInc}},
		{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: 2, Local: src, Size: 64, SigMrID: 1, SigOff: size, SigOp: abi.SignalOpInc}},
		{Request: dataplane.Request{Msg: wire.MsgPutSignal, Tag: 3, SigMrID: 1, SigOff: 12, SigOp: abi.SignalOpInc}},
		{Request: dataplane.Request{Msg: wire.MsgPutSignal, Tag: 4, SigMrID: 1, SigOff: 16, SigOp: 9}},
		// Inline puts (at most endpoint.InlineMax bytes) whose range the target
		// rejects: past the end, an unknown registration, an offset that
		// overflows. Their signals must not apply either.
		{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: 6, Local: src, Size: 16, Off: size - 8, SigMrID: 1, SigOff: 8, SigOp: abi.SignalOpInc}},
		{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 7, Tag: 7, Local: src, Size: 8, SigMrID: 1, SigOff: 8, SigOp: abi.SignalOpInc}},
		{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: 8, Local: src, Size: 8, Off: 1<<64 - 4, SigMrID: 1, SigOff: 8, SigOp: abi.SignalOpInc}},
	}
	for i := range bad {
		ms[0].Post(1, &bad[i], false, -1)
	}
	for i := range bad {
		parts := ms[0].PeerParts(1, bad[i].Msg, bad[i].Size)
		if st := os[0].WaitN(t, bad[i].Tag, parts); st != abi.InvalidArgument {
			t.Fatalf("signal %d rejected at the target: request completed with %v, want %v", bad[i].Tag, st, abi.InvalidArgument)
		}
	}
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, Tag: 5, SigMrID: 1, SigOff: 8, SigOp: abi.SignalOpAdd, SigValue: 3}}, false, -1)
	if st := os[0].WaitN(t, 5, ms[0].PeerParts(1, wire.MsgPutSignal, 0)); st != abi.Success {
		t.Fatalf("valid signal after rejections: %v", st)
	}
	if w := *(*uint64)(unsafe.Add(os[1].Mem, 8)); w != 3 {
		t.Fatalf("signal word %d, want 3", w)
	}
	time.Sleep(10 * time.Millisecond) // a duplicate completion would show now
	os[0].Mu.Lock()
	defer os[0].Mu.Unlock()
	for i := range bad {
		if got, want := os[0].Parts[bad[i].Tag], ms[0].PeerParts(1, bad[i].Msg, bad[i].Size); got != want {
			t.Errorf("request %d completed %d times, want %d", bad[i].Tag, got, want)
		}
	}
	if len(os[0].Fail) < len(bad) {
		t.Fatalf("%d rejections reported to the sender, want %d: %v", len(os[0].Fail), len(bad), os[0].Fail)
	}
}

// TestFabricHostileMessages: a peer's malformed inline put drops that
// peer with a protocol error. Messages longer than a receive buffer fail
// to arrive; a provider that survives them gives the buffer back (more
// of them than there are buffers, then a put with signal still gets
// through), and one whose connection they break (the tcp provider ends
// the stream) leaves the pair silent, which the watchdog turns into a
// failed request: never a hang.
func TestFabricHostileMessages(t *testing.T) {
	const size = 1 << 16
	meshtest.FabTestPeerTimeout = time.Second
	defer func() { meshtest.FabTestPeerTimeout = 0 }()
	ms, _ := meshtest.FabMesh2(t, "tcp;ofi_rxm", size, 1)
	e := ms[0].Fab().EP(0)
	dest := e.Links()[1].Rails()[0].Addr()
	const long = endpoint.MsgMax + 64
	buf := fabric.Alloc(long)
	defer fabric.Free(buf)
	b := unsafe.Slice((*byte)(buf), long)

	// Malformed: an inline put whose size disagrees with its length.
	b[0] = endpoint.MsgPutSignal
	binary.LittleEndian.PutUint64(b[8:], 1<<40)
	binary.LittleEndian.PutUint32(b[32:], 1)
	binary.LittleEndian.PutUint32(b[36:], 40)
	meshtest.InjectForged(t, e, buf, endpoint.PutSigHdr+8, dest)
	meshtest.AwaitDropped(t, ms[1].Peer(0), "a malformed inline put did not drop its sender")

	// Oversized, on a fresh pair.
	ms, os := meshtest.FabMesh2(t, "tcp;ofi_rxm", size, 1)
	e = ms[0].Fab().EP(0)
	dest = e.Links()[1].Rails()[0].Addr()
	ctxs := fabric.Alloc(endpoint.Recvs * 2 * fabric.ContextSize)
	defer fabric.Free(ctxs)
	clear(b)
	b[0] = endpoint.MsgSignal
	for i := 0; i < endpoint.Recvs+endpoint.Recvs/2; i++ {
		for {
			err := e.FI.SendMsg(buf, long, nil, dest, unsafe.Add(ctxs, i*fabric.ContextSize), false)
			if err == nil {
				break
			}
			if err != fabric.ErrAgain {
				t.Fatal(err)
			}
			e.Poll()
		}
	}
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: 1, Local: buf, Size: 8, Off: 64, SigMrID: 1, SigOff: 8, SigOp: abi.SignalOpInc}}, false, -1)
	switch st := os[0].WaitN(t, 1, 1); {
	case st == abi.Success:
		if ms[1].Peer(0).Dead() || ms[0].Peer(1).Dead() {
			t.Fatal("the put completed but a peer was dropped")
		}
	case st == abi.RemoteError && ms[0].Peer(1).Dead():
		t.Logf("the provider broke the connection; the watchdog failed the peer: %v", os[0].Fail)
	default:
		t.Fatalf("put with signal after %d oversized messages: %v", endpoint.Recvs+endpoint.Recvs/2, st)
	}
}

// TestFabricRefusedPosts: with most writes and signal sends finding no
// room (as shm refuses them while a write is in segmentation and
// reassembly), every put with signal still lands, in order, and
// completes. A signal refused after its payload was posted from the retry
// queue used to queue itself again under the queue's lock: the poller
// deadlocked and every later operation hung (on shm with 100 B..4 KiB
// puts, every run).
func TestFabricRefusedPosts(t *testing.T) {
	ofi.TestRefuse = 3
	defer func() { ofi.TestRefuse = 0 }()
	ms, os := meshtest.FabMesh2(t, "tcp;ofi_rxm", 1<<18, 1) // room for every put apart
	const n = 200
	srcs := fabric.Alloc(8 * (n + 1))
	defer fabric.Free(srcs)
	sizes := []uint64{8, 100, 512, 2048} // 8 B travels inline, the rest as write + signal
	off := uint64(8 * (n + 1))
	offs := make([]uint64, n+1)
	for i := uint64(1); i <= n; i++ {
		*(*uint64)(unsafe.Add(srcs, 8*i)) = i
		offs[i] = off
		off += sizes[i%4]
	}
	big := fabric.Alloc(2048)
	defer fabric.Free(big)
	var pending []uint64
	for i := uint64(1); i <= n; i++ {
		local, size := unsafe.Add(srcs, 8*i), sizes[i%4]
		if size > 8 {
			b := unsafe.Slice((*byte)(big), size)
			for j := range b {
				b[j] = byte(i + uint64(j))
			}
			local = big
		}
		// Several in flight, so that refused ones queue behind each other
		// (the large source is reused: wait before the next one).
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: i, Local: local, Size: size, Off: offs[i], SigMrID: 1, SigOff: 0, SigOp: abi.SignalOpInc}}, false, -1)
		pending = append(pending, i)
		if size > 8 || len(pending) >= 8 {
			for _, k := range pending {
				if st := os[0].WaitN(t, k, ms[0].PeerParts(1, wire.MsgPutSignal, sizes[k%4])); st != abi.Success {
					t.Fatalf("put %d: %v", k, st)
				}
			}
			pending = pending[:0]
		}
		if size > 8 {
			got := unsafe.Slice((*byte)(unsafe.Add(os[1].Mem, offs[i])), size)
			for j := range got {
				if got[j] != byte(i+uint64(j)) {
					t.Fatalf("put %d (%d B), byte %d: %d, want %d", i, size, j, got[j], byte(i+uint64(j)))
				}
			}
		}
	}
	for _, k := range pending {
		if st := os[0].WaitN(t, k, ms[0].PeerParts(1, wire.MsgPutSignal, sizes[k%4])); st != abi.Success {
			t.Fatalf("put %d: %v", k, st)
		}
	}
	sig := (*uint64)(os[1].Mem)
	for deadline := time.Now().Add(time.Minute); *sig != n; {
		if time.Now().After(deadline) {
			t.Fatalf("signal %d, want %d", *sig, n)
		}
		time.Sleep(10 * time.Microsecond)
	}
	for i := uint64(1); i <= n; i++ {
		if sizes[i%4] == 8 {
			if v := *(*uint64)(unsafe.Add(os[1].Mem, offs[i])); v != i {
				t.Fatalf("put %d: word %d", i, v)
			}
		}
	}
	if ofi.TestRefused.Load() == 0 {
		t.Fatal("nothing was refused: the hook is not reached")
	}
	if len(os[0].Fail)+len(os[1].Fail) > 0 {
		t.Fatalf("failures: %v %v", os[0].Fail, os[1].Fail)
	}
}
