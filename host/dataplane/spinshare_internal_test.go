package dataplane

import (
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// TestShareSpinners: a host's budget of spinning readers is divided among
// the job's processes on that host, told apart by pid; ranks on other
// hosts, and ranks that share a process, do not divide it further.
func TestShareSpinners(t *testing.T) {
	a, b := [8]byte{1}, [8]byte{2}
	h := func(host [8]byte, pid uint32) wire.HandleInfo { return wire.HandleInfo{HostID: host, Pid: pid} }
	cases := []struct {
		name   string
		budget int
		infos  []wire.HandleInfo
		rank   int
		want   int
		procs  int
	}{
		{"alone", 4, []wire.HandleInfo{h(a, 10)}, 0, 4, 1},
		{"one per host", 4, []wire.HandleInfo{h(a, 10), h(b, 10)}, 1, 4, 1},
		{"two on the host", 4, []wire.HandleInfo{h(a, 10), h(a, 11), h(b, 12)}, 0, 2, 2},
		{"four on the host", 4, []wire.HandleInfo{h(a, 10), h(a, 11), h(a, 12), h(a, 13)}, 2, 1, 4},
		{"more processes than spinners", 4, []wire.HandleInfo{h(a, 1), h(a, 2), h(a, 3), h(a, 4), h(a, 5), h(a, 6), h(a, 7), h(a, 8)}, 0, 0, 8},
		{"two ranks of one process", 4, []wire.HandleInfo{h(a, 10), h(a, 10), h(a, 11)}, 0, 2, 2},
		{"ranks not connected (zero handles)", 4, []wire.HandleInfo{h(a, 10), {}, {}, h(a, 11)}, 3, 2, 2},
		{"no budget", 0, []wire.HandleInfo{h(a, 10), h(a, 11)}, 0, 0, 2},
	}
	for _, c := range cases {
		if got, procs := shareSpinners(c.budget, c.infos, c.rank); got != c.want || procs != c.procs {
			t.Errorf("%s: %d spinners among %d processes, want %d among %d", c.name, got, procs, c.want, c.procs)
		}
	}
}
