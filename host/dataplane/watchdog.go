package dataplane

import (
	"fmt"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/ofi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// The peer watchdog. A peer that stops answering (its process stopped with
// SIGSTOP, its host frozen, a path that drops every packet) leaves the
// operations posted to it pending forever: TCP never fails a connection
// whose peer still answers window probes, and a get's request was
// acknowledged by the peer's kernel long ago. So once per tick the
// watchdog reads, for every peer with work outstanding, how many bytes the
// kernel moved on that peer's streams (acknowledged by the peer plus
// received from it, TCP_INFO); a peer whose count has not moved for
// Options.PeerTimeout is failed like a lost connection. Progress of any
// kind resets the count, so a slow link or a long transfer is never cut;
// ticks, not wall time, are counted, so a process that was itself
// stopped does not blame its peers when it resumes.

// progresser is a transport that can tell how many bytes moved to and
// from the peer; ok is false when it cannot (the watchdog skips it).
type progresser interface {
	Progress() (n uint64, ok bool)
}

// The watchdog finds these only by assertion: a renamed method would
// silently turn it off for them.
var (
	_ progresser = (*tcp.Link)(nil)
	_ progresser = (*ofi.Link)(nil)
)

// watchTick is the watchdog's period for timeout: an eighth of it, kept
// between 10 ms and 1 s.
func watchTick(timeout time.Duration) time.Duration {
	return min(max(timeout/8, 10*time.Millisecond), time.Second)
}

// watch runs until the mesh closes; see above.
func (m *Mesh) watch(timeout time.Duration) {
	defer m.wg.Done()
	tick := watchTick(timeout)
	need := int((timeout + tick - 1) / tick)
	last := make([]uint64, len(m.peers))
	stalled := make([]int, len(m.peers))
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-m.quit:
			return
		case <-t.C:
		}
		for i, p := range m.peers {
			if i == m.rank || p.dead.Load() {
				continue // our own process is never stalled behind our back
			}
			pr, ok := p.t.(progresser)
			if !ok {
				continue
			}
			n, ok := pr.Progress()
			if !ok || n != last[i] || p.t.Idle() {
				last[i], stalled[i] = n, 0
				continue
			}
			if stalled[i]++; stalled[i] < need {
				continue
			}
			err := fmt.Errorf("rank %d moved no byte for %v with operations outstanding (NCCL_RMA_WASM_PEER_TIMEOUT_MS)", i, timeout)
			logx.Warn(abi.SubsysNet, "NET/wasm: rank %d: %v; failing its operations", m.rank, err)
			p.markDead(err)
		}
	}
}
