package dataplane_test

import (
	"bytes"
	"encoding/binary"
	"errors"
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

// TestCloseDeliversQueuedOps posts puts on every lane, some held back by
// the aggregation hint, and a put with a signal, then closes at once: the
// target must hold every byte and the signal, and neither side may report
// an error.
func TestCloseDeliversQueuedOps(t *testing.T) {
	for _, lanes := range []int{1, 3} {
		for round := 0; round < 20; round++ {
			os := meshtest.NewOwners(2, 64<<10)
			ms := meshtest.Connect2(t, os, dataplane.Options{Timeout: 10 * time.Second, Lanes: lanes, StripeThreshold: 16 << 10, ChunkSize: 4096})
			src := make([]byte, 64<<10)
			for i := range src {
				src[i] = byte(i*7 + round)
			}
			const sigOff = 64<<10 - 8
			// 15 puts of 4 KiB, spread over the lanes, held for a test()
			// that never comes; then one striped put with the signal.
			for k := 0; k < 15; k++ {
				ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: uint64(k + 1), Local: unsafe.Pointer(&src[k*4096]), Size: 4096, Off: uint64(k * 4096)}}, true, k%lanes)
			}
			ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, SigMrID: 1, SigOp: abi.SignalOpAdd, SigValue: 5, SigOff: sigOff, Tag: 99, Local: unsafe.Pointer(&src[15*4096]), Size: 4096 - 8, Off: 15 * 4096}}, false, 0)
			if err := ms[0].Close(); err != nil {
				t.Fatalf("lanes %d round %d: close: %v", lanes, round, err)
			}
			// The close returned after the target acknowledged: no waiting.
			if got := binary.LittleEndian.Uint64(os[1].Mem[sigOff:]); got != 5 {
				t.Fatalf("lanes %d round %d: signal word is %d after the close, want 5", lanes, round, got)
			}
			if !bytes.Equal(os[1].Mem[:sigOff], src[:sigOff]) {
				t.Fatalf("lanes %d round %d: bytes put before the close are missing at the target", lanes, round)
			}
			if n := os[1].Pins.Load(); n != 0 {
				t.Fatalf("lanes %d round %d: the target still holds %d registration pins after every put and signal landed", lanes, round, n)
			}
			for _, o := range os {
				o.Mu.Lock()
				failed := o.Failed
				o.Mu.Unlock()
				if len(failed) > 0 {
					t.Fatalf("lanes %d round %d: an orderly close reported errors: %v", lanes, round, failed)
				}
			}
			ms[1].Close()
		}
	}
}

// gatedOwner is a target whose service stalls in Resolve until the gate
// opens, like a peer process that stopped (SIGSTOP) with its sockets open.
type gatedOwner struct {
	*meshtest.MemOwner
	gate    chan struct{}
	stalled atomic.Bool
}

func (o *gatedOwner) Resolve(id uint32) (unsafe.Pointer, uint64, uintptr, dataplane.Pin, bool) {
	o.stalled.Store(true)
	<-o.gate
	return o.MemOwner.Resolve(id)
}

// TestCloseBoundedOnStalledPeer: a peer whose service never gets to the
// goodbye cannot hold closeColl beyond the close timeout, and the close
// names it.
func TestCloseBoundedOnStalledPeer(t *testing.T) {
	mo := meshtest.NewOwners(2, 4096)
	g := &gatedOwner{MemOwner: mo[1], gate: make(chan struct{})}
	ls, hs := meshtest.ListenN(t, 2)
	opt := dataplane.Options{Timeout: 10 * time.Second, Lanes: 2, CloseTimeout: 300 * time.Millisecond}
	owners := []dataplane.Owner{mo[0], g}
	ms := make([]*dataplane.Mesh, 2)
	errs := make(chan error, 2)
	for i := range ms {
		go func(i int) {
			m, err := dataplane.Connect(ls[i], hs, i, owners[i], opt)
			ms[i] = m
			errs <- err
		}(i)
	}
	for range ms {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	defer ms[1].Close()
	defer close(g.gate) // before ms[1].Close, whose service waits on it
	src := make([]byte, 64)
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 1, Local: unsafe.Pointer(&src[0]), Size: 64}}, false, 0)
	ms[0].Flush(1)
	// The target's service holds the put before the close begins, however
	// slowly this machine runs it.
	for end := time.Now().Add(time.Minute); !g.stalled.Load(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the target's service never received the put")
		}
	}
	done := make(chan error, 1)
	go func() { done <- ms[0].Close() }()
	select {
	case err := <-done:
		var u *dataplane.ErrUnconfirmed
		if !errors.As(err, &u) || len(u.Ranks) != 1 || u.Ranks[0] != 1 {
			t.Fatalf("close with a stalled peer returned %v, want ErrUnconfirmed naming rank 1", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("close hung on a stalled peer")
	}
}

// TestDrainCompletesPosted: Drain returns only when every posted operation
// completed (puts arrived, or in local-completion mode left), held ones
// included, and the mesh stays usable.
func TestDrainCompletesPosted(t *testing.T) {
	for _, local := range []bool{false, true} {
		drainCompletesPosted(t, local)
	}
}

func drainCompletesPosted(t *testing.T, local bool) {
	os := meshtest.NewOwners(2, 64<<10)
	ms := meshtest.Connect2(t, os, dataplane.Options{Timeout: 10 * time.Second, Lanes: 2, StripeThreshold: 16 << 10, ChunkSize: 4096, LocalCompletion: local})
	src := make([]byte, 64<<10)
	dst := make([]byte, 4096)
	for k := 0; k < 8; k++ {
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: uint64(k + 1), Local: unsafe.Pointer(&src[k*4096]), Size: 4096, Off: uint64(k * 4096)}}, true, k%2)
	}
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgGet, MrID: 1, Tag: 50, Local: unsafe.Pointer(&dst[0]), Size: 4096}}, true, 1)
	if busy := ms[0].Drain(); len(busy) != 0 {
		t.Fatalf("drain left ranks %v busy", busy)
	}
	for _, tag := range []uint64{1, 2, 3, 4, 5, 6, 7, 8, 50} {
		if st, ok := os[0].Status(tag); !ok || st != abi.Success {
			t.Fatalf("tag %d after drain: done %v status %v", tag, ok, st)
		}
	}
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 60, Local: unsafe.Pointer(&src[0]), Size: 64}}, false, 0)
	if st := meshtest.WaitDone(t, os[0], 60); st != abi.Success {
		t.Fatalf("put after drain: %v", st)
	}
}

