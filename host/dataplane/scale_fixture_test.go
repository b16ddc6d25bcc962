package dataplane

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
)

// The fixture of scale_test.go, the one internal test file left (package
// dataplane, which cannot import host/dataplane/meshtest): memOwner and
// waitDoneWithin are meshtest.MemOwner and meshtest.WaitDoneWithin under
// the names scale_test.go uses. They go once scale_test.go moves to
// package dataplane_test with the other mesh-level tests (kept apart
// while branch scale31 changes it).

// memOwner is a target with one registration and recorded events
// (meshtest.MemOwner).
type memOwner struct {
	mu         sync.Mutex
	mem        []byte
	done       map[uint64]abi.Result
	parts      map[uint64]int // completions seen per tag (striped ops have several)
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
	o.mu.Unlock()
}
func (o *memOwner) PeerFailed(_ int, err error) {
	o.mu.Lock()
	o.failed = append(o.failed, err)
	o.mu.Unlock()
}
func (o *memOwner) LaneFailed(peer, lane, moved int, _ error) {
	o.mu.Lock()
	o.laneEvents = append(o.laneEvents, [3]int{peer, lane, moved})
	o.mu.Unlock()
}

func (o *memOwner) status(tag uint64) (abi.Result, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	st, ok := o.done[tag]
	return st, ok
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
	tb.Fatalf("tag %d never completed", tag)
	return 0
}
