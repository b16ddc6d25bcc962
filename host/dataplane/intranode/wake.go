package intranode

import (
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// The link's half of the mesh's wake backstop of shared-memory streams
// (host/dataplane's stream_wake.go says why it exists): only an
// intra-node link's incoming streams read rings, so only it is watched.
// Once per tick the mesh's watcher calls WakeStuck, which looks at each
// incoming ring (tcp.Link.RingView) and wakes a reader that left bytes in
// it since the last look (tcp.Link.WakeReader).

// SkipStreamWake switches the backstop's wakes off (the negative control
// of its test): stuck readers are still counted.
var SkipStreamWake atomic.Bool

// wakeState is the watcher's view of one incoming stream: what it saw at
// its last look (its goroutine only) and the wakes it made.
type wakeState struct {
	head  uint64
	seen  bool
	wakes atomic.Uint64
	lost  atomic.Uint64 // of wakes, those of a reader marked asleep
}

// WakeStuck wakes the readers of the link's incoming streams that left
// bytes in their ring since the watcher's last look, tick ago (the
// watcher's goroutine only).
func (x *Link) WakeStuck(tick time.Duration) {
	if x.Peer().Dead() {
		return
	}
	for i := range x.wake {
		if stuck, sleeping := x.stuck(i); stuck {
			w := &x.wake[i]
			n := w.wakes.Add(1)
			if sleeping {
				w.lost.Add(1)
			}
			wakeInfo.Info(abi.SubsysNet, "NET/wasm: rank %d: the reader of rank %d's shared-memory stream (lane %d) left bytes waiting for %v (marked asleep: %v); woken (%d times on this stream)",
				x.Peer().Mesh().Rank, x.Peer().Rank(), i, tick, sleeping, n)
			if !SkipStreamWake.Load() {
				x.WakeReader(i)
			}
		}
	}
}

// wakeInfo limits the backstop's INFO lines.
var wakeInfo = logx.Limited{Burst: 5, Every: 10 * time.Second}

// stuck reports a ring that held bytes and kept its reader's position
// since the watcher's last look, and whether the reader said it sleeps. A
// reader that sleeps is woken by the writer that publishes after its
// mark, and one that is awake reads within microseconds, so the state
// lasts a tick only when a wake-up was lost, or when the reader's thread
// got no CPU for that long.
func (x *Link) stuck(i int) (bool, bool) {
	w := &x.wake[i]
	tail, head, sleeping, ok := x.RingView(i)
	if !ok || tail == head {
		w.seen = false
		return false, false
	}
	if !w.seen || head != w.head {
		w.head, w.seen = head, true
		return false, false
	}
	w.seen = false
	return true, sleeping
}

// addWakes adds the backstop's wakes to st.
func (x *Link) addWakes(st *link.Stats) {
	for i := range x.wake {
		st.StreamWakes += x.wake[i].wakes.Load()
		st.LostWakes += x.wake[i].lost.Load()
	}
}

// writeWakes is the stall report's line on the backstop's wakes, when it
// made any.
func (x *Link) writeWakes(w io.Writer) {
	for i := range x.wake {
		if n := x.wake[i].wakes.Load(); n > 0 {
			fmt.Fprintf(w, "    in %d: stream wakes %d (reader marked asleep: %d)\n", i, n, x.wake[i].lost.Load())
		}
	}
}
