package share

import (
	"encoding/binary"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/inbox"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
)

// fakeIPC is a mesh whose rank 1 is process 4242 on this host.
type fakeIPC struct{ handles [][64]byte }

func (f *fakeIPC) Pid(rank int) int {
	if rank == 1 {
		return 4242
	}
	return 0
}
func (f *fakeIPC) MakeEvents(int, uintptr) ([][64]byte, error) { return f.handles, nil }
func (f *fakeIPC) EventHandles(int) [][64]byte                 { return f.handles }
func (f *fakeIPC) SetEventsReady(int)                          {}
func (f *fakeIPC) EventsReady(int) bool                        { return false }
func (f *fakeIPC) OpenPeerEvents(int, uintptr, [][64]byte) error {
	return nil
}
func (f *fakeIPC) OpenPeerMarks(int, int) error     { return nil }
func (f *fakeIPC) SetMarksReady(int)                {}
func (f *fakeIPC) MarksReady(int) bool              { return false }
func (f *fakeIPC) PeerMarks(int) *staging.PeerMarks { return nil }
func (f *fakeIPC) SetPeerInbox(_ int, p *inbox.Peer) bool {
	p.Close()
	return false
}
func (f *fakeIPC) SetInboxRow(int, int) {}

// fakeRegs holds registration 7, host memory.
type fakeRegs struct {
	pins   atomic.Int32
	shared bool
}

func (g *fakeRegs) Resolve(id uint32) (unsafe.Pointer, uint64, uintptr, link.Pin, bool) {
	if id != 7 {
		return nil, 0, 0, link.Pin{}, false
	}
	return nil, 64, 0, link.NewPin(&g.pins), true
}
func (g *fakeRegs) DeviceContext(uint32) uintptr { return 0 }
func (g *fakeRegs) MarkShared(uint32)            { g.shared = true }

// The server answers only its intra-node peers' pids, refuses what it
// does not hold (host memory, unknown keys) and leaves nothing pinned.
func TestExchangeServe(t *testing.T) {
	var h [64]byte
	h[0] = 9
	regs := &fakeRegs{}
	x := New(Config{Rank: 0, Ranks: 2, Regs: regs})
	x.Attach(&fakeIPC{handles: [][64]byte{h}})
	if !x.sharePeer(4242) || x.sharePeer(4243) {
		t.Fatal("sharePeer does not tell the intra-node peer's pid")
	}
	for name, key := range map[string]uint64{
		"unknown registration": 8,
		"host memory":          7,
		"unknown kind":         9 << 32,
		"events of a stranger": keyEventHandles, // rank 0, which is not pid 4242
		"events of no rank":    keyEventHandles | 5,
		"open for no peer":     keyOpenEvents | 5<<keyRankShift | 7,
		"open in host memory":  keyOpenEvents | 1<<keyRankShift | 7,
		"marks of a stranger":  keyMarkPage, // rank 0, which is not pid 4242
		"marks of no rank":     keyMarkPage | 5,
		"no mark page":         keyMarkPage | 1, // none was made
		"marks for no peer":    keyOpenMarks | 5,
		"marks, no server":     keyOpenMarks | 1, // rank 1 offered none
	} {
		if _, _, err := x.serve(4242, key); err == nil {
			t.Errorf("%s: served", name)
		}
	}
	if regs.pins.Load() != 0 || regs.shared {
		t.Fatalf("%d pins left, shared %v", regs.pins.Load(), regs.shared)
	}
	if _, _, err := x.serve(4243, keyEventHandles|1); err == nil {
		t.Fatal("rank 1's events served to another pid")
	}
	p, fds, err := x.serve(4242, keyEventHandles|1)
	if err != nil || fds != nil || len(p) != 8+64 || binary.LittleEndian.Uint32(p) != 1 || binary.LittleEndian.Uint32(p[4:]) != segEvents || p[8] != 9 {
		t.Fatalf("rank 1's events: %v, %v, %v", p, fds, err)
	}
	var none Mapped
	x.Unmap(&none) // nothing mapped: nothing to do
	x.Stop()
}

// Offers are recorded per peer; a zero token is no offer.
func TestExchangePeerOffered(t *testing.T) {
	x := New(Config{Rank: 0, Ranks: 3})
	x.PeerOffered(1, 0)
	if x.tokens != nil {
		t.Fatal("a zero token recorded")
	}
	x.PeerOffered(2, 0xabc1)
	if x.tokens[2] != 0xabc1 {
		t.Fatalf("tokens %v", x.tokens)
	}
}
