package instream

import (
	"sync/atomic"
	"time"
)

// Hooks for the transports' integration tests (host/dataplane/tcp's and
// host/dataplane/intranode's, which reach a reader through a TCP link):
// they look at or pin the turns underneath a whole mesh. Test-only;
// nothing in the data path calls them.

// CallerMsgs counts the messages callers' threads served.
func (r *Reader) CallerMsgs() *atomic.Uint64 { return &r.callerMsgs }

// Handoffs counts the times a caller left the stream to the service.
func (r *Reader) Handoffs() *atomic.Uint64 { return &r.handoffs }

// Napping reports the service napping while callers serve.
func (r *Reader) Napping() *atomic.Bool { return &r.napping }

// Sring is the shared-memory stream the reader reads, or nil.
func (r *Reader) Sring() ShmIn { return r.sring }

// PollActive is how long after a stream's last message the service leaves
// it to callers; long, it pins the service to its naps.
func PollActive() *time.Duration { return &pollActive }

// CallerWindow is how long the service naps before it looks whether
// callers still call.
func CallerWindow() *time.Duration { return &callerWindow }
