package putack

import (
	"sync"
	"sync/atomic"
	"time"
)

// Hooks for the transport's integration tests (host/dataplane/tcp's,
// which reach an acker through the link's Acks): they pin an acker's
// state underneath a whole mesh. Test-only; nothing in the data path
// calls them.

// Hold holds the stream's acks back while it is set.
func (a *Acker) Hold() *atomic.Bool { return &a.hold }

// Pub is the landed count published at the last drain.
func (a *Acker) Pub() *atomic.Uint64 { return &a.pub }

// Tmu guards Armed and the timer.
func (a *Acker) Tmu() *sync.Mutex { return &a.tmu }

// Armed reports the timer armed (under Tmu).
func (a *Acker) Armed() *bool { return &a.armed }

// Timer is the timer that sends an owed ack alone (under Tmu).
func (a *Acker) Timer() *time.Timer { return a.timer }
