package plugin

import (
	"sync/atomic"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
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
	switch {
	case r.mapped == nil || r.mapped[rank] == 0:
		directNot(rank, "its part of the signal registration is not mapped here (another host, or not a cuMem allocation with POSIX file descriptors)")
		return
	case r.adds == nil || !r.adds[rank]:
		directNot(rank, "its part of the signal registration takes no agent adds (the setting off there, or on another GPU without native atomics)")
		return
	}
	ctx := sig.devCtx
	if op.Size > 0 {
		if op.Mapped == 0 || op.LocalCtx == 0 {
			directNot(rank, "the payload is not copied into its mapped window (host memory, or its window not mapped)")
			return
		}
		ctx = op.LocalCtx
	}
	if !staging.AgentRuns(ctx) {
		directNot(rank, "no device agent runs in the copying context")
		return
	}
	op.SigMapped, op.Direct = uint64(r.mapped[rank])+off, true
	if op.Size == 0 {
		op.MapCtx = ctx
	}
}

// directNotSaid: directNot has said why, once per process.
var directNotSaid atomic.Bool

// directNot says, once per process, why the first put+signal or signal
// that could not take the direct signal did not: an operator who set
// NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL and never sees the path learns
// which condition failed. One atomic load per operation after that.
func directNot(rank uint32, why string) {
	if !directNotSaid.Load() && directNotSaid.CompareAndSwap(false, true) {
		logx.Info(abi.SubsysNet, "NET/wasm: a signal to rank %d is applied by its host, not added by our device agent (NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL): %s; later ones are not reported", rank, why)
	}
}

// directNotOursSaid: directNotOurs has spoken.
var directNotOursSaid atomic.Bool

// directNotOurs says, once per process, that the setting is on but our
// device registrations are not offered for our peers' agents' adds.
func directNotOurs() {
	if directNotOursSaid.CompareAndSwap(false, true) {
		logx.Info(abi.SubsysNet, "NET/wasm: our device signal words are not offered for our peers' device agents' adds (NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL): device windows are not mapped between ranks (NCCL_RMA_WASM_INTRANODE_IPC), or no device agent runs in their context, or the driver's stream atomics or GDRCopy serve them")
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
			if err != nil {
				directNot(uint32(p), "our device of the signal registration is unknown: "+err.Error())
			}
			rs.adds[p] = false
			continue
		}
		_, dev, err := d.Locate(m.devCtx, rs.mapped[p])
		if pa, ok := d.(peerAtomics); err != nil || (dev != own && (!ok || !pa.PeerAtomics(own, dev))) {
			if err != nil {
				directNot(uint32(p), "the device of its mapped signal words is unknown: "+err.Error())
			} else {
				directNot(uint32(p), "its signal words lie on another GPU that ours reaches without native atomics")
			}
			rs.adds[p] = false
		}
	}
}
