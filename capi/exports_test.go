package main

import (
	"runtime"
	"testing"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/plugin"
)

// Test files cannot name C types, so the helpers below take an export and
// let type inference find its parameter types.
type num interface {
	~int32 | ~uint32 | ~uint64
}

// bindOp fixes the arguments of iput or iget; out is its request.
func bindOp[A, B, C, D, E, F, G, H, I, T, R num](f func(A, B, C, D, E, F, G, H, I, *T) R, v [9]uint64) (call func() R, out *T) {
	out = new(T)
	return func() R {
		return f(A(v[0]), B(v[1]), C(v[2]), D(v[3]), E(v[4]), F(v[5]), G(v[6]), H(v[7]), I(v[8]), out)
	}, out
}

// bindTest fixes the arguments of test, reading the request from *req;
// out is its done flag.
func bindTest[A, T, R num](f func(A, A, *T) R, coll uint64, req *uint64) (call func() R, out *T) {
	out = new(T)
	return func() R { return f(A(coll), A(*req), out) }, out
}

// bindProgress fixes the argument of rmaProgress.
func bindProgress[A, R num](f func(A) R, ctx uint64) func() R {
	return func() R { return f(A(ctx)) }
}

// The per-op exports must add no allocation to what host does for the same
// call: the scaffold (recoverTo, clearOut, putID) runs on every operation.
func TestOpExportsAllocateNothingMore(t *testing.T) {
	config.SetGetenv(func(k string) string {
		switch k {
		case config.Backend.Name:
			return "native"
		case config.Addr.Name:
			return "127.0.0.1"
		}
		return ""
	})
	defer config.SetGetenv(libcGetenv)

	ctx, r := plugin.Init(1)
	if r != abi.Success {
		t.Fatal(r)
	}
	defer plugin.Finalize(ctx)
	var handle [abi.HandleSize]byte
	listen, r := plugin.Listen(ctx, 0, &handle)
	if r != abi.Success {
		t.Fatal(r)
	}
	coll, r := plugin.Connect([]*[abi.HandleSize]byte{&handle}, 0, listen)
	if r != abi.Success {
		t.Fatal(r)
	}
	defer plugin.CloseColl(coll)
	plugin.CloseListen(listen)
	rma, r := plugin.CreateContext(coll, abi.RmaConfig{NContexts: 1, TrafficClass: abi.ConfigUndefInt})
	if r != abi.Success {
		t.Fatal(r)
	}
	defer plugin.DestroyContext(rma)
	buf := make([]byte, 64)
	mh, r := plugin.RegMr(coll, uintptr(unsafe.Pointer(&buf[0])), uint64(len(buf)), abi.PtrHost, 0)
	if r != abi.Success {
		t.Fatal(r)
	}
	defer plugin.DeregMr(coll, mh)

	// One op, driven to completion: iput or iget, then test until done.
	drive := func(post func() (uint64, abi.Result)) {
		req, r := post()
		if r != abi.Success {
			t.Fatal(r)
		}
		for {
			done, r := plugin.Test(coll, req)
			if r != abi.Success {
				t.Fatal(r)
			}
			if done {
				return
			}
			// AllocsPerRun runs at GOMAXPROCS=1: without a yield the
			// reply goroutine waits for preemption (tens of ms).
			runtime.Gosched()
		}
	}
	iput, iputReq := bindOp(rmawasm_iput, [9]uint64{rma, 0, 0, mh, 8, 32, mh, 0, 0})
	iget, igetReq := bindOp(rmawasm_iget, [9]uint64{rma, 0, 32, mh, 8, 0, mh, 0, 0})
	progress := bindProgress(rmawasm_rmaProgress, rma)
	var testReq uint64
	test, done := bindTest(rmawasm_test, coll, &testReq)
	for _, c := range []struct {
		name           string
		export, direct func()
	}{
		{"iput", func() {
			drive(func() (uint64, abi.Result) { return uint64(*iputReq), abi.Result(iput()) })
		}, func() {
			drive(func() (uint64, abi.Result) { return plugin.Iput(rma, 0, 0, mh, 8, 32, mh, 0, 0) })
		}},
		{"iget", func() {
			drive(func() (uint64, abi.Result) { return uint64(*igetReq), abi.Result(iget()) })
		}, func() {
			drive(func() (uint64, abi.Result) { return plugin.Iget(rma, 0, 32, mh, 8, 0, mh, 0, 0) })
		}},
		{"test", func() {
			var r abi.Result
			if testReq, r = plugin.Iput(rma, 0, 0, mh, 8, 32, mh, 0, 0); r != abi.Success {
				t.Fatal(r)
			}
			for *done = 0; *done == 0; runtime.Gosched() {
				if r := abi.Result(test()); r != abi.Success {
					t.Fatal(r)
				}
			}
		}, func() {
			drive(func() (uint64, abi.Result) { return plugin.Iput(rma, 0, 0, mh, 8, 32, mh, 0, 0) })
		}},
		{"rmaProgress", func() {
			if r := abi.Result(progress()); r != abi.Success {
				t.Fatal(r)
			}
		}, func() {
			if r := plugin.Progress(rma); r != abi.Success {
				t.Fatal(r)
			}
		}},
	} {
		c.export() // warm up both paths
		c.direct()
		e, d := testing.AllocsPerRun(20, c.export), testing.AllocsPerRun(20, c.direct)
		t.Logf("%s: %.2f allocs through the export, %.2f calling host", c.name, e, d)
		if e > d {
			t.Errorf("%s: the export allocates %.2f per op, host alone %.2f", c.name, e, d)
		}
	}
}