// countGateOwner stalls the service in the Resolve of its n-th put until
// the gate opens.
type countGateOwner struct {
	*meshtest.MemOwner
	n       int32
	calls   atomic.Int32
	gate    chan struct{}
	stalled chan struct{}
}

func (o *countGateOwner) Resolve(id uint32) (unsafe.Pointer, uint64, uintptr, dataplane.Pin, bool) {
	if o.calls.Add(1) == o.n {
		close(o.stalled)
		<-o.gate
	}
	return o.MemOwner.Resolve(id)
}

// TestAckWithinARead: a burst of small puts that the target reads at once
// is acknowledged every ackEvery puts, not only when the service goes back
// to the socket, so the initiator's window refills while the rest lands.
// The target stalls at the 100th put of 150, 99 landed: the acks leave at
// least every ackEvery landed puts counted from the last one sent (which
// the ack timer may have sent early, after a first partial read on a busy
// machine), so at least the first 99-ackEvery+1 must complete, none past
// the 99th. Acknowledged only between reads, none would.
func TestAckWithinARead(t *testing.T) {
	mo := meshtest.NewOwners(2, 4096)
	g := &countGateOwner{MemOwner: mo[1], n: 100, gate: make(chan struct{}), stalled: make(chan struct{})}
	ls, hs := meshtest.ListenN(t, 2)
	owners := []dataplane.Owner{mo[0], g}
	ms := make([]*dataplane.Mesh, 2)
	errs := make(chan error, 2)
	for i := range ms {
		go func(i int) {
			m, err := dataplane.Connect(ls[i], hs, i, owners[i], dataplane.Options{Timeout: 10 * time.Second, Lanes: 1})
			ms[i] = m
			errs <- err
		}(i)
	}
	for range ms {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	defer ms[0].Close()
	defer ms[1].Close()
	var opened bool
	defer func() {
		if !opened {
			close(g.gate)
		}
	}()
	src := make([]byte, 8)
	const n = 150
	for k := 0; k < n; k++ { // held, then one writev
		ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: uint64(k + 1), Local: unsafe.Pointer(&src[0]), Size: 8, Off: uint64(8 * k)}}, true, 0)
	}
	ms[0].Flush(1)
	select {
	case <-g.stalled:
	case <-time.After(10 * time.Second):
		t.Fatal("the target never reached the 100th put")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mo[0].Mu.Lock()
		done := len(mo[0].Done)
		mo[0].Mu.Unlock()
		if least := 99 - tcp.AckEvery + 1; done >= least {
			if done >= 100 {
				t.Fatalf("%d puts completed while the target is stuck landing the 100th", done)
			}
			for k := 1; k <= least; k++ {
				if st, ok := mo[0].Status(uint64(k)); !ok || st != abi.Success {
					t.Fatalf("put %d: completed %v, status %v", k, ok, st)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d puts completed while the target lands the 100th of one burst; want at least the first %d acknowledged", done, 99-tcp.AckEvery+1)
		}
		time.Sleep(time.Millisecond)
	}
	close(g.gate)
	opened = true
	for k := 1; k <= n; k++ {
		if st := meshtest.WaitDone(t, mo[0], uint64(k)); st != abi.Success {
			t.Fatalf("put %d: %v", k, st)
		}
	}
}
