package staging

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx/logtest"
)

// doneSet records the requests a queued copy completed.
type doneSet struct {
	mu sync.Mutex
	m  map[uint64]abi.Result
}

func (s *doneSet) Complete(tag uint64, st abi.Result) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.m[tag]; dup {
		panic("request completed twice")
	}
	s.m[tag] = st
}

func (s *doneSet) get(tag uint64) (abi.Result, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.m[tag]
	return st, ok
}

// TestCopySelfAsync: a rank's device copy to itself is queued and returns
// at once; its request completes only after the copy executed (Reap sees
// the event), every byte is there then, a signal written after it on the
// stream follows it, and a fence completes it too.
func TestCopySelfAsync(t *testing.T) {
	d := newStreamDevice(8<<20, asyncCaps, 3*time.Millisecond)
	asyncSetup(t, d)
	done := &doneSet{m: map[uint64]abi.Result{}}
	for k, n := range []int{8, 4096, 300 << 10} {
		src, dst := d.Base+uintptr(k)<<20, d.Base+4<<20+uintptr(k)<<20
		p := pattern(n, k)
		copy(d.At(src, uint64(n)), p)
		tag := uint64(k + 1)
		start := time.Now()
		ok, err := CopySelfAsync(1, dst, src, uint64(n), done, tag)
		if !ok || err != nil {
			t.Fatalf("%d bytes: not queued: %v", n, err)
		}
		if el := time.Since(start); el > 2*time.Millisecond {
			t.Logf("%d bytes: queueing took %v", n, el) // a loaded machine; not a failure
		}
		Reap()
		if _, ok := done.get(tag); ok && !bytes.Equal(d.peek(dst, uint64(n)), p) {
			t.Fatalf("%d bytes: completed before its bytes landed", n)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			Reap()
			if st, ok := done.get(tag); ok {
				if st != abi.Success {
					t.Fatalf("%d bytes: completed with %v", n, st)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d bytes: never completed", n)
			}
			time.Sleep(100 * time.Microsecond)
		}
		if !bytes.Equal(d.peek(dst, uint64(n)), p) {
			t.Fatalf("%d bytes: bytes differ after completion", n)
		}
	}
	// A never-reset signal written after it is visible only after its
	// payload; a fence (what a host signal word waits for) completes it.
	sh := NewShadow(d.Base+7<<20, 64)
	src, dst := d.Base+3<<20, d.Base+3<<20+4096
	p := pattern(1024, 9)
	copy(d.At(src, 1024), p)
	if ok, err := CopySelfAsync(1, dst, src, 1024, done, 9); !ok || err != nil {
		t.Fatalf("not queued: %v", err)
	}
	if err := AddSignal(1, d.Base+7<<20, 1, sh); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); d.peekWord(d.Base+7<<20) != 1; time.Sleep(50 * time.Microsecond) {
		if time.Now().After(deadline) {
			t.Fatal("the signal never landed")
		}
	}
	if !bytes.Equal(d.peek(dst, 1024), p) {
		t.Fatal("the signal landed before the payload")
	}
	if err := Fence(); err != nil {
		t.Fatal(err)
	}
	if st, ok := done.get(9); !ok || st != abi.Success {
		t.Fatalf("after a fence: completed %v with %v", ok, st)
	}
}

// TestCopySelfAsyncRefusals: off, a runtime without the copy, no spare slot
// (half stay for landings) and a context without slots all say "copy
// synchronously", complete nothing and leave nothing queued; a device
// whose event fails fails the request with a WARN naming the cause.
func TestCopySelfAsyncRefusals(t *testing.T) {
	d := newStreamDevice(1<<20, asyncCaps, 20*time.Millisecond)
	asyncSetup(t, d)
	done := &doneSet{m: map[uint64]abi.Result{}}
	src, dst := d.Base, d.Base+1<<19

	SetSelfAsync(false)
	ok, err := CopySelfAsync(1, dst, src, 64, done, 1)
	SetSelfAsync(true)
	if ok || err != nil {
		t.Fatalf("off: queued %v (%v)", ok, err)
	}
	if ok, err := CopySelfAsync(2, dst, src, 64, done, 2); ok || err != nil {
		t.Fatalf("a context without slots: queued %v (%v)", ok, err)
	}
	d.noDtoD = true
	ok, err = CopySelfAsync(1, dst, src, 64, done, 3)
	d.noDtoD = false
	if ok || err != nil {
		t.Fatalf("no DtoDAsync: queued %v (%v)", ok, err)
	}
	// The stream is slow: the slots fill up to half, then refuse.
	queued := 0
	for tag := uint64(10); tag < 10+bounceSlots; tag++ {
		ok, err := CopySelfAsync(1, dst, src, 64, done, tag)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			queued++
		}
	}
	if queued != bounceSlots/2 {
		t.Fatalf("%d copies queued with a slow stream, want %d (half the slots)", queued, bounceSlots/2)
	}
	if len(done.m) != 0 {
		t.Fatalf("refused copies completed requests: %v", done.m)
	}
	if err := Fence(); err != nil {
		t.Fatal(err)
	}
	if len(done.m) != queued {
		t.Fatalf("%d requests completed after the fence, want %d", len(done.m), queued)
	}
	// A failing event: the request fails, with a WARN, rather than hang.
	warns := logtest.Warnings(t)
	if ok, err := CopySelfAsync(1, dst, src, 64, done, 99); !ok || err != nil {
		t.Fatalf("not queued: %v", err)
	}
	d.failEv.Store(true)
	Reap()
	d.failEv.Store(false)
	if st, ok := done.get(99); !ok || st != abi.RemoteError {
		t.Fatalf("after a failed event: completed %v with %v, want ncclRemoteError", ok, st)
	}
	if w := strings.Join(warns(), "\n"); !strings.Contains(w, "failed: asynchronous device copy: injected event failure") {
		t.Fatalf("no WARN naming the cause: %q", w)
	}
}
