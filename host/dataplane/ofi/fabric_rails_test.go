package ofi_test

import (
	"bytes"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/ofi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric/nics"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// Several rails (NICs): striping over them and what each carried.

// TestFabricRails stripes large puts, puts with signal and gets over two
// rails and checks every byte, the signals, and that both rails carried
// bytes. Test traffic stays on loopback here, so both rails are endpoints
// on the loopback domain (TestFabricRailsNamespaces in test/ gives each
// rail a NIC of its own).
func TestFabricRails(t *testing.T) {
	prov := meshtest.FabricProvider(t, "tcp;ofi_rxm")
	nics := nics.List(prov)
	if len(nics) < 1 {
		t.Skipf("%s offers no domain here", prov)
	}
	const size = 8 << 20
	dom := nics[0].Domain
	ms, os := meshtest.FabMesh2Rails(t, prov, size, 2, [2]bool{}, dom, [2][]string{{dom}, {dom}})
	for i, m := range ms {
		if got := m.Stats().FabricRails; len(got) != 2 || got[0] != dom || got[1] != dom {
			t.Fatalf("rank %d rails %v, want [%s %s]", i, got, dom, dom)
		}
		for _, p := range m.Peers() {
			if f := p.Transport().(*ofi.Link); len(f.Rails()) != 2 {
				t.Fatalf("rank %d link to %d has %d rails", i, p.Rank(), len(f.Rails()))
			}
		}
	}
	src := fabric.Alloc(size)
	defer fabric.Free(src)
	s := unsafe.Slice((*byte)(src), size)
	sigOff := uint64(size - 8)
	const rounds, n = 4, 3 << 20 // striped: at least the 1 MiB threshold
	for r := uint64(1); r <= rounds; r++ {
		for i := range s[:n] {
			s[i] = byte(uint64(i)*13 + r)
		}
		// A striped put with signal, then small ones on lane 1 (rail 1)
		// each counted by the same signal: it may reach k only once the
		// first k operations of this round landed, pieces included.
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: 10 * r, Local: src, Size: n, SigMrID: 1, SigOff: sigOff, SigOp: abi.SignalOpInc}}, false, -1)
		for k := uint64(1); k <= 3; k++ {
			ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: 10*r + k, Local: unsafe.Add(src, n+8*k), Size: 8, Off: n + 8*k, SigMrID: 1, SigOff: sigOff, SigOp: abi.SignalOpInc}}, false, 1)
		}
		for k := uint64(0); k <= 3; k++ {
			if st := os[0].WaitN(t, 10*r+k, ms[0].OpParts(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, Size: map[bool]uint64{true: n, false: 8}[k == 0]}})); st != abi.Success {
				t.Fatalf("round %d op %d: %v", r, k, st)
			}
		}
		want := 4 * r
		for deadline := time.Now().Add(5 * time.Second); atomic.LoadUint64((*uint64)(unsafe.Add(os[1].Mem, sigOff))) != want; {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: signal %d, want %d", r, *(*uint64)(unsafe.Add(os[1].Mem, sigOff)), want)
			}
			time.Sleep(10 * time.Microsecond)
		}
		if got := os[1].Bytes()[:n]; !bytes.Equal(got, s[:n]) {
			t.Fatalf("round %d: payload differs", r)
		}
	}
	// Rank 1 reads it back, striped over its rails too.
	dst := fabric.Alloc(n)
	defer fabric.Free(dst)
	ms[1].Post(0, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgGet, MrID: 1, Tag: 99, Local: dst, Size: n}}, false, -1)
	if st := os[1].WaitN(t, 99, ms[1].Parts(wire.MsgGet, n)); st != abi.Success {
		t.Fatalf("get: %v", st)
	}
	for i, m := range ms {
		b := m.Stats().RailBytes
		t.Logf("rank %d: bytes by rail %v", i, b)
		if b[0] == 0 || b[1] == 0 {
			t.Errorf("rank %d: rail bytes %v: a rail carried nothing", i, b)
		}
	}
	if len(os[0].Fail)+len(os[1].Fail) > 0 {
		t.Fatalf("failures: %v %v", os[0].Fail, os[1].Fail)
	}
}

