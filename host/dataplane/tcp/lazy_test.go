package tcp_test

import (
	"bytes"
	"fmt"
	"os"
	"strings"
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

// openStreams counts the streams of the connection to peer that are open:
// ours (lanes dialled) and the peer's (lanes it dialled to us).
func openStreams(m *dataplane.Mesh, peer int) (outs, ins int) {
	t := m.Peer(peer).Transport().(*tcp.Link)
	for _, l := range t.Lanes() {
		l.Mu().Lock()
		if l.Out() != nil {
			outs++
		}
		l.Mu().Unlock()
	}
	t.InMu().Lock()
	for _, c := range t.Ins() {
		if c != nil {
			ins++
		}
	}
	t.InMu().Unlock()
	return outs, ins
}

// meshSockets counts this process's descriptors that are connected TCP
// sockets to or from one of ports (the listeners' ports): the streams the
// test's meshes hold, whatever sockets other tests leave closing.
func meshSockets(t *testing.T, ports ...int) int {
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) < 10 || fs[3] == "0A" { // 0A: listening
				continue
			}
			for _, p := range ports {
				hex := fmt.Sprintf(":%04X", p)
				if strings.HasSuffix(fs[1], hex) || strings.HasSuffix(fs[2], hex) {
					inodes[fs[9]] = true
				}
			}
		}
	}
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range es {
		l, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err == nil && strings.HasPrefix(l, "socket:[") && inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] {
			n++
		}
	}
	return n
}

// TestLazyLanes: with four lanes, connect opens lane 0 only (one stream
// each way per pair, four descriptors a rank with itself); a lane opens on
// the first operation queued on it, a signal on a newly opened lane still
// waits for a put on another new lane posted before it, a striped put
// opens the rest, and the direction never used beyond lane 0 keeps one
// stream. Every byte and signal is checked.
func TestLazyLanes(t *testing.T) {
	const size = 1 << 20
	owners := meshtest.NewOwners(2, 2*size)
	ls, hs := meshtest.ListenN(t, 2)
	ports := []int{ls[0].Addr().Port, ls[1].Addr().Port}
	ms := meshtest.ConnectAll(t, ls, hs, func(i int) dataplane.Owner { return owners[i] }, func(int) dataplane.Options {
		return dataplane.Options{Timeout: 10 * time.Second, Lanes: 4, StripeThreshold: 256 << 10, ChunkSize: 64 << 10, CloseTimeout: 5 * time.Second}
	})
	// Two ranks, each with a stream each way to itself and to the other.
	if got := meshSockets(t, ports...); got != 8 {
		t.Errorf("connect opened %d descriptors, want 8 (lane 0 only)", got)
	}
	for r, m := range ms {
		for p := range 2 {
			if o, i := openStreams(m, p); o != 1 || i != 1 {
				t.Fatalf("rank %d to %d after connect: %d streams out, %d in; want 1 and 1", r, p, o, i)
			}
		}
	}
	src := make([]byte, 2*size)
	for i := range src {
		src[i] = byte(i*13 + 5)
	}
	// A put on lane 2, then a put with signal on lane 3: both lanes open,
	// and the signal is applied only after the put of lane 2 landed.
	word := (*uint64)(unsafe.Pointer(&owners[1].Mem[0]))
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 1, Local: unsafe.Pointer(&src[8]), Size: 4096, Off: 8}}, false, 2)
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, SigMrID: 1, SigOp: abi.SignalOpInc, Tag: 2, Local: unsafe.Pointer(&src[8+4096]), Size: 4096, Off: 8 + 4096}}, false, 3)
	meshtest.WaitUntil(t, "the signal", func() bool { return atomic.LoadUint64(word) == 1 })
	if !bytes.Equal(owners[1].Mem[8:8+8192], src[8:8+8192]) {
		t.Fatal("the signal of lane 3 was applied before the put of lane 2 landed")
	}
	for tag := uint64(1); tag <= 2; tag++ {
		if st := meshtest.WaitDone(t, owners[0], tag); st != abi.Success {
			t.Fatalf("op %d: %v", tag, st)
		}
	}
	if o, _ := openStreams(ms[0], 1); o != 3 {
		t.Fatalf("%d lanes open to rank 1 after operations on lanes 2 and 3, want 3", o)
	}
	meshtest.WaitUntil(t, "rank 1 to take the new lanes", func() bool { _, i := openStreams(ms[1], 0); return i == 3 })
	// A striped put with signal opens the last lane; every byte arrives
	// before the signal.
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, SigMrID: 1, SigOp: abi.SignalOpInc, Tag: 3, Local: unsafe.Pointer(&src[size]), Size: size, Off: size}}, false, 0)
	meshtest.WaitUntil(t, "the striped signal", func() bool { return atomic.LoadUint64(word) == 2 })
	if !bytes.Equal(owners[1].Mem[size:], src[size:]) {
		t.Fatal("the striped put's signal was applied before all of it landed")
	}
	want := ms[0].Parts(wire.MsgPutSignal, size)
	meshtest.WaitUntil(t, "the striped put's parts", func() bool {
		owners[0].Mu.Lock()
		defer owners[0].Mu.Unlock()
		return owners[0].Parts[3] == want
	})
	if o, _ := openStreams(ms[0], 1); o != 4 {
		t.Fatalf("%d lanes open to rank 1 after a striped put, want 4", o)
	}
	// Rank 1 never sent to rank 0: one stream that way still.
	if o, _ := openStreams(ms[1], 0); o != 1 {
		t.Fatalf("rank 1 opened %d lanes to rank 0 without using them", o)
	}
	for i, m := range ms {
		if err := m.Close(); err != nil {
			t.Fatalf("close of rank %d: %v", i, err)
		}
	}
	for i, o := range owners {
		if len(o.Failed) > 0 {
			t.Fatalf("rank %d heard of failures: %v", i, o.Failed)
		}
	}
}

