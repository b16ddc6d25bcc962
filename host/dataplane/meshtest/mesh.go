package meshtest

import (
	"sync"
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// Mesh2 connects two ranks over loopback (intra: over the intra-node
// path), one lane each, each with a 256-byte registration between guard
// bytes.
func Mesh2(t testing.TB, intra bool) ([]*dataplane.Mesh, []*MemOwner) {
	t.Helper()
	os := make([]*MemOwner, 2)
	for i := range os {
		whole := make([]byte, 64+256+64)
		os[i] = &MemOwner{Mem: whole[64:320:320], Whole: whole, Done: map[uint64]abi.Result{}}
	}
	return Connect2(t, os, dataplane.Options{Timeout: 10 * time.Second, IntraNode: intra, Lanes: 1, CloseTimeout: 500 * time.Millisecond}), os
}

// Connect2 connects two meshes over loopback with the given owners.
func Connect2(t testing.TB, os []*MemOwner, opt dataplane.Options) []*dataplane.Mesh {
	t.Helper()
	return ConnectOwners(t, []dataplane.Owner{os[0], os[1]}, opt)
}

// ConnectOwners connects a mesh per owner over loopback, all with opt;
// they close when the test ends.
func ConnectOwners(t testing.TB, os []dataplane.Owner, opt dataplane.Options) []*dataplane.Mesh {
	t.Helper()
	ls, hs := ListenN(t, len(os))
	ms := ConnectAll(t, ls, hs, func(i int) dataplane.Owner { return os[i] }, func(int) dataplane.Options { return opt })
	t.Cleanup(func() {
		for _, m := range ms {
			m.Close()
		}
	})
	return ms
}

// ListenN opens n listeners on loopback, closed when the test ends.
func ListenN(t testing.TB, n int) ([]*dataplane.Listener, []*wire.Handle) {
	t.Helper()
	ls := make([]*dataplane.Listener, n)
	hs := make([]*wire.Handle, n)
	for i := range ls {
		l, h, err := dataplane.Listen(dataplane.ListenOptions{Addr: "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		ls[i], hs[i] = l, h
		t.Cleanup(func() { l.Close() })
	}
	return ls, hs
}

// ConnectAll connects every listener's rank at once (Connect blocks until
// all are up), rank i with owner(i) and opt(i); a failure ends the test.
func ConnectAll(t testing.TB, ls []*dataplane.Listener, hs []*wire.Handle, owner func(int) dataplane.Owner, opt func(int) dataplane.Options) []*dataplane.Mesh {
	t.Helper()
	ms := make([]*dataplane.Mesh, len(ls))
	var wg sync.WaitGroup
	for i := range ms {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			m, err := dataplane.Connect(ls[i], hs, i, owner(i), opt(i))
			if err != nil {
				t.Error(err)
			}
			ms[i] = m
		}(i)
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return ms
}

// Pair is two listeners of a 2-rank communicator, their handles and what
// the handles hold.
func Pair(t testing.TB) ([]*dataplane.Listener, []*wire.Handle, []wire.HandleInfo) {
	t.Helper()
	ls, hs := ListenN(t, 2)
	his := make([]wire.HandleInfo, 2)
	for i, h := range hs {
		his[i], _ = wire.DecodeHandle(h)
	}
	return ls, hs, his
}

// ConnectPair runs Connect for both ranks (rank r sees handles views[r])
// and returns the meshes with their 64-byte registrations.
func ConnectPair(t testing.TB, ls []*dataplane.Listener, views [][]*wire.Handle) ([]*dataplane.Mesh, []*MemOwner) {
	t.Helper()
	opt := dataplane.Options{Timeout: 10 * time.Second, Lanes: 1, CloseTimeout: time.Second}
	ms, owners, errs := ConnectPairOpt(t, ls, views, []dataplane.Options{opt, opt}, 64)
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("connect: rank 0: %v; rank 1: %v", errs[0], errs[1])
	}
	return ms, owners
}

// ConnectPairOpt is ConnectPair with each rank's options and size-byte
// registrations; it returns each rank's Connect error instead of failing,
// and closes the meshes that came up when the test ends.
func ConnectPairOpt(t testing.TB, ls []*dataplane.Listener, views [][]*wire.Handle, opts []dataplane.Options, size int) ([]*dataplane.Mesh, []*MemOwner, []error) {
	t.Helper()
	owners := []*MemOwner{{Mem: make([]byte, size), Done: map[uint64]abi.Result{}}, {Mem: make([]byte, size), Done: map[uint64]abi.Result{}}}
	ms := make([]*dataplane.Mesh, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range ms {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			ms[i], errs[i] = dataplane.Connect(ls[i], views[i], i, owners[i], opts[i])
		}(i)
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, m := range ms {
			if m != nil {
				m.Close()
			}
		}
	})
	return ms, owners, errs
}
