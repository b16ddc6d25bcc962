package sandbox

// Info: what tools (cmd/rmaw) show about a loaded backend. Reading it costs
// nothing on the data path; it reports the control instance's answers.

import (
	"sort"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
)

// Info describes a loaded guest backend.
type Info struct {
	Name         string
	Exports      []string // the ABI exports the module defines, sorted
	HostFeatures uint64   // what the host offered rmaw_init
	Features     uint64   // what the control instance's rmaw_init enabled
	Area         uint32   // address of the descriptor area
	CompCap      uint32   // completion records the area holds
	MemoryBytes  uint32   // the control instance's linear memory after init
	Faults       int32    // faults counted so far
	Disabled     bool
}

// Info reports what the module exports and what its control instance
// negotiated. After Close, or when the control instance was replaced after a
// fault and not revived, the instance fields are zero.
func (b *Backend) Info() Info {
	inf := Info{Name: b.name, HostFeatures: guestabi.FeaturesV11, Faults: b.faults.Load(), Disabled: b.disabled.Load()}
	for n := range b.exports {
		inf.Exports = append(inf.Exports, n)
	}
	sort.Strings(inf.Exports)
	b.ctlMu.Lock()
	defer b.ctlMu.Unlock()
	if in := b.ctl; in != nil && in.mod != nil {
		inf.Features, inf.Area, inf.CompCap, inf.MemoryBytes = in.features, in.area, in.compCap, in.mem.Size()
	}
	return inf
}
