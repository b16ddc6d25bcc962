package tcp

import (
	"fmt"
	"net"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
)

// Lazy lanes. Connect opens lane 0 to every peer; a lane beyond it opens
// when the first operation is queued on it: the lane dials the peer's
// listener with the signed hello (the claim names the lane), and the
// peer's mesh takes the stream from its listener (lateLanes), which must
// stay open while the mesh lives. Until then the lane's operations wait in
// its queue, in order; the target's orderer holds signals for sequence
// numbers still on the way, as for a slow lane. A dial that fails is a
// lane failure (tcp_failover.go): the queue moves to a live lane, or the
// peer fails when none is left. Only an opened lane is live for a
// failover (peer.opened): a failed lane's work never waits on a dial. A peer never used beyond lane 0 costs one
// stream each way.

// startOpen dials the lane in the background; l.mu held. The mesh's wait
// group counts the dial, so Close waits for it (p.quit cuts it short).
func (l *lane) startOpen() {
	l.opening = true
	l.p.Mesh().WG.Add(1)
	go l.open()
}

func (l *lane) open() {
	p := l.p
	defer p.Mesh().WG.Done()
	c, err := p.DialLane(l.idx)
	if err == nil {
		l.alloc()
	}
	l.mu.Lock()
	if err == nil && (p.Dead() || l.down) {
		l.mu.Unlock()
		c.Close()
		return
	}
	if err != nil {
		l.mu.Unlock()
		err = fmt.Errorf("open lane %d to rank %d: %w", l.idx, p.Rank(), err)
		l.broken(err)
		if l.isDown() {
			l.migrate(err)
		}
		return
	}
	l.q.Grow(laneQueue)
	l.out = c
	l.setOut(c)
	p.Opened().Or(1 << l.idx)
	l.mu.Unlock()
	l.run()
	l.kick()
}

// LaneUnused reports that nothing was ever queued on lane: it never
// opened and is not opening.
func (t *Link) LaneUnused(lane int) bool {
	l := t.lanes[lane]
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.out == nil && !l.opening
}

// closeIn closes incoming stream i if the peer opened it.
func (t *Link) closeIn(i int) {
	t.inMu.Lock()
	c := t.ins[i]
	t.inMu.Unlock()
	if c != nil {
		c.Close()
	}
}

// AddIn takes a stream the peer opened after connect for one of its
// lanes beyond the first, and starts serving it.
func (t *Link) AddIn(lane, lanes int, c *net.TCPConn) error {
	t.inMu.Lock()
	defer t.inMu.Unlock()
	switch {
	case lanes != len(t.ins) || lane < 1 || lane >= lanes:
		return fmt.Errorf("rank %d opened lane %d of %d; it announced %d lanes", t.p.Rank(), lane, lanes, len(t.ins))
	case t.ins[lane] != nil:
		return fmt.Errorf("two connections claim rank %d lane %d", t.p.Rank(), lane)
	case t.fenced&(1<<lane) != 0:
		return fmt.Errorf("rank %d opened lane %d after it resent that lane's operations", t.p.Rank(), lane)
	case t.p.Dead():
		return fmt.Errorf("%w: rank %d", link.ErrPeerGone, t.p.Rank())
	}
	c.SetNoDelay(true)
	t.ins[lane] = c
	t.acks[lane].in = c
	t.p.Mesh().WG.Add(1)
	go t.service(lane, c)
	return nil
}
