package intranode

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/inbox"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// Interprocess events of mapped put+signals (SPEC.md §4, "Device windows
// mapped"). A put+signal into a peer's mapped window queues its copy and
// records one of our events for that peer after it, then sends its header
// at once, marked with the event (wire.StatusEvent, its index in the low
// byte). The target makes the stream its signal write goes to wait for
// that event (or, for a signal it applies from the host, waits for it
// there), so neither host waits for the copy. The request completes when
// the target acknowledged it and our copy executed. Events are made and
// exchanged at registration (host/dataplane/intranode/share), and used only once
// the peer said it opened ours.

// nLinkEvents is how many events a link cycles through. Reusing one
// before the target waited for its last recording only makes the target
// wait for a later point of the same stream, never an earlier one.
const nLinkEvents = 64

// linkEvents is an intra-node link's events, both ways.
type linkEvents struct {
	mu      sync.Mutex
	ctx     uintptr       // the context ours were made in (and record in)
	own     []uintptr     // ours
	handles [][64]byte    // ours, shareable
	ready   atomic.Bool   // the peer opened ours
	next    atomic.Uint32 // the next of ours to record (modulo len(own); any lane's writer)
	closed  bool          // released: nothing is made or opened any more (under mu)

	peerCtx uintptr                   // the context the peer's were opened in
	peer    atomic.Pointer[[]uintptr] // the peer's, opened here
	// Agent marks (staging's marks.go): marksReady, the peer mapped our
	// mark page; peerMarks, the peer's page mapped here.
	marksReady atomic.Bool
	peerMarks  atomic.Pointer[staging.PeerMarks]
	// The peer inbox (host/devmem/inbox): peerInbox, the peer's row mapped
	// here (we send); inboxRow, 1 + the row of ours the peer was given,
	// and inboxPid, its process (we receive).
	peerInbox atomic.Pointer[inbox.Peer]
	inboxRow  atomic.Int32
	inboxPid  atomic.Int32

	// lastEv is the peer's event a stream of ours last waited for (on
	// lastCtx's stream), 0 once a host wait covered it: a later signal
	// from the peer applied elsewhere waits for it first. Only whoever
	// applies the peer's signals touches it: its one lane's reader, or
	// with several lanes the holder of its orderer's lock (sigRef.Apply).
	lastEv, lastCtx uintptr
}

// ErrNoIntra is the answer for a peer the intra-node path does not carry.
var ErrNoIntra = errors.New("not a peer on this host's intra-node path")

// release frees both ways' events (the mesh is closed).
func (e *linkEvents) release() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	e.ready.Store(false)
	freeEvents(e.ctx, e.own)
	e.own, e.handles = nil, nil
	if p := e.peer.Swap(nil); p != nil {
		freeEvents(e.peerCtx, *p)
	}
	e.marksReady.Store(false)
	e.peerMarks.Swap(nil).Close()
	e.peerInbox.Swap(nil).Close()
	e.inboxRow.Store(0)
}

// SetPeerInbox keeps the peer's inbox row mapped here; false (p closed)
// once the link was released, or when one was set already.
func (e *linkEvents) SetPeerInbox(p *inbox.Peer) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed || !e.peerInbox.CompareAndSwap(nil, p) {
		p.Close()
		return false
	}
	return true
}

// PeerInbox is the peer's inbox row mapped here, or nil.
func (e *linkEvents) PeerInbox() *inbox.Peer { return e.peerInbox.Load() }

// SetInboxRow records the row of our inbox the peer (process pid) got.
func (e *linkEvents) SetInboxRow(row, pid int) {
	e.inboxPid.Store(int32(pid))
	e.inboxRow.Store(int32(row + 1))
}

// InboxRow is the row of our inbox the peer got (-1: none) and its pid.
func (e *linkEvents) InboxRow() (int, int) {
	return int(e.inboxRow.Load()) - 1, int(e.inboxPid.Load())
}

