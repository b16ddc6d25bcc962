package tcp_test

import (
	"bytes"
	"io"
	"net"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/handshake"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// tap sits between rank 1 and rank 0's listener: it forwards every
// connection both ways, keeps a copy of what rank 1 sends, and lets a test
// alter those bytes (off counts from the start of each connection).
type tap struct {
	ln     *net.TCPListener
	to     *net.TCPAddr
	mutate func(off int64, b []byte)
	mu     sync.Mutex
	sent   bytes.Buffer
}

func newTap(t *testing.T, to *net.TCPAddr, mutate func(int64, []byte)) *tap {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	tp := &tap{ln: ln, to: to, mutate: mutate}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			a, err := ln.AcceptTCP()
			if err != nil {
				return
			}
			u, err := net.DialTCP("tcp", nil, to)
			if err != nil {
				a.Close()
				return
			}
			go func() { io.Copy(a, u); a.Close() }()
			go func() {
				b := make([]byte, 32<<10)
				var off int64
				for {
					n, err := a.Read(b)
					if n > 0 {
						tp.mu.Lock()
						tp.sent.Write(b[:n])
						tp.mu.Unlock()
						if tp.mutate != nil {
							tp.mutate(off, b[:n])
						}
						off += int64(n)
						if _, werr := u.Write(b[:n]); werr != nil {
							break
						}
					}
					if err != nil {
						break
					}
				}
				u.Close()
			}()
		}
	}()
	return tp
}

// view returns handles for rank 1: rank 0's, pointing at the tap.
func (tp *tap) view(t *testing.T, his []wire.HandleInfo, hs []*wire.Handle) []*wire.Handle {
	via := his[0]
	via.Addr = tp.ln.Addr().(*net.TCPAddr)
	var h wire.Handle
	via.Encode(&h)
	return []*wire.Handle{&h, hs[1]}
}

func (tp *tap) wire() []byte {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return append([]byte(nil), tp.sent.Bytes()...)
}

// pattern is a payload that is easy to find on the wire.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = "SECRET-payload-"[i%15]
	}
	return b
}

// TestEncryptedStreams: with Encrypt every byte of puts (striped over two
// lanes, and small), a put with signal and a get arrives intact, and the
// payload is nowhere in what crosses the wire; the same run in clear shows
// it there (so the tap sees the payload stream).
func TestEncryptedStreams(t *testing.T) {
	for _, encrypt := range []bool{false, true} {
		ls, hs, his := meshtest.Pair(t)
		tp := newTap(t, his[0].Addr, nil)
		const size = 3 << 20
		opt := dataplane.Options{Timeout: 10 * time.Second, Lanes: 2, StripeThreshold: 256 << 10, ChunkSize: 64 << 10, CloseTimeout: 2 * time.Second, Encrypt: encrypt}
		ms, owners, errs := meshtest.ConnectPairOpt(t, ls, [][]*wire.Handle{hs, tp.view(t, his, hs)}, []dataplane.Options{opt, opt}, size)
		if errs[0] != nil || errs[1] != nil {
			t.Fatalf("encrypt=%v: connect: %v / %v", encrypt, errs[0], errs[1])
		}
		src := pattern(size)
		copy(owners[1].Mem, src)
		ms[1].Post(0, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 1, Local: unsafe.Pointer(&src[0]), Size: 2 << 20}}, false, -1)
		ms[1].Post(0, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPutSignal, MrID: 1, Tag: 2, Local: unsafe.Pointer(&src[2<<20]), Size: 4096, Off: 2 << 20, SigMrID: 1, SigOff: size - 8, SigOp: abi.SignalOpInc}}, false, -1)
		// Striped requests complete piece by piece: wait for every piece.
		want := map[uint64]int{1: ms[1].Parts(wire.MsgPut, 2<<20), 2: ms[1].Parts(wire.MsgPutSignal, 4096), 3: ms[1].Parts(wire.MsgGet, 1<<20)}
		wait := func(tag uint64) {
			if st := meshtest.WaitDone(t, owners[1], tag); st != abi.Success {
				t.Fatalf("encrypt=%v: op %d: %v", encrypt, tag, st)
			}
			meshtest.WaitFor(t, "every piece", func() bool {
				owners[1].Mu.Lock()
				defer owners[1].Mu.Unlock()
				return owners[1].Parts[tag] == want[tag]
			})
		}
		wait(1)
		wait(2)
		// The get reads back what the first put wrote, once it landed.
		got := make([]byte, 1<<20)
		ms[1].Post(0, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgGet, MrID: 1, Tag: 3, Local: unsafe.Pointer(&got[0]), Size: 1 << 20, Off: 1 << 20}}, false, -1)
		wait(3)
		if !bytes.Equal(owners[0].Mem[:2<<20+4096], src[:2<<20+4096]) || !bytes.Equal(got, src[1<<20:2<<20]) {
			t.Fatalf("encrypt=%v: bytes differ after put and get", encrypt)
		}
		if w := *(*uint64)(unsafe.Pointer(&owners[0].Mem[size-8])); w != 1 {
			t.Fatalf("encrypt=%v: signal word %d, want 1", encrypt, w)
		}
		seen := bytes.Contains(tp.wire(), src[:64])
		if seen == encrypt {
			t.Fatalf("encrypt=%v: payload visible on the wire: %v", encrypt, seen)
		}
	}
}

