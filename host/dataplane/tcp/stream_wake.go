package tcp

// What the intra-node link's wake backstop (host/dataplane/intranode's
// wake.go) needs of TCP's readers of shared-memory streams: a look at an
// incoming stream's ring, and a wake of its reader.

// RingView is what incoming stream i's shared ring holds now: bytes
// written and read, ever, and whether its reader marked itself asleep; ok
// is false while the stream reads no ring (or is gone).
func (t *Link) RingView(i int) (tail, head uint64, sleeping, ok bool) {
	r := t.acks[i].rd.Load()
	if r == nil {
		return 0, 0, false, false
	}
	return r.RingView()
}

// WakeReader wakes incoming stream i's reader as a polling caller wakes
// its service: a read deadline in the past, which every read of the
// service takes as a wake-up (a spurious one costs a look at an empty
// socket).
func (t *Link) WakeReader(i int) {
	if r := t.acks[i].rd.Load(); r != nil {
		r.Wake()
	}
}

// Incoming is how many incoming streams the link has (one per lane).
func (t *Link) Incoming() int { return len(t.acks) }
