package intranode_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/intranode"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/shmstream"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// streamPuts posts n put+signals of 8 B to 8 KiB from rank a to rank b,
// round-robin over the lanes, each with its own bytes, and checks every
// byte and the signal count (word 0 of b's memory counts to base+n).
func streamPuts(t *testing.T, ms []*dataplane.Mesh, owners []*meshtest.MemOwner, a, b, n int, base uint64) {
	t.Helper()
	sizes := []uint64{8, 64, 1024, 8 << 10}
	src := make([]byte, 16<<10)
	for i := range n {
		size := sizes[i%len(sizes)]
		for j := range src[:size] {
			src[j] = byte(i*13 + j)
		}
		// Each put its own bytes of the target: a put reusing another's
		// would race with the check of it (the race detector does not see
		// the raw writev of a socket lane order them).
		off := uint64(64 + (int(base)+i)*(8<<10))
		tag := uint64(a)<<32 | (base + uint64(i) + 1) // tag 0 asks for no completion
		ms[a].Post(b, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: tag, Local: unsafe.Pointer(&src[0]), Size: size, Off: off, SigMrID: 1, SigOp: abi.SignalOpInc}}, false, i%ms[a].Lanes())
		if st := meshtest.WaitDone(t, owners[a], tag); st != abi.Success {
			t.Fatalf("put %d of %d bytes: %v", i, size, st)
		}
		meshtest.WaitWord(t, owners[b], 0, base+uint64(i)+1, nil)
		if got := owners[b].Mem[off : off+size]; !bytes.Equal(got, src[:size]) {
			t.Fatalf("put %d of %d bytes: bytes differ once its signal was seen", i, size)
		}
	}
}

// TestStreamRings: between two ranks of one host every lane's requests go
// through a shared-memory stream (the sending lanes switched, the readers
// read rings), both ways, with every byte and signal in place; the
// service, asleep when a put comes (nobody polls here), is woken by a bell.
func TestStreamRings(t *testing.T) {
	for _, lanes := range []int{1, 2} {
		t.Run(fmt.Sprintf("lanes=%d", lanes), func(t *testing.T) {
			owners := meshtest.NewOwners(2, 64+48*(8<<10))
			ms := meshtest.Connect2(t, owners, dataplane.Options{Timeout: 10 * time.Second, IntraNode: true, Lanes: lanes, CloseTimeout: time.Second})
			streamPuts(t, ms, owners, 0, 1, 40, 0)
			streamPuts(t, ms, owners, 1, 0, 40, 0)
			// Quiet long enough for the services to park, then one more.
			time.Sleep(50 * time.Millisecond)
			streamPuts(t, ms, owners, 0, 1, 1, 40)
			var bells uint64
			for a := range 2 {
				tl := meshtest.TCPOf(t, ms[a], 1-a)
				for _, l := range tl.Lanes() {
					if meshtest.IntraOf(l).SState() != intranode.RingOn || meshtest.IntraOf(l).Sring().Load() == nil {
						t.Fatalf("rank %d lane %d to rank %d: no shared-memory stream", a, l.Idx(), 1-a)
					}
					bells += meshtest.IntraOf(l).Bells().Load()
				}
				target := meshtest.TCPOf(t, ms[1-a], a)
				for i, ac := range target.Acks() {
					if r := ac.Rd().Load(); r == nil || r.Sring() == nil {
						t.Fatalf("rank %d's reader of lane %d from rank %d reads no ring", 1-a, i, a)
					}
				}
			}
			if bells == 0 {
				t.Fatal("no bell rung, yet a put reached a parked service")
			}
			var st strings.Builder
			ms[0].WriteState(&st)
			if !strings.Contains(st.String(), "shm{written ") {
				t.Fatalf("the stall report shows no shared-memory stream:\n%s", st.String())
			}
			for _, m := range ms {
				if err := m.Close(); err != nil {
					t.Fatal(err)
				}
			}
			for _, o := range owners {
				if len(o.Failed) > 0 {
					t.Fatalf("errors: %v", o.Failed)
				}
			}
		})
	}
}

// TestStreamRefused: a target that cannot map the ring refuses it (INFO),
// and the lane goes on with its socket.
func TestStreamRefused(t *testing.T) {
	refusal := errors.New("refused by the test")
	intranode.StreamRefusal().Store(&refusal)
	defer intranode.StreamRefusal().Store(nil)
	owners := meshtest.NewOwners(2, 64+48*(8<<10))
	ms := meshtest.Connect2(t, owners, dataplane.Options{Timeout: 10 * time.Second, IntraNode: true, Lanes: 1, CloseTimeout: time.Second})
	streamPuts(t, ms, owners, 0, 1, 20, 0)
	l := meshtest.TCPOf(t, ms[0], 1).Lanes()[0]
	if meshtest.IntraOf(l).SState() != intranode.RingOff || !meshtest.IntraOf(l).SNo().Load() {
		t.Fatalf("lane state %d (refused %v) after a refusal", meshtest.IntraOf(l).SState(), meshtest.IntraOf(l).SNo().Load())
	}
	if r := meshtest.TCPOf(t, ms[1], 0).Acks()[0].Rd().Load(); r == nil || r.Sring() != nil {
		t.Fatal("the target reads a ring it refused")
	}
}

