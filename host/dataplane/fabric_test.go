package dataplane

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/devtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric/endpoint"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric/nics"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

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
			m.Post(p, &Op{Msg: wire.MsgReg, MrID: 1, Size: size, Off: uint64(uintptr(os[i].mem)), SigValue: key}, false, 0)
		}
	}
	// The keys arrive over TCP; wait until both links know them.
	for deadline := time.Now().Add(5 * time.Second); ; {
		ok := true
		for _, m := range ms {
			for _, p := range m.peers {
				if f, isFab := p.t.(*fabricLink); isFab {
					_, _, known := f.target(1, 0, len(f.rails)-1)
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

// TestFabricPutSignalGet moves bytes both ways and checks that a signal
// arrives after its payload, on every provider available here.
func TestFabricPutSignalGet(t *testing.T) {
	// shm is covered by the driver tests (one process per rank): two shm
	// endpoints in one Go process crash inside libfabric 1.17.
	for _, prov := range []string{"tcp;ofi_rxm"} {
		for _, lanes := range []int{1, 3} {
			t.Run(prov+"/lanes"+string(rune('0'+lanes)), func(t *testing.T) {
				const size = 4 << 20
				ms, os := fabMesh2(t, prov, size, lanes)
				src := fabric.Alloc(size)
				defer fabric.Free(src)
				s := unsafe.Slice((*byte)(src), size)
				for i := range s {
					s[i] = byte(i*7 + 1)
				}
				// Rank 0 puts 3 MiB (striped when lanes > 1) with a signal
				// at the registration's last 8 bytes, then a signal alone.
				const n = 3 << 20
				sigOff := uint64(size - 8)
				ms[0].Post(1, &Op{Msg: wire.MsgPutSignal, MrID: 1, Tag: 1, Local: src, Size: n, Off: 0, SigMrID: 1, SigOff: sigOff, SigOp: abi.SignalOpAdd, SigValue: 5}, false, -1)
				ms[0].Post(1, &Op{Msg: wire.MsgPutSignal, Tag: 2, SigMrID: 1, SigOff: sigOff, SigOp: abi.SignalOpInc}, false, -1)
				for _, tag := range []uint64{1, 2} {
					if st := os[0].wait(t, tag); st != abi.Success {
						t.Fatalf("tag %d: %v", tag, st)
					}
				}
				sig := (*uint64)(unsafe.Add(os[1].mem, sigOff))
				for deadline := time.Now().Add(5 * time.Second); *(*uint64)(unsafe.Pointer(sig)) != 6; {
					if time.Now().After(deadline) {
						t.Fatalf("signal %d, want 6", *sig)
					}
					time.Sleep(10 * time.Microsecond)
				}
				got := os[1].bytes()
				for i := 0; i < n; i++ {
					if got[i] != s[i] {
						t.Fatalf("byte %d: %d, want %d", i, got[i], s[i])
					}
				}
				// Rank 1 reads it back.
				dst := fabric.Alloc(n)
				defer fabric.Free(dst)
				ms[1].Post(0, &Op{Msg: wire.MsgGet, MrID: 1, Tag: 3, Local: dst, Size: n, Off: 0}, false, -1)
				_ = os[1].wait(t, 3)
				ms[1].Post(0, &Op{Msg: wire.MsgGet, MrID: 1, Tag: 4, Local: dst, Size: n, Off: 0}, false, -1)
				if st := os[1].wait(t, 4); st != abi.Success {
					t.Fatalf("get: %v", st)
				}
				if len(os[0].fail)+len(os[1].fail) > 0 {
					t.Fatalf("failures: %v %v", os[0].fail, os[1].fail)
				}
			})
		}
	}
}

// TestFabricOrderedSignals posts many small puts, each followed by a
// signal: whenever the target sees the counter at k, the first k puts
// landed.
func TestFabricOrderedSignals(t *testing.T) {
	ms, os := fabMesh2(t, "tcp;ofi_rxm", 1<<16, 1)
	src := fabric.Alloc(8)
	defer fabric.Free(src)
	const n = 500
	for i := uint64(1); i <= n; i++ {
		*(*uint64)(src) = i
		ms[0].Post(1, &Op{Msg: wire.MsgPutSignal, MrID: 1, Tag: i, Local: src, Size: 8, Off: 8 * i, SigMrID: 1, SigOff: 0, SigOp: abi.SignalOpInc}, false, -1)
		os[0].waitN(t, i, ms[0].PeerParts(1, wire.MsgPutSignal, 8)) // the source is reused
	}
	sig := (*uint64)(os[1].mem)
	for deadline := time.Now().Add(5 * time.Second); *sig != n; {
		if time.Now().After(deadline) {
			t.Fatalf("signal %d, want %d", *sig, n)
		}
		time.Sleep(10 * time.Microsecond)
	}
	for i := uint64(1); i <= n; i++ {
		if v := *(*uint64)(unsafe.Add(os[1].mem, 8*i)); v != i {
			t.Fatalf("word %d: %d", i, v)
		}
	}
}

// TestFabricLatency reports the round trip of a put with signal answered
// by one; it only logs (no NIC here, the numbers are loopback's).
func TestFabricLatency(t *testing.T) {
	// shm is covered by the driver tests (one process per rank): two shm
	// endpoints in one Go process crash inside libfabric 1.17.
	for _, prov := range []string{"tcp;ofi_rxm"} {
		t.Run(prov, func(t *testing.T) {
			ms, os := fabMesh2(t, prov, 1<<16, 1)
			src := fabric.Alloc(1 << 16)
			defer fabric.Free(src)
			const n = 200
			s0, s1 := (*uint64)(os[0].mem), (*uint64)(os[1].mem)
			start := time.Now()
			for i := uint64(1); i <= n; i++ {
				ms[0].Post(1, &Op{Msg: wire.MsgPutSignal, MrID: 1, Tag: i, Local: src, Size: 1 << 15, Off: 64, SigMrID: 1, SigOp: abi.SignalOpInc}, false, -1)
				for atomic.LoadUint64(s1) != i {
					runtime.Gosched()
				}
				ms[1].Post(0, &Op{Msg: wire.MsgPutSignal, Tag: i, SigMrID: 1, SigOp: abi.SignalOpInc}, false, -1)
				for atomic.LoadUint64(s0) != i {
					runtime.Gosched()
				}
			}
			t.Logf("%s: 32 KiB put+signal, signal back: %v per round trip", prov, time.Since(start)/n)
		})
	}
}

// TestFabricThroughput reports 1 MiB puts, 16 in flight (a log, not a check).
func TestFabricThroughput(t *testing.T) {
	const size, window, total = 1 << 20, 16, 256
	ms, os := fabMesh2(t, "tcp;ofi_rxm", size*window, 1)
	src := fabric.Alloc(size)
	defer fabric.Free(src)
	start := time.Now()
	for i := uint64(1); i <= total; i++ {
		if i > window {
			os[0].wait(t, i-window)
		}
		ms[0].Post(1, &Op{Msg: wire.MsgPut, MrID: 1, Tag: i, Local: src, Size: size, Off: (i % window) * size}, false, -1)
	}
	os[0].wait(t, total)
	el := time.Since(start)
	t.Logf("tcp;ofi_rxm: %d × 1 MiB puts, window %d: %.2f GB/s", total, window, float64(total*size)/el.Seconds()/1e9)
}

// TestHandleFabricName: the endpoint name and provider hash ride the
// handle; a name too long for it leaves the handle TCP-only.
func TestHandleFabricName(t *testing.T) {
	l, _, err := Listen(ListenOptions{Addr: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	hi := l.info
	hi.FabricHash, hi.FabricName = endpoint.ProviderHash("tcp;ofi_rxm"), []byte{2, 0, 0x1f, 0x90, 127, 0, 0, 1}
	var h wire.Handle
	hi.Encode(&h)
	got, err := wire.DecodeHandle(&h)
	if err != nil || got.FabricHash != hi.FabricHash || string(got.FabricName) != string(hi.FabricName) || got.Pid != hi.Pid {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	if endpoint.ProviderHash("shm") == got.FabricHash {
		t.Fatal("two providers hash alike")
	}
	hi.FabricName = make([]byte, wire.FabNameMax+1)
	hi.Encode(&h)
	if got, _ := wire.DecodeHandle(&h); got.FabricHash != 0 || got.FabricName != nil {
		t.Fatalf("oversized name encoded: %+v", got)
	}
}

// TestFabricPostAllocs: posting over the fabric allocates nothing.
func TestFabricPostAllocs(t *testing.T) {
	ms, os := fabMesh2(t, "tcp;ofi_rxm", 1<<16, 1)
	src := fabric.Alloc(8)
	defer fabric.Free(src)
	tag := uint64(0)
	op := Op{Msg: wire.MsgPutSignal, MrID: 1, Local: src, Size: 8, Off: 8, SigMrID: 1, SigOp: abi.SignalOpInc}
	allocs := testing.AllocsPerRun(200, func() {
		tag++
		op.Tag = tag
		ms[0].Post(1, &op, false, -1)
	})
	// 8 bytes travel inline (one message, one part); larger ones as a
	// write and a signal message (two parts).
	os[0].waitN(t, tag, 1)
	if n := ms[0].PeerParts(1, wire.MsgPutSignal, 8); n != 1 {
		t.Fatalf("an inline put with signal over the fabric has %d parts, want 1", n)
	}
	if n := ms[0].PeerParts(1, wire.MsgPutSignal, endpoint.InlineMax+1); n != 2 {
		t.Fatalf("a put with signal of %d bytes over the fabric has %d parts, want 2", endpoint.InlineMax+1, n)
	}
	if allocs != 0 {
		t.Fatalf("%v allocations per post", allocs)
	}
}

// TestFabricNarrowCQData runs the ordered-signal test with the sequence
// field cut to 8 bits (as with 4-byte CQ data, only narrower), so the
// target's unwrap is crossed many times, with one lane and with three.
func TestFabricNarrowCQData(t *testing.T) {
	fabTestSeqBits = 8
	defer func() { fabTestSeqBits = 0 }()
	for _, lanes := range []int{1, 3} {
		ms, os := fabMesh2(t, "tcp;ofi_rxm", 1<<16, lanes)
		if ms[0].fab.cq.SeqBits != 8 {
			t.Fatalf("seqBits %d", ms[0].fab.cq.SeqBits)
		}
		src := fabric.Alloc(8)
		const n = 700
		for i := uint64(1); i <= n; i++ {
			*(*uint64)(src) = i
			ms[0].Post(1, &Op{Msg: wire.MsgPutSignal, MrID: 1, Tag: i, Local: src, Size: 8, Off: 8 * i, SigMrID: 1, SigOp: abi.SignalOpInc}, false, -1)
			os[0].waitN(t, i, ms[0].PeerParts(1, wire.MsgPutSignal, 8))
		}
		fabric.Free(src)
		sig := (*uint64)(os[1].mem)
		for deadline := time.Now().Add(5 * time.Second); *sig != n; {
			if time.Now().After(deadline) {
				t.Fatalf("lanes %d: signal %d, want %d", lanes, *sig, n)
			}
			time.Sleep(10 * time.Microsecond)
		}
		for i := uint64(1); i <= n; i++ {
			if v := *(*uint64)(unsafe.Add(os[1].mem, 8*i)); v != i {
				t.Fatalf("lanes %d: word %d: %d", lanes, i, v)
			}
		}
	}
}

// TestFabricIdleWake: after a long idle spell both progress goroutines
// sleep on their CQ's wait fd; a put with signal must wake the target. The
// wait's own bound is raised to ten minutes, so only the fd can wake it:
// without that wake-up the signal does not arrive and the test fails.
func TestFabricIdleWake(t *testing.T) {
	prev := endpoint.SetWaitBound(600_000)
	t.Cleanup(func() { endpoint.SetWaitBound(prev) })
	ms, os := fabMesh2(t, "tcp;ofi_rxm", 1<<16, 1)
	if !ms[1].fab.CanWait() {
		t.Skip("tcp;ofi_rxm offers no CQ wait fd here")
	}
	src := fabric.Alloc(64)
	defer fabric.Free(src)
	sig := (*uint64)(os[1].mem)
	for i := uint64(1); i <= 3; i++ {
		asleep := time.Now().Add(20 * time.Second)
		for !ms[1].fab.InWait() || !ms[0].fab.InWait() {
			if time.Now().After(asleep) {
				t.Fatalf("round %d: the progress goroutines never went to sleep", i)
			}
			time.Sleep(time.Millisecond)
		}
		ms[0].Post(1, &Op{Msg: wire.MsgPutSignal, MrID: 1, Tag: i, Local: src, Size: 64, Off: 64, SigMrID: 1, SigOp: abi.SignalOpInc}, false, -1)
		start := time.Now()
		for atomic.LoadUint64(sig) != i {
			if time.Since(start) > 60*time.Second {
				t.Fatalf("round %d: the signal never arrived: the wait fd did not wake the target", i)
			}
			time.Sleep(20 * time.Microsecond)
		}
		t.Logf("round %d: woke and applied in %v", i, time.Since(start))
	}
	if !ms[1].fab.CanWait() {
		t.Fatal("the provider refused to wait after all")
	}
}

// TestFabricDeclined: when either rank's connection plan declines
// libfabric, both choose TCP for the pair (the hello carries the choice),
// and bytes and signals still arrive.
func TestFabricDeclined(t *testing.T) {
	for _, noFab := range [][2]bool{{false, false}, {true, false}, {false, true}} {
		ms, os := fabMesh2NoFab(t, "tcp;ofi_rxm", 1<<16, 1, noFab)
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
		ms[0].Post(1, &Op{Msg: wire.MsgPutSignal, MrID: 1, Tag: 1, Local: src, Size: 4096, Off: 64, SigMrID: 1, SigOp: abi.SignalOpInc}, false, -1)
		os[0].waitN(t, 1, ms[0].PeerParts(1, wire.MsgPutSignal, 4096))
		deadline := time.Now().Add(10 * time.Second)
		for atomic.LoadUint64((*uint64)(os[1].mem)) != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("decline %v: signal never arrived", noFab)
			}
			time.Sleep(100 * time.Microsecond)
		}
		if !bytes.Equal(unsafe.Slice((*byte)(unsafe.Add(os[1].mem, 64)), 4096), b) {
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
	ms, os := fabMesh2(t, "tcp;ofi_rxm", size, 1)
	src := fabric.Alloc(4096)
	defer fabric.Free(src)
	bad := []Op{
		{Msg: wire.MsgPutSignal, MrID: 1, Tag: 1, Local: src, Size: 4096, SigMrID: 9, SigOp: abi.SignalOpInc},
		{Msg: wire.MsgPutSignal, MrID: 1, Tag: 2, Local: src, Size: 64, SigMrID: 1, SigOff: size, SigOp: abi.SignalOpInc},
		{Msg: wire.MsgPutSignal, Tag: 3, SigMrID: 1, SigOff: 12, SigOp: abi.SignalOpInc},
		{Msg: wire.MsgPutSignal, Tag: 4, SigMrID: 1, SigOff: 16, SigOp: 9},
		// Inline puts (at most endpoint.InlineMax bytes) whose range the target
		// rejects: past the end, an unknown registration, an offset that
		// overflows. Their signals must not apply either.
		{Msg: wire.MsgPutSignal, MrID: 1, Tag: 6, Local: src, Size: 16, Off: size - 8, SigMrID: 1, SigOff: 8, SigOp: abi.SignalOpInc},
		{Msg: wire.MsgPutSignal, MrID: 7, Tag: 7, Local: src, Size: 8, SigMrID: 1, SigOff: 8, SigOp: abi.SignalOpInc},
		{Msg: wire.MsgPutSignal, MrID: 1, Tag: 8, Local: src, Size: 8, Off: 1<<64 - 4, SigMrID: 1, SigOff: 8, SigOp: abi.SignalOpInc},
	}
	for i := range bad {
		ms[0].Post(1, &bad[i], false, -1)
	}
	for i := range bad {
		parts := ms[0].PeerParts(1, bad[i].Msg, bad[i].Size)
		if st := os[0].waitN(t, bad[i].Tag, parts); st != abi.InvalidArgument {
			t.Fatalf("signal %d rejected at the target: request completed with %v, want %v", bad[i].Tag, st, abi.InvalidArgument)
		}
	}
	ms[0].Post(1, &Op{Msg: wire.MsgPutSignal, Tag: 5, SigMrID: 1, SigOff: 8, SigOp: abi.SignalOpAdd, SigValue: 3}, false, -1)
	if st := os[0].waitN(t, 5, ms[0].PeerParts(1, wire.MsgPutSignal, 0)); st != abi.Success {
		t.Fatalf("valid signal after rejections: %v", st)
	}
	if w := *(*uint64)(unsafe.Add(os[1].mem, 8)); w != 3 {
		t.Fatalf("signal word %d, want 3", w)
	}
	time.Sleep(10 * time.Millisecond) // a duplicate completion would show now
	os[0].mu.Lock()
	defer os[0].mu.Unlock()
	for i := range bad {
		if got, want := os[0].parts[bad[i].Tag], ms[0].PeerParts(1, bad[i].Msg, bad[i].Size); got != want {
			t.Errorf("request %d completed %d times, want %d", bad[i].Tag, got, want)
		}
	}
	if len(os[0].fail) < len(bad) {
		t.Fatalf("%d rejections reported to the sender, want %d: %v", len(os[0].fail), len(bad), os[0].fail)
	}
}

// TestFabricSeqWindowHolds: with a 6-bit sequence field, while nothing
// of ours can complete (no poller) no more than 2^6 numbers are posted;
// the rest wait in order and land once completions flow, every byte and
// the signal count right.
func TestFabricSeqWindowHolds(t *testing.T) {
	fabTestSeqBits = 6
	defer func() { fabTestSeqBits = 0 }()
	ms, os := fabMesh2(t, "tcp;ofi_rxm", 1<<16, 1)
	l := ms[0].fab.links[1]
	if l.win.Size() != 64 {
		t.Fatalf("window %d, want 64 for a 6-bit field", l.win.Size())
	}
	src := fabric.Alloc(8 * 1024)
	defer fabric.Free(src)
	const n = 600
	// One put first: rxm connects on the first send, which needs progress.
	ms[0].Post(1, &Op{Msg: wire.MsgPut, MrID: 1, Tag: 1 << 20, Local: src, Size: 8, Off: 0}, false, -1)
	os[0].wait(t, 1<<20)
	ms[0].fab.LockPoll() // nobody reaps: nothing of ours completes
	for i := uint64(1); i <= n; i++ {
		*(*uint64)(unsafe.Add(src, 8*i)) = i
		ms[0].Post(1, &Op{Msg: wire.MsgPut, MrID: 1, Tag: i, Local: unsafe.Add(src, 8*i), Size: 8, Off: 8 * i}, false, -1)
	}
	ms[0].Post(1, &Op{Msg: wire.MsgPutSignal, Tag: n + 1, SigMrID: 1, SigOp: abi.SignalOpInc}, false, -1)
	posted := l.inflight.Load()
	waiting := l.backlog.Load()
	ms[0].fab.UnlockPoll()
	t.Logf("%d posted, %d waiting", posted, waiting)
	if posted > 64 || waiting < n+1-64 {
		t.Fatalf("%d posted and %d waiting with nothing completed; the window allows 64", posted, waiting)
	}
	for i := uint64(1); i <= n; i++ {
		if st := os[0].wait(t, i); st != abi.Success {
			t.Fatalf("put %d: %v", i, st)
		}
	}
	os[0].waitN(t, n+1, ms[0].PeerParts(1, wire.MsgPutSignal, 0))
	for deadline := time.Now().Add(5 * time.Second); *(*uint64)(os[1].mem) != 1; {
		if time.Now().After(deadline) {
			t.Fatal("signal never applied")
		}
		time.Sleep(10 * time.Microsecond)
	}
	for i := uint64(1); i <= n; i++ {
		if v := *(*uint64)(unsafe.Add(os[1].mem, 8*i)); v != i {
			t.Fatalf("word %d: %d", i, v)
		}
	}
}

// TestFabricRails stripes large puts, puts with signal and gets over two
// rails and checks every byte, the signals, and that both rails carried
// bytes. Test traffic stays on loopback here, so both rails are endpoints
// on the loopback domain (TestFabricRailsNamespaces in test/ gives each
// rail a NIC of its own).
func TestFabricRails(t *testing.T) {
	prov := fabricProvider(t, "tcp;ofi_rxm")
	nics := nics.List(prov)
	if len(nics) < 1 {
		t.Skipf("%s offers no domain here", prov)
	}
	const size = 8 << 20
	dom := nics[0].Domain
	ms, os := fabMesh2Rails(t, prov, size, 2, [2]bool{}, dom, [2][]string{{dom}, {dom}})
	for i, m := range ms {
		if got := m.Stats().FabricRails; len(got) != 2 || got[0] != dom || got[1] != dom {
			t.Fatalf("rank %d rails %v, want [%s %s]", i, got, dom, dom)
		}
		for _, p := range m.peers {
			if f := p.t.(*fabricLink); len(f.rails) != 2 {
				t.Fatalf("rank %d link to %d has %d rails", i, p.rank, len(f.rails))
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
		ms[0].Post(1, &Op{Msg: wire.MsgPutSignal, MrID: 1, Tag: 10 * r, Local: src, Size: n, SigMrID: 1, SigOff: sigOff, SigOp: abi.SignalOpInc}, false, -1)
		for k := uint64(1); k <= 3; k++ {
			ms[0].Post(1, &Op{Msg: wire.MsgPutSignal, MrID: 1, Tag: 10*r + k, Local: unsafe.Add(src, n+8*k), Size: 8, Off: n + 8*k, SigMrID: 1, SigOff: sigOff, SigOp: abi.SignalOpInc}, false, 1)
		}
		for k := uint64(0); k <= 3; k++ {
			if st := os[0].waitN(t, 10*r+k, ms[0].OpParts(1, &Op{Msg: wire.MsgPutSignal, Size: map[bool]uint64{true: n, false: 8}[k == 0]})); st != abi.Success {
				t.Fatalf("round %d op %d: %v", r, k, st)
			}
		}
		want := 4 * r
		for deadline := time.Now().Add(5 * time.Second); atomic.LoadUint64((*uint64)(unsafe.Add(os[1].mem, sigOff))) != want; {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: signal %d, want %d", r, *(*uint64)(unsafe.Add(os[1].mem, sigOff)), want)
			}
			time.Sleep(10 * time.Microsecond)
		}
		if got := os[1].bytes()[:n]; !bytes.Equal(got, s[:n]) {
			t.Fatalf("round %d: payload differs", r)
		}
	}
	// Rank 1 reads it back, striped over its rails too.
	dst := fabric.Alloc(n)
	defer fabric.Free(dst)
	ms[1].Post(0, &Op{Msg: wire.MsgGet, MrID: 1, Tag: 99, Local: dst, Size: n}, false, -1)
	if st := os[1].waitN(t, 99, ms[1].Parts(wire.MsgGet, n)); st != abi.Success {
		t.Fatalf("get: %v", st)
	}
	for i, m := range ms {
		b := m.Stats().RailBytes
		t.Logf("rank %d: bytes by rail %v", i, b)
		if b[0] == 0 || b[1] == 0 {
			t.Errorf("rank %d: rail bytes %v: a rail carried nothing", i, b)
		}
	}
	if len(os[0].fail)+len(os[1].fail) > 0 {
		t.Fatalf("failures: %v %v", os[0].fail, os[1].fail)
	}
}

// TestFabricRailsUneven: a rank with two rails and one with one (its
// listener knows no second NIC) pair on one rail: rank 0's second
// endpoint carries nothing to rank 1, and every byte and signal arrives.
func TestFabricRailsUneven(t *testing.T) {
	prov := fabricProvider(t, "tcp;ofi_rxm")
	nics := nics.List(prov)
	if len(nics) < 1 {
		t.Skipf("%s offers no domain here", prov)
	}
	const size = 4 << 20
	dom := nics[0].Domain
	ms, os := fabMesh2Rails(t, prov, size, 2, [2]bool{}, dom, [2][]string{{dom}, nil})
	if r0, r1 := ms[0].Stats().FabricRails, ms[1].Stats().FabricRails; len(r0) != 2 || len(r1) != 1 {
		t.Fatalf("rails %v and %v, want 2 and 1", r0, r1)
	}
	for i, m := range ms {
		for _, p := range m.peers {
			want := 1
			if i == 0 && p.rank == 0 {
				want = 2 // rank 0 to itself: both ends have two
			}
			if f := p.t.(*fabricLink); len(f.rails) != want {
				t.Fatalf("rank %d link to %d: %d rails, want %d", i, p.rank, len(f.rails), want)
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
	ms[0].Post(1, &Op{Msg: wire.MsgPutSignal, MrID: 1, Tag: 1, Local: src, Size: n, SigMrID: 1, SigOff: size - 8, SigOp: abi.SignalOpInc}, false, -1)
	if st := os[0].waitN(t, 1, ms[0].OpParts(1, &Op{Msg: wire.MsgPutSignal, Size: n})); st != abi.Success {
		t.Fatal(st)
	}
	for deadline := time.Now().Add(5 * time.Second); atomic.LoadUint64((*uint64)(unsafe.Add(os[1].mem, size-8))) != 1; {
		if time.Now().After(deadline) {
			t.Fatal("signal never applied")
		}
		time.Sleep(10 * time.Microsecond)
	}
	if !bytes.Equal(os[1].bytes()[:n], s[:n]) {
		t.Fatal("payload differs")
	}
	if b := ms[0].Stats().RailBytes; b[0] != n || b[1] != 0 {
		t.Fatalf("rank 0 bytes by rail %v, want [%d 0]", b, n)
	}
}

// devFabOwner is fabOwner with a second registration (id 2) in a fake
// device's memory: ops on it must be staged (the provider here has no
// FI_HMEM, and the fake's addresses cannot be dereferenced).
type devFabOwner struct {
	*fabOwner
	dev  uintptr
	size uint64
}

func (o *devFabOwner) Resolve(id uint32) (unsafe.Pointer, uint64, uintptr, Pin, bool) {
	if id == 2 {
		a := o.dev
		return *(*unsafe.Pointer)(unsafe.Pointer(&a)), o.size, 1, Pin{}, true
	}
	return o.fabOwner.Resolve(id)
}

// TestFabricDeviceStaged: puts from and to device memory, with signals,
// interleaved with host puts that go over RDMA, and a get from device
// memory, on a fabric link: every byte lands, every signal is applied
// (device ops ride the TCP lanes with the fabric's sequence numbers, which
// the target's orderer takes from both paths), the staged puts leave the
// number window when acknowledged, and no device byte touched the fabric.
func TestFabricDeviceStaged(t *testing.T) {
	for _, lanes := range []int{1, 2} {
		t.Run(fmt.Sprintf("lanes%d", lanes), func(t *testing.T) {
			const hsize, dsize = 1 << 20, 4 << 20
			d := &devtest.Pipe{Mem: make([]byte, 2*dsize), Base: 0x7e00_0000_0000}
			devmem.Register(d)
			defer devmem.Register(nil)
			prov := fabricProvider(t, "tcp;ofi_rxm")
			owners := make([]*devFabOwner, 2)
			ms := make([]*Mesh, 2)
			{
				ls := make([]*Listener, 2)
				hs := make([]*wire.Handle, 2)
				for i := range ls {
					owners[i] = &devFabOwner{fabOwner: &fabOwner{mem: fabric.Alloc(hsize), size: hsize, done: map[uint64]abi.Result{}}, dev: d.Base + uintptr(i*dsize), size: dsize}
					l, h, err := Listen(ListenOptions{Addr: "127.0.0.1", Provider: prov})
					if err != nil {
						t.Fatal(err)
					}
					ls[i], hs[i] = l, h
					t.Cleanup(func() { l.Close() })
				}
				copy(ms, connectAll(t, ls, hs, func(i int) Owner { return owners[i] }, func(int) Options {
					return Options{Timeout: 10 * time.Second, Lanes: lanes, StripeThreshold: 1 << 20, ChunkSize: 256 << 10, CloseTimeout: time.Second}
				}))
			}
			defer func() {
				ms[0].Close()
				ms[1].Close()
				fabric.Free(owners[0].mem)
				fabric.Free(owners[1].mem)
			}()
			for i, m := range ms {
				key, err := m.RegisterMemory(1, owners[i].mem, hsize, false)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := m.RegisterMemory(2, nil, dsize, true); err != nil {
					t.Fatalf("device registration on a fabric communicator: %v", err)
				}
				for p := 0; p < 2; p++ {
					m.Post(p, &Op{Msg: wire.MsgReg, MrID: 1, Size: hsize, Off: uint64(uintptr(owners[i].mem)), SigValue: key}, false, 0)
					m.Post(p, &Op{Msg: wire.MsgReg, MrID: 2, Size: dsize, Off: uint64(owners[i].dev), Dev: true}, false, 0)
				}
			}
			f := ms[0].peers[1].t.(*fabricLink)
			for deadline := time.Now().Add(5 * time.Second); !func() bool { d, _ := f.remoteDev(2); return d }(); {
				if time.Now().After(deadline) {
					t.Fatal("device registration never announced")
				}
				time.Sleep(time.Millisecond)
			}
			// Rank 0's source: its host registration and its device memory.
			hsrc := owners[0].bytes()
			for i := range hsrc {
				hsrc[i] = byte(i*7 + 3)
			}
			dsrc := d.Mem[:dsize]
			for i := range dsrc {
				dsrc[i] = byte(i*11 + 5)
			}
			before := ms[0].Stats().RailBytes[0]
			// Ops to rank 1, each followed by an INC of the word at 0 of its
			// host registration; the target must see every earlier op
			// landed whenever the signal moves.
			type step struct {
				op     Op
				fabric bool
			}
			var steps []step
			for k := uint64(0); k < 6; k++ {
				n := uint64(64 << 10)
				if k%3 == 2 {
					n = 2 << 20 // striped when lanes > 1
				}
				off := k * (n + 4096) % (dsize - n)
				switch k % 2 {
				case 0: // device source → device destination, staged
					steps = append(steps, step{Op{Msg: wire.MsgPutSignal, MrID: 2, Local: nil, LocalCtx: 1, Size: n, Off: off, SigMrID: 1, SigOp: abi.SignalOpInc}, false})
					steps[len(steps)-1].op.Local = *(*unsafe.Pointer)(unsafe.Pointer(&[]uintptr{d.Base + uintptr(off)}[0]))
				default: // host → host over RDMA, then host → device staged
					hn := min(n, hsize/2)
					steps = append(steps, step{Op{Msg: wire.MsgPut, MrID: 1, Local: unsafe.Add(owners[0].mem, 8), Size: hn - 8, Off: hsize/2 + 8, LocalMr: 1}, true})
					steps = append(steps, step{Op{Msg: wire.MsgPutSignal, MrID: 2, Local: unsafe.Add(owners[0].mem, 8), Size: hn - 8, Off: dsize - hn, LocalMr: 1, SigMrID: 1, SigOp: abi.SignalOpInc}, false})
				}
			}
			for i := range steps {
				steps[i].op.Tag = uint64(i + 1)
				ms[0].Post(1, &steps[i].op, false, -1)
			}
			for i := range steps {
				if st := owners[0].waitN(t, steps[i].op.Tag, ms[0].OpParts(1, &steps[i].op)); st != abi.Success {
					t.Fatalf("op %d: %v", i, st)
				}
			}
			sigs := uint64(0)
			for _, s := range steps {
				if s.op.Msg == wire.MsgPutSignal {
					sigs++
				}
			}
			sig := (*uint64)(owners[1].mem)
			for deadline := time.Now().Add(5 * time.Second); atomic.LoadUint64(sig) != sigs; {
				if time.Now().After(deadline) {
					t.Fatalf("signal %d, want %d", atomic.LoadUint64(sig), sigs)
				}
				time.Sleep(10 * time.Microsecond)
			}
			// Rank 1's device memory holds the last device put to each
			// range; check each op's bytes where no later op overwrote them.
			dst := d.Mem[dsize:]
			for i, s := range steps {
				if s.op.MrID != 2 {
					continue
				}
				var want []byte
				if s.op.LocalCtx != 0 {
					want = dsrc[s.op.Off : s.op.Off+s.op.Size]
				} else {
					want = hsrc[8 : 8+s.op.Size]
				}
				later := false
				for _, u := range steps[i+1:] {
					later = later || (u.op.MrID == 2 && u.op.Off < s.op.Off+s.op.Size && s.op.Off < u.op.Off+u.op.Size)
				}
				if !later && !bytes.Equal(dst[s.op.Off:s.op.Off+s.op.Size], want) {
					t.Fatalf("op %d: device bytes differ", i)
				}
			}
			if got := owners[1].bytes()[hsize/2+8 : hsize/2+64<<10]; !bytes.Equal(got, hsrc[8:64<<10]) {
				t.Fatal("host put over the fabric: bytes differ")
			}
			// Only the host puts used the fabric.
			var hostBytes uint64
			for _, s := range steps {
				if s.fabric {
					hostBytes += s.op.Size
				}
			}
			if got := ms[0].Stats().RailBytes[0] - before; got != hostBytes {
				t.Errorf("the fabric moved %d bytes, want %d (the host puts only)", got, hostBytes)
			}
			// Rank 1 gets device bytes of rank 0 into its host memory.
			ms[1].Post(0, &Op{Msg: wire.MsgGet, MrID: 2, Tag: 500, Local: unsafe.Add(owners[1].mem, 4096), LocalMr: 1, Size: 128 << 10, Off: 4096}, false, -1)
			if st := owners[1].waitN(t, 500, ms[1].Parts(wire.MsgGet, 128<<10)); st != abi.Success {
				t.Fatalf("get: %v", st)
			}
			if !bytes.Equal(owners[1].bytes()[4096:4096+128<<10], dsrc[4096:4096+128<<10]) {
				t.Fatal("get from device memory: bytes differ")
			}
			// The lane releases the window when the acks arrive, unless a
			// poller was reaping at that moment (reapStaged takes turns);
			// then that poller's next round does: wait for it, bounded.
			for end := time.Now().Add(10 * time.Second); f.staging.Load() != 0 && time.Now().Before(end); {
				time.Sleep(time.Millisecond)
			}
			if f.staging.Load() != 0 {
				t.Errorf("%d staged puts still hold the window", f.staging.Load())
			}
			if len(owners[0].fail)+len(owners[1].fail) > 0 {
				t.Fatalf("failures: %v %v", owners[0].fail, owners[1].fail)
			}
		})
	}
}

// TestFabricStagedChoice: which operations a fabric link stages over TCP.
// Device memory goes by RDMA only where both ends registered it with the
// provider (FI_HMEM): our local buffer's registration and the peer's
// target registration (its MsgReg says so); host memory always does.
func TestFabricStagedChoice(t *testing.T) {
	local := []fabric.MR{1: {}, 2: {Dev: true}} // 1 host, 2 device registered with FI_HMEM
	e := &fabEP{Endpoint: &endpoint.Endpoint{Regs: endpoint.NewRegs(nil, 0, local)}}
	f := &fabricLink{e: e, rails: []fabRail{{e: e}}}
	empty := []fabRemote{}
	f.remote.Store(&empty)
	f.peerRegistered(0, 1, 0x1000, 11, false, false) // host
	f.peerRegistered(0, 2, 0x2000, 12, true, false)  // device, not registered with the provider: staged
	f.peerRegistered(0, 3, 0x3000, 13, true, true)   // device registered with FI_HMEM
	f.peerRegistered(0, 4, 0x4000, 14, false, true)  // host: "direct" means nothing there
	dev := uintptr(0x7e00_0000_0000)
	for _, c := range []struct {
		name   string
		op     Op
		staged bool
	}{
		{"host to host", Op{Msg: wire.MsgPut, MrID: 1, LocalMr: 1, Size: 64}, false},
		{"host to staged device", Op{Msg: wire.MsgPutSignal, MrID: 2, LocalMr: 1, Size: 64}, true},
		{"host to direct device", Op{Msg: wire.MsgPut, MrID: 3, LocalMr: 1, Size: 64}, false},
		{"host to host marked direct", Op{Msg: wire.MsgPut, MrID: 4, LocalMr: 1, Size: 64}, false},
		{"direct device to host", Op{Msg: wire.MsgPut, MrID: 1, LocalMr: 2, LocalCtx: dev, Size: 64}, false},
		{"unregistered device to host", Op{Msg: wire.MsgPut, MrID: 1, LocalMr: 1, LocalCtx: dev, Size: 64}, true},
		{"direct device to staged device", Op{Msg: wire.MsgPut, MrID: 2, LocalMr: 2, LocalCtx: dev, Size: 64}, true},
		{"get from staged device", Op{Msg: wire.MsgGet, MrID: 2, LocalMr: 1, Size: 64}, true},
		{"get into unregistered device", Op{Msg: wire.MsgGet, MrID: 1, LocalMr: 1, LocalCtx: dev, Size: 64}, true},
		{"signal alone to a device word", Op{Msg: wire.MsgPutSignal, SigMrID: 2}, false},
		{"empty put to staged device", Op{Msg: wire.MsgPut, MrID: 2, LocalMr: 1}, false},
		{"goodbye", Op{Msg: wire.MsgBye}, false},
	} {
		if got := f.staged(&c.op); got != c.staged {
			t.Errorf("%s: staged %v, want %v", c.name, got, c.staged)
		}
	}
	if d, direct := f.remoteDev(4); d || direct {
		t.Errorf("host registration 4 reads as device %v direct %v", d, direct)
	}
}

// TestFabricInlinePutSignal: puts with signal of up to endpoint.InlineMax bytes
// travel as one message (one part) and larger ones as a write and a
// message (two); either way every byte lands and every signal applies
// once, after its payload.
func TestFabricInlinePutSignal(t *testing.T) {
	const size = 1 << 16
	ms, os := fabMesh2(t, "tcp;ofi_rxm", size, 1)
	src := fabric.Alloc(4096)
	defer fabric.Free(src)
	sb := unsafe.Slice((*byte)(src), 4096)
	tag, off := uint64(0), uint64(64)
	for _, n := range []uint64{1, 7, 8, 56, endpoint.InlineMax - 1, endpoint.InlineMax, endpoint.InlineMax + 1, 4096} {
		for i := range sb {
			sb[i] = byte(uint64(i)*7 + n)
		}
		tag++
		op := Op{Msg: wire.MsgPutSignal, MrID: 1, Tag: tag, Local: src, Size: n, Off: off, SigMrID: 1, SigOff: 8, SigOp: abi.SignalOpAdd, SigValue: n}
		want := 1
		if n > endpoint.InlineMax {
			want = 2
		}
		if got := ms[0].OpParts(1, &op); got != want {
			t.Fatalf("%d bytes: %d parts, want %d", n, got, want)
		}
		ms[0].Post(1, &op, false, -1)
		if st := os[0].waitN(t, tag, want); st != abi.Success {
			t.Fatalf("%d bytes: %v", n, st)
		}
		// Completion means arrival: the bytes and the signal are there
		// without the target doing anything.
		got := os[1].bytes()[off : off+n]
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
	for deadline := time.Now().Add(10 * time.Second); atomic.LoadUint64((*uint64)(unsafe.Add(os[1].mem, 8))) != sum; {
		if time.Now().After(deadline) {
			t.Fatalf("signal word %d, want %d", atomic.LoadUint64((*uint64)(unsafe.Add(os[1].mem, 8))), sum)
		}
		time.Sleep(time.Millisecond)
	}
	if len(os[0].fail)+len(os[1].fail) != 0 {
		t.Fatalf("failures: %v %v", os[0].fail, os[1].fail)
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
	fabTestPeerTimeout = time.Second
	defer func() { fabTestPeerTimeout = 0 }()
	ms, _ := fabMesh2(t, "tcp;ofi_rxm", size, 1)
	e := ms[0].fab
	dest := e.links[1].rails[0].addr
	const long = endpoint.MsgMax + 64
	buf := fabric.Alloc(long)
	defer fabric.Free(buf)
	b := unsafe.Slice((*byte)(buf), long)

	// Malformed: an inline put whose size disagrees with its length.
	b[0] = endpoint.MsgPutSignal
	binary.LittleEndian.PutUint64(b[8:], 1<<40)
	binary.LittleEndian.PutUint32(b[32:], 1)
	binary.LittleEndian.PutUint32(b[36:], 40)
	injectForged(t, e, buf, endpoint.PutSigHdr+8, dest)
	awaitDropped(t, ms[1].peers[0], "a malformed inline put did not drop its sender")

	// Oversized, on a fresh pair.
	ms, os := fabMesh2(t, "tcp;ofi_rxm", size, 1)
	e = ms[0].fab
	dest = e.links[1].rails[0].addr
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
	ms[0].Post(1, &Op{Msg: wire.MsgPutSignal, MrID: 1, Tag: 1, Local: buf, Size: 8, Off: 64, SigMrID: 1, SigOff: 8, SigOp: abi.SignalOpInc}, false, -1)
	switch st := os[0].waitN(t, 1, 1); {
	case st == abi.Success:
		if ms[1].peers[0].dead.Load() || ms[0].peers[1].dead.Load() {
			t.Fatal("the put completed but a peer was dropped")
		}
	case st == abi.RemoteError && ms[0].peers[1].dead.Load():
		t.Logf("the provider broke the connection; the watchdog failed the peer: %v", os[0].fail)
	default:
		t.Fatalf("put with signal after %d oversized messages: %v", endpoint.Recvs+endpoint.Recvs/2, st)
	}
}

// BenchmarkFabricPing: an 8-byte put with signal answered by one, each
// side polling as NCCL's proxy does (Progress, the caller's thread); one
// op is half a round trip.
func BenchmarkFabricPing(b *testing.B) {
	ms, os := fabMesh2(b, "tcp;ofi_rxm", 1<<16, 1)
	src := fabric.Alloc(64)
	defer fabric.Free(src)
	s0, s1 := (*uint64)(unsafe.Add(os[0].mem, 8)), (*uint64)(unsafe.Add(os[1].mem, 8))
	n := uint64(b.N/2 + 1)
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer close(done)
		op := Op{Msg: wire.MsgPutSignal, MrID: 1, Local: src, Size: 8, Off: 64, SigMrID: 1, SigOff: 8, SigOp: abi.SignalOpInc}
		for i := uint64(1); i <= n; i++ {
			for atomic.LoadUint64(s1) != i {
				ms[1].Progress()
			}
			for i > 1 && !os[1].isDone(i-1) {
				ms[1].Progress()
			}
			op.Tag = i
			ms[1].Post(0, &op, false, -1)
		}
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	op := Op{Msg: wire.MsgPutSignal, MrID: 1, Local: src, Size: 8, Off: 64, SigMrID: 1, SigOff: 8, SigOp: abi.SignalOpInc}
	b.ResetTimer()
	for i := uint64(1); i <= n; i++ {
		op.Tag = i
		ms[0].Post(1, &op, false, -1)
		for atomic.LoadUint64(s0) != i || !os[0].isDone(i) {
			ms[0].Progress()
		}
	}
	b.StopTimer()
	<-done
}

// TestFabricOneRailNoStripe: with one rail every lane posts on the same
// endpoint, so a large put is one write (one part) unless the backend's
// plan asks for a chunk size; the bytes land either way.
func TestFabricOneRailNoStripe(t *testing.T) {
	const size = 8 << 20
	ms, os := fabMesh2(t, "tcp;ofi_rxm", size, 4)
	src := fabric.Alloc(4 << 20)
	defer fabric.Free(src)
	sb := unsafe.Slice((*byte)(src), 4<<20)
	for i := range sb {
		sb[i] = byte(i*13 + 1)
	}
	plain := Op{Msg: wire.MsgPut, MrID: 1, Tag: 1, Local: src, Size: 4 << 20}
	chunked := Op{Msg: wire.MsgPut, MrID: 1, Tag: 2, Local: src, Size: 4 << 20, Off: 4 << 20, Chunk: 1 << 20}
	if n := ms[0].OpParts(1, &plain); n != 1 {
		t.Fatalf("a 4 MiB put over one rail has %d parts, want 1", n)
	}
	if n := ms[0].OpParts(1, &chunked); n != 4 {
		t.Fatalf("a 4 MiB put with a 1 MiB chunk has %d parts, want 4", n)
	}
	ms[0].Post(1, &plain, false, -1)
	ms[0].Post(1, &chunked, false, -1)
	for _, op := range []Op{plain, chunked} {
		if st := os[0].waitN(t, op.Tag, ms[0].OpParts(1, &op)); st != abi.Success {
			t.Fatalf("put %d: %v", op.Tag, st)
		}
		if got := os[1].bytes()[op.Off : op.Off+op.Size]; !bytes.Equal(got, sb) {
			t.Fatalf("put %d: bytes differ", op.Tag)
		}
	}
	os[0].mu.Lock()
	defer os[0].mu.Unlock()
	if os[0].parts[1] != 1 || os[0].parts[2] != 4 {
		t.Fatalf("completions %d and %d, want 1 and 4", os[0].parts[1], os[0].parts[2])
	}
}

// TestFabricNoInject runs the signal tests on endpoints that inject
// nothing (as shm does with FI_HMEM): every message, goodbyes and
// verdicts included, goes with a completion, and closing still delivers
// everything (the meshes close at cleanup, through their goodbyes).
func TestFabricNoInject(t *testing.T) {
	fabTestNoInject = true
	defer func() { fabTestNoInject = false }()
	t.Run("inline", TestFabricInlinePutSignal)
	t.Run("ordered", TestFabricOrderedSignals)
	t.Run("rejected-signal", TestFabricRejectedSignal)
}

// TestFabricRefusedPosts: with most writes and signal sends finding no
// room (as shm refuses them while a write is in segmentation and
// reassembly), every put with signal still lands, in order, and
// completes. A signal refused after its payload was posted from the retry
// queue used to queue itself again under the queue's lock: the poller
// deadlocked and every later operation hung (on shm with 100 B..4 KiB
// puts, every run).
func TestFabricRefusedPosts(t *testing.T) {
	fabTestRefuse = 3
	defer func() { fabTestRefuse = 0 }()
	ms, os := fabMesh2(t, "tcp;ofi_rxm", 1<<18, 1) // room for every put apart
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
		ms[0].Post(1, &Op{Msg: wire.MsgPutSignal, MrID: 1, Tag: i, Local: local, Size: size, Off: offs[i], SigMrID: 1, SigOff: 0, SigOp: abi.SignalOpInc}, false, -1)
		pending = append(pending, i)
		if size > 8 || len(pending) >= 8 {
			for _, k := range pending {
				if st := os[0].waitN(t, k, ms[0].PeerParts(1, wire.MsgPutSignal, sizes[k%4])); st != abi.Success {
					t.Fatalf("put %d: %v", k, st)
				}
			}
			pending = pending[:0]
		}
		if size > 8 {
			got := unsafe.Slice((*byte)(unsafe.Add(os[1].mem, offs[i])), size)
			for j := range got {
				if got[j] != byte(i+uint64(j)) {
					t.Fatalf("put %d (%d B), byte %d: %d, want %d", i, size, j, got[j], byte(i+uint64(j)))
				}
			}
		}
	}
	for _, k := range pending {
		if st := os[0].waitN(t, k, ms[0].PeerParts(1, wire.MsgPutSignal, sizes[k%4])); st != abi.Success {
			t.Fatalf("put %d: %v", k, st)
		}
	}
	sig := (*uint64)(os[1].mem)
	for deadline := time.Now().Add(time.Minute); *sig != n; {
		if time.Now().After(deadline) {
			t.Fatalf("signal %d, want %d", *sig, n)
		}
		time.Sleep(10 * time.Microsecond)
	}
	for i := uint64(1); i <= n; i++ {
		if sizes[i%4] == 8 {
			if v := *(*uint64)(unsafe.Add(os[1].mem, offs[i])); v != i {
				t.Fatalf("put %d: word %d", i, v)
			}
		}
	}
	if fabTestRefused.Load() == 0 {
		t.Fatal("nothing was refused: the hook is not reached")
	}
	if len(os[0].fail)+len(os[1].fail) > 0 {
		t.Fatalf("failures: %v %v", os[0].fail, os[1].fail)
	}
}

// TestTakesDmaBuf: device memory goes to NIC providers as a DMA-BUF, to
// shm and tcp by address, and to none when NCCL_RMA_WASM_FI_DMABUF=0.
func TestTakesDmaBuf(t *testing.T) {
	for prov, want := range map[string]bool{"verbs;ofi_rxm": true, "efa": true, "cxi": true, "psm3": true, "opx": true,
		"shm": false, "tcp;ofi_rxm": false, "tcp": false, "verbsx": false} {
		if got := takesDmaBuf(prov, false); got != want {
			t.Errorf("takesDmaBuf(%q) = %v, want %v", prov, got, want)
		}
	}
	if takesDmaBuf("efa", true) {
		t.Error("efa takes a DMA-BUF with NCCL_RMA_WASM_FI_DMABUF=0")
	}
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

// TestFabricSignalInCQData: once the target accepted a signal word (the
// first put with signal to it is a message with a verdict), small puts
// with an add of 1 to it travel as one write whose CQ data carries the
// signal; a larger put, an add of 2, a word past what the encoding
// reaches or an unaligned one fall back to the message. Puts without
// signal interleave: whenever the counter reads k, every earlier put and
// payload landed (strong signals). Every byte and the word are checked.
func TestFabricSignalInCQData(t *testing.T) {
	const size = 8 << 20
	ms, os := fabMesh2(t, "tcp;ofi_rxm", size, 1)
	f := fabLink0(t, ms)
	if !f.e.cq.SigCQ {
		t.Skip("the provider has no 8-byte CQ data")
	}
	src := fabric.Alloc(4096)
	defer fabric.Free(src)
	sb := unsafe.Slice((*byte)(src), 4096)
	sig := (*uint64)(unsafe.Add(os[1].mem, 4096)) // word 512 of registration 1
	tag, want := uint64(0), uint64(0)
	put := func(op Op) {
		t.Helper()
		tag++
		op.Tag, op.MrID, op.Local = tag, 1, src
		ms[0].Post(1, &op, false, -1)
		if st := os[0].waitN(t, tag, ms[0].OpParts(1, &op)); st != abi.Success {
			t.Fatalf("op %d (%d bytes): %v", tag, op.Size, st)
		}
	}
	// A plain put, then the first signal to the word (a message: not yet
	// accepted), then many with the signal in CQ data, each after a plain
	// put of its own marker.
	base := f.cqSigs.Load()
	const n = 300
	for i := uint64(0); i < n; i++ {
		binary.LittleEndian.PutUint64(sb, i+1)
		put(Op{Msg: wire.MsgPut, Size: 8, Off: 8192 + 8*i})
		binary.LittleEndian.PutUint64(sb[8:], ^i)
		put(Op{Msg: wire.MsgPutSignal, Size: 8 + i%73, Off: 65536 + 128*i, SigMrID: 1, SigOff: 4096, SigOp: abi.SignalOpInc, SigValue: 0})
		want++
	}
	if got := f.cqSigs.Load() - base; got < n-1 {
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
	mem := os[1].bytes()
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
	before := f.cqSigs.Load()
	put(Op{Msg: wire.MsgPutSignal, Size: 8, Off: 0, SigMrID: 1, SigOff: 4096, SigOp: abi.SignalOpAdd, SigValue: 2}) // add 2
	want += 2
	put(Op{Msg: wire.MsgPutSignal, Size: endpoint.InlineMax + 1, Off: 0, SigMrID: 1, SigOff: 4096, SigOp: abi.SignalOpInc}) // not inline
	want++
	put(Op{Msg: wire.MsgPutSignal, Size: 8, Off: 0, SigMrID: 1, SigOff: 5 << 20, SigOp: abi.SignalOpInc})  // past 2^16 words
	put(Op{Msg: wire.MsgPutSignal, Size: 8, Off: 0, SigMrID: 1, SigOff: 5 << 20, SigOp: abi.SignalOpInc})  // still past, though accepted
	put(Op{Msg: wire.MsgPutSignal, Size: 8, Off: 0, SigMrID: 1, SigOff: 8192 - 8, SigOp: abi.SignalOpInc}) // above the word accepted
	if got := f.cqSigs.Load() - before; got != 0 {
		t.Fatalf("%d fallbacks went in CQ data", got)
	}
	// The last one taught the link a higher word: words below it now fit.
	put(Op{Msg: wire.MsgPutSignal, Size: 8, Off: 0, SigMrID: 1, SigOff: 4096, SigOp: abi.SignalOpAdd, SigValue: 1})
	want++
	if got := f.cqSigs.Load() - before; got != 1 {
		t.Fatalf("an add of 1 to an accepted word: %d in CQ data, want 1", got)
	}
	for deadline := time.Now().Add(10 * time.Second); atomic.LoadUint64(sig) != want ||
		atomic.LoadUint64((*uint64)(unsafe.Add(os[1].mem, 5<<20))) != 2 || atomic.LoadUint64((*uint64)(unsafe.Add(os[1].mem, 8192-8))) != 1; {
		if time.Now().After(deadline) {
			t.Fatalf("signal words %d %d %d, want %d 2 1", atomic.LoadUint64(sig), atomic.LoadUint64((*uint64)(unsafe.Add(os[1].mem, 5<<20))),
				atomic.LoadUint64((*uint64)(unsafe.Add(os[1].mem, 8192-8))), want)
		}
		time.Sleep(time.Millisecond)
	}
	if len(os[0].fail)+len(os[1].fail) != 0 {
		t.Fatalf("failures: %v %v", os[0].fail, os[1].fail)
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
	ms, os := fabMesh2(t, "tcp;ofi_rxm", size, 1)
	f := fabLink0(t, ms)
	if !f.e.cq.SigCQ {
		t.Skip("the provider has no 8-byte CQ data")
	}
	src := fabric.Alloc(64)
	defer fabric.Free(src)
	// Never accepted: a message, rejected with the target's code.
	op := Op{Msg: wire.MsgPutSignal, MrID: 1, Tag: 1, Local: src, Size: 8, SigMrID: 9, SigOff: 8, SigOp: abi.SignalOpInc}
	ms[0].Post(1, &op, false, -1)
	if st := os[0].wait(t, 1); st != abi.InvalidArgument {
		t.Fatalf("signal to an unknown registration: %v, want %v", st, abi.InvalidArgument)
	}
	if f.cqSigs.Load() != 0 {
		t.Fatal("an unaccepted target went in CQ data")
	}
	os[0].mu.Lock()
	nfail := len(os[0].fail)
	os[0].mu.Unlock()
	// Forged: registration 9 and a word past registration 1's end.
	f.learnSignal(9, 8)
	f.learnSignal(1, size+64)
	for i, o := range []Op{
		{Msg: wire.MsgPutSignal, MrID: 1, Tag: 2, Local: src, Size: 8, Off: 16, SigMrID: 9, SigOff: 8, SigOp: abi.SignalOpInc},
		{Msg: wire.MsgPutSignal, MrID: 1, Tag: 3, Local: src, Size: 8, Off: 24, SigMrID: 1, SigOff: size + 64, SigOp: abi.SignalOpInc},
	} {
		ms[0].Post(1, &o, false, -1)
		if st := os[0].wait(t, o.Tag); st != abi.Success {
			t.Fatalf("forged %d: request %v, want success (complete on arrival)", i, st)
		}
	}
	if f.cqSigs.Load() != 2 {
		t.Fatalf("%d forged signals went in CQ data, want 2", f.cqSigs.Load())
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		os[0].mu.Lock()
		got := os[0].fail[nfail:]
		os[0].mu.Unlock()
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
	ms[0].Post(1, &Op{Msg: wire.MsgPutSignal, MrID: 1, Tag: 4, Local: src, Size: 8, Off: 32, SigMrID: 1, SigOff: 0, SigOp: abi.SignalOpInc}, false, -1)
	if st := os[0].wait(t, 4); st != abi.Success {
		t.Fatalf("valid signal after rejections: %v", st)
	}
	for deadline := time.Now().Add(10 * time.Second); atomic.LoadUint64((*uint64)(os[1].mem)) != 1; {
		if time.Now().After(deadline) {
			t.Fatalf("signal word %d, want 1", atomic.LoadUint64((*uint64)(os[1].mem)))
		}
		time.Sleep(time.Millisecond)
	}
	if w := atomic.LoadUint64((*uint64)(unsafe.Add(os[1].mem, 8))); w != 0 {
		t.Fatalf("a rejected signal changed word 1 to %d", w)
	}
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

// TestFabricControlNotAwaited: a control message whose send completion
// was not reaped yet (an acknowledgement sent with a completion, here a
// slot taken as the senders take it) is in flight but is no operation a
// leaving peer could lose: awaiting() counts operations only. A peer that
// left right after such a message was reported as failed with one
// operation lost (the driver's teardown scenario over tcp;ofi_rxm, a few
// runs in 150 under load).
func TestFabricControlNotAwaited(t *testing.T) {
	ms, os := fabMesh2(t, "tcp;ofi_rxm", 1<<16, 1)
	l := ms[0].fab.links[1]
	src := fabric.Alloc(64)
	defer fabric.Free(src)
	// One put first: rxm connects on the first send, which needs progress.
	ms[0].Post(1, &Op{Msg: wire.MsgPut, MrID: 1, Tag: 1, Local: src, Size: 8, Off: 0}, false, -1)
	os[0].wait(t, 1)
	e := l.rails[0].e
	ms[0].fab.LockPoll() // nobody reaps meanwhile
	ctl, ok := l.slot(e, 0, true)
	if !ok {
		ms[0].fab.UnlockPoll()
		t.Fatal("no free slot")
	}
	flying, awaited := l.inflight.Load(), l.awaiting()
	op, ok := l.slot(e, 7, false)
	withOp := l.awaiting()
	if ok {
		l.unslot(e, op)
	}
	l.unslot(e, ctl)
	ms[0].fab.UnlockPoll()
	if flying != 1 || awaited != 0 {
		t.Fatalf("a control message in flight: inflight %d, awaiting %d; want 1 and 0", flying, awaited)
	}
	if !ok || withOp != 1 {
		t.Fatalf("an operation beside it: awaiting %d, want 1", withOp)
	}
	if n, c := l.inflight.Load(), l.ctlLive.Load(); n != 0 || c != 0 {
		t.Fatalf("after both were freed: inflight %d, control %d; want 0 and 0", n, c)
	}
}
