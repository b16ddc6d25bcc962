package tcp_test

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/codec/codectest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// TestCallerReadsStream sends a stream of puts with signal of many sizes
// (from nothing to several read buffers), compressed puts and gets, while
// two threads of the target poll (rmaProgress and test(), which serve what
// the socket holds on the caller's thread, tcp_caller.go) beside the
// service goroutine. The stream changes hands between them all the time:
// whatever a caller does not serve (a big or compressed put, a get) it
// leaves to the service. Every byte and every signal must land, each
// signal only after its payload: whenever the signal word reads k, puts
// 0..k-1 are whole. Over TCP, sealed streams, and two lanes (acks on the
// streams themselves rather than piggybacked). Not the intra-node link:
// its payloads are copied in this process, which the race detector cannot
// see ordered by the signal that crossed a socket (TestPiggybackedAcks
// runs it with callers polling).
func TestCallerReadsStream(t *testing.T) {
	for _, c := range []struct {
		name string
		opt  dataplane.Options
	}{
		{"tcp", dataplane.Options{Lanes: 1}},
		{"sealed", dataplane.Options{Lanes: 1, Encrypt: true}},
		{"lanes2", dataplane.Options{Lanes: 2}},
	} {
		t.Run(c.name, func(t *testing.T) {
			const n = 240
			sizes := []int{8, 0, 100, 4000, 24 << 10, 3, 70 << 10, 16, 64}
			offs := make([]int, n+1)
			offs[0] = 64 // word 0 is the signal
			for i := 0; i < n; i++ {
				offs[i+1] = offs[i] + sizes[i%len(sizes)]
			}
			const getSize = 256
			size := offs[n] + 64 + getSize
			getsAt := offs[n] + 64
			os := meshtest.NewOwners(2, size)
			for i := 0; i < getSize; i++ {
				os[1].Mem[getsAt+i] = byte(i*5 + 3)
			}
			src := codectest.CompressibleData(offs[n], 7)
			opt := c.opt
			opt.Timeout = 10 * time.Second
			ms := meshtest.Connect2(t, os, opt)
			// The callers of rank 1.
			var stop atomic.Bool
			var wg sync.WaitGroup
			for k := 0; k < 2; k++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for !stop.Load() {
						if k == 0 {
							ms[1].Progress()
						} else {
							ms[1].Flush(0)
						}
						runtime.Gosched()
					}
				}()
			}
			// The checker of rank 1: puts 0..k-1 whole once the word reads k.
			checked := make(chan error, 1)
			go func() {
				w := (*uint64)(unsafe.Pointer(&os[1].Mem[0]))
				seen := 0
				deadline := time.Now().Add(30 * time.Second)
				for seen < n {
					k := int(atomic.LoadUint64(w))
					for ; seen < k; seen++ {
						a, b := offs[seen], offs[seen+1]
						if string(os[1].Mem[a:b]) != string(src[a-64:b-64]) {
							checked <- fmt.Errorf("signal reads %d but put %d (%d bytes at %d) differs", k, seen, b-a, a)
							return
						}
					}
					if time.Now().After(deadline) {
						checked <- fmt.Errorf("signal word at %d after 30 s, want %d", k, n)
						return
					}
					runtime.Gosched()
				}
				checked <- nil
			}()
			dsts := make([][]byte, 0, n/10)
			for i := 0; i < n; i++ {
				a, b := offs[i], offs[i+1]
				op := dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: uint64(i + 1), Size: uint64(b - a), Off: uint64(a), SigMrID: 1, SigOp: abi.SignalOpAdd, SigValue: 1}, Route: dataplane.Route{Remote: uint64(uintptr(unsafe.Pointer(&os[1].Mem[a])))}}
				if b > a {
					op.Local = unsafe.Pointer(&src[a-64])
				}
				if i%7 == 3 && b-a >= 4000 {
					op.Codec = guestabi.Codec(guestabi.CodecS2, 0)
				}
				ms[0].Post(1, &op, i%3 == 0, 0)
				if i%10 == 5 {
					dst := make([]byte, getSize)
					dsts = append(dsts, dst)
					ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgGet, MrID: 1, Tag: uint64(1<<32 | len(dsts)), Local: unsafe.Pointer(&dst[0]), Size: getSize, Off: uint64(getsAt)}}, false, 0)
				}
				if i%4 == 0 {
					ms[0].Flush(1)
				}
			}
			ms[0].Flush(1)
			if err := <-checked; err != nil {
				t.Fatal(err)
			}
			for i := 0; i < n; i++ {
				if st := meshtest.WaitDone(t, os[0], uint64(i+1)); st != abi.Success {
					t.Fatalf("put %d: %v", i, st)
				}
			}
			for j, dst := range dsts {
				if st := meshtest.WaitDone(t, os[0], uint64(1<<32|(j+1))); st != abi.Success {
					t.Fatalf("get %d: %v", j, st)
				}
				for i, b := range dst {
					if want := byte(i*5 + 3); b != want {
						t.Fatalf("get %d: byte %d is %#x, want %#x", j, i, b, want)
					}
				}
			}
			stop.Store(true)
			wg.Wait()
			if got := *(*uint64)(unsafe.Pointer(&os[1].Mem[0])); got != n {
				t.Fatalf("signal word %d, want %d", got, n)
			}
			var msgs, hand uint64
			for _, a := range meshtest.TCPOf(t, ms[1], 0).Acks() {
				if r := a.Rd().Load(); r != nil {
					msgs += r.CallerMsgs().Load()
					hand += r.Handoffs().Load()
				}
			}
			t.Logf("callers served %d messages, left the stream to the service %d times", msgs, hand)
			if len(os[1].Failed) != 0 || len(os[0].Failed) != 0 {
				t.Fatalf("errors: %v %v", os[0].Failed, os[1].Failed)
			}
		})
	}
}

