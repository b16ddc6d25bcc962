package meshtest

import (
	"os"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/ofi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// The fixtures of the libfabric tests: an owner of one registration, the
// provider to test, and two-rank meshes over it.

// FabOwner is a target whose one registration (id 1) lives in C memory,
// as registered memory does in the plugin.
type FabOwner struct {
	// Mem is registration 1 (fabric.Alloc), Size its size.
	Mem  unsafe.Pointer
	Size uint64
	// Mu guards Done, Parts and Fail.
	Mu sync.Mutex
	// Done is each completed request's status, by tag.
	Done map[uint64]abi.Result
	// Parts counts the completions seen per tag.
	Parts map[uint64]int
	// Fail are the errors PeerFailed reported.
	Fail []error
}

// Resolve is registration 1, Mem.
func (o *FabOwner) Resolve(id uint32) (unsafe.Pointer, uint64, uintptr, dataplane.Pin, bool) {
	if id != 1 {
		return nil, 0, 0, dataplane.Pin{}, false
	}
	return o.Mem, o.Size, 0, dataplane.Pin{}, true
}

// PeerRegistered ignores the peers' registrations.
func (o *FabOwner) PeerRegistered(int, dataplane.PeerReg) {}

// Complete records tag's status and counts its completions.
func (o *FabOwner) Complete(tag uint64, st abi.Result) {
	o.Mu.Lock()
	o.Done[tag] = st
	if o.Parts == nil {
		o.Parts = map[uint64]int{}
	}
	o.Parts[tag]++
	o.Mu.Unlock()
}

// PeerFailed records err.
func (o *FabOwner) PeerFailed(_ int, err error) {
	o.Mu.Lock()
	o.Fail = append(o.Fail, err)
	o.Mu.Unlock()
}

// Wait is tag's status once it completed.
func (o *FabOwner) Wait(t testing.TB, tag uint64) abi.Result { return o.WaitN(t, tag, 1) }

// WaitN waits up to 10 s for n completions of tag (a put with signal has
// two) and is its status.
func (o *FabOwner) WaitN(t testing.TB, tag uint64, n int) abi.Result {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		o.Mu.Lock()
		st, ok := o.Done[tag]
		ok = ok && o.Parts[tag] >= n
		o.Mu.Unlock()
		if ok {
			return st
		}
		time.Sleep(20 * time.Microsecond)
	}
	t.Fatalf("tag %d never completed", tag)
	return 0
}

// IsDone reports that tag completed.
func (o *FabOwner) IsDone(tag uint64) bool {
	o.Mu.Lock()
	_, ok := o.Done[tag]
	o.Mu.Unlock()
	return ok
}

// Bytes is the registration's memory.
func (o *FabOwner) Bytes() []byte { return unsafe.Slice((*byte)(o.Mem), o.Size) }

// FabricProvider returns the provider to test with, or skips.
func FabricProvider(t testing.TB, prov string) string {
	t.Helper()
	LoopbackOnly()
	lib := os.Getenv("NCCL_RMA_WASM_FI_LIBRARY")
	if lib == "" {
		lib = "libfabric.so.1"
	}
	if err := fabric.Load(lib); err != nil {
		t.Skipf("libfabric: %v", err)
	}
	infos, err := fabric.Probe(prov)
	if err != nil || len(infos) == 0 {
		t.Skipf("no provider %s: %v", prov, err)
	}
	return infos[0].Provider
}

// LoopbackOnly keeps the tcp provider on the loopback interface (its first
// domain is otherwise the machine's first real interface): test traffic
// stays on loopback. libfabric reads it when it first initialises its
// providers; os.Setenv reaches the C environment in a cgo program.
func LoopbackOnly() {
	if os.Getenv("FI_TCP_IFACE") == "" {
		os.Setenv("FI_TCP_IFACE", "lo")
	}
}

// FabMesh2 connects two meshes over provider prov, each with a size-byte
// registration 1 known to the other.
func FabMesh2(t testing.TB, prov string, size uint64, lanes int) ([]*dataplane.Mesh, []*FabOwner) {
	t.Helper()
	return FabMesh2NoFab(t, prov, size, lanes, [2]bool{})
}

// FabTestPeerTimeout is the watchdog's timeout in FabMesh2's meshes (0:
// none); a test that sets it restores it.
var FabTestPeerTimeout time.Duration

