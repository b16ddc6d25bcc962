package ofi_test

import (
	"runtime"
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

// TestFabricPutSignalGet moves bytes both ways and checks that a signal
// arrives after its payload, on every provider available here.
func TestFabricPutSignalGet(t *testing.T) {
	// shm is covered by the driver tests (one process per rank): two shm
	// endpoints in one Go process crash inside libfabric 1.17.
	for _, prov := range []string{"tcp;ofi_rxm"} {
		for _, lanes := range []int{1, 3} {
			t.Run(prov+"/lanes"+string(rune('0'+lanes)), func(t *testing.T) {
				const size = 4 << 20
				ms, os := meshtest.FabMesh2(t, prov, size, lanes)
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
				ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: 1, Local: src, Size: n, Off: 0, SigMrID: 1, SigOff: sigOff, SigOp: abi.SignalOpAdd, SigValue: 5}}, false, -1)
				ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, Tag: 2, SigMrID: 1, SigOff: sigOff, SigOp: abi.SignalOpInc}}, false, -1)
				for _, tag := range []uint64{1, 2} {
					if st := os[0].Wait(t, tag); st != abi.Success {
						t.Fatalf("tag %d: %v", tag, st)
					}
				}
				sig := (*uint64)(unsafe.Add(os[1].Mem, sigOff))
				for deadline := time.Now().Add(5 * time.Second); *(*uint64)(unsafe.Pointer(sig)) != 6; {
					if time.Now().After(deadline) {
						t.Fatalf("signal %d, want 6", *sig)
					}
					time.Sleep(10 * time.Microsecond)
				}
				got := os[1].Bytes()
				for i := 0; i < n; i++ {
					if got[i] != s[i] {
						t.Fatalf("byte %d: %d, want %d", i, got[i], s[i])
					}
				}
				// Rank 1 reads it back.
				dst := fabric.Alloc(n)
				defer fabric.Free(dst)
				ms[1].Post(0, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgGet, MrID: 1, Tag: 3, Local: dst, Size: n, Off: 0}}, false, -1)
				_ = os[1].Wait(t, 3)
				ms[1].Post(0, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgGet, MrID: 1, Tag: 4, Local: dst, Size: n, Off: 0}}, false, -1)
				if st := os[1].Wait(t, 4); st != abi.Success {
					t.Fatalf("get: %v", st)
				}
				if len(os[0].Fail)+len(os[1].Fail) > 0 {
					t.Fatalf("failures: %v %v", os[0].Fail, os[1].Fail)
				}
			})
		}
	}
}

// TestFabricOrderedSignals posts many small puts, each followed by a
// signal: whenever the target sees the counter at k, the first k puts
// landed.
func TestFabricOrderedSignals(t *testing.T) {
	ms, os := meshtest.FabMesh2(t, "tcp;ofi_rxm", 1<<16, 1)
	src := fabric.Alloc(8)
	defer fabric.Free(src)
	const n = 500
	for i := uint64(1); i <= n; i++ {
		*(*uint64)(src) = i
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: i, Local: src, Size: 8, Off: 8 * i, SigMrID: 1, SigOff: 0, SigOp: abi.SignalOpInc}}, false, -1)
		os[0].WaitN(t, i, ms[0].PeerParts(1, wire.MsgPutSignal, 8)) // the source is reused
	}
	sig := (*uint64)(os[1].Mem)
	for deadline := time.Now().Add(5 * time.Second); *sig != n; {
		if time.Now().After(deadline) {
			t.Fatalf("signal %d, want %d", *sig, n)
		}
		time.Sleep(10 * time.Microsecond)
	}
	for i := uint64(1); i <= n; i++ {
		if v := *(*uint64)(unsafe.Add(os[1].Mem, 8*i)); v != i {
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
			ms, os := meshtest.FabMesh2(t, prov, 1<<16, 1)
			src := fabric.Alloc(1 << 16)
			defer fabric.Free(src)
			const n = 200
			s0, s1 := (*uint64)(os[0].Mem), (*uint64)(os[1].Mem)
			start := time.Now()
			for i := uint64(1); i <= n; i++ {
				ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: i, Local: src, Size: 1 << 15, Off: 64, SigMrID: 1, SigOp: abi.SignalOpInc}}, false, -1)
				for atomic.LoadUint64(s1) != i {
					runtime.Gosched()
				}
				ms[1].Post(0, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, Tag: i, SigMrID: 1, SigOp: abi.SignalOpInc}}, false, -1)
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
	ms, os := meshtest.FabMesh2(t, "tcp;ofi_rxm", size*window, 1)
	src := fabric.Alloc(size)
	defer fabric.Free(src)
	start := time.Now()
	for i := uint64(1); i <= total; i++ {
		if i > window {
			os[0].Wait(t, i-window)
		}
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: i, Local: src, Size: size, Off: (i % window) * size}}, false, -1)
	}
	os[0].Wait(t, total)
	el := time.Since(start)
	t.Logf("tcp;ofi_rxm: %d × 1 MiB puts, window %d: %.2f GB/s", total, window, float64(total*size)/el.Seconds()/1e9)
}

