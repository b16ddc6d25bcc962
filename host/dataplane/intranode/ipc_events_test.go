package intranode_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/intranode"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/devtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/seqorder"
)

// TestEventOrderFollowsSequence: with several lanes a peer's signals are
// applied in sequence order, whatever order their headers arrived in.
// The event a mapped put+signal named is waited for when its signal is
// applied, not when its header arrives, so a signal numbered after it
// that another lane delivered first, applied from the host, still waits
// for that put's copy.
func TestEventOrderFollowsSequence(t *testing.T) {
	d := &eventDevice{StreamSelfDevice: &meshtest.StreamSelfDevice{Stream: devtest.NewStream(1<<16, 0)}}
	devmem.Register(d)
	t.Cleanup(func() { devmem.Register(nil) })
	evs := intranode.NewEvents(3) // the context the peer's events were opened in
	var o seqorder.Orderer[link.Signal]
	o.OnErr = func(err error) { t.Error(err) }
	sh := staging.NewShadow(d.Base, 1<<16)
	var host uint64
	const ev1, ev2 = 0xe1, 0xe2

	// Number 2, a host word with no event of its own, arrives first.
	if err := o.Done(2, link.Signal{Host: &host, Evs: evs}, 1); err != nil {
		t.Fatal(err)
	}
	if len(d.calls) != 0 || atomic.LoadUint64(&host) != 0 {
		t.Fatalf("applied before number 1 landed: %v, word %d", d.calls, host)
	}
	// Number 1, a put+signal ordered by event 1 whose device word is
	// written on context 1's stream: its stream waits for the event, then
	// number 2's host word waits for it from the host (in the context the
	// event was opened in).
	if err := o.Done(1, link.Signal{Dev: d.Base, Ctx: 1, Sh: sh, Evs: evs, Ev: ev1}, 1); err != nil {
		t.Fatal(err)
	}
	if want := []string{"stream 1 e1", "host 3 e1"}; !slices.Equal(d.calls, want) || atomic.LoadUint64(&host) != 1 {
		t.Fatalf("calls %v, want %v; word %d", d.calls, want, host)
	}
	// Number 3 on the same stream: the host wait covered event 1.
	// Number 4, a refused signal whose put was ordered by event 2: the
	// host waits for it, so that later signals follow that put's bytes.
	for seq, s := range map[uint64]link.Signal{3: {Dev: d.Base + 8, Ctx: 1, Sh: sh, Evs: evs}, 4: {Evs: evs, Ev: ev2}} {
		if err := o.Done(seq, s, 1); err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{"stream 1 e1", "host 3 e1", "host 3 e2"}; !slices.Equal(d.calls, want) {
		t.Fatalf("calls %v, want %v", d.calls, want)
	}
	if err := d.Sync(1); err != nil {
		t.Fatal(err)
	}
	if w := binary.LittleEndian.Uint64(d.Peek(d.Base, 8)); w != 1 {
		t.Fatalf("device word %d, want 1", w)
	}
}

// eventDevice records the waits for a peer's events (0xe0 and up).
type eventDevice struct {
	*meshtest.StreamSelfDevice
	calls []string
}

func (d *eventDevice) IPCEventNew(uintptr) (uintptr, [64]byte, error) {
	return 0, [64]byte{}, errors.New("no events here")
}
func (d *eventDevice) IPCEventOpen(uintptr, [64]byte) (uintptr, error) {
	return 0, errors.New("no events here")
}
func (d *eventDevice) StreamWait(ctx, ev uintptr) error {
	d.calls = append(d.calls, fmt.Sprintf("stream %d %x", ctx, ev))
	return nil
}
func (d *eventDevice) Passed(ctx, ev uintptr) (bool, error) {
	if ev >= 0xe0 && ev < 0xf0 {
		d.calls = append(d.calls, fmt.Sprintf("host %d %x", ctx, ev))
		return true, nil
	}
	return d.StreamSelfDevice.Passed(ctx, ev)
}
