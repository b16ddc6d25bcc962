package tcp_test

import (
	"bytes"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// TestGatherWriter: with Options.GatherWriter (NCCL_RMA_WASM_GATHER_WRITER)
// the caller's thread, which gathers a small device payload (its
// device-to-host copy queued on the stream), hands the batch to the lane's
// writer goroutine instead of waiting for the copy. The test holds the
// device's stream (nothing on it runs) while the caller posts and calls
// Progress: those calls return only if they did not wait for the copy.
// Without the option the same calls are still waiting when the stream is
// let go. Then every put+signal lands, each signal after its bytes, and
// the mesh counts the hand-offs.
func TestGatherWriter(t *testing.T) {
	for _, handOff := range []bool{true, false} {
		name := "handed"
		if !handOff {
			name = "waited"
		}
		t.Run(name, func(t *testing.T) { gatherWriter(t, handOff) })
	}
}

func gatherWriter(t *testing.T, handOff bool) {
	const n = 8
	d, os, ms := gatherMesh(t, handOff)
	// The caller's calls alone take the lane's work: the send timer would
	// hand it to the writer goroutine on a slow machine.
	defer tcp.SetSendDelay(time.Hour)()
	warmUp(t, ms, os)
	src := d.At(os[0].Dev, gatherSize)
	meshtest.Fill(src[:n*4096], 5)
	sig := (*uint64)(unsafe.Pointer(&os[1].Host[0]))
	post := func(k int) {
		// k+1 KiB from rank 0's device memory into rank 1's host memory,
		// then add 1 to the word at its start.
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 2, Tag: uint64(100 + k),
			Local: meshtest.AddrPtr(uint64(os[0].Dev) + uint64(k)*4096), LocalCtx: 1, Size: uint64(k+1) << 10, Off: uint64(k+1) * 4096,
			SigMrID: 2, SigOp: abi.SignalOpAdd, SigValue: 1}}, false, -1)
		ms[0].Progress()
	}

	d.Exec.Lock() // the stream runs nothing until let go
	returned := make(chan struct{})
	go func() {
		post(0)
		close(returned)
	}()
	select {
	case <-returned:
		if !handOff {
			d.Exec.Unlock()
			t.Fatal("the caller's post and Progress returned while the copy of its payload could not run, without the hand-off")
		}
	case <-time.After(map[bool]time.Duration{true: 20 * time.Second, false: 300 * time.Millisecond}[handOff]):
		if handOff {
			d.Exec.Unlock()
			t.Fatal("the caller's post and Progress waited for the copy of its payload")
		}
	}
	d.Exec.Unlock()
	<-returned
	for k := 1; k < n; k++ {
		post(k)
	}
	for deadline := time.Now().Add(20 * time.Second); atomic.LoadUint64(sig) != n; time.Sleep(20 * time.Microsecond) {
		ms[0].Progress()
		ms[1].Progress()
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d signals arrived", atomic.LoadUint64(sig), n)
		}
	}
	for k := range n {
		off := (k + 1) * 4096
		if got, want := os[1].Host[off:off+(k+1)<<10], src[k*4096:k*4096+(k+1)<<10]; !bytes.Equal(got, want) {
			t.Fatalf("put %d: its bytes differ once every signal arrived", k)
		}
		if st := meshtest.WaitDone(t, &os[0].MemOwner, uint64(100+k)); st != abi.Success {
			t.Fatalf("put %d: %v", k, st)
		}
	}
	if h := ms[0].Stats().Handed; (h > 0) != handOff {
		t.Fatalf("%d batches handed to the writer (GatherWriter %v)", h, handOff)
	}
}

// TestGatherWriterFinishers: a handed batch is finished by whoever comes
// first once its copies executed. With the send timer out of the way the
// caller's own next calls (NCCL's proxy polling) write it; with nobody
// calling at all, the send timer wakes the lane's writer goroutine,
// which waits for the copies and writes it. Either way every byte and
// signal arrives.
func TestGatherWriterFinishers(t *testing.T) {
	t.Run("caller", func(t *testing.T) {
		defer tcp.SetSendDelay(time.Hour)()
		if st := gatherFinish(t, true); st.HandedByCaller == 0 || st.HandedByCaller != st.Handed {
			t.Fatalf("%d of %d handed batches written by the caller's calls, want all", st.HandedByCaller, st.Handed)
		}
	})
	t.Run("writer", func(t *testing.T) {
		if st := gatherFinish(t, false); st.Handed == 0 || st.HandedByCaller != 0 {
			t.Fatalf("%d handed batches, %d written by the caller, who made no call after posting", st.Handed, st.HandedByCaller)
		}
	})
}

