package dataplane

import (
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/intranode"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/inbox"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
)

var errNoIntra = intranode.ErrNoIntra

// IPC is the mesh's side of the descriptor exchange with the other
// processes of this host (share.IPC, host/dataplane/intranode/share):
// which peer a process is, and the interprocess events of mapped
// put+signals. It answers for the peers the intra-node path carries; for
// any other, as for a peer it does not know.
type IPC struct{ m *Mesh }

// IPC returns the mesh's intra-node exchange.
func (m *Mesh) IPC() IPC { return IPC{m} }

// ipcPeer is what the exchange needs of an intra-node link.
type ipcPeer interface {
	PeerPid() int
	IPCEvents() *intranode.Events
}

// Found by assertion only: a renamed method would silently leave the
// exchange without its peers.
var _ ipcPeer = (*intranode.Link)(nil)

func (c IPC) intra(rank int) (ipcPeer, error) {
	m := c.m
	if rank < 0 || rank >= len(m.peers) || rank == m.rank {
		return nil, errNoIntra
	}
	x, ok := m.peers[rank].t.(ipcPeer)
	if !ok {
		return nil, errNoIntra
	}
	return x, nil
}

// Pid is the pid of rank's process when the intra-node path carries
// its operations (another process of this host), else 0.
func (c IPC) Pid(rank int) int {
	if x, err := c.intra(rank); err == nil {
		return x.PeerPid()
	}
	return 0
}

// MakeEvents makes, once, the events our mapped put+signals to rank
// record (in ctx) and returns their handles.
func (c IPC) MakeEvents(rank int, ctx uintptr) ([][64]byte, error) {
	x, err := c.intra(rank)
	if err != nil {
		return nil, err
	}
	return x.IPCEvents().Make(rank, ctx)
}

// EventHandles returns the handles of the events MakeEvents made for
// rank, or nil.
func (c IPC) EventHandles(rank int) [][64]byte {
	x, err := c.intra(rank)
	if err != nil {
		return nil
	}
	return x.IPCEvents().Handles()
}

// SetEventsReady records that rank opened our events: our mapped
// put+signals to it may use them from now on.
func (c IPC) SetEventsReady(rank int) {
	if x, err := c.intra(rank); err == nil {
		x.IPCEvents().SetReady()
	}
}

// EventsReady reports whether rank opened our events.
func (c IPC) EventsReady(rank int) bool {
	x, err := c.intra(rank)
	return err == nil && x.IPCEvents().Ready()
}

// OpenPeerEvents opens rank's event handles in ctx, once: the events its
// mapped put+signals to us record.
func (c IPC) OpenPeerEvents(rank int, ctx uintptr, handles [][64]byte) error {
	x, err := c.intra(rank)
	if err != nil {
		return err
	}
	return x.IPCEvents().OpenPeer(rank, ctx, handles)
}

// OpenPeerMarks maps rank's mark page from fd, once: the page its agent
// marks its mapped copies into our memory on.
func (c IPC) OpenPeerMarks(rank int, fd int) error {
	x, err := c.intra(rank)
	if err != nil {
		return err
	}
	return x.IPCEvents().OpenPeerMarks(fd, x.PeerPid())
}

// SetPeerInbox keeps rank's inbox row mapped here (p is closed when the
// link cannot take it).
func (c IPC) SetPeerInbox(rank int, p *inbox.Peer) bool {
	x, err := c.intra(rank)
	if err != nil {
		p.Close()
		return false
	}
	return x.IPCEvents().SetPeerInbox(p)
}

// SetInboxRow records the row of our inbox that rank got.
func (c IPC) SetInboxRow(rank, row int) {
	if x, err := c.intra(rank); err == nil {
		x.IPCEvents().SetInboxRow(row, x.PeerPid())
	}
}

// PeerMarks is rank's mark page mapped here, or nil.
func (c IPC) PeerMarks(rank int) *staging.PeerMarks {
	if x, err := c.intra(rank); err == nil {
		return x.IPCEvents().PeerMarks()
	}
	return nil
}

// SetMarksReady records that rank mapped our mark page: our mapped
// put+signals to it whose copy is the agent's are marked from now on.
func (c IPC) SetMarksReady(rank int) {
	if x, err := c.intra(rank); err == nil {
		x.IPCEvents().SetMarksReady()
	}
}

// MarksReady reports whether rank mapped our mark page.
func (c IPC) MarksReady(rank int) bool {
	x, err := c.intra(rank)
	return err == nil && x.IPCEvents().MarksReady()
}