// TestCallerServesWhileServiceNaps pins the service to its naps (callers
// always count as polling), so that what arrives is served on the test's
// thread by Flush (test()) alone: small puts with signal are served by the
// caller, every one of them; a put bigger than the read buffer, a
// compressed put and a get are left to the service, which the caller
// wakes; then the caller serves again.
func TestCallerServesWhileServiceNaps(t *testing.T) {
	savedA, savedW := *tcp.PollActive(), *tcp.CallerWindow()
	*tcp.PollActive(), *tcp.CallerWindow() = time.Hour, time.Hour
	t.Cleanup(func() { *tcp.PollActive(), *tcp.CallerWindow() = savedA, savedW }) // after the meshes closed
	const size = 256 << 10
	os := meshtest.NewOwners(2, size)
	ms := meshtest.Connect2(t, os, dataplane.Options{Timeout: 10 * time.Second, Lanes: 1})
	src := codectest.CompressibleData(size, 3)
	r := meshtest.TCPOf(t, ms[1], 0).Acks()[0].Rd().Load()
	for r == nil { // the service publishes its reader as it starts
		runtime.Gosched()
		r = meshtest.TCPOf(t, ms[1], 0).Acks()[0].Rd().Load()
	}
	sig := uint64(0)
	tag := uint64(0)
	put := func(off, n int, cw uint32) {
		tag++
		sig++
		op := dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: tag, Local: unsafe.Pointer(&src[off]), Size: uint64(n), Off: uint64(off), SigMrID: 1, SigOp: abi.SignalOpAdd, SigValue: 1}, Plan: dataplane.Plan{Codec: cw}}
		ms[0].Post(1, &op, false, 0)
		ms[0].Flush(1)
		meshtest.WaitWord(t, os[1], 0, sig, func() { ms[1].Flush(0) })
		if string(os[1].Mem[off:off+n]) != string(src[off:off+n]) {
			t.Fatalf("put of %d bytes at %d: the target's bytes differ", n, off)
		}
		if st := meshtest.WaitDone(t, os[0], tag); st != abi.Success {
			t.Fatalf("put of %d bytes at %d: %v", n, off, st)
		}
	}
	small := func(k int) {
		// Until the service naps, leaving the stream to callers, it serves
		// (a put wakes it; it naps when a caller called since its last
		// look).
		for !r.Napping().Load() {
			ms[1].Flush(0)
			put(64, 8, 0)
		}
		m0, h0 := r.CallerMsgs().Load(), r.Handoffs().Load()
		for i := 0; i < k; i++ {
			put(64+8*i, 8, 0)
		}
		// More than k: the initiator may also have asked for its acks
		// (a starved machine's backstop), which the caller serves too.
		if got := r.CallerMsgs().Load() - m0; got < uint64(k) {
			t.Fatalf("the caller served %d of %d small puts, want all (the service naps)", got, k)
		}
		if h := r.Handoffs().Load() - h0; h != 0 {
			t.Fatalf("the caller left the stream to the service %d times during %d small puts, want none", h, k)
		}
	}
	small(50)
	h0 := r.Handoffs().Load()
	put(4096, 100<<10, 0) // more than a read buffer
	put(128<<10, 64<<10, guestabi.Codec(guestabi.CodecS2, 0))
	dst := make([]byte, 512)
	tag++
	ms[0].Post(1, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgGet, MrID: 1, Tag: tag, Local: unsafe.Pointer(&dst[0]), Size: 512, Off: 4096}}, false, 0)
	ms[0].Flush(1)
	for {
		if _, ok := os[0].Status(tag); ok {
			break
		}
		ms[1].Flush(0)
		runtime.Gosched()
	}
	if st := meshtest.WaitDone(t, os[0], tag); st != abi.Success || string(dst) != string(src[4096:4096+512]) {
		t.Fatalf("get: %v, or its bytes differ", st)
	}
	if r.Handoffs().Load() == h0 {
		t.Fatal("the caller served a put bigger than its buffer, a compressed put and a get itself")
	}
	small(50)
	// The goodbyes, too, reach services that nap: callers serve them.
	var stop atomic.Bool
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for !stop.Load() {
			ms[0].Progress() // every peer: each rank's link to itself naps too
			ms[1].Progress()
			runtime.Gosched()
		}
	}()
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Add(1)
		go func() { defer wg.Done(); m.Close() }()
	}
	wg.Wait()
	stop.Store(true)
	<-polled
	for i, o := range os {
		if len(o.Failed) != 0 {
			t.Fatalf("rank %d: %v", i, o.Failed)
		}
	}
}
