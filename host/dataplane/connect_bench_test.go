package dataplane_test

import (
	"sync"
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// BenchmarkConnect8 times a full 8-rank connect in one process over
// loopback (64 authenticated streams with one lane), listen to close; the
// figure SPEC.md quotes for the cost of the hello.
func BenchmarkConnect8(b *testing.B) {
	const n = 8
	for i := 0; i < b.N; i++ {
		ls := make([]*dataplane.Listener, n)
		hs := make([]*wire.Handle, n)
		for r := range ls {
			l, h, err := dataplane.Listen(dataplane.ListenOptions{Addr: "127.0.0.1"})
			if err != nil {
				b.Fatal(err)
			}
			ls[r], hs[r] = l, h
		}
		ms := make([]*dataplane.Mesh, n)
		var wg sync.WaitGroup
		for r := range ms {
			wg.Add(1)
			go func(r int) {
				defer wg.Done()
				m, err := dataplane.Connect(ls[r], hs, r, &meshtest.MemOwner{Mem: make([]byte, 64), Done: map[uint64]abi.Result{}}, dataplane.Options{Timeout: 20 * time.Second, Lanes: 1, CloseTimeout: time.Second})
				if err != nil {
					b.Error(err)
				}
				ms[r] = m
			}(r)
		}
		wg.Wait()
		b.StopTimer()
		for r := range ms {
			if ms[r] != nil {
				ms[r].Close()
			}
			ls[r].Close()
		}
		b.StartTimer()
	}
}
