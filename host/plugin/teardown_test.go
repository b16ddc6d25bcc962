package plugin

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
)

// Environment of a rank process of TestTeardownDeviceAcrossProcesses.
const (
	envTDRank   = "RMAW_TEARDOWN_RANK"
	envTDDir    = "RMAW_TEARDOWN_DIR"
	envTDLanes  = "RMAW_TEARDOWN_LANES"
	envTDCycles = "RMAW_TEARDOWN_CYCLES"
)

// TestTeardownDeviceAcrossProcesses runs two rank processes (this test
// binary again) over loopback with fake device memory whose copies are slow,
// so that operations are still in flight at teardown. In every cycle one
// rank puts from device memory into the other's, with signals in device
// memory, and tears down at once without testing: destroyContext,
// deregMrSym, then the source is freed as cuMemFree would, closeColl,
// finalize. The receiver must see every byte and both signals.
func TestTeardownDeviceAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	for _, lanes := range []string{"1", "3"} {
		t.Run("lanes="+lanes, func(t *testing.T) {
			dir := t.TempDir()
			const cycles = 8
			cmds := make([]*exec.Cmd, 2)
			outs := make([]*bytes.Buffer, 2)
			for r := range cmds {
				c := exec.Command(os.Args[0], "-test.run=^TestTeardownDeviceRank$", "-test.count=1", "-test.v", "-test.timeout=3m")
				c.Env = append(os.Environ(), envTDRank+"="+strconv.Itoa(r), envTDDir+"="+dir,
					envTDLanes+"="+lanes, envTDCycles+"="+strconv.Itoa(cycles))
				outs[r] = &bytes.Buffer{}
				c.Stdout, c.Stderr = outs[r], outs[r]
				if err := c.Start(); err != nil {
					t.Fatal(err)
				}
				cmds[r] = c
			}
			for r, c := range cmds {
				if err := c.Wait(); err != nil {
					t.Errorf("rank %d: %v\n%s", r, err, outs[r])
				}
			}
			delivered := strings.Count(outs[0].String()+outs[1].String(), "received every byte and signal")
			if !t.Failed() && delivered != cycles {
				t.Fatalf("%d of %d cycles delivered:\n%s\n%s", delivered, cycles, outs[0], outs[1])
			}
		})
	}
}

// TestTeardownDeviceRank is one rank process of the test above.
func TestTeardownDeviceRank(t *testing.T) {
	rs := os.Getenv(envTDRank)
	if rs == "" {
		t.Skip("a rank process of TestTeardownDeviceAcrossProcesses")
	}
	rank, _ := strconv.Atoi(rs)
	cycles, _ := strconv.Atoi(os.Getenv(envTDCycles))
	dir, lanes := os.Getenv(envTDDir), os.Getenv(envTDLanes)
	config.SetGetenv(func(k string) string {
		switch k {
		case config.Backend.Name:
			return "native"
		case config.Addr.Name:
			return "127.0.0.1"
		case config.Lanes.Name:
			return lanes
		}
		return ""
	})
	dev := newFakeDevice()
	dev.delay = 500 * time.Microsecond
	devmem.Register(dev)
	defer devmem.Register(nil)
	for c := 0; c < cycles; c++ {
		teardownCycle(t, dev, dir, rank, c)
	}
}

// exchange publishes this rank's handle for cycle c and reads the peer's.
func exchange(t *testing.T, dir string, rank, c int, h *[abi.HandleSize]byte) [2]*[abi.HandleSize]byte {
	t.Helper()
	name := func(r int) string { return filepath.Join(dir, fmt.Sprintf("handle-%d-%d", c, r)) }
	tmp := name(rank) + ".tmp"
	if err := os.WriteFile(tmp, h[:], 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, name(rank)); err != nil {
		t.Fatal(err)
	}
	var hs [2]*[abi.HandleSize]byte
	hs[rank] = h
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, err := os.ReadFile(name(1 - rank))
		if err == nil && len(b) == abi.HandleSize {
			hs[1-rank] = (*[abi.HandleSize]byte)(b)
			return hs
		}
		if time.Now().After(deadline) {
			t.Fatalf("cycle %d: no handle from rank %d", c, 1-rank)
		}
		time.Sleep(time.Millisecond)
	}
}

