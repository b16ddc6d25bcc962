package tcp

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp/waitpolicy"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/inbox"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/shmstream"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// markSide is an intra-node side whose peer's mark page is pm (nil: none
// handed over).
type markSide struct {
	SidePath
	evs markEvents
}

func (s *markSide) PeerEvents() link.Events { return &s.evs }

type markEvents struct{ pm *staging.PeerMarks }

func (markEvents) Order(uintptr, uintptr, bool) error { return nil }
func (markEvents) PeerOpened() bool                   { return false }
func (markEvents) PeerEvent(int) uintptr              { return 0 }
func (e *markEvents) PeerMarks() *staging.PeerMarks   { return e.pm }
func (markEvents) PeerInbox() *inbox.Peer             { return nil }
func (markEvents) InboxRow() (int, int)               { return -1, 0 }

// The polling caller serves a marked put+signal only when its mark is
// already there and nothing else in its status asks for the service
// (a resent put, a ring, an event), and never a marked header on a link
// whose peer handed no page over.
func TestMarkReachedServedByCaller(t *testing.T) {
	fd, w, err := shmstream.CreateSealed("marks-caller", 4096)
	if err != nil {
		t.Skipf("sealed memfd: %v", err)
	}
	defer unix.Close(fd)
	defer unix.Munmap(w)
	w[3*8] = 7 // word 3 (little endian) at 7
	pm, err := staging.OpenPeerMarks(fd, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer pm.Close()
	side := &markSide{evs: markEvents{pm: pm}}
	l := &Link{side: side}
	marked := func(k uint16, v uint64) *wire.Header {
		return &wire.Header{Typ: wire.MsgPutSignal, Status: wire.StatusMark | k, Off: v}
	}
	for _, c := range []struct {
		name string
		h    *wire.Header
		want bool
	}{
		{"reached", marked(3, 7), true},
		{"passed", marked(3, 2), true},
		{"not yet", marked(3, 8), false},
		{"another word", marked(4, 1), false},
		{"resent", &wire.Header{Typ: wire.MsgPutSignal, Status: wire.StatusMark | wire.StatusResent | 3, Off: 1}, false},
		{"with payload", &wire.Header{Typ: wire.MsgPutSignal, Status: wire.StatusMark | 3, Off: 1, Size: 8}, false},
		{"put without signal", &wire.Header{Typ: wire.MsgPut, Status: wire.StatusMark | 3, Off: 1}, false},
		{"event", &wire.Header{Typ: wire.MsgPutSignal, Status: wire.StatusEvent | 3}, false},
		{"word past the page", marked(200, 1), false},
	} {
		if got := l.markReached(c.h); got != c.want {
			t.Errorf("%s: markReached = %v, want %v", c.name, got, c.want)
		}
	}
	// What the caller did with the marked ones (link.Stats): the two
	// reached at once, the three it gave up on; no wait saw its mark.
	var st link.Stats
	l.AddAcks(&st)
	if st.MarksAtOnce != 2 || st.MarksWaited != 0 || st.MarksLeft != 3 {
		t.Errorf("marks at once %d, after a wait %d, left %d; want 2, 0, 3", st.MarksAtOnce, st.MarksWaited, st.MarksLeft)
	}
	side.evs.pm = nil
	if l.markReached(marked(3, 7)) {
		t.Error("a marked header served with no page handed over")
	}
	if (&Link{}).markReached(marked(3, 7)) {
		t.Error("a marked header served on a link with no intra-node side")
	}
}

// The polling caller's wait for marks stops after waitpolicy.MissesMax misses in
// a row, comes back once every waitpolicy.RetryEvery headers, and a mark seen in
// time (waited for or not) turns it on again.
func TestMarkWaitsAdapt(t *testing.T) {
	var m markWaits
	for i := 0; i < waitpolicy.MissesMax; i++ {
		d := m.bound()
		if d != callerMarkWait {
			t.Fatalf("miss %d: wait %v, want %v", i, d, callerMarkWait)
		}
		m.record(d, false)
	}
	waits := 0
	for i := 0; i < 2*waitpolicy.RetryEvery; i++ {
		d := m.bound()
		if d != 0 {
			waits++
		}
		m.record(d, false)
	}
	if waits != 2 {
		t.Fatalf("after %d misses in a row: %d waits in %d headers, want 2", waitpolicy.MissesMax, waits, 2*waitpolicy.RetryEvery)
	}
	m.record(0, false) // a look that did not wait is no miss
	m.record(0, true)  // a mark there at the first look
	if d := m.bound(); d != callerMarkWait {
		t.Fatalf("after a mark in time: wait %v, want %v", d, callerMarkWait)
	}
	// A miss below the bound does not stop the waits.
	m.record(callerMarkWait, false)
	if d := m.bound(); d != callerMarkWait {
		t.Fatalf("after one miss: wait %v, want %v", d, callerMarkWait)
	}
}

// A header naming an inbox entry is taken only as its sender was allowed
// to send it: the row it was given, no payload, its signal marked
// applied, a position; anything else is a protocol error (orderInbox),
// and a caller serves none whose link has no row.
func TestInboxHeaders(t *testing.T) {
	ok := func() *wire.Header {
		return &wire.Header{Typ: wire.MsgPutSignal, Status: wire.StatusInbox | 2, SigOp: 2 | wire.SigApplied, Off: 5}
	}
	if !inboxHeaderOK(ok(), 2) {
		t.Fatal("a well-formed inbox header refused")
	}
	again := ok()
	again.Status |= wire.StatusResent | 1<<8
	if !inboxHeaderOK(again, 2) {
		t.Fatal("an inbox header sent again after a lane failed refused")
	}
	for name, mut := range map[string]func(h *wire.Header) int{
		"no row given":   func(h *wire.Header) int { return -1 },
		"another row":    func(h *wire.Header) int { h.Status = wire.StatusInbox | 3; return 2 },
		"with payload":   func(h *wire.Header) int { h.Size = 8; return 2 },
		"not applied":    func(h *wire.Header) int { h.SigOp = 2; return 2 },
		"no position":    func(h *wire.Header) int { h.Off = 0; return 2 },
		"put, no signal": func(h *wire.Header) int { h.Typ = wire.MsgPut; return 2 },
		"marked as well": func(h *wire.Header) int { h.Status |= wire.StatusMark; return 2 },
	} {
		h := ok()
		if row := mut(h); inboxHeaderOK(h, row) {
			t.Errorf("%s: taken", name)
		}
	}
	l := &Link{side: &markSide{evs: markEvents{}}}
	if l.inboxReached(ok()) {
		t.Error("a caller served an inbox header on a link that gave no row")
	}
}
