package dataplane

import (
	"sync/atomic"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// The wake backstop of the intra-node shared-memory streams (stream.go).
// A reader that finds its ring empty marks itself asleep and parks on
// the lane's socket; the writer that publishes after the mark rings a
// bell byte on that socket. Should a wake-up be lost all the same, the
// bytes would wait in the ring with nobody reading them, and whatever
// they carry (a registration notice, a put, an ack) would never arrive:
// a hang. So a watcher looks at every incoming ring once per
// streamWakeTick, and a ring that holds bytes while its reader's position
// did not move for a whole tick gets its reader woken as a polling caller
// wakes its service (a read deadline in the past, which every read of the
// service takes as a wake-up). Each such wake is counted
// (Stats.StreamWakes) and reported in a rate-limited INFO line: the normal
// path failed to wake the reader, or the reader's thread got no CPU for a
// tick, which the operator (and the soak) should see.

// streamWakeTick is the watcher's period: a lost wake-up costs one to two
// of them.
const streamWakeTick = 20 * time.Millisecond

// skipStreamWake switches the watcher's wakes off (the negative control
// of its test).
var skipStreamWake atomic.Bool

// streamWaker is a transport whose incoming streams may be shared-memory
// rings (the intra-node link).
type streamWaker interface{ wakeStuck() }

// watchStreams runs until the mesh closes, over the links that may read
// rings (NewMesh starts it when there are any).
func (m *Mesh) watchStreams(links []streamWaker) {
	defer m.wg.Done()
	t := time.NewTicker(streamWakeTick)
	defer t.Stop()
	for {
		select {
		case <-m.quit:
			return
		case <-t.C:
		}
		for _, l := range links {
			l.wakeStuck()
		}
	}
}

// wakeStuck wakes the readers of the link's incoming streams that left
// bytes waiting for a tick (the watcher's goroutine only).
func (x *intraLink) wakeStuck() {
	if x.p.dead.Load() {
		return
	}
	for _, a := range x.acks {
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
				x.p.m.rank, x.p.rank, r.lane, streamWakeTick, sleeping, n)
			if !skipStreamWake.Load() {
				r.in.SetReadDeadline(pastDeadline)
			}
		}
	}
}

// streamWakeInfo limits the watcher's INFO lines.
var streamWakeInfo = logx.Limited{Burst: 5, Every: 10 * time.Second}

// stuck reports a ring that held bytes and kept its reader's position
// for a whole tick (the watcher's goroutine only: wHead and wSeen are
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
