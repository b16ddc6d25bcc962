package dataplane

import (
	"os"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// The fixtures of the libfabric tests: an owner of one registration, the
// provider to test, and two-rank meshes over it.

// fabOwner is a target whose one registration (id 1) lives in C memory,
// as registered memory does in the plugin.
type fabOwner struct {
	mem   unsafe.Pointer
	size  uint64
	mu    sync.Mutex
	done  map[uint64]abi.Result
	parts map[uint64]int
	fail  []error
}

func (o *fabOwner) Resolve(id uint32) (unsafe.Pointer, uint64, uintptr, Pin, bool) {
	if id != 1 {
		return nil, 0, 0, Pin{}, false
	}
	return o.mem, o.size, 0, Pin{}, true
}
func (o *fabOwner) PeerRegistered(int, PeerReg) {}
func (o *fabOwner) Complete(tag uint64, st abi.Result) {
	o.mu.Lock()
	o.done[tag] = st
	if o.parts == nil {
		o.parts = map[uint64]int{}
	}
	o.parts[tag]++
	o.mu.Unlock()
}
func (o *fabOwner) PeerFailed(_ int, err error) {
	o.mu.Lock()
	o.fail = append(o.fail, err)
	o.mu.Unlock()
}
func (o *fabOwner) wait(t testing.TB, tag uint64) abi.Result { return o.waitN(t, tag, 1) }

// waitN waits for n completions of tag (a put with signal has two).
func (o *fabOwner) waitN(t testing.TB, tag uint64, n int) abi.Result {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		o.mu.Lock()
		st, ok := o.done[tag]
		ok = ok && o.parts[tag] >= n
		o.mu.Unlock()
		if ok {
			return st
		}
		time.Sleep(20 * time.Microsecond)
	}
	t.Fatalf("tag %d never completed", tag)
	return 0
}
func (o *fabOwner) isDone(tag uint64) bool {
	o.mu.Lock()
	_, ok := o.done[tag]
	o.mu.Unlock()
	return ok
}
func (o *fabOwner) bytes() []byte { return unsafe.Slice((*byte)(o.mem), o.size) }

// fabricProvider returns the provider to test with, or skips.
func fabricProvider(t testing.TB, prov string) string {
	t.Helper()
	loopbackOnly()
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

// loopbackOnly keeps the tcp provider on the loopback interface (its first
// domain is otherwise the machine's first real interface): test traffic
// stays on loopback. libfabric reads it when it first initialises its
// providers; os.Setenv reaches the C environment in a cgo program.
func loopbackOnly() {
	if os.Getenv("FI_TCP_IFACE") == "" {
		os.Setenv("FI_TCP_IFACE", "lo")
	}
}

// fabMesh2 connects two meshes over provider prov, each with a size-byte
// registration 1 known to the other.
func fabMesh2(t testing.TB, prov string, size uint64, lanes int) ([]*Mesh, []*fabOwner) {
	t.Helper()
	return fabMesh2NoFab(t, prov, size, lanes, [2]bool{})
}

// fabTestPeerTimeout is the watchdog's timeout in fabMesh2's meshes (0:
// none); a test that sets it restores it.
var fabTestPeerTimeout time.Duration

// fabMesh2NoFab is fabMesh2 where rank i's plan declines libfabric if noFab[i].
func fabMesh2NoFab(t testing.TB, prov string, size uint64, lanes int, noFab [2]bool) ([]*Mesh, []*fabOwner) {
	t.Helper()
	return fabMesh2Rails(t, prov, size, lanes, noFab, "", [2][]string{})
}

// fabMesh2Rails is fabMesh2NoFab with rail 0 on domain and rank i's
// further rails on the domains rails[i].
func fabMesh2Rails(t testing.TB, prov string, size uint64, lanes int, noFab [2]bool, domain string, rails [2][]string) ([]*Mesh, []*fabOwner) {
	t.Helper()
	prov = fabricProvider(t, prov)
	os := make([]*fabOwner, 2)
	ls := make([]*Listener, 2)
	hs := make([]*wire.Handle, 2)
	for i := range ls {
		os[i] = &fabOwner{mem: fabric.Alloc(size), size: size, done: map[uint64]abi.Result{}}
		l, h, err := Listen(ListenOptions{Addr: "127.0.0.1", Provider: prov, Domain: domain, Rails: rails[i]})
		if err != nil {
			t.Fatal(err)
		}
		if l.fab == nil {
			t.Fatalf("no fabric endpoint on %s", prov)
		}
		ls[i], hs[i] = l, h
		t.Cleanup(func() { l.Close() })
	}
	ms := connectAll(t, ls, hs, func(i int) Owner { return os[i] }, func(i int) Options {
		return Options{Timeout: 10 * time.Second, Lanes: lanes, StripeThreshold: 1 << 20, ChunkSize: 1 << 20, CloseTimeout: time.Second, NoFabric: noFab[i], PeerTimeout: fabTestPeerTimeout}
	})
	t.Cleanup(func() {
		ms[0].Close()
		ms[1].Close()
		fabric.Free(os[0].mem)
		fabric.Free(os[1].mem)
	})
	for i, m := range ms {
		if m.Stats().FabricPeers != 2 && noFab == [2]bool{} {
			t.Fatalf("rank %d reaches %d peers over fabric, want 2", i, m.Stats().FabricPeers)
		}
		key, err := m.RegisterMemory(1, os[i].mem, size, false)
		if err != nil {
			t.Fatal(err)
		}
		for p := 0; p < 2; p++ {
			m.Post(p, &Op{Request: Request{Msg: wire.MsgReg, MrID: 1, Size: size, Off: uint64(uintptr(os[i].mem)), SigValue: key}}, false, 0)
		}
	}
	// The keys arrive over TCP; wait until both links know them.
	for deadline := time.Now().Add(5 * time.Second); ; {
		ok := true
		for _, m := range ms {
			for _, p := range m.peers {
				if f, isFab := p.t.(*fabricLink); isFab {
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

// fabLink0 is rank 0's fabric link to rank 1.
func fabLink0(t *testing.T, ms []*Mesh) *fabricLink {
	t.Helper()
	f, ok := ms[0].peers[1].t.(*fabricLink)
	if !ok {
		t.Fatal("rank 1 is not reached over fabric")
	}
	return f
}

// injectForged sends n bytes at buf to dest as they are, past the
// plugin's own framing (a hostile peer's message), retrying while the
// provider has no room.
func injectForged(t *testing.T, e *fabEP, buf unsafe.Pointer, n, dest uint64) {
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

// awaitDropped waits up to 10 s for p to be failed; why is the failure
// message otherwise.
func awaitDropped(t *testing.T, p *peer, why string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !p.dead.Load(); {
		if time.Now().After(deadline) {
			t.Fatal(why)
		}
		time.Sleep(time.Millisecond)
	}
}
