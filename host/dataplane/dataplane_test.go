package dataplane

import (
	"bytes"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
)

func TestHeaderRoundTrip(t *testing.T) {
	in := header{typ: msgPutSig, sigOp: 2, status: 6, mrID: 7, tag: 1<<63 | 5, off: 1 << 40, size: 123,
		sigMrID: 9, context: 3, sigOff: 64, sigValue: ^uint64(0)}
	var b [hdrSize]byte
	in.encode(b[:])
	var out header
	out.decode(b[:])
	if in != out {
		t.Fatalf("round trip: %+v != %+v", out, in)
	}
}

func TestHandleRoundTrip(t *testing.T) {
	hi := HandleInfo{Addr: &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 4242}, Pid: 77, UID: 1000}
	hi.Token[0], hi.HostID[15] = 0xaa, 0xbb
	var h Handle
	hi.Encode(&h)
	got, err := DecodeHandle(&h)
	if err != nil || !got.Addr.IP.Equal(hi.Addr.IP) || got.Addr.Port != 4242 || got.Token != hi.Token || got.HostID != hi.HostID || got.Pid != 77 || got.UID != 1000 {
		t.Fatalf("decode: %+v %v", got, err)
	}
	h[0] = 'X'
	if _, err := DecodeHandle(&h); !errors.Is(err, ErrBadHandle) {
		t.Fatalf("foreign handle accepted: %v", err)
	}
	hi.Encode(&h)
	h[4] = 99
	if _, err := DecodeHandle(&h); err == nil || !strings.Contains(err.Error(), "version") {
		t.Fatalf("wrong version accepted: %v", err)
	}
}

func TestSpan(t *testing.T) {
	for _, c := range []struct {
		off, n, size uint64
		ok           bool
	}{{0, 0, 0, true}, {0, 8, 8, true}, {1, 8, 8, false}, {8, 0, 8, true}, {9, 0, 8, false}, {^uint64(0), 2, 8, false}, {4, ^uint64(0), 8, false}} {
		if span(c.off, c.n, c.size) != c.ok {
			t.Errorf("span(%d, %d, %d) != %v", c.off, c.n, c.size, c.ok)
		}
	}
}

// memOwner is a target with one registration and recorded events.
type memOwner struct {
	mu     sync.Mutex
	mem    []byte
	done   map[uint64]abi.Result
	failed []error
}

func (o *memOwner) Resolve(id uint32) (unsafe.Pointer, uint64, bool) {
	if id != 1 {
		return nil, 0, false
	}
	return unsafe.Pointer(&o.mem[0]), uint64(len(o.mem)), true
}
func (o *memOwner) PeerRegistered(int, uint32, uint64, uint64) {}
func (o *memOwner) Complete(tag uint64, st abi.Result) {
	o.mu.Lock()
	o.done[tag] = st
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
	ls := make([]*Listener, 2)
	hs := make([]*Handle, 2)
	for i := range ls {
		l, h, err := Listen("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		ls[i], hs[i] = l, h
		t.Cleanup(func() { l.Close() })
	}
	ms := make([]*Mesh, 2)
	os := []*memOwner{{mem: make([]byte, 256), done: map[uint64]abi.Result{}}, {mem: make([]byte, 256), done: map[uint64]abi.Result{}}}
	var wg sync.WaitGroup
	for i := range ms {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			m, err := Connect(ls[i], hs, i, os[i], Options{Timeout: 10 * time.Second, IntraNode: intra})
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
	t.Cleanup(func() { ms[0].Close(); ms[1].Close() })
	return ms, os
}

func waitDone(t *testing.T, o *memOwner, tag uint64) abi.Result {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if st, ok := o.status(tag); ok {
			return st
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("tag %d never completed", tag)
	return 0
}

// TestTargetRejectsBadRanges sends operations the target must refuse: the
// initiator learns it through PeerFailed, gets fail, and the stream lives on.
func TestTargetRejectsBadRanges(t *testing.T) {
	for _, intra := range []bool{false, true} {
		ms, os := mesh2(t, intra)
		src := bytes.Repeat([]byte{7}, 64)
		ms[0].Post(1, &Op{Kind: OpPut, MrID: 1, Tag: 1, Local: unsafe.Pointer(&src[0]), Size: 64, Off: 250}, false)
		ms[0].Post(1, &Op{Kind: OpPut, MrID: 9, Tag: 2, Local: unsafe.Pointer(&src[0]), Size: 8}, false)
		ms[0].Post(1, &Op{Kind: OpPutSignal, MrID: 1, SigMrID: 1, SigOp: abi.SignalOpInc, SigOff: 3, Tag: 3}, false)
		dst := make([]byte, 64)
		ms[0].Post(1, &Op{Kind: OpGet, MrID: 1, Tag: 4, Local: unsafe.Pointer(&dst[0]), Size: 64, Off: 200}, false)
		if st := waitDone(t, os[0], 4); st != abi.InvalidArgument {
			t.Fatalf("out-of-range get: %v", st)
		}
		ms[0].Post(1, &Op{Kind: OpPut, MrID: 1, Tag: 5, Local: unsafe.Pointer(&src[0]), Size: 64, Off: 0}, false)
		ms[0].Post(1, &Op{Kind: OpGet, MrID: 1, Tag: 6, Local: unsafe.Pointer(&dst[0]), Size: 64, Off: 0}, false)
		if st := waitDone(t, os[0], 6); st != abi.Success || !bytes.Equal(dst, src) {
			t.Fatalf("stream unusable after rejections: %v %v", st, dst[:8])
		}
		os[0].mu.Lock()
		n := len(os[0].failed)
		os[0].mu.Unlock()
		if n < 4 {
			t.Fatalf("intra=%v: %d rejections reported, want at least 4", intra, n)
		}
	}
}

// TestTokenRequired dials a listener without its token: the connection is
// refused and never reaches connect.
func TestTokenRequired(t *testing.T) {
	l, h, err := Listen("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	hi, _ := DecodeHandle(h)
	hi.Token[0] ^= 1
	if _, err := dial(hi, 0, 1, time.Now().Add(time.Second)); err == nil {
		t.Fatal("a dialer with the wrong token was admitted")
	}
	select {
	case in := <-l.conns:
		t.Fatalf("rejected connection reached connect: rank %d", in.rank)
	default:
	}
}

// TestConnectTimeout: a peer that never connects makes Connect fail in time
// with a message that names what is missing.
func TestConnectTimeout(t *testing.T) {
	l0, h0, _ := Listen("127.0.0.1")
	l1, h1, _ := Listen("127.0.0.1")
	defer l0.Close()
	defer l1.Close()
	start := time.Now()
	_, err := Connect(l0, []*Handle{h0, h1}, 0, &memOwner{done: map[uint64]abi.Result{}}, Options{Timeout: 300 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "timed out") {
		t.Fatalf("connect without the peer: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("connect took %v", d)
	}
}
