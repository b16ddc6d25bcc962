package tcp

import (
	"sync/atomic"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// The reader's half of the wake backstop of shared-memory streams (the
// watcher is the mesh's, host/dataplane's stream_wake.go, which says why
// it exists): WakeStuckStreams looks at every incoming stream that reads a
// ring, and wakes a reader that left bytes in it for a whole tick, as a
// polling caller wakes its service (a read deadline in the past, which
// every read of the service takes as a wake-up).

// SkipStreamWake switches the backstop's wakes off (the negative control
// of its test): stuck readers are still counted.
var SkipStreamWake atomic.Bool

// WakeStuckStreams wakes the readers of the link's incoming streams that
// left bytes in their ring since the watcher's last look, tick ago (the
// watcher's goroutine only).
func (t *Link) WakeStuckStreams(tick time.Duration) {
	if t.p.Dead() {
		return
	}
	for _, a := range t.acks {
		r := a.rd.Load()
		if r == nil {
			continue
		}
		if stuck, sleeping := r.stuck(); stuck {
			n := r.wakes.Add(1)
			if sleeping {
				r.lostWakes.Add(1)
			}
			streamWakeInfo.Info(abi.SubsysNet, "NET/wasm: rank %d: the reader of rank %d's shared-memory stream (lane %d) left bytes waiting for %v (marked asleep: %v); woken (%d times on this stream)",
				t.p.Mesh().Rank, t.p.Rank(), r.lane, tick, sleeping, n)
			if !SkipStreamWake.Load() {
				r.in.SetReadDeadline(pastDeadline)
			}
		}
	}
}

// streamWakeInfo limits the backstop's INFO lines.
var streamWakeInfo = logx.Limited{Burst: 5, Every: 10 * time.Second}

// stuck reports a ring that held bytes and kept its reader's position
// since the watcher's last look (its goroutine only: wHead and wSeen are
// its), and whether the reader said it sleeps. A reader that sleeps is
// woken by the writer that publishes after its mark, and one that is awake
// reads within microseconds, so the state lasts a tick only when a
// wake-up was lost, or when the reader's thread got no CPU for that long
// (a spurious wake costs the reader one look at an empty socket).
func (r *inReader) stuck() (bool, bool) {
	r.smu.Lock()
	s := r.sview
	if s == nil {
		r.smu.Unlock()
		return false, false
	}
	tail, head, sleeping, _ := s.State()
	r.smu.Unlock()
	if tail == head {
		r.wSeen = false
		return false, false
	}
	if !r.wSeen || head != r.wHead {
		r.wHead, r.wSeen = head, true
		return false, false
	}
	r.wSeen = false
	return true, sleeping
}
