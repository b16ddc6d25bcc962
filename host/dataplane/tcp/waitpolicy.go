package tcp

import "sync/atomic"

// waitPolicy decides whether to wait for something a peer usually sends
// soon (a mark behind its header, acks a flush needs): after
// waitMissesMax waits in a row that were in vain, it stops waiting, and
// waits again once every waitRetryEvery times to notice the peer coming
// back on time; a wait that paid turns waiting back on. The polling
// caller's mark wait (markWaits) and the flush's ask for held acks
// (askPacer) share it.
type waitPolicy struct {
	misses atomic.Uint32 // waits in a row that were in vain
	n      atomic.Uint32 // decisions taken while waiting is off
}

const (
	waitMissesMax  = 4
	waitRetryEvery = 64
)

// waiting reports whether to wait this time.
func (p *waitPolicy) waiting() bool {
	return p.misses.Load() < waitMissesMax || p.n.Add(1)%waitRetryEvery == 0
}

// paid notes a wait (or a look) that saw what it waited for.
func (p *waitPolicy) paid() {
	if p.misses.Load() != 0 {
		p.misses.Store(0)
	}
}

// vain notes a wait that did not.
func (p *waitPolicy) vain() {
	if p.misses.Load() < waitMissesMax {
		p.misses.Add(1)
	}
}