func freeEvents(ctx uintptr, evs []uintptr) {
	if st, ok := devmem.Get().(devmem.Streams); ok {
		for _, ev := range evs {
			st.FreeEvent(ctx, ev)
		}
	}
}

// queueMapped queues op's copy into the peer's mapped memory and records
// our next event after it (sender side), for a put+signal the target can
// order by that event, or, where the device agent copies, marks our page
// after it (queueMarked). false: the lane's other ways.
func (x *Link) queueMapped(op *link.Op) bool {
	e := &x.evs
	evs, marks := e.ready.Load(), e.marksReady.Load()
	if op.Msg != wire.MsgPutSignal || (!evs && !marks) {
		return false
	}
	po, ok := x.Peer().Mesh().Owner.(link.PartOwner)
	if !ok {
		return false
	}
	if staging.AgentRuns(op.LocalCtx) {
		// The agent copies and its ticket passes with no driver call:
		// the agent's mark where the peer mapped our page, else the
		// lane's gathered copies (waited for before the header leaves)
		// beat an event's record and the target's wait.
		return marks && x.queueMarked(op, po)
	}
	if !evs || op.LocalCtx != e.ctx {
		return false
	}
	// Lanes may race for a slot: two copies recording one event make
	// the target wait for the later of the two, never too little.
	k := int(e.next.Add(1)-1) % len(e.own)
	po.AddPart(op.Tag) // the copy's part; given back below when nothing was queued
	ok, err := staging.CopyMappedAsync(op.LocalCtx, uintptr(op.Mapped), uintptr(op.Local), op.Size, x.Peer().Mesh().Owner, op.Tag, e.own[k])
	if !ok {
		x.Peer().Mesh().Owner.Complete(op.Tag, abi.Success)
		if err != nil {
			selfWarn.Warn(abi.SubsysNet, "NET/wasm: rank %d: a mapped put+signal could not be ordered by an event: %v; waiting for its copy instead", x.Peer().Rank(), err)
		}
		return false
	}
	op.Event = uint8(k + 1)
	return true
}

// queueMarked queues op's copy into the peer's mapped memory as an agent
// command that then marks our page (staging.CopyMappedMark): the header
// leaves at once naming the mark, which the target waits for.
func (x *Link) queueMarked(op *link.Op, po link.PartOwner) bool {
	po.AddPart(op.Tag) // the copy's part; given back below when nothing was queued
	ok, k, v, err := staging.CopyMappedMark(op.LocalCtx, uintptr(op.Mapped), uintptr(op.Local), op.Size, x.Peer().Mesh().Owner, op.Tag)
	if !ok {
		x.Peer().Mesh().Owner.Complete(op.Tag, abi.Success)
		if err != nil {
			selfWarn.Warn(abi.SubsysNet, "NET/wasm: rank %d: a mapped put+signal could not be marked by the device agent: %v; waiting for its copy instead", x.Peer().Rank(), err)
		}
		return false
	}
	op.Mark, op.MarkV = uint8(k+1), v
	return true
}

// SetMarksReady records that the peer mapped our mark page: our mapped
// put+signals whose copy is the agent's are marked from now on.
func (e *linkEvents) SetMarksReady() {
	e.mu.Lock()
	e.marksReady.Store(!e.closed)
	e.mu.Unlock()
}

// MarksReady reports whether the peer mapped our mark page.
func (e *linkEvents) MarksReady() bool { return e.marksReady.Load() }

// OpenPeerMarks maps the peer's (process pid's) mark page from fd, once.
func (e *linkEvents) OpenPeerMarks(fd, pid int) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrNoIntra
	}
	if e.peerMarks.Load() != nil {
		return nil
	}
	m, err := staging.OpenPeerMarks(fd, pid)
	if err != nil {
		return err
	}
	e.peerMarks.Store(m)
	return nil
}

// PeerMarks is the peer's mark page mapped here, or nil.
func (e *linkEvents) PeerMarks() *staging.PeerMarks { return e.peerMarks.Load() }

// PeerOpened reports that the peer's events were opened here.
func (e *linkEvents) PeerOpened() bool { return e.peer.Load() != nil }