// TestFabricRailsUneven: a rank with two rails and one with one (its
// listener knows no second NIC) pair on one rail: rank 0's second
// endpoint carries nothing to rank 1, and every byte and signal arrives.
func TestFabricRailsUneven(t *testing.T) {
	prov := meshtest.FabricProvider(t, "tcp;ofi_rxm")
	nics := nics.List(prov)
	if len(nics) < 1 {
		t.Skipf("%s offers no domain here", prov)
	}
	const size = 4 << 20
	dom := nics[0].Domain
	ms, os := meshtest.FabMesh2Rails(t, prov, size, 2, [2]bool{}, dom, [2][]string{{dom}, nil})
	if r0, r1 := ms[0].Stats().FabricRails, ms[1].Stats().FabricRails; len(r0) != 2 || len(r1) != 1 {
		t.Fatalf("rails %v and %v, want 2 and 1", r0, r1)
	}
	for i, m := range ms {
		for _, p := range m.Peers() {
			want := 1
			if i == 0 && p.Rank() == 0 {
				want = 2 // rank 0 to itself: both ends have two
			}
			if f := p.Transport().(*ofi.Link); len(f.Rails()) != want {
				t.Fatalf("rank %d link to %d: %d rails, want %d", i, p.Rank(), len(f.Rails()), want)
			}
		}
	}
	src := fabric.Alloc(size)
	defer fabric.Free(src)
	s := unsafe.Slice((*byte)(src), size)
	for i := range s {
		s[i] = byte(i*5 + 1)
	}
	const n = 2 << 20
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: 1, Local: src, Size: n, SigMrID: 1, SigOff: size - 8, SigOp: abi.SignalOpInc}}, false, -1)
	if st := os[0].WaitN(t, 1, ms[0].OpParts(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, Size: n}})); st != abi.Success {
		t.Fatal(st)
	}
	for deadline := time.Now().Add(5 * time.Second); atomic.LoadUint64((*uint64)(unsafe.Add(os[1].Mem, size-8))) != 1; {
		if time.Now().After(deadline) {
			t.Fatal("signal never applied")
		}
		time.Sleep(10 * time.Microsecond)
	}
	if !bytes.Equal(os[1].Bytes()[:n], s[:n]) {
		t.Fatal("payload differs")
	}
	if b := ms[0].Stats().RailBytes; b[0] != n || b[1] != 0 {
		t.Fatalf("rank 0 bytes by rail %v, want [%d 0]", b, n)
	}
}

// TestFabricOneRailNoStripe: with one rail every lane posts on the same
// endpoint, so a large put is one write (one part) unless the backend's
// plan asks for a chunk size; the bytes land either way.
func TestFabricOneRailNoStripe(t *testing.T) {
	const size = 8 << 20
	ms, os := meshtest.FabMesh2(t, "tcp;ofi_rxm", size, 4)
	src := fabric.Alloc(4 << 20)
	defer fabric.Free(src)
	sb := unsafe.Slice((*byte)(src), 4<<20)
	for i := range sb {
		sb[i] = byte(i*13 + 1)
	}
	plain := dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 1, Local: src, Size: 4 << 20}}
	chunked := dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 2, Local: src, Size: 4 << 20, Off: 4 << 20}, Plan: dataplane.Plan{Chunk: 1 << 20}}
	if n := ms[0].OpParts(1, &plain); n != 1 {
		t.Fatalf("a 4 MiB put over one rail has %d parts, want 1", n)
	}
	if n := ms[0].OpParts(1, &chunked); n != 4 {
		t.Fatalf("a 4 MiB put with a 1 MiB chunk has %d parts, want 4", n)
	}
	ms[0].Post(1, &plain, false, -1)
	ms[0].Post(1, &chunked, false, -1)
	for _, op := range []dataplane.Op{plain, chunked} {
		if st := os[0].WaitN(t, op.Tag, ms[0].OpParts(1, &op)); st != abi.Success {
			t.Fatalf("put %d: %v", op.Tag, st)
		}
		if got := os[1].Bytes()[op.Off : op.Off+op.Size]; !bytes.Equal(got, sb) {
			t.Fatalf("put %d: bytes differ", op.Tag)
		}
	}
	os[0].Mu.Lock()
	defer os[0].Mu.Unlock()
	if os[0].Parts[1] != 1 || os[0].Parts[2] != 4 {
		t.Fatalf("completions %d and %d, want 1 and 4", os[0].Parts[1], os[0].Parts[2])
	}
}
