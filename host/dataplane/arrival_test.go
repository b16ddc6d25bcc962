// The race detector does not see the order a socket gives between the
// writev that sends a put (net.Buffers.WriteTo) and the service that lands
// it, so rank 1 reading its memory after the out-of-band barrier, which is
// the point of this test, looks racy to it.

//go:build !race

package dataplane_test

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// TestCompletionMeansArrival is aws-ofi-nccl's rma_duplicate_mr check: rank
// 0 puts, waits for the request to complete, then tells rank 1 out of band
// (a channel, not the plugin), and rank 1 reads its memory without calling
// the plugin: every byte, and the signal of a put with signal, must already
// be there. Over TCP with one lane and several, and on the intra-node path
// (below and above the side path's threshold, striped and not), with the
// stream readers parking at once and spinning after traffic.
func TestCompletionMeansArrival(t *testing.T) {
	const sigOff = 0 // the signal word; payloads go after it
	const payOff = 4096
	sizes := []uint64{8, 4 << 10, 64 << 10, 1 << 20}
	for _, cfg := range []struct {
		intra bool
		lanes int
		spin  time.Duration
	}{{false, 1, 0}, {false, 3, 0}, {true, 1, 0}, {true, 2, 0}, {false, 1, time.Millisecond}, {false, 3, 200 * time.Microsecond}} {
		t.Run(fmt.Sprintf("intra=%v/lanes=%d/spin=%v", cfg.intra, cfg.lanes, cfg.spin), func(t *testing.T) {
			os := meshtest.NewOwners(2, payOff+1<<20)
			ms := meshtest.Connect2(t, os, dataplane.Options{Timeout: 10 * time.Second, IntraNode: cfg.intra, Lanes: cfg.lanes,
				StripeThreshold: 256 << 10, ChunkSize: 64 << 10, SpinWait: cfg.spin, Spinners: 3})
			src := make([]byte, 1<<20)
			notify := make(chan uint64) // out of band: "request tag completed"
			checked := make(chan error)
			// Rank 1: never calls the mesh; reads its memory when told.
			go func() {
				sig := uint64(0)
				for tag := range notify {
					size, iter := sizes[tag%uint64(len(sizes))], byte(tag>>8)
					got := os[1].Mem[payOff : payOff+size]
					var err error
					for i := range got {
						if got[i] != iter+byte(i) {
							err = fmt.Errorf("put %d (%d bytes) completed but byte %d at the target is %d, want %d", tag, size, i, got[i], iter+byte(i))
							break
						}
					}
					if tag&0x80 != 0 {
						sig++
						if w := binary.LittleEndian.Uint64(os[1].Mem[sigOff:]); err == nil && w != sig {
							err = fmt.Errorf("put with signal %d completed but the signal word is %d, want %d", tag, w, sig)
						}
					}
					checked <- err
				}
			}()
			defer close(notify)
			for iter := 1; iter <= 120; iter++ {
				for si, size := range sizes {
					if size >= 64<<10 && iter%8 != 0 {
						continue // large sizes cost more; fewer of them
					}
					for i := range src[:size] {
						src[i] = byte(iter) + byte(i)
					}
					tag := uint64(iter)<<8 | uint64(si)
					op := dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Local: unsafe.Pointer(&src[0]), Size: size, Off: payOff}, Route: dataplane.Route{Remote: uint64(uintptr(unsafe.Pointer(&os[1].Mem[payOff])))}}
					if iter%2 == 0 {
						tag |= 0x80
						op.Msg, op.SigMrID, op.SigOp, op.SigOff = wire.MsgPutSignal, 1, abi.SignalOpInc, sigOff
					}
					op.Tag = tag
					want := ms[0].Parts(op.Msg, size)
					ms[0].Post(1, &op, false, 0)
					// Rank 0's test() loop: flush and poll until done.
					deadline := time.Now().Add(10 * time.Second)
					for {
						ms[0].Flush(1)
						os[0].Mu.Lock()
						n, st := os[0].Parts[tag], os[0].Done[tag]
						os[0].Mu.Unlock()
						if n == want {
							if st != abi.Success {
								t.Fatalf("put %d: %v", tag, st)
							}
							break
						}
						if time.Now().After(deadline) {
							t.Fatalf("put %d: %d of %d parts completed", tag, n, want)
						}
						runtime.Gosched()
					}
					notify <- tag
					if err := <-checked; err != nil {
						t.Fatal(err)
					}
				}
			}
		})
	}
}