// gatherFinish posts 4 small device put+signals from rank 0, each with
// one Progress call (which hands its batch over), then waits for every
// signal, calling rank 0's Progress meanwhile only when poll is set. It
// checks every byte and returns rank 0's counts.
func gatherFinish(t *testing.T, poll bool) dataplane.Stats {
	const n = 4
	d, os, ms := gatherMesh(t, true)
	warmUp(t, ms, os)
	src := d.At(os[0].Dev, gatherSize)
	meshtest.Fill(src[:n*4096], 3)
	sig := (*uint64)(unsafe.Pointer(&os[1].Host[0]))
	for k := range n {
		// The stream held while posting: the copy cannot have executed
		// when the call that hands the batch over looks.
		d.Exec.Lock()
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 2, Tag: uint64(200 + k),
			Local: meshtest.AddrPtr(uint64(os[0].Dev) + uint64(k)*4096), LocalCtx: 1, Size: 512, Off: uint64(k+1) * 4096,
			SigMrID: 2, SigOp: abi.SignalOpAdd, SigValue: 1}}, false, -1)
		ms[0].Progress()
		d.Exec.Unlock()
		for deadline := time.Now().Add(20 * time.Second); atomic.LoadUint64(sig) != uint64(k+1); time.Sleep(20 * time.Microsecond) {
			if poll {
				ms[0].Progress()
			}
			ms[1].Progress()
			if time.Now().After(deadline) {
				t.Fatalf("put+signal %d: its signal never arrived (poll %v)", k, poll)
			}
		}
		if off := (k + 1) * 4096; !bytes.Equal(os[1].Host[off:off+512], src[k*4096:k*4096+512]) {
			t.Fatalf("put+signal %d: the signal came before its bytes", k)
		}
	}
	return ms[0].Stats()
}

// warmUp sends one put+signal from host memory, rank 0 to rank 1, and
// waits for it: the lanes are open and idle after it.
func warmUp(t *testing.T, ms []*dataplane.Mesh, os []*meshtest.DevOwner) {
	sig := (*uint64)(unsafe.Pointer(&os[1].Host[8]))
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 2, Tag: 1,
		Local: unsafe.Pointer(&os[0].Host[60<<10]), Size: 64, Off: 60 << 10, SigMrID: 2, SigOff: 8, SigOp: abi.SignalOpAdd, SigValue: 1}}, false, -1)
	for deadline := time.Now().Add(20 * time.Second); atomic.LoadUint64(sig) != 1; time.Sleep(20 * time.Microsecond) {
		ms[0].Progress()
		ms[1].Progress()
		if time.Now().After(deadline) {
			t.Fatal("the warm-up put+signal never arrived")
		}
	}
	if st := meshtest.WaitDone(t, &os[0].MemOwner, 1); st != abi.Success {
		t.Fatalf("warm-up put: %v", st)
	}
}

const gatherSize = 1 << 20

// gatherMesh connects two ranks over TCP, each with gatherSize bytes of a
// device whose stream runs every operation 2 ms late (registration 1)
// and 64 KiB of host memory (registration 2); the meshes close when t ends.
func gatherMesh(t *testing.T, handOff bool) (*meshtest.StreamSelfDevice, []*meshtest.DevOwner, []*dataplane.Mesh) {
	d := meshtest.QueuedDevice(t, 2*gatherSize)
	os := make([]*meshtest.DevOwner, 2)
	owners := make([]dataplane.Owner, 2)
	for r := range os {
		os[r] = &meshtest.DevOwner{MemOwner: meshtest.MemOwner{Done: map[uint64]abi.Result{}}, Dev: d.Base + uintptr(r)*gatherSize, Size: gatherSize, Host: make([]byte, 64<<10)}
		owners[r] = os[r]
	}
	ms := meshtest.ConnectOwners(t, owners, dataplane.Options{Timeout: 10 * time.Second, Lanes: 1, StripeThreshold: 1 << 40, ChunkSize: 64 << 10,
		CloseTimeout: 2 * time.Second, StageChunk: 4 << 10, GatherWriter: handOff})
	t.Cleanup(func() {
		for _, m := range ms {
			m.Close()
		}
	})
	return d, os, ms
}

// TestGatherWriterPeerDies: a batch is handed over (its copy held on the
// device's stream) and then the target goes away, or our own mesh
// closes. The put fails (the caller's next call, or the close, finishing
// the batch) rather than hanging or completing, and the close returns.
func TestGatherWriterPeerDies(t *testing.T) {
	for _, ownClose := range []bool{false, true} {
		name := map[bool]string{false: "peer", true: "close"}[ownClose]
		t.Run(name, func(t *testing.T) {
			defer tcp.SetSendDelay(time.Hour)() // only the caller or the close finishes it
			d, os, ms := gatherMesh(t, true)
			warmUp(t, ms, os)
			d.Exec.Lock()
			ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 2, Tag: 300,
				Local: meshtest.AddrPtr(uint64(os[0].Dev)), LocalCtx: 1, Size: 256, Off: 4096,
				SigMrID: 2, SigOp: abi.SignalOpAdd, SigValue: 1}}, false, -1)
			ms[0].Progress()
			if ms[0].Stats().Handed == 0 {
				d.Exec.Unlock()
				t.Fatal("the batch was not handed over")
			}
			closed := make(chan error, 1)
			if ownClose {
				go func() { closed <- ms[0].Close() }()
			} else {
				ms[1].Close()
			}
			d.Exec.Unlock()
			deadline := time.Now().Add(30 * time.Second)
			for {
				if st, ok := os[0].Status(300); ok {
					if st == abi.Success && !ownClose {
						t.Fatal("a put handed over to a target that went away completed")
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the handed put never completed or failed")
				}
				if !ownClose {
					ms[0].Progress()
				}
				time.Sleep(100 * time.Microsecond)
			}
			if ownClose {
				select {
				case <-closed:
				case <-time.After(30 * time.Second):
					t.Fatal("the close never returned with a batch handed over")
				}
			}
		})
	}
}