func teardownCycle(t *testing.T, dev *fakeDevice, dir string, rank, c int) {
	const size = 3<<20 + 5 // striped when there are several lanes
	ctx, res := Init(uint64(c))
	if res != abi.Success {
		t.Fatalf("init: %v", res)
	}
	h := new([abi.HandleSize]byte)
	l, res := Listen(ctx, 0, h)
	if res != abi.Success {
		t.Fatalf("listen: %v", res)
	}
	hs := exchange(t, dir, rank, c, h)
	coll, res := Connect(hs[:], int32(rank), l)
	if res != abi.Success {
		t.Fatalf("cycle %d: connect: %v", c, res)
	}
	CloseListen(l)
	rma, res := CreateContext(coll, abi.RmaConfig{NContexts: 1, TrafficClass: abi.ConfigUndefInt})
	if res != abi.Success {
		t.Fatalf("createContext: %v", res)
	}
	src, dst, sig := dev.alloc(size), dev.alloc(size), dev.alloc(16)
	pat := make([]byte, size)
	for i := range pat {
		pat[i] = byte(i*13 + c)
	}
	dev.write(src, pat)
	var mh [3]uint64
	for k, a := range []uintptr{src, dst, sig} {
		if mh[k], res = RegMr(coll, a, []uint64{size, size, 16}[k], abi.PtrCuda, 0); res != abi.Success {
			t.Fatalf("cycle %d: regMr(CUDA): %v", c, res)
		}
	}
	const half = size / 2
	if rank == c%2 { // the sender tears down right after posting
		for _, post := range []func() (uint64, abi.Result){
			func() (uint64, abi.Result) { return Iput(rma, 0, 0, mh[0], half, 0, mh[1], uint32(1-rank), 0) },
			func() (uint64, abi.Result) {
				return IputSignal(rma, 0, half, mh[0], size-half, half, mh[1], uint32(1-rank), 0, mh[2], uint64(c+1), abi.SignalOpAdd, true, 0)
			},
			func() (uint64, abi.Result) {
				return IputSignal(rma, 0, 0, 0, 0, 0, 0, uint32(1-rank), 8, mh[2], 0, abi.SignalOpInc, true, 0)
			},
		} {
			if req, res := post(); res != abi.Success || req == 0 {
				t.Fatalf("cycle %d: post: %v", c, res)
			}
		}
		for _, r := range []abi.Result{DestroyContext(rma), DeregMr(coll, mh[0])} {
			if r != abi.Success {
				t.Fatalf("cycle %d: teardown: %v", c, r)
			}
		}
		dev.free(src) // the caller frees its memory once deregistered
		for _, r := range []abi.Result{DeregMr(coll, mh[1]), DeregMr(coll, mh[2]), CloseColl(coll), Finalize(ctx)} {
			if r != abi.Success {
				t.Fatalf("cycle %d: teardown: %v", c, r)
			}
		}
		return
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		w := dev.read(sig, 16)
		a, b := binary.LittleEndian.Uint64(w), binary.LittleEndian.Uint64(w[8:])
		if a == uint64(c+1) && b == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cycle %d: device signals %d %d, want %d 1: operations accepted before the sender's teardown were lost", c, a, b, c+1)
		}
		time.Sleep(time.Millisecond)
	}
	// The sender's pattern: byte i is i*13+c.
	if !bytes.Equal(dev.read(dst, size), pat) {
		t.Fatalf("cycle %d: device bytes differ after the signal", c)
	}
	if bad, _ := QueryLastError(rma); bad {
		t.Fatalf("cycle %d: queryLastError reports an error after an orderly goodbye", c)
	}
	for _, r := range []abi.Result{DestroyContext(rma), DeregMr(coll, mh[0]), DeregMr(coll, mh[1]), DeregMr(coll, mh[2]), CloseColl(coll), Finalize(ctx)} {
		if r != abi.Success {
			t.Fatalf("cycle %d: teardown: %v", c, r)
		}
	}
	fmt.Printf("cycle %d: rank %d received every byte and signal\n", c, rank)
}

// TestDeregWaitsForLandingPut: the target deregisters a buffer while a put
// into it is landing (slow device copies keep it in flight). deregMrSym must
// not return before the last byte landed, since the caller frees the memory
// next: no copy may reach the allocation after it returned.
func TestDeregWaitsForLandingPut(t *testing.T) {
	testIntraNode = "0"
	defer func() { testIntraNode = "1" }()
	dev := newFakeDevice()
	dev.delay = 300 * time.Microsecond
	dev.freed = map[uintptr]bool{}
	devmem.Register(dev)
	defer devmem.Register(nil)
	rs := setup(t, 2, 64)
	const size = 8 << 20
	src, dst := dev.alloc(size), dev.alloc(size)
	var mh [2][2]uint64
	var wg sync.WaitGroup
	for i := range rs {
		wg.Add(1)
		go func(i int) { // collective
			defer wg.Done()
			var res abi.Result
			if mh[i][0], res = RegMr(rs[i].coll, src, size, abi.PtrCuda, 0); res != abi.Success {
				t.Errorf("regMr: %v", res)
			}
			if mh[i][1], res = RegMr(rs[i].coll, dst, size, abi.PtrCuda, 0); res != abi.Success {
				t.Errorf("regMr: %v", res)
			}
		}(i)
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	req, res := Iput(rs[0].rma, 0, 0, mh[0][0], size, 0, mh[0][1], 1, 0)
	if res != abi.Success {
		t.Fatalf("iput: %v", res)
	}
	// Wait until the target is landing it, then deregister there.
	deadline := time.Now().Add(20 * time.Second)
	for {
		dev.mu.Lock()
		n := dev.htod
		dev.mu.Unlock()
		if n >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the put never started landing")
		}
		time.Sleep(100 * time.Microsecond)
	}
	if res := DeregMr(rs[1].coll, mh[1][1]); res != abi.Success {
		t.Fatalf("deregMr at the target: %v", res)
	}
	dev.mu.Lock()
	dev.freed[dst] = true // what cuMemFree would do now
	dev.mu.Unlock()
	// The put completes once the target acknowledged it landed: after
	// that no copy of it can come.
	wait(t, rs[0].coll, req)
	DeregMr(rs[1].coll, mh[1][0])
	DeregMr(rs[0].coll, mh[0][0])
	DeregMr(rs[0].coll, mh[0][1])
	dev.mu.Lock()
	late := dev.lateCopies
	dev.mu.Unlock()
	if late > 0 {
		t.Fatalf("%d device copies landed in the buffer after deregMrSym returned", late)
	}
}