// TestEncryptedTamper: a byte altered on the wire after the hello does not
// reach memory: the record fails to open, the receiver WARNs and drops the
// stream, and the sender's operation fails with ncclRemoteError.
func TestEncryptedTamper(t *testing.T) {
	got := meshtest.Warnings(t)
	meshtest.ResetLimits()
	handshake.ResetWarnings()
	ls, hs, his := meshtest.Pair(t)
	var armed sync.Mutex
	flip := int64(-1)
	tp := newTap(t, his[0].Addr, func(off int64, b []byte) {
		armed.Lock()
		defer armed.Unlock()
		if flip >= off && flip < off+int64(len(b)) {
			b[flip-off] ^= 0x40
		}
	})
	opt := dataplane.Options{Timeout: 10 * time.Second, Lanes: 1, CloseTimeout: time.Second, Encrypt: true}
	ms, owners, errs := meshtest.ConnectPairOpt(t, ls, [][]*wire.Handle{hs, tp.view(t, his, hs)}, []dataplane.Options{opt, opt}, 1<<16)
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("connect: %v / %v", errs[0], errs[1])
	}
	// Alter the 100th byte of the next record's ciphertext.
	armed.Lock()
	flip = int64(len(tp.wire())) + 4 + 100
	armed.Unlock()
	src := pattern(1 << 16)
	ms[1].Post(0, &dataplane.Op{Request: dataplane.Request{Msg: wire.MsgPut, MrID: 1, Tag: 1, Local: unsafe.Pointer(&src[0]), Size: 1 << 16}}, false, -1)
	if st := meshtest.WaitDone(t, owners[1], 1); st != abi.RemoteError {
		t.Fatalf("a put whose bytes were altered on the way: %v, want RemoteError", st)
	}
	if bytes.Contains(owners[0].Mem, []byte("SECRET")) && !bytes.Equal(owners[0].Mem, src) {
		t.Fatal("altered bytes reached the target's memory")
	}
	if meshtest.CountMatching(got(), "does not authenticate") == 0 {
		t.Fatalf("no WARN for the altered record: %q", got())
	}
}

// TestEncryptMismatch: a rank that requires encryption refuses a peer that
// does not seal its streams, with a WARN that names the variable.
func TestEncryptMismatch(t *testing.T) {
	got := meshtest.Warnings(t)
	meshtest.ResetLimits()
	ls, hs, _ := meshtest.Pair(t)
	on := dataplane.Options{Timeout: 1500 * time.Millisecond, Lanes: 1, Encrypt: true}
	off := on
	off.Encrypt = false
	_, _, errs := meshtest.ConnectPairOpt(t, ls, [][]*wire.Handle{hs, hs}, []dataplane.Options{on, off}, 64)
	if errs[0] == nil || errs[1] == nil {
		t.Fatalf("mismatched encryption connected: %v / %v", errs[0], errs[1])
	}
	if meshtest.CountMatching(got(), "NCCL_RMA_WASM_ENCRYPT must be set alike") == 0 {
		t.Fatalf("no WARN naming the variable: %q", got())
	}
}