// FabMesh2NoFab is FabMesh2 where rank i's plan declines libfabric if noFab[i].
func FabMesh2NoFab(t testing.TB, prov string, size uint64, lanes int, noFab [2]bool) ([]*dataplane.Mesh, []*FabOwner) {
	t.Helper()
	return FabMesh2Rails(t, prov, size, lanes, noFab, "", [2][]string{})
}

// FabMesh2Rails is FabMesh2NoFab with rail 0 on domain and rank i's
// further rails on the domains rails[i].
func FabMesh2Rails(t testing.TB, prov string, size uint64, lanes int, noFab [2]bool, domain string, rails [2][]string) ([]*dataplane.Mesh, []*FabOwner) {
	t.Helper()
	prov = FabricProvider(t, prov)
	os := make([]*FabOwner, 2)
	ls := make([]*dataplane.Listener, 2)
	hs := make([]*wire.Handle, 2)
	for i := range ls {
		os[i] = &FabOwner{Mem: fabric.Alloc(size), Size: size, Done: map[uint64]abi.Result{}}
		l, h, err := dataplane.Listen(dataplane.ListenOptions{Addr: "127.0.0.1", Provider: prov, Domain: domain, Rails: rails[i]})
		if err != nil {
			t.Fatal(err)
		}
		if l.Fab() == nil {
			t.Fatalf("no fabric endpoint on %s", prov)
		}
		ls[i], hs[i] = l, h
		t.Cleanup(func() { l.Close() })
	}
	ms := ConnectAll(t, ls, hs, func(i int) dataplane.Owner { return os[i] }, func(i int) dataplane.Options {
		return dataplane.Options{Timeout: 10 * time.Second, Lanes: lanes, StripeThreshold: 1 << 20, ChunkSize: 1 << 20, CloseTimeout: time.Second, NoFabric: noFab[i], PeerTimeout: FabTestPeerTimeout}
	})
	t.Cleanup(func() {
		ms[0].Close()
		ms[1].Close()
		fabric.Free(os[0].Mem)
		fabric.Free(os[1].Mem)
	})
	for i, m := range ms {
		if m.Stats().FabricPeers != 2 && noFab == [2]bool{} {
			t.Fatalf("rank %d reaches %d peers over fabric, want 2", i, m.Stats().FabricPeers)
		}
		key, err := m.RegisterMemory(1, os[i].Mem, size, false)
		if err != nil {
			t.Fatal(err)
		}
		for p := 0; p < 2; p++ {
			m.Post(p, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgReg, MrID: 1, Size: size, Off: uint64(uintptr(os[i].Mem)), SigValue: key}}, false, 0)
		}
	}
	// The keys arrive over TCP; wait until both links know them.
	for deadline := time.Now().Add(5 * time.Second); ; {
		ok := true
		for _, m := range ms {
			for _, p := range m.Peers() {
				if f, isFab := p.Transport().(*ofi.Link); isFab {
					_, _, known := f.Target(1, 0, len(f.Rails())-1)
					ok = ok && known
				}
			}
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("registration keys never arrived")
		}
		time.Sleep(time.Millisecond)
	}
	return ms, os
}

// FabLink0 is rank 0's fabric link to rank 1.
func FabLink0(t testing.TB, ms []*dataplane.Mesh) *ofi.Link {
	t.Helper()
	f, ok := ms[0].Peer(1).Transport().(*ofi.Link)
	if !ok {
		t.Fatal("rank 1 is not reached over fabric")
	}
	return f
}

// InjectForged sends n bytes at buf to dest as they are, past the
// plugin's own framing (a hostile peer's message), retrying while the
// provider has no room.
func InjectForged(t testing.TB, e *ofi.EP, buf unsafe.Pointer, n, dest uint64) {
	t.Helper()
	for {
		err := e.FI.Inject(buf, n, dest)
		if err == nil {
			return
		}
		if err != fabric.ErrAgain {
			t.Fatal(err)
		}
		e.Poll()
	}
}

// AwaitDropped waits up to 10 s for p to be failed; why is the failure
// message otherwise.
func AwaitDropped(t testing.TB, p link.Peer, why string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !p.Dead(); {
		if time.Now().After(deadline) {
			t.Fatal(why)
		}
		time.Sleep(time.Millisecond)
	}
}
