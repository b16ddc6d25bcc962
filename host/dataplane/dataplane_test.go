package dataplane

import (
	"bytes"
	"encoding/binary"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

func TestSpan(t *testing.T) {
	for _, c := range []struct {
		off, n, size uint64
		ok           bool
	}{{0, 0, 0, true}, {0, 8, 8, true}, {1, 8, 8, false}, {8, 0, 8, true}, {9, 0, 8, false}, {^uint64(0), 2, 8, false}, {4, ^uint64(0), 8, false}} {
		if Span(c.off, c.n, c.size) != c.ok {
			t.Errorf("Span(%d, %d, %d) != %v", c.off, c.n, c.size, c.ok)
		}
	}
}

// memOwner is a target with one registration and recorded events.
type memOwner struct {
	mu         sync.Mutex
	mem        []byte
	whole      []byte // mem with 64 guard bytes on each side
	done       map[uint64]abi.Result
	parts      map[uint64]int        // completions seen per tag (striped ops have several)
	bad        map[uint64]abi.Result // the first failure among a tag's completions
	failed     []error
	pins       atomic.Int32 // registrations the target side holds (Resolve)
	laneEvents [][3]int     // LaneFailed: peer, lane, moved
}

func (o *memOwner) Resolve(id uint32) (unsafe.Pointer, uint64, uintptr, Pin, bool) {
	if id != 1 {
		return nil, 0, 0, Pin{}, false
	}
	return unsafe.Pointer(&o.mem[0]), uint64(len(o.mem)), 0, NewPin(&o.pins), true
}
func (o *memOwner) PeerRegistered(int, PeerReg) {}
func (o *memOwner) Complete(tag uint64, st abi.Result) {
	o.mu.Lock()
	o.done[tag] = st
	if o.parts == nil {
		o.parts = map[uint64]int{}
	}
	o.parts[tag]++
	if st != abi.Success {
		if o.bad == nil {
			o.bad = map[uint64]abi.Result{}
		}
		if _, ok := o.bad[tag]; !ok {
			o.bad[tag] = st
		}
	}
	o.mu.Unlock()
}
func (o *memOwner) PeerFailed(_ int, err error) {
	o.mu.Lock()
	o.failed = append(o.failed, err)
	o.mu.Unlock()
}

func (o *memOwner) status(tag uint64) (abi.Result, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	st, ok := o.done[tag]
	return st, ok
}

func mesh2(t *testing.T, intra bool) ([]*Mesh, []*memOwner) {
	t.Helper()
	os := make([]*memOwner, 2)
	for i := range os {
		whole := make([]byte, 64+256+64)
		os[i] = &memOwner{mem: whole[64:320:320], whole: whole, done: map[uint64]abi.Result{}}
	}
	return connect2(t, os, Options{Timeout: 10 * time.Second, IntraNode: intra, Lanes: 1, CloseTimeout: 500 * time.Millisecond}), os
}

// connect2 connects two meshes over loopback with the given owners.
func connect2(t *testing.T, os []*memOwner, opt Options) []*Mesh {
	t.Helper()
	return connectOwners(t, []Owner{os[0], os[1]}, opt)
}

// connectOwners connects a mesh per owner over loopback.
func connectOwners(t *testing.T, os []Owner, opt Options) []*Mesh {
	t.Helper()
	ls, hs := listenN(t, len(os))
	ms := connectAll(t, ls, hs, func(i int) Owner { return os[i] }, func(int) Options { return opt })
	t.Cleanup(func() {
		for _, m := range ms {
			m.Close()
		}
	})
	return ms
}

// listenN opens n listeners on loopback, closed when the test ends.
func listenN(t testing.TB, n int) ([]*Listener, []*wire.Handle) {
	t.Helper()
	ls := make([]*Listener, n)
	hs := make([]*wire.Handle, n)
	for i := range ls {
		l, h, err := Listen(ListenOptions{Addr: "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		ls[i], hs[i] = l, h
		t.Cleanup(func() { l.Close() })
	}
	return ls, hs
}

// connectAll connects every listener's rank at once (Connect blocks until
// all are up), rank i with owner(i) and opt(i); a failure ends the test.
func connectAll(t testing.TB, ls []*Listener, hs []*wire.Handle, owner func(int) Owner, opt func(int) Options) []*Mesh {
	t.Helper()
	ms := make([]*Mesh, len(ls))
	var wg sync.WaitGroup
	for i := range ms {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			m, err := Connect(ls[i], hs, i, owner(i), opt(i))
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

// requestDone is the status of request tag once its parts completions
// came (Mesh.OpParts: a striped op completes once per piece, and once more
// for its signal): the first failure among them, else success. Only then
// is the request done, as the runtime counts it (host/plugin's
// completeRequest), and its source free for reuse: the parts complete on
// their own lanes' acks, in no order, and one can complete while another
// still waits in its lane's queue (TestSignalPartBeforeItsPiece).
func (o *memOwner) requestDone(tag uint64, parts int) (abi.Result, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.parts[tag] < parts {
		return 0, false
	}
	if st, ok := o.bad[tag]; ok {
		return st, true
	}
	return abi.Success, true
}

// waitRequestWithin is requestDone once the request is done, within d; a
// request that is not ends the test.
func waitRequestWithin(tb testing.TB, o *memOwner, tag uint64, parts int, d time.Duration) abi.Result {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if st, ok := o.requestDone(tag, parts); ok {
			return st
		}
		time.Sleep(time.Millisecond)
	}
	if h := stuckHook.Load(); h != nil {
		(*h)()
	}
	o.mu.Lock()
	n := o.parts[tag]
	o.mu.Unlock()
	tb.Fatalf("tag %d never completed (%d of %d parts)", tag, n, parts)
	return 0
}

func waitDone(t testing.TB, o *memOwner, tag uint64) abi.Result {
	return waitDoneWithin(t, o, tag, 10*time.Second)
}

// waitDoneWithin is tag's status once it completed, within d; a tag that
// does not complete ends the test.
func waitDoneWithin(tb testing.TB, o *memOwner, tag uint64, d time.Duration) abi.Result {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if st, ok := o.status(tag); ok {
			return st
		}
		time.Sleep(time.Millisecond)
	}
	if h := stuckHook.Load(); h != nil {
		(*h)()
	}
	tb.Fatalf("tag %d never completed", tag)
	return 0
}

// TestTargetRejectsBadRanges sends operations the target must refuse: the
// initiator learns it through PeerFailed, gets fail, and the stream lives on.
func TestTargetRejectsBadRanges(t *testing.T) {
	for _, intra := range []bool{false, true} {
		ms, os := mesh2(t, intra)
		src := bytes.Repeat([]byte{7}, 64)
		ms[0].Post(1, &Op{Request: Request{Msg: wire.MsgPut, MrID: 1, Tag: 1, Local: unsafe.Pointer(&src[0]), Size: 64, Off: 250}}, false, -1)
		ms[0].Post(1, &Op{Request: Request{Msg: wire.MsgPut, MrID: 9, Tag: 2, Local: unsafe.Pointer(&src[0]), Size: 8}}, false, -1)
		ms[0].Post(1, &Op{Request: Request{Msg: wire.MsgPutSignal, MrID: 1, SigMrID: 1, SigOp: abi.SignalOpInc, SigOff: 3, Tag: 3}}, false, -1)
		dst := make([]byte, 64)
		ms[0].Post(1, &Op{Request: Request{Msg: wire.MsgGet, MrID: 1, Tag: 4, Local: unsafe.Pointer(&dst[0]), Size: 64, Off: 200}}, false, -1)
		if st := waitDone(t, os[0], 4); st != abi.InvalidArgument {
			t.Fatalf("out-of-range get: %v", st)
		}
		ms[0].Post(1, &Op{Request: Request{Msg: wire.MsgPut, MrID: 1, Tag: 5, Local: unsafe.Pointer(&src[0]), Size: 64, Off: 0}}, false, -1)
		ms[0].Post(1, &Op{Request: Request{Msg: wire.MsgGet, MrID: 1, Tag: 6, Local: unsafe.Pointer(&dst[0]), Size: 64, Off: 0}}, false, -1)
		if st := waitDone(t, os[0], 6); st != abi.Success || !bytes.Equal(dst, src) {
			t.Fatalf("stream unusable after rejections: %v %v", st, dst[:8])
		}
		os[0].mu.Lock()
		n := len(os[0].failed)
		os[0].mu.Unlock()
		if n < 4 {
			t.Fatalf("intra=%v: %d rejections reported, want at least 4", intra, n)
		}
		// The rejected puts and signals fail their own requests too, with
		// the target's code, and never complete as a success.
		ms[0].Post(1, &Op{Request: Request{Msg: wire.MsgPutSignal, MrID: 1, SigMrID: 9, SigOp: abi.SignalOpInc, Tag: 7, Local: unsafe.Pointer(&src[0]), Size: 64, Off: 64}}, false, -1)
		for _, tag := range []uint64{1, 2, 3, 7} {
			if st := waitDone(t, os[0], tag); st != abi.InvalidArgument {
				t.Fatalf("intra=%v: request %d rejected at the target completed with %v, want %v", intra, tag, st, abi.InvalidArgument)
			}
		}
		if st := waitDone(t, os[0], 5); st != abi.Success {
			t.Fatalf("intra=%v: valid put after rejections: %v", intra, st)
		}
		os[0].mu.Lock()
		for tag, k := range os[0].parts {
			if k != 1 {
				t.Errorf("intra=%v: request %d completed %d times", intra, tag, k)
			}
		}
		os[0].mu.Unlock()
	}
}

// TestConnectTimeout: a peer that never connects makes Connect fail in time
// with a message that names what is missing.
func TestConnectTimeout(t *testing.T) {
	l0, h0, _ := Listen(ListenOptions{Addr: "127.0.0.1"})
	l1, h1, _ := Listen(ListenOptions{Addr: "127.0.0.1"})
	defer l0.Close()
	defer l1.Close()
	start := time.Now()
	_, err := Connect(l0, []*wire.Handle{h0, h1}, 0, &memOwner{done: map[uint64]abi.Result{}}, Options{Timeout: 300 * time.Millisecond, Lanes: 1})
	if err == nil || !strings.Contains(err.Error(), "timed out") {
		t.Fatalf("connect without the peer: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("connect took %v", d)
	}
}

// TestStripedLanes sends striped puts, gets and a put with signal over three
// lanes between two meshes and checks bytes, signal and completion counts.
func TestStripedLanes(t *testing.T) {
	const size = 1<<20 + 333
	// Target memory: the signal word, the put region, then a get source
	// written before the meshes start (the race detector cannot see the
	// ordering a signal gives across sockets, so the get reads other bytes).
	owners := []*memOwner{{mem: make([]byte, 2*size), done: map[uint64]abi.Result{}}, {mem: make([]byte, 2*size), done: map[uint64]abi.Result{}}}
	for i := size; i < 2*size; i++ {
		owners[1].mem[i] = byte(i * 7)
	}
	// The readers spin after traffic (two of the six may at once).
	ms := connect2(t, owners, Options{Timeout: 10 * time.Second, Lanes: 3, StripeThreshold: 64 << 10, ChunkSize: 100 << 10,
		SpinWait: 500 * time.Microsecond, Spinners: 2})
	// One piece per lane (3) plus the signal; a smaller op is cut into
	// pieces no smaller than the chunk size (200 KiB / 100 KiB = 2).
	if got := ms[0].Parts(wire.MsgPutSignal, size); got != 4 {
		t.Fatalf("parts = %d, want 4", got)
	}
	if got := ms[0].Parts(wire.MsgPut, 200<<10); got != 2 {
		t.Fatalf("parts of 200 KiB = %d, want 2", got)
	}
	src := make([]byte, size)
	for i := range src {
		src[i] = byte(i * 13)
	}
	// The signal word lives in the first 8 bytes of the target registration,
	// so the payload goes from offset 8.
	n := uint64(size - 8)
	ms[0].Post(1, &Op{Request: Request{Msg: wire.MsgPutSignal, MrID: 1, SigMrID: 1, SigOp: abi.SignalOpInc, Tag: 7, Local: unsafe.Pointer(&src[8]), Size: n, Off: 8}}, false, 1)
	deadline := time.Now().Add(10 * time.Second)
	for atomic.LoadUint64((*uint64)(unsafe.Pointer(&owners[1].mem[0]))) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("signal never arrived")
		}
		time.Sleep(time.Millisecond)
	}
	if !bytes.Equal(owners[1].mem[8:size], src[8:]) {
		t.Fatal("signal visible before all striped chunks landed")
	}
	dst := make([]byte, size)
	ms[0].Post(1, &Op{Request: Request{Msg: wire.MsgGet, MrID: 1, Tag: 8, Local: unsafe.Pointer(&dst[0]), Size: size, Off: size}}, false, -1)
	want := ms[0].Parts(wire.MsgGet, size)
	for {
		owners[0].mu.Lock()
		got := owners[0].parts[8]
		owners[0].mu.Unlock()
		if got == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("striped get: %d of %d parts completed", got, want)
		}
		time.Sleep(time.Millisecond)
	}
	if !bytes.Equal(dst, owners[1].mem[size:]) {
		t.Fatal("striped get returned wrong bytes")
	}
}

// TestServiceSurvivesGarbage writes random headers and payloads straight
// onto an authenticated stream, as a broken or hostile peer could: the
// target must never touch memory outside its registration, must not crash,
// and at worst drops that peer.
func TestServiceSurvivesGarbage(t *testing.T) {
	rng := uint64(0x9e3779b97f4a7c15)
	next := func() uint64 {
		rng ^= rng << 13
		rng ^= rng >> 7
		rng ^= rng << 17
		return rng
	}
	for iter := 0; iter < 40; iter++ {
		ms, owners := mesh2(t, false)
		var b [wire.HeaderSize + 64]byte
		for i := range b {
			b[i] = byte(next())
		}
		// Keep some headers plausible so they reach the range checks.
		b[0] = byte(1 + next()%5)
		binary.LittleEndian.PutUint32(b[4:], uint32(next()%3))
		binary.LittleEndian.PutUint64(b[24:], next()%512)
		binary.LittleEndian.PutUint64(b[56:], next()%4)
		if _, err := ms[0].peers[1].t.(*tcp.Link).Lanes()[0].Out().Write(b[:]); err != nil {
			t.Fatal(err)
		}
		// Close queues a goodbye behind the garbage on the same stream and
		// returns once the target acknowledged it (so it handled the
		// garbage) or dropped the stream over it; a garbage length that
		// swallows the goodbye ends with the short close timeout.
		ms[0].Close()
		ms[1].Close()
		w := owners[1].whole
		if !bytes.Equal(w[:64], make([]byte, 64)) || !bytes.Equal(w[320:], make([]byte, 64)) {
			t.Fatalf("iteration %d: a garbage header wrote outside the registration", iter)
		}
	}
}
