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

// Signals over libfabric: in the write's CQ data, inline, or a message
// behind the payload; the sequence window and control messages.

// TestFabricNarrowCQData runs the ordered-signal test with the sequence
// field cut to 8 bits (as with 4-byte CQ data, only narrower), so the
// target's unwrap is crossed many times, with one lane and with three.
func TestFabricNarrowCQData(t *testing.T) {
	ofi.TestSeqBits = 8
	defer func() { ofi.TestSeqBits = 0 }()
	for _, lanes := range []int{1, 3} {
		ms, os := meshtest.FabMesh2(t, "tcp;ofi_rxm", 1<<16, lanes)
		if ms[0].Fab().EP(0).CQ().SeqBits != 8 {
			t.Fatalf("seqBits %d", ms[0].Fab().EP(0).CQ().SeqBits)
		}
		src := fabric.Alloc(8)
		const n = 700
		for i := uint64(1); i <= n; i++ {
			*(*uint64)(src) = i
			ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: i, Local: src, Size: 8, Off: 8 * i, SigMrID: 1, SigOp: abi.SignalOpInc}}, false, -1)
			os[0].WaitN(t, i, ms[0].PeerParts(1, wire.MsgPutSignal, 8))
		}
		fabric.Free(src)
		sig := (*uint64)(os[1].Mem)
		for deadline := time.Now().Add(5 * time.Second); *sig != n; {
			if time.Now().After(deadline) {
				t.Fatalf("lanes %d: signal %d, want %d", lanes, *sig, n)
			}
			time.Sleep(10 * time.Microsecond)
		}
		for i := uint64(1); i <= n; i++ {
			if v := *(*uint64)(unsafe.Add(os[1].Mem, 8*i)); v != i {
				t.Fatalf("lanes %d: word %d: %d", lanes, i, v)
			}
		}
	}
}

// TestFabricSeqWindowHolds: with a 6-bit sequence field, while nothing
// of ours can complete (no poller) no more than 2^6 numbers are posted;
// the rest wait in order and land once completions flow, every byte and
// the signal count right.
func TestFabricSeqWindowHolds(t *testing.T) {
	ofi.TestSeqBits = 6
	defer func() { ofi.TestSeqBits = 0 }()
	ms, os := meshtest.FabMesh2(t, "tcp;ofi_rxm", 1<<16, 1)
	l := ms[0].Fab().EP(0).Links()[1]
	if l.Win().Size() != 64 {
		t.Fatalf("window %d, want 64 for a 6-bit field", l.Win().Size())
	}
	src := fabric.Alloc(8 * 1024)
	defer fabric.Free(src)
	const n = 600
	// One put first: rxm connects on the first send, which needs progress.
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 1 << 20, Local: src, Size: 8, Off: 0}}, false, -1)
	os[0].Wait(t, 1<<20)
	ms[0].Fab().EP(0).LockPoll() // nobody reaps: nothing of ours completes
	for i := uint64(1); i <= n; i++ {
		*(*uint64)(unsafe.Add(src, 8*i)) = i
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: i, Local: unsafe.Add(src, 8*i), Size: 8, Off: 8 * i}}, false, -1)
	}
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, Tag: n + 1, SigMrID: 1, SigOp: abi.SignalOpInc}}, false, -1)
	posted := l.Inflight().Load()
	waiting := l.Backlog().Load()
	ms[0].Fab().EP(0).UnlockPoll()
	t.Logf("%d posted, %d waiting", posted, waiting)
	if posted > 64 || waiting < n+1-64 {
		t.Fatalf("%d posted and %d waiting with nothing completed; the window allows 64", posted, waiting)
	}
	for i := uint64(1); i <= n; i++ {
		if st := os[0].Wait(t, i); st != abi.Success {
			t.Fatalf("put %d: %v", i, st)
		}
	}
	os[0].WaitN(t, n+1, ms[0].PeerParts(1, wire.MsgPutSignal, 0))
	for deadline := time.Now().Add(5 * time.Second); *(*uint64)(os[1].Mem) != 1; {
		if time.Now().After(deadline) {
			t.Fatal("signal never applied")
		}
		time.Sleep(10 * time.Microsecond)
	}
	for i := uint64(1); i <= n; i++ {
		if v := *(*uint64)(unsafe.Add(os[1].Mem, 8*i)); v != i {
			t.Fatalf("word %d: %d", i, v)
		}
	}
}

