package plugin

import (
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/intranode/share"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
)

// Device windows mapped between the processes of a host (SPEC.md §4,
// NCCL_RMA_WASM_INTRANODE_IPC): the descriptor exchange is
// host/dataplane/intranode/share's; this is the communicator's glue: it
// says whether the feature is on, offers a registration in its MsgReg,
// maps the peers' parts at regMrSym and unmaps them at deregMrSym.

// newShares returns the communicator's exchange; its mesh side is
// attached once connected.
func newShares(c *coll) *share.Exchange {
	return share.New(share.Config{Rank: c.rank, Ranks: c.nranks, Regs: c, Closed: &c.closed, Events: config.IntraIPCEvents.Get, Marks: config.IntraAgentMarks.Get, Inbox: inboxOn.Load})
}

// ipcOn says whether device windows are mapped between the ranks of a
// host: NCCL_RMA_WASM_INTRANODE_IPC where set, else on with CUDA (measured
// on an H100) and off with HIP (not yet measured on an AMD GPU).
func ipcOn() bool {
	if config.IntraIPC.Lookup() == "" {
		d := devmem.Get()
		return d != nil && d.Name() == "CUDA"
	}
	return config.IntraIPC.Get()
}

// local is m as the exchange sees it.
func (m *mr) local() share.Local {
	return share.Local{ID: m.id, Ctx: m.devCtx, Base: uintptr(m.base), Size: m.size}
}

// offerShare returns the token to put in m's MsgReg; 0: nothing to offer
// (off, host memory, or share.Exchange.Offer's reasons).
func (c *coll) offerShare(m *mr) uint64 {
	if m.devCtx == 0 || !ipcOn() {
		return 0
	}
	return c.shares.Offer(m.local())
}

// importShares maps, for every intra-node peer that offered registration
// m, its part of it (share.Exchange.Import).
func (c *coll) importShares(m *mr, rs *remoteRegs) {
	if rs.share == nil || m.devCtx == 0 || !ipcOn() {
		return
	}
	rs.mapped, m.maps = c.shares.Import(m.local(), share.Remote{Tokens: rs.share, Dev: rs.dev, Bases: rs.bases, Sizes: rs.sizes})
	keepAtomicPeers(m, rs)
}

// closeShares unmaps the mappings of registrations the caller never
// deregistered (the mesh is closed: nothing uses them) and takes them
// out of our peer inbox's table, which the process's other communicators
// keep using.
func (c *coll) closeShares() {
	c.shares.Stop()
	for _, m := range *c.regs.byID.Load() {
		if m != nil {
			c.shares.Unmap(&m.maps)
			m.releaseInbox()
		}
	}
}

// DeviceContext is the device context of registration id, 0 for host
// memory or no such registration (share.Registry).
func (c *coll) DeviceContext(id uint32) uintptr {
	if m := c.regs.lookup(id); m != nil {
		return m.devCtx
	}
	return 0
}

// MarkShared records that registration id was handed to a peer on this
// host (share.Registry); Shared reports it from then on.
func (c *coll) MarkShared(id uint32) {
	if m := c.regs.lookup(id); m != nil {
		m.shared.Store(true)
	}
}

// Shared reports whether registration id was handed to a peer on this
// host (dataplane.SharedOwner): puts into it land before they are
// acknowledged.
func (c *coll) Shared(id uint32) bool {
	m := c.regs.lookup(id)
	return m != nil && m.shared.Load()
}

var (
	_ dataplane.Owner       = (*coll)(nil)
	_ dataplane.SharedOwner = (*coll)(nil)
	_ share.Registry        = (*coll)(nil)
	_ share.IPC             = dataplane.IPC{}
)