// TestStreamOff: NoIntraStream keeps the socket.
func TestStreamOff(t *testing.T) {
	owners := meshtest.NewOwners(2, 64+48*(8<<10))
	ms := meshtest.Connect2(t, owners, dataplane.Options{Timeout: 10 * time.Second, IntraNode: true, Lanes: 1, NoIntraStream: true})
	streamPuts(t, ms, owners, 0, 1, 8, 0)
	if l := meshtest.TCPOf(t, ms[0], 1).Lanes()[0]; meshtest.IntraOf(l).Sring().Load() != nil {
		t.Fatal("a shared-memory stream although NoIntraStream")
	}
}

// TestStreamCorrupt: a writer whose ring tail runs ahead of what the ring
// holds has corrupted the stream: the target drops it with an error that
// says so, at once, and nothing hangs.
func TestStreamCorrupt(t *testing.T) {
	// The hostile writer keeps a descriptor of every ring made (the lanes
	// close theirs once the target answered).
	var fds []*os.File
	*intranode.NewStreamRing() = func(size uint64) (*shmstream.Ring, error) {
		r, err := shmstream.New(size)
		if err == nil {
			fd, _ := r.Offer()
			f, ferr := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", fd), os.O_RDWR, 0)
			if ferr != nil {
				t.Error(ferr)
			}
			fds = append(fds, f)
		}
		return r, err
	}
	defer func() { *intranode.NewStreamRing() = shmstream.New }()
	owners := meshtest.NewOwners(2, 64+48*(8<<10))
	ms := meshtest.Connect2(t, owners, dataplane.Options{Timeout: 10 * time.Second, IntraNode: true, Lanes: 1, CloseTimeout: time.Second})
	streamPuts(t, ms, owners, 0, 1, 4, 0)
	*intranode.NewStreamRing() = shmstream.New
	_, size := meshtest.IntraOf(meshtest.TCPOf(t, ms[0], 1).Lanes()[0]).Sring().Load().Offer()
	if len(fds) != 1 {
		t.Fatalf("%d rings made, want 1 (rank 0 to rank 1)", len(fds))
	}
	f := fds[0]
	defer f.Close()
	mem, err := unix.Mmap(int(f.Fd()), 0, int(4096+size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	tail := (*uint64)(unsafe.Pointer(&mem[128]))
	atomic.AddUint64(tail, 3*size)
	// Wake the target's service: a bell, as a writer would ring.
	meshtest.IntraOf(meshtest.TCPOf(t, ms[0], 1).Lanes()[0]).Ring()
	deadline := time.Now().Add(10 * time.Second)
	for !ms[1].Peer(0).Dead() {
		if time.Now().After(deadline) {
			t.Fatal("the target still serves a corrupted stream")
		}
		time.Sleep(time.Millisecond)
	}
	owners[1].WaitFailure(t, "corrupted")
}

// TestStreamSecondOffer: a sender that offers a second shared-memory
// stream on a lane that already reads one breaks the protocol: the target
// drops the peer with an error that says so, and nothing hangs.
func TestStreamSecondOffer(t *testing.T) {
	owners := meshtest.NewOwners(2, 64+48*(8<<10))
	ms := meshtest.Connect2(t, owners, dataplane.Options{Timeout: 10 * time.Second, IntraNode: true, Lanes: 1, CloseTimeout: time.Second})
	streamPuts(t, ms, owners, 0, 1, 4, 0)
	l := meshtest.TCPOf(t, ms[0], 1).Lanes()[0]
	if meshtest.IntraOf(l).Sring().Load() == nil {
		t.Fatal("the lane did not switch to a shared-memory stream")
	}
	// Take the lane's writing role, as a batch does, and offer again.
	meshtest.WaitUntil(t, "the lane's writing role", func() bool {
		l.Mu().Lock()
		defer l.Mu().Unlock()
		if *l.Writing() {
			return false
		}
		*l.Writing() = true
		return true
	})
	var b [wire.HeaderSize]byte
	(&wire.Header{Typ: wire.MsgStream, Off: 3, Size: 1 << 18}).Encode(b[:])
	err := l.WriteIov([][]byte{b[:]})
	l.Mu().Lock()
	*l.Writing() = false
	l.Mu().Unlock()
	if err != nil {
		t.Fatal(err)
	}
	meshtest.IntraOf(l).Ring()
	meshtest.WaitUntil(t, "the target to drop the peer", ms[1].Peer(0).Dead)
	owners[1].WaitFailure(t, "second shared-memory stream")
}
