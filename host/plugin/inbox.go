package plugin

import (
	"sync/atomic"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/inbox"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// Signals handed to the target's device agent through its peer inbox
// (NCCL_RMA_WASM_INTRANODE_INBOX; host/devmem/inbox). A rank with it on
// enters its device registrations into its inbox's table (mr.go) and
// offers them in its MsgReg; a sender marks a put+signal for it when the
// signal registration's part on the target is in the target's table, the
// value and offset fit an entry, and, for a payload, our agent copies it
// into the target's mapped window. The intra-node link's direct path then
// writes the entry (or, when the target handed us no row, ends the path
// for the peer), and dataplane's peer.directRoute keeps the order.

// inboxOn is NCCL_RMA_WASM_INTRANODE_INBOX, read at init.
var inboxOn atomic.Bool

// markInbox sets op.InboxIdx and op.Direct where the target's agent may
// add op's signal, at off of registration sig on rank, from our agent's
// inbox entry.
func (sig *mr) markInbox(op *dataplane.Op, rank uint32, off uint64) {
	r := sig.remote.Load()
	v := op.SigValue
	if op.SigOp == abi.SignalOpInc {
		v = 1
	}
	switch {
	case r.inbox == nil || r.inbox[rank] == 0:
		inboxNot(rank, "its part of the signal registration is not in its peer inbox's table (another host, the setting off there, or no device agent in its context)")
		return
	case !inbox.Fits(off, v):
		inboxNot(rank, "the signal's value is above 2^28-1 or its offset beyond 32 MiB")
		return
	case op.Size > 0 && (op.Mapped == 0 || op.LocalCtx == 0 || !staging.AgentRuns(op.LocalCtx)):
		inboxNot(rank, "the payload is not copied into its mapped window by our device agent (host memory, its window not mapped, or no agent)")
		return
	}
	op.InboxIdx, op.Direct = r.inbox[rank], true
}

// inboxNotSaid: inboxNot has said why, once per process.
var inboxNotSaid atomic.Bool

// inboxNot says, once per process, why the first put+signal or signal
// that could not go through the target's inbox did not.
func inboxNot(rank uint32, why string) {
	if !inboxNotSaid.Load() && inboxNotSaid.CompareAndSwap(false, true) {
		logx.Info(abi.SubsysNet, "NET/wasm: a signal to rank %d does not go through its peer inbox (NCCL_RMA_WASM_INTRANODE_INBOX): %s; later ones are not reported", rank, why)
	}
}
