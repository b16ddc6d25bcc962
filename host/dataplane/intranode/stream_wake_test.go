package intranode_test

import (
	"os"
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/intranode"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
)

// TestStreamWakeBackstop: with every bell of the shared-memory streams
// lost (dropBells), a reader that parked stays asleep with a put in its
// ring, and only the wake backstop (stream_wake.go) gets it read: the puts
// land and complete, both ways, and both ranks count wakes. Nobody polls here,
// so the services alone read the rings. With the backstop's wakes off
// (intranode.SkipStreamWake; RMAW_NEGATIVE_CONTROL=streamwake) the first put never
// completes.
func TestStreamWakeBackstop(t *testing.T) {
	intranode.DropBells(true)
	t.Cleanup(func() { intranode.DropBells(false) })
	if os.Getenv("RMAW_NEGATIVE_CONTROL") == "streamwake" {
		intranode.SkipStreamWake.Store(true)
		t.Cleanup(func() { intranode.SkipStreamWake.Store(false) })
	}
	owners := meshtest.NewOwners(2, 64+8*(8<<10))
	ms := meshtest.Connect2(t, owners, dataplane.Options{Timeout: 10 * time.Second, IntraNode: true, Lanes: 1, CloseTimeout: time.Second})
	meshtest.DumpWhenStuck(t, ms)
	for i := range 3 {
		for a := range 2 {
			// Quiet until the target's reader parked (once its ring
			// exists): every bell is lost, so only the backstop wakes it.
			time.Sleep(50 * time.Millisecond)
			in := meshtest.TCPOf(t, ms[1-a], a)
			if _, _, _, ok := in.RingView(0); ok {
				meshtest.WaitFor(t, "the reader parked", func() bool { _, _, sleeping, _ := in.RingView(0); return sleeping })
			}
			streamPuts(t, ms, owners, a, 1-a, 1, uint64(i))
		}
	}
	for a := range 2 {
		if l := meshtest.TCPOf(t, ms[a], 1-a).Lanes()[0]; meshtest.IntraOf(l).SState() != intranode.RingOn {
			t.Fatalf("rank %d's lane to rank %d writes no shared-memory stream", a, 1-a)
		}
		st := ms[a].Stats()
		if st.StreamWakes == 0 {
			t.Fatalf("rank %d's wake backstop woke no reader, yet puts to it landed with every bell lost", a)
		}
		if st.LostWakes > st.StreamWakes {
			t.Fatalf("rank %d: %d lost wake-ups counted of %d wakes", a, st.LostWakes, st.StreamWakes)
		}
		t.Logf("rank %d: %d wakes, %d of a reader marked asleep", a, st.StreamWakes, st.LostWakes)
	}
}