// TestHandleFabricName: the endpoint name and provider hash ride the
// handle; a name too long for it leaves the handle TCP-only.
func TestHandleFabricName(t *testing.T) {
	l, _, err := dataplane.Listen(dataplane.ListenOptions{Addr: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	hi := l.Info()
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
	ms, os := meshtest.FabMesh2(t, "tcp;ofi_rxm", 1<<16, 1)
	src := fabric.Alloc(8)
	defer fabric.Free(src)
	tag := uint64(0)
	op := dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Local: src, Size: 8, Off: 8, SigMrID: 1, SigOp: abi.SignalOpInc}}
	allocs := testing.AllocsPerRun(200, func() {
		tag++
		op.Tag = tag
		ms[0].Post(1, &op, false, -1)
	})
	// 8 bytes travel inline (one message, one part); larger ones as a
	// write and a signal message (two parts).
	os[0].WaitN(t, tag, 1)
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

// TestFabricIdleWake: after a long idle spell both progress goroutines
// sleep on their CQ's wait fd; a put with signal must wake the target. The
// wait's own bound is raised to ten minutes, so only the fd can wake it:
// without that wake-up the signal does not arrive and the test fails.
func TestFabricIdleWake(t *testing.T) {
	prev := endpoint.SetWaitBound(600_000)
	t.Cleanup(func() { endpoint.SetWaitBound(prev) })
	ms, os := meshtest.FabMesh2(t, "tcp;ofi_rxm", 1<<16, 1)
	if !ms[1].Fab().EP(0).CanWait() {
		t.Skip("tcp;ofi_rxm offers no CQ wait fd here")
	}
	src := fabric.Alloc(64)
	defer fabric.Free(src)
	sig := (*uint64)(os[1].Mem)
	for i := uint64(1); i <= 3; i++ {
		asleep := time.Now().Add(20 * time.Second)
		for !ms[1].Fab().EP(0).InWait() || !ms[0].Fab().EP(0).InWait() {
			if time.Now().After(asleep) {
				t.Fatalf("round %d: the progress goroutines never went to sleep", i)
			}
			time.Sleep(time.Millisecond)
		}
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: i, Local: src, Size: 64, Off: 64, SigMrID: 1, SigOp: abi.SignalOpInc}}, false, -1)
		start := time.Now()
		for atomic.LoadUint64(sig) != i {
			if time.Since(start) > 60*time.Second {
				t.Fatalf("round %d: the signal never arrived: the wait fd did not wake the target", i)
			}
			time.Sleep(20 * time.Microsecond)
		}
		t.Logf("round %d: woke and applied in %v", i, time.Since(start))
	}
	if !ms[1].Fab().EP(0).CanWait() {
		t.Fatal("the provider refused to wait after all")
	}
}

// BenchmarkFabricPing: an 8-byte put with signal answered by one, each
// side polling as NCCL's proxy does (Progress, the caller's thread); one
// op is half a round trip.
func BenchmarkFabricPing(b *testing.B) {
	ms, os := meshtest.FabMesh2(b, "tcp;ofi_rxm", 1<<16, 1)
	src := fabric.Alloc(64)
	defer fabric.Free(src)
	s0, s1 := (*uint64)(unsafe.Add(os[0].Mem, 8)), (*uint64)(unsafe.Add(os[1].Mem, 8))
	n := uint64(b.N/2 + 1)
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer close(done)
		op := dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Local: src, Size: 8, Off: 64, SigMrID: 1, SigOff: 8, SigOp: abi.SignalOpInc}}
		for i := uint64(1); i <= n; i++ {
			for atomic.LoadUint64(s1) != i {
				ms[1].Progress()
			}
			for i > 1 && !os[1].IsDone(i-1) {
				ms[1].Progress()
			}
			op.Tag = i
			ms[1].Post(0, &op, false, -1)
		}
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	op := dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Local: src, Size: 8, Off: 64, SigMrID: 1, SigOff: 8, SigOp: abi.SignalOpInc}}
	b.ResetTimer()
	for i := uint64(1); i <= n; i++ {
		op.Tag = i
		ms[0].Post(1, &op, false, -1)
		for atomic.LoadUint64(s0) != i || !os[0].IsDone(i) {
			ms[0].Progress()
		}
	}
	b.StopTimer()
	<-done
}

// TestFabricNoInject runs the signal tests on endpoints that inject
// nothing (as shm does with FI_HMEM): every message, goodbyes and
// verdicts included, goes with a completion, and closing still delivers
// everything (the meshes close at cleanup, through their goodbyes).
func TestFabricNoInject(t *testing.T) {
	ofi.TestNoInject = true
	defer func() { ofi.TestNoInject = false }()
	t.Run("inline", TestFabricInlinePutSignal)
	t.Run("ordered", TestFabricOrderedSignals)
	t.Run("rejected-signal", TestFabricRejectedSignal)
}
