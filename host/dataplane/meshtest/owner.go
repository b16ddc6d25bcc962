package meshtest

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
)

// MemOwner is a target with one registration (id 1, Mem) and recorded
// events: the completions of its requests, the failures of its peers and
// the failovers of its lanes.
type MemOwner struct {
	// Mu guards Done, Parts, Bad, Failed and LaneEvents.
	Mu sync.Mutex
	// Mem is registration 1.
	Mem []byte
	// Whole is Mem with 64 guard bytes on each side (NewOwners), or nil.
	Whole []byte
	// Done is each completed request's status, by tag.
	Done map[uint64]abi.Result
	// Parts counts the completions seen per tag (striped ops have several).
	Parts map[uint64]int
	// Bad is the first failure among each tag's completions.
	Bad map[uint64]abi.Result
	// Failed are the errors PeerFailed reported.
	Failed []error
	// Pins counts the registrations the target side holds (Resolve).
	Pins atomic.Int32
	// LaneEvents are the LaneFailed reports: peer, lane, moved.
	LaneEvents [][3]int
}

// Resolve is registration 1, Mem.
func (o *MemOwner) Resolve(id uint32) (unsafe.Pointer, uint64, uintptr, dataplane.Pin, bool) {
	if id != 1 {
		return nil, 0, 0, dataplane.Pin{}, false
	}
	return unsafe.Pointer(&o.Mem[0]), uint64(len(o.Mem)), 0, dataplane.NewPin(&o.Pins), true
}

// PeerRegistered ignores the peers' registrations.
func (o *MemOwner) PeerRegistered(int, dataplane.PeerReg) {}

// Complete records tag's status and counts its completions.
func (o *MemOwner) Complete(tag uint64, st abi.Result) {
	o.Mu.Lock()
	o.Done[tag] = st
	if o.Parts == nil {
		o.Parts = map[uint64]int{}
	}
	o.Parts[tag]++
	if st != abi.Success {
		if o.Bad == nil {
			o.Bad = map[uint64]abi.Result{}
		}
		if _, ok := o.Bad[tag]; !ok {
			o.Bad[tag] = st
		}
	}
	o.Mu.Unlock()
}

// RequestDone is the status of request tag once its parts completions
// came (Mesh.OpParts: a striped op completes once per piece, and once more
// for its signal): the first failure among them, else success. Only then
// is the request done, as the runtime counts it (host/plugin's
// completeRequest), and its source free for reuse: the parts complete on
// their own lanes' acks, in no order, and one can complete while another
// still waits in its lane's queue (TestSignalPartBeforeItsPiece).
func (o *MemOwner) RequestDone(tag uint64, parts int) (abi.Result, bool) {
	o.Mu.Lock()
	defer o.Mu.Unlock()
	if o.Parts[tag] < parts {
		return 0, false
	}
	if st, ok := o.Bad[tag]; ok {
		return st, true
	}
	return abi.Success, true
}

// PeerFailed records err.
func (o *MemOwner) PeerFailed(_ int, err error) {
	o.Mu.Lock()
	o.Failed = append(o.Failed, err)
	o.Mu.Unlock()
}

// WaitFailure waits until a PeerFailed report names substr, and fails the
// test with the reports so far if none does within 15 s. A peer is marked
// dead before its loss is reported, so a test that saw Dead waits here.
func (o *MemOwner) WaitFailure(t testing.TB, substr string) {
	t.Helper()
	var got string
	WaitUntilOr(t, func() bool {
		o.Mu.Lock()
		got = fmt.Sprint(o.Failed)
		o.Mu.Unlock()
		return strings.Contains(got, substr)
	}, func() string { return fmt.Sprintf("no reported failure names %q: %s", substr, got) })
}

// LaneFailed records a lane's failover (dataplane.LaneObserver).
func (o *MemOwner) LaneFailed(peer, lane, moved int, _ error) {
	o.Mu.Lock()
	o.LaneEvents = append(o.LaneEvents, [3]int{peer, lane, moved})
	o.Mu.Unlock()
}

// Status is tag's status, and whether it completed.
func (o *MemOwner) Status(tag uint64) (abi.Result, bool) {
	o.Mu.Lock()
	defer o.Mu.Unlock()
	st, ok := o.Done[tag]
	return st, ok
}

// NewOwners makes n owners of size bytes each, with guard bytes (Whole).
func NewOwners(n, size int) []*MemOwner {
	os := make([]*MemOwner, n)
	for i := range os {
		whole := make([]byte, 64+size+64)
		os[i] = &MemOwner{Mem: whole[64 : 64+size : 64+size], Whole: whole, Done: map[uint64]abi.Result{}}
	}
	return os
}
