// Package waitpolicy decides whether to wait for something a peer usually
// sends soon: a mark behind its header, the acks a flush needs, a batch of
// our own that an ack could ride. Where the peer keeps not sending it in
// time, waiting only delays the caller, so after MissesMax waits in a row
// that were in vain a Policy stops waiting; it waits again once every
// RetryEvery decisions, to notice the peer coming back on time, and a
// wait that paid turns waiting back on. It is a unit of its own because
// the transport's three waits (host/dataplane/tcp) and its acknowledgement
// state machine (host/dataplane/tcp/putack) share it.
package waitpolicy

import "sync/atomic"

const (
	// MissesMax is how many waits in a row may be in vain before the
	// policy stops waiting.
	MissesMax = 4
	// RetryEvery is how often, in decisions, a policy that stopped
	// waiting waits once more.
	RetryEvery = 64
)

// Policy is one such decision's state. The zero Policy waits. Its
// methods are safe for concurrent use; a race between them only shifts
// one decision.
type Policy struct {
	misses atomic.Uint32 // waits in a row that were in vain
	n      atomic.Uint32 // decisions taken while waiting is off
}

// Waiting reports whether to wait this time.
func (p *Policy) Waiting() bool {
	return p.misses.Load() < MissesMax || p.n.Add(1)%RetryEvery == 0
}

// Paid notes a wait (or a look) that saw what it waited for.
func (p *Policy) Paid() {
	if p.misses.Load() != 0 {
		p.misses.Store(0)
	}
}

// Vain notes a wait that did not.
func (p *Policy) Vain() {
	if p.misses.Load() < MissesMax {
		p.misses.Add(1)
	}
}
