package meshtest

import (
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/handshake/admission"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx/logtest"
)

// StuckHook, when set, runs before WaitWord or WaitDone fails: it writes
// what the meshes hold and every goroutine's stack, to tell where a
// signal or an operation stuck (DumpWhenStuck sets it).
var StuckHook atomic.Pointer[func()]

// WaitDone is tag's status once it completed, within a minute.
func WaitDone(t testing.TB, o *MemOwner, tag uint64) abi.Result {
	return WaitDoneWithin(t, o, tag, time.Minute)
}

// WaitDoneWithin is tag's status once it completed, within d; a tag that
// does not complete ends the test.
func WaitDoneWithin(tb testing.TB, o *MemOwner, tag uint64, d time.Duration) abi.Result {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if st, ok := o.Status(tag); ok {
			return st
		}
		time.Sleep(time.Millisecond)
	}
	if h := StuckHook.Load(); h != nil {
		(*h)()
	}
	tb.Fatalf("tag %d never completed", tag)
	return 0
}

// WaitWord waits until the 8-byte word at off of o's memory reaches want
// (atomic: the signal is the reader's proof that the payload landed),
// calling poll (if not nil) meanwhile, for up to a minute.
func WaitWord(t testing.TB, o *MemOwner, off int, want uint64, poll func()) {
	t.Helper()
	w := (*uint64)(unsafe.Pointer(&o.Mem[off]))
	deadline := time.Now().Add(time.Minute)
	for atomic.LoadUint64(w) < want {
		if poll != nil {
			poll()
		}
		if time.Now().After(deadline) {
			if h := StuckHook.Load(); h != nil {
				(*h)()
			}
			t.Fatalf("signal word at %d is %d, want %d", off, atomic.LoadUint64(w), want)
		}
		runtime.Gosched()
	}
}

// DumpWhenStuck makes WaitWord and WaitDone write what ms hold and every
// goroutine's stack, once, before they fail (to tell where an operation
// stuck); call the function it returns when the test ends.
func DumpWhenStuck(t testing.TB, ms []*dataplane.Mesh) func() {
	var dumped atomic.Bool
	dump := func() {
		if dumped.Swap(true) {
			return
		}
		var b strings.Builder
		for _, m := range ms {
			m.WriteState(&b)
		}
		buf := make([]byte, 1<<20)
		b.Write(buf[:runtime.Stack(buf, true)])
		t.Log(b.String())
	}
	StuckHook.Store(&dump)
	return func() { StuckHook.Store(nil) }
}

// WaitFor polls cond every 5 ms for up to a minute (a bound on a hang,
// never a measure: a loaded machine takes its time).
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// WaitUntil polls cond every millisecond for up to a minute.
func WaitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// WaitUntilOr is WaitUntil whose failure message is why(), for a
// condition whose last state says more than its name.
func WaitUntilOr(t testing.TB, cond func() bool, why func() string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(why())
		}
		time.Sleep(time.Millisecond)
	}
}

// Warnings captures the WARN lines logged until the test ends.
func Warnings(t testing.TB) func() []string {
	t.Helper()
	return logtest.Warnings(t)
}

// CountMatching counts the lines that contain sub.
func CountMatching(lines []string, sub string) int {
	n := 0
	for _, l := range lines {
		if strings.Contains(l, sub) {
			n++
		}
	}
	return n
}

// ResetLimits gives the process-wide rate limits a full budget, so a test
// sees its own lines.
func ResetLimits() {
	admission.Warn.Reset()
	dataplane.AcceptWarn().Reset()
}

// WaitRequestWithin is o.RequestDone once the request is done, within d; a
// request that is not ends the test.
func WaitRequestWithin(tb testing.TB, o *MemOwner, tag uint64, parts int, d time.Duration) abi.Result {
	tb.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if st, ok := o.RequestDone(tag, parts); ok {
			return st
		}
		time.Sleep(time.Millisecond)
	}
	if h := StuckHook.Load(); h != nil {
		(*h)()
	}
	o.Mu.Lock()
	n := o.Parts[tag]
	o.Mu.Unlock()
	tb.Fatalf("tag %d never completed (%d of %d parts)", tag, n, parts)
	return 0
}