// TestLazyLaneDialFails: a lane that cannot open (the peer's listener is
// gone) fails over like a broken lane: its operations go on lane 0, land
// once, and the initiator hears of the failover; the peer stays up.
func TestLazyLaneDialFails(t *testing.T) {
	owners := meshtest.NewOwners(2, 64<<10)
	ls, hs := meshtest.ListenN(t, 2)
	ms := meshtest.ConnectAll(t, ls, hs, func(i int) dataplane.Owner { return owners[i] }, func(int) dataplane.Options {
		// The lane that cannot open fails over once this passes; the
		// connect that must succeed gets it too, on a loaded machine.
		return dataplane.Options{Timeout: 2 * time.Second, Lanes: 2, StripeThreshold: 1 << 40, ChunkSize: 1 << 20, CloseTimeout: 5 * time.Second}
	})
	t.Cleanup(func() {
		for _, m := range ms {
			m.Close()
		}
	})
	ls[1].Close() // lane 1 to rank 1 can no longer open
	src := bytes.Repeat([]byte("lazy"), 1024)
	word := (*uint64)(unsafe.Pointer(&owners[1].Mem[0]))
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, SigMrID: 1, SigOp: abi.SignalOpInc, Tag: 1, Local: unsafe.Pointer(&src[0]), Size: uint64(len(src)), Off: 8}}, false, 1)
	if st := meshtest.WaitDone(t, owners[0], 1); st != abi.Success {
		t.Fatalf("put with signal on a lane that cannot open: %v", st)
	}
	if !bytes.Equal(owners[1].Mem[8:8+len(src)], src) || atomic.LoadUint64(word) != 1 {
		t.Fatalf("bytes or signal (%d) wrong after the failover", atomic.LoadUint64(word))
	}
	owners[0].Mu.Lock()
	events, failed := owners[0].LaneEvents, owners[0].Failed
	owners[0].Mu.Unlock()
	if len(events) != 1 || events[0] != [3]int{1, 1, 1} || len(failed) != 0 {
		t.Fatalf("lane events %v (want rank 1 lane 1, 1 op moved), failures %v", events, failed)
	}
	if ms[0].Peer(1).Dead() {
		t.Fatal("the peer died")
	}
}
