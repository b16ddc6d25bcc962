package dataplane

import (
	"fmt"
	"io"
)

// A peer list (Options.Peers): the ranks a rank connects to when it does
// not connect to all of them. NCCL's GIN proxy with
// NCCL_GIN_CONNECTION_FULL connects every pair; a v17 peer list would let
// a rank name only the peers its kernels reach.

// peerSet turns a peer list into one flag per rank; nil means every rank.
// The rank itself is always in the set (loopback operations use it).
func peerSet(peers []int, rank, n int) ([]bool, error) {
	want := make([]bool, n)
	if peers == nil {
		for i := range want {
			want[i] = true
		}
		return want, nil
	}
	want[rank] = true
	for _, r := range peers {
		if r < 0 || r >= n {
			return nil, fmt.Errorf("peer list names rank %d outside [0, %d)", r, n)
		}
		want[r] = true
	}
	return want, nil
}

// absentPeer is a rank outside the peer list: dead from the start, so
// Close does not wait for its goodbye, and small (a rank of a large
// communicator holds one per rank it does not connect).
func absentPeer(m *Mesh, rank int) *peer {
	p := &peer{m: m, rank: rank, lanes: m.lanes, quit: make(chan struct{})}
	p.t = absentLink{p}
	p.dead.Store(true)
	return p
}

// absentLink is an absent peer's transport: every operation fails as to
// a lost peer.
type absentLink struct{ p *peer }

func (a absentLink) Props() Props                           { return Props{Name: "absent", Lanes: a.p.lanes} }
func (a absentLink) Start()                                 {}
func (a absentLink) Submit(_ int, op Op, _ bool)            { a.p.fail(&op) }
func (a absentLink) SubmitCaller(_ int, op Op, _ bool) bool { a.p.fail(&op); return false }
func (a absentLink) WriteLone(int)                          {}
func (a absentLink) Flush()                                 {}
func (a absentLink) Turn()                                  {}
func (a absentLink) Kick()                                  {}
func (a absentLink) Idle() bool                             { return true }
func (a absentLink) Stop()                                  {}
func (a absentLink) Awaiting() int                          { return 0 }
func (a absentLink) FailAll()                               {}
func (a absentLink) WholeOp(Op) bool                        { return true }
func (a absentLink) SignalApart(Op) bool                    { return false }
func (a absentLink) Release()                               {}
func (a absentLink) WriteState(io.Writer)                   {}
func (a absentLink) AddStats(*Stats)                        {}
