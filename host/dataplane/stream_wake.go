package dataplane

import (
	"time"
)

// The wake backstop of the intra-node shared-memory streams
// (host/dataplane/intranode). A reader that finds its ring empty marks
// itself asleep and parks on the lane's socket; the writer that publishes
// after the mark rings a bell byte on that socket. Should a wake-up be
// lost all the same, the bytes would wait in the ring with nobody reading
// them, and whatever they carry (a registration notice, a put, an ack)
// would never arrive: a hang. So a watcher looks at every incoming ring
// once per streamWakeTick, and a ring that holds bytes while its reader's
// position did not move for a whole tick gets its reader woken
// (intranode.Link.WakeStuck, over tcp.Link.RingView and WakeReader).
// Each such wake is counted
// (Stats.StreamWakes, and Stats.LostWakes when the reader had marked
// itself asleep) and reported in a rate-limited INFO line: the normal path
// failed to wake the reader, or the reader's thread got no CPU for a
// tick, which the operator (and the soak) should see.

// streamWakeTick is the watcher's period: a lost wake-up costs one to two
// of them.
const streamWakeTick = 20 * time.Millisecond

// streamWaker is a transport whose incoming streams may be shared-memory
// rings (the intra-node link).
type streamWaker interface{ WakeStuck(tick time.Duration) }

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
			l.WakeStuck(streamWakeTick)
		}
	}
}