// PeerEvent is the peer's event i, or 0.
func (e *linkEvents) PeerEvent(i int) uintptr {
	p := e.peer.Load()
	if p == nil || i < 0 || i >= len(*p) {
		return 0
	}
	return (*p)[i]
}

// Order makes a signal from the peer follow its mapped copies (target
// side, the stream's reader): ev, when not 0, is the event the signal's
// header named; ctx and stream say where the signal is applied (on ctx's
// stream when stream, else from the host). An event waited for on a
// stream is remembered, so that a later signal applied anywhere else
// waits for it too.
func (e *linkEvents) Order(ev, ctx uintptr, stream bool) error {
	if ev == 0 {
		if e.lastEv == 0 || (stream && ctx == e.lastCtx) {
			return nil // nothing pending, or the same stream keeps the order
		}
		ev, e.lastEv = e.lastEv, 0
		return staging.AfterPeerEvent(e.peerCtx, ev, false)
	}
	// A host wait watches the event in the context it was opened in (a
	// host word has none: HIP needs a device to query on).
	wctx := ctx
	if !stream {
		wctx = e.peerCtx
	}
	if err := staging.AfterPeerEvent(wctx, ev, stream); err != nil {
		return err
	}
	if stream {
		e.lastEv, e.lastCtx = ev, ctx
	} else {
		e.lastEv = 0
	}
	return nil
}

// Events names a link's interprocess events for the mesh's IPC exchange
// (host/dataplane's IPC), which reaches them through Link.IPCEvents.
type Events = linkEvents

// Make makes, once, the events our mapped put+signals to the peer (rank)
// record (in ctx) and returns their handles.
func (e *linkEvents) Make(rank int, ctx uintptr) ([][64]byte, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, ErrNoIntra
	}
	if e.own != nil {
		return e.handles, nil
	}
	ie, ok := devmem.Get().(devmem.IPCEvents)
	if !ok {
		return nil, devmem.ErrUnsupported
	}
	own := make([]uintptr, 0, nLinkEvents)
	handles := make([][64]byte, 0, nLinkEvents)
	for len(own) < nLinkEvents {
		ev, h, err := ie.IPCEventNew(ctx)
		if err != nil {
			freeEvents(ctx, own)
			return nil, fmt.Errorf("interprocess event for rank %d: %w", rank, err)
		}
		own, handles = append(own, ev), append(handles, h)
	}
	e.ctx, e.own, e.handles = ctx, own, handles
	return handles, nil
}

// Handles returns the handles of the events Make made, or nil.
func (e *linkEvents) Handles() [][64]byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.handles
}

// SetReady records that the peer opened our events: our mapped
// put+signals to it may use them from now on.
func (e *linkEvents) SetReady() {
	e.mu.Lock()
	e.ready.Store(e.own != nil && !e.closed)
	e.mu.Unlock()
}

// Ready reports whether the peer opened our events.
func (e *linkEvents) Ready() bool { return e.ready.Load() }

// OpenPeer opens the peer's (rank's) event handles in ctx, once: the
// events its mapped put+signals to us record.
func (e *linkEvents) OpenPeer(rank int, ctx uintptr, handles [][64]byte) error {
	if len(handles) == 0 || len(handles) > 256 {
		return fmt.Errorf("%d event handles from rank %d", len(handles), rank)
	}
	ie, ok := devmem.Get().(devmem.IPCEvents)
	if !ok {
		return devmem.ErrUnsupported
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrNoIntra
	}
	if e.peer.Load() != nil {
		return nil
	}
	evs := make([]uintptr, 0, len(handles))
	for _, h := range handles {
		ev, err := ie.IPCEventOpen(ctx, h)
		if err != nil {
			freeEvents(ctx, evs)
			return fmt.Errorf("open an event of rank %d: %w", rank, err)
		}
		evs = append(evs, ev)
	}
	e.peerCtx = ctx
	e.peer.Store(&evs)
	return nil
}