// TestFabricInlinePutSignal: puts with signal of up to endpoint.InlineMax bytes
// travel as one message (one part) and larger ones as a write and a
// message (two); either way every byte lands and every signal applies
// once, after its payload.
func TestFabricInlinePutSignal(t *testing.T) {
	const size = 1 << 16
	ms, os := meshtest.FabMesh2(t, "tcp;ofi_rxm", size, 1)
	src := fabric.Alloc(4096)
	defer fabric.Free(src)
	sb := unsafe.Slice((*byte)(src), 4096)
	tag, off := uint64(0), uint64(64)
	for _, n := range []uint64{1, 7, 8, 56, endpoint.InlineMax - 1, endpoint.InlineMax, endpoint.InlineMax + 1, 4096} {
		for i := range sb {
			sb[i] = byte(uint64(i)*7 + n)
		}
		tag++
		op := dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: tag, Local: src, Size: n, Off: off, SigMrID: 1, SigOff: 8, SigOp: abi.SignalOpAdd, SigValue: n}}
		want := 1
		if n > endpoint.InlineMax {
			want = 2
		}
		if got := ms[0].OpParts(1, &op); got != want {
			t.Fatalf("%d bytes: %d parts, want %d", n, got, want)
		}
		ms[0].Post(1, &op, false, -1)
		if st := os[0].WaitN(t, tag, want); st != abi.Success {
			t.Fatalf("%d bytes: %v", n, st)
		}
		// Completion means arrival: the bytes and the signal are there
		// without the target doing anything.
		got := os[1].Bytes()[off : off+n]
		for i := range got {
			if got[i] != sb[i] {
				t.Fatalf("%d bytes: byte %d is %d, want %d", n, i, got[i], sb[i])
			}
		}
		off += n + 3 // odd offsets too
	}
	var sum uint64
	for _, n := range []uint64{1, 7, 8, 56, endpoint.InlineMax - 1, endpoint.InlineMax, endpoint.InlineMax + 1, 4096} {
		sum += n
	}
	for deadline := time.Now().Add(10 * time.Second); atomic.LoadUint64((*uint64)(unsafe.Add(os[1].Mem, 8))) != sum; {
		if time.Now().After(deadline) {
			t.Fatalf("signal word %d, want %d", atomic.LoadUint64((*uint64)(unsafe.Add(os[1].Mem, 8))), sum)
		}
		time.Sleep(time.Millisecond)
	}
	if len(os[0].Fail)+len(os[1].Fail) != 0 {
		t.Fatalf("failures: %v %v", os[0].Fail, os[1].Fail)
	}
}

