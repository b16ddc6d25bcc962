package plugin

import (
	"sync/atomic"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
)

// Signals added by our device agent into a peer's mapped signal word
// (NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL; the intra-node link's direct.go
// carries them, dataplane's peer.directRoute keeps their order). A rank
// with it on offers its device registrations for such adds (share's
// DirectAdds bit in its MsgReg): it keeps no never-reset shadow for them
// and adds to their words with device atomics only. A sender marks a
// put+signal for it when the signal registration's part on the target
// takes the adds and is mapped here on our GPU or one whose memory our
// GPU's atomics reach natively (NVLink), and the agent runs
// in the context that copies: its payload's, mapped too, or for a signal
// alone the signal registration's.

// directSignal is NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL, read at init.
var directSignal atomic.Bool

// markDirect sets op.SigMapped (and, for a signal alone, op.MapCtx) where
// the agent may add op's signal into rank's word at off of registration
// sig itself.
func (sig *mr) markDirect(op *dataplane.Op, rank uint32, off uint64) {
	r := sig.remote.Load()
	if r.adds == nil || !r.adds[rank] || r.mapped == nil || r.mapped[rank] == 0 {
		return
	}
	ctx := sig.devCtx
	if op.Size > 0 {
		if op.Mapped == 0 || op.LocalCtx == 0 {
			return
		}
		ctx = op.LocalCtx
	}
	if !staging.AgentRuns(ctx) {
		return
	}
	op.SigMapped, op.Direct = uint64(r.mapped[rank])+off, true
	if op.Size == 0 {
		op.MapCtx = ctx
	}
}

// peerAtomics is the device's PeerAtomics (host/devmem/cuda).
type peerAtomics interface{ PeerAtomics(a, b int) bool }

// keepAtomicPeers drops the adds of ranks whose part of m lies on another
// GPU that ours reaches without native atomics (over PCIe, where a device
// atomic may not be one): the agent adds within one GPU, or across NVLink.
func keepAtomicPeers(m *mr, rs *remoteRegs) {
	if rs.adds == nil {
		return
	}
	d, ok := devmem.Get().(devmem.Locator)
	if !ok {
		rs.adds = nil
		return
	}
	_, own, err := d.Locate(m.devCtx, uintptr(m.base))
	for p := range rs.adds {
		if !rs.adds[p] {
			continue
		}
		if err != nil || rs.mapped == nil || rs.mapped[p] == 0 {
			rs.adds[p] = false
			continue
		}
		_, dev, err := d.Locate(m.devCtx, rs.mapped[p])
		if pa, ok := d.(peerAtomics); err != nil || (dev != own && (!ok || !pa.PeerAtomics(own, dev))) {
			rs.adds[p] = false
		}
	}
}
