package ofi_test

import (
	"bytes"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/ofi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/devtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric/endpoint"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// Device memory over libfabric: staged over the TCP lanes beside the
// endpoint, or direct (dma-buf).

// devFabOwner is meshtest.FabOwner with a second registration (id 2) in a fake
// device's memory: ops on it must be staged (the provider here has no
// FI_HMEM, and the fake's addresses cannot be dereferenced).
type devFabOwner struct {
	*meshtest.FabOwner
	dev  uintptr
	size uint64
}

func (o *devFabOwner) Resolve(id uint32) (unsafe.Pointer, uint64, uintptr, dataplane.Pin, bool) {
	if id == 2 {
		a := o.dev
		return *(*unsafe.Pointer)(unsafe.Pointer(&a)), o.size, 1, dataplane.Pin{}, true
	}
	return o.FabOwner.Resolve(id)
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
			prov := meshtest.FabricProvider(t, "tcp;ofi_rxm")
			owners := make([]*devFabOwner, 2)
			ms := make([]*dataplane.Mesh, 2)
			{
				ls := make([]*dataplane.Listener, 2)
				hs := make([]*wire.Handle, 2)
				for i := range ls {
					owners[i] = &devFabOwner{FabOwner: &meshtest.FabOwner{Mem: fabric.Alloc(hsize), Size: hsize, Done: map[uint64]abi.Result{}}, dev: d.Base + uintptr(i*dsize), size: dsize}
					l, h, err := dataplane.Listen(dataplane.ListenOptions{Addr: "127.0.0.1", Provider: prov})
					if err != nil {
						t.Fatal(err)
					}
					ls[i], hs[i] = l, h
					t.Cleanup(func() { l.Close() })
				}
				copy(ms, meshtest.ConnectAll(t, ls, hs, func(i int) dataplane.Owner { return owners[i] }, func(int) dataplane.Options {
					return dataplane.Options{Timeout: 10 * time.Second, Lanes: lanes, StripeThreshold: 1 << 20, ChunkSize: 256 << 10, CloseTimeout: time.Second}
				}))
			}
			defer func() {
				ms[0].Close()
				ms[1].Close()
				fabric.Free(owners[0].Mem)
				fabric.Free(owners[1].Mem)
			}()
			for i, m := range ms {
				key, err := m.RegisterMemory(1, owners[i].Mem, hsize, false)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := m.RegisterMemory(2, nil, dsize, true); err != nil {
					t.Fatalf("device registration on a fabric communicator: %v", err)
				}
				for p := 0; p < 2; p++ {
					m.Post(p, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgReg, MrID: 1, Size: hsize, Off: uint64(uintptr(owners[i].Mem)), SigValue: key}}, false, 0)
					m.Post(p, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgReg, MrID: 2, Size: dsize, Off: uint64(owners[i].dev), Dev: true}}, false, 0)
				}
			}
			f := ms[0].Peer(1).Transport().(*ofi.Link)
			for deadline := time.Now().Add(5 * time.Second); !func() bool { d, _ := f.RemoteDev(2); return d }(); {
				if time.Now().After(deadline) {
					t.Fatal("device registration never announced")
				}
				time.Sleep(time.Millisecond)
			}
			// Rank 0's source: its host registration and its device memory.
			hsrc := owners[0].Bytes()
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
				op     dataplane.Op
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
					steps = append(steps, step{dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 2, Local: nil, LocalCtx: 1, Size: n, Off: off, SigMrID: 1, SigOp: abi.SignalOpInc}}, false})
					steps[len(steps)-1].op.Local = *(*unsafe.Pointer)(unsafe.Pointer(&[]uintptr{d.Base + uintptr(off)}[0]))
				default: // host → host over RDMA, then host → device staged
					hn := min(n, hsize/2)
					steps = append(steps, step{dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Local: unsafe.Add(owners[0].Mem, 8), Size: hn - 8, Off: hsize/2 + 8, LocalMr: 1}}, true})
					steps = append(steps, step{dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 2, Local: unsafe.Add(owners[0].Mem, 8), Size: hn - 8, Off: dsize - hn, LocalMr: 1, SigMrID: 1, SigOp: abi.SignalOpInc}}, false})
				}
			}
			for i := range steps {
				steps[i].op.Tag = uint64(i + 1)
				ms[0].Post(1, &steps[i].op, false, -1)
			}
			for i := range steps {
				if st := owners[0].WaitN(t, steps[i].op.Tag, ms[0].OpParts(1, &steps[i].op)); st != abi.Success {
					t.Fatalf("op %d: %v", i, st)
				}
			}
			sigs := uint64(0)
			for _, s := range steps {
				if s.op.Msg == wire.MsgPutSignal {
					sigs++
				}
			}
			sig := (*uint64)(owners[1].Mem)
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
			if got := owners[1].Bytes()[hsize/2+8 : hsize/2+64<<10]; !bytes.Equal(got, hsrc[8:64<<10]) {
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
			ms[1].Post(0, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgGet, MrID: 2, Tag: 500, Local: unsafe.Add(owners[1].Mem, 4096), LocalMr: 1, Size: 128 << 10, Off: 4096}}, false, -1)
			if st := owners[1].WaitN(t, 500, ms[1].Parts(wire.MsgGet, 128<<10)); st != abi.Success {
				t.Fatalf("get: %v", st)
			}
			if !bytes.Equal(owners[1].Bytes()[4096:4096+128<<10], dsrc[4096:4096+128<<10]) {
				t.Fatal("get from device memory: bytes differ")
			}
			// The lane releases the window when the acks arrive, unless a
			// poller was reaping at that moment (reapStaged takes turns);
			// then that poller's next round does: wait for it, bounded.
			for end := time.Now().Add(10 * time.Second); f.Staging().Load() != 0 && time.Now().Before(end); {
				time.Sleep(time.Millisecond)
			}
			if f.Staging().Load() != 0 {
				t.Errorf("%d staged puts still hold the window", f.Staging().Load())
			}
			if len(owners[0].Fail)+len(owners[1].Fail) > 0 {
				t.Fatalf("failures: %v %v", owners[0].Fail, owners[1].Fail)
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
	f := ofi.BareLink(&endpoint.Endpoint{Regs: endpoint.NewRegs(nil, 0, local)}, nil)
	f.PeerRegistered(0, 1, 0x1000, 11, false, false) // host
	f.PeerRegistered(0, 2, 0x2000, 12, true, false)  // device, not registered with the provider: staged
	f.PeerRegistered(0, 3, 0x3000, 13, true, true)   // device registered with FI_HMEM
	f.PeerRegistered(0, 4, 0x4000, 14, false, true)  // host: "direct" means nothing there
	dev := uintptr(0x7e00_0000_0000)
	for _, c := range []struct {
		name   string
		op     dataplane.Op
		staged bool
	}{
		{"host to host", dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, LocalMr: 1, Size: 64}}, false},
		{"host to staged device", dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 2, LocalMr: 1, Size: 64}}, true},
		{"host to direct device", dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 3, LocalMr: 1, Size: 64}}, false},
		{"host to host marked direct", dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 4, LocalMr: 1, Size: 64}}, false},
		{"direct device to host", dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, LocalMr: 2, LocalCtx: dev, Size: 64}}, false},
		{"unregistered device to host", dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, LocalMr: 1, LocalCtx: dev, Size: 64}}, true},
		{"direct device to staged device", dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 2, LocalMr: 2, LocalCtx: dev, Size: 64}}, true},
		{"get from staged device", dataplane.Op{Request: dataplane.Request{Msg: wire.MsgGet, MrID: 2, LocalMr: 1, Size: 64}}, true},
		{"get into unregistered device", dataplane.Op{Request: dataplane.Request{Msg: wire.MsgGet, MrID: 1, LocalMr: 1, LocalCtx: dev, Size: 64}}, true},
		{"signal alone to a device word", dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, SigMrID: 2}}, false},
		{"empty put to staged device", dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 2, LocalMr: 1}}, false},
		{"goodbye", dataplane.Op{Request: dataplane.Request{Msg: wire.MsgBye}}, false},
	} {
		if got := f.Staged(&c.op); got != c.staged {
			t.Errorf("%s: staged %v, want %v", c.name, got, c.staged)
		}
	}
	if d, direct := f.RemoteDev(4); d || direct {
		t.Errorf("host registration 4 reads as device %v direct %v", d, direct)
	}
}