// TestFabricSignalInCQData: once the target accepted a signal word (the
// first put with signal to it is a message with a verdict), small puts
// with an add of 1 to it travel as one write whose CQ data carries the
// signal; a larger put, an add of 2, a word past what the encoding
// reaches or an unaligned one fall back to the message. Puts without
// signal interleave: whenever the counter reads k, every earlier put and
// payload landed (strong signals). Every byte and the word are checked.
func TestFabricSignalInCQData(t *testing.T) {
	const size = 8 << 20
	ms, os := meshtest.FabMesh2(t, "tcp;ofi_rxm", size, 1)
	f := meshtest.FabLink0(t, ms)
	if !f.EP().CQ().SigCQ {
		t.Skip("the provider has no 8-byte CQ data")
	}
	src := fabric.Alloc(4096)
	defer fabric.Free(src)
	sb := unsafe.Slice((*byte)(src), 4096)
	sig := (*uint64)(unsafe.Add(os[1].Mem, 4096)) // word 512 of registration 1
	tag, want := uint64(0), uint64(0)
	put := func(op dataplane.Op) {
		t.Helper()
		tag++
		op.Tag, op.MrID, op.Local = tag, 1, src
		ms[0].Post(1, &op, false, -1)
		if st := os[0].WaitN(t, tag, ms[0].OpParts(1, &op)); st != abi.Success {
			t.Fatalf("op %d (%d bytes): %v", tag, op.Size, st)
		}
	}
	// A plain put, then the first signal to the word (a message: not yet
	// accepted), then many with the signal in CQ data, each after a plain
	// put of its own marker.
	base := f.CQSigs().Load()
	const n = 300
	for i := uint64(0); i < n; i++ {
		binary.LittleEndian.PutUint64(sb, i+1)
		put(dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, Size: 8, Off: 8192 + 8*i}})
		binary.LittleEndian.PutUint64(sb[8:], ^i)
		put(dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, Size: 8 + i%73, Off: 65536 + 128*i, SigMrID: 1, SigOff: 4096, SigOp: abi.SignalOpInc, SigValue: 0}})
		want++
	}
	if got := f.CQSigs().Load() - base; got < n-1 {
		t.Fatalf("%d of %d puts with signal went in CQ data, want at least %d", got, n, n-1)
	}
	// Each write is complete on arrival: its bytes are there; the counter
	// may still wait for the orderer, never for more than what is posted.
	for deadline := time.Now().Add(10 * time.Second); atomic.LoadUint64(sig) != want; {
		if time.Now().After(deadline) {
			t.Fatalf("signal word %d, want %d", atomic.LoadUint64(sig), want)
		}
		time.Sleep(time.Millisecond)
	}
	mem := os[1].Bytes()
	for i := uint64(0); i < n; i++ {
		if v := binary.LittleEndian.Uint64(mem[8192+8*i:]); v != i+1 {
			t.Fatalf("put %d: %d", i, v)
		}
		// The source as it was at post time: i+1, then ^i, then sb's rest.
		var head [16]byte
		binary.LittleEndian.PutUint64(head[:], i+1)
		binary.LittleEndian.PutUint64(head[8:], ^i)
		m := mem[65536+128*i : 65536+128*i+8+i%73]
		for j := range m {
			w := sb[j]
			if j < 16 {
				w = head[j]
			}
			if m[j] != w {
				t.Fatalf("put with signal %d: byte %d is %d, want %d", i, j, m[j], w)
			}
		}
		for j := 16; j < len(m); j++ {
			if m[j] != sb[j] {
				t.Fatalf("put with signal %d: byte %d is %d, want %d", i, j, m[j], sb[j])
			}
		}
	}
	// Fallbacks: each goes as a message, and still applies once.
	before := f.CQSigs().Load()
	put(dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, Size: 8, Off: 0, SigMrID: 1, SigOff: 4096, SigOp: abi.SignalOpAdd, SigValue: 2}}) // add 2
	want += 2
	put(dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, Size: endpoint.InlineMax + 1, Off: 0, SigMrID: 1, SigOff: 4096, SigOp: abi.SignalOpInc}}) // not inline
	want++
	put(dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, Size: 8, Off: 0, SigMrID: 1, SigOff: 5 << 20, SigOp: abi.SignalOpInc}})  // past 2^16 words
	put(dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, Size: 8, Off: 0, SigMrID: 1, SigOff: 5 << 20, SigOp: abi.SignalOpInc}})  // still past, though accepted
	put(dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, Size: 8, Off: 0, SigMrID: 1, SigOff: 8192 - 8, SigOp: abi.SignalOpInc}}) // above the word accepted
	if got := f.CQSigs().Load() - before; got != 0 {
		t.Fatalf("%d fallbacks went in CQ data", got)
	}
	// The last one taught the link a higher word: words below it now fit.
	put(dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, Size: 8, Off: 0, SigMrID: 1, SigOff: 4096, SigOp: abi.SignalOpAdd, SigValue: 1}})
	want++
	if got := f.CQSigs().Load() - before; got != 1 {
		t.Fatalf("an add of 1 to an accepted word: %d in CQ data, want 1", got)
	}
	for deadline := time.Now().Add(10 * time.Second); atomic.LoadUint64(sig) != want ||
		atomic.LoadUint64((*uint64)(unsafe.Add(os[1].Mem, 5<<20))) != 2 || atomic.LoadUint64((*uint64)(unsafe.Add(os[1].Mem, 8192-8))) != 1; {
		if time.Now().After(deadline) {
			t.Fatalf("signal words %d %d %d, want %d 2 1", atomic.LoadUint64(sig), atomic.LoadUint64((*uint64)(unsafe.Add(os[1].Mem, 5<<20))),
				atomic.LoadUint64((*uint64)(unsafe.Add(os[1].Mem, 8192-8))), want)
		}
		time.Sleep(time.Millisecond)
	}
	if len(os[0].Fail)+len(os[1].Fail) != 0 {
		t.Fatalf("failures: %v %v", os[0].Fail, os[1].Fail)
	}
}

// TestFabricSignalInCQDataRejected: a signal in CQ data whose target the
// peer no longer accepts (here: the sender's memory of accepted words is
// forged, as a registration dropped since would leave it) is not applied,
// and the rejection reaches the sender's sticky error (the WARN), naming
// CQ data; a target never accepted goes as a message and its request
// fails with the target's code.
func TestFabricSignalInCQDataRejected(t *testing.T) {
	const size = 1 << 16
	ms, os := meshtest.FabMesh2(t, "tcp;ofi_rxm", size, 1)
	f := meshtest.FabLink0(t, ms)
	if !f.EP().CQ().SigCQ {
		t.Skip("the provider has no 8-byte CQ data")
	}
	src := fabric.Alloc(64)
	defer fabric.Free(src)
	// Never accepted: a message, rejected with the target's code.
	op := dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: 1, Local: src, Size: 8, SigMrID: 9, SigOff: 8, SigOp: abi.SignalOpInc}}
	ms[0].Post(1, &op, false, -1)
	if st := os[0].Wait(t, 1); st != abi.InvalidArgument {
		t.Fatalf("signal to an unknown registration: %v, want %v", st, abi.InvalidArgument)
	}
	if f.CQSigs().Load() != 0 {
		t.Fatal("an unaccepted target went in CQ data")
	}
	os[0].Mu.Lock()
	nfail := len(os[0].Fail)
	os[0].Mu.Unlock()
	// Forged: registration 9 and a word past registration 1's end.
	f.LearnSignal(9, 8)
	f.LearnSignal(1, size+64)
	for i, o := range []dataplane.Op{
		{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: 2, Local: src, Size: 8, Off: 16, SigMrID: 9, SigOff: 8, SigOp: abi.SignalOpInc}},
		{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: 3, Local: src, Size: 8, Off: 24, SigMrID: 1, SigOff: size + 64, SigOp: abi.SignalOpInc}},
	} {
		ms[0].Post(1, &o, false, -1)
		if st := os[0].Wait(t, o.Tag); st != abi.Success {
			t.Fatalf("forged %d: request %v, want success (complete on arrival)", i, st)
		}
	}
	if f.CQSigs().Load() != 2 {
		t.Fatalf("%d forged signals went in CQ data, want 2", f.CQSigs().Load())
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		os[0].Mu.Lock()
		got := os[0].Fail[nfail:]
		os[0].Mu.Unlock()
		if len(got) >= 2 {
			for _, err := range got {
				if !bytes.Contains([]byte(err.Error()), []byte("CQ data")) {
					t.Fatalf("rejection: %v", err)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rejections reached the sender, want 2", len(got))
		}
		time.Sleep(time.Millisecond)
	}
	// The link still works, in order: a valid signal after them applies.
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: 4, Local: src, Size: 8, Off: 32, SigMrID: 1, SigOff: 0, SigOp: abi.SignalOpInc}}, false, -1)
	if st := os[0].Wait(t, 4); st != abi.Success {
		t.Fatalf("valid signal after rejections: %v", st)
	}
	for deadline := time.Now().Add(10 * time.Second); atomic.LoadUint64((*uint64)(os[1].Mem)) != 1; {
		if time.Now().After(deadline) {
			t.Fatalf("signal word %d, want 1", atomic.LoadUint64((*uint64)(os[1].Mem)))
		}
		time.Sleep(time.Millisecond)
	}
	if w := atomic.LoadUint64((*uint64)(unsafe.Add(os[1].Mem, 8))); w != 0 {
		t.Fatalf("a rejected signal changed word 1 to %d", w)
	}
}

// TestFabricControlNotAwaited: a control message whose send completion
// was not reaped yet (an acknowledgement sent with a completion, here a
// slot taken as the senders take it) is in flight but is no operation a
// leaving peer could lose: Awaiting() counts operations only. A peer that
// left right after such a message was reported as failed with one
// operation lost (the driver's teardown scenario over tcp;ofi_rxm, a few
// runs in 150 under load).
func TestFabricControlNotAwaited(t *testing.T) {
	ms, os := meshtest.FabMesh2(t, "tcp;ofi_rxm", 1<<16, 1)
	l := ms[0].Fab().EP(0).Links()[1]
	src := fabric.Alloc(64)
	defer fabric.Free(src)
	// One put first: rxm connects on the first send, which needs progress.
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 1, Local: src, Size: 8, Off: 0}}, false, -1)
	os[0].Wait(t, 1)
	e := l.Rails()[0].EP()
	ms[0].Fab().EP(0).LockPoll() // nobody reaps meanwhile
	ctl, ok := l.Slot(e, 0, true)
	if !ok {
		ms[0].Fab().EP(0).UnlockPoll()
		t.Fatal("no free slot")
	}
	flying, awaited := l.Inflight().Load(), l.Awaiting()
	op, ok := l.Slot(e, 7, false)
	withOp := l.Awaiting()
	if ok {
		l.Unslot(e, op)
	}
	l.Unslot(e, ctl)
	ms[0].Fab().EP(0).UnlockPoll()
	if flying != 1 || awaited != 0 {
		t.Fatalf("a control message in flight: inflight %d, awaiting %d; want 1 and 0", flying, awaited)
	}
	if !ok || withOp != 1 {
		t.Fatalf("an operation beside it: awaiting %d, want 1", withOp)
	}
	if n, c := l.Inflight().Load(), l.CtlLive().Load(); n != 0 || c != 0 {
		t.Fatalf("after both were freed: inflight %d, control %d; want 0 and 0", n, c)
	}
}
