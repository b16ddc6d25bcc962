package plugin

import (
	"errors"
	"testing"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/devtest"
)

// gpus is a fake device of several GPUs: an address's GPU is its high
// byte, and atomics cross from GPU a to b where linked[a][b].
type gpus struct {
	devtest.Pipe
	linked map[[2]int]bool
}

func (g *gpus) Locate(_, ptr uintptr) (int, int, error) {
	if ptr == 0 {
		return 0, 0, errors.New("no device")
	}
	return devmem.IfaceCUDA, int(ptr >> 56), nil
}
func (g *gpus) PeerAtomics(a, b int) bool { return a == b || g.linked[[2]int{a, b}] }

// TestDirectAddsOnlyWhereAtomic: a peer's offer of its signal words for
// our agent's adds is kept only where its part is mapped here on our GPU
// or on one our GPU's atomics reach natively (NVLink); over a link
// without them, or unmapped, the peer's host applies our signals.
func TestDirectAddsOnlyWhereAtomic(t *testing.T) {
	g := &gpus{linked: map[[2]int]bool{{1, 2}: true}}
	devmem.Register(g)
	defer devmem.Register(nil)
	at := func(gpu int) uintptr { return uintptr(gpu)<<56 | 0x1000 }
	own := at(1)
	m := &mr{base: *(*unsafe.Pointer)(unsafe.Pointer(&own)), devCtx: 1} // ours, on GPU 1
	rs := &remoteRegs{adds: []bool{true, true, true, true, false}, mapped: []uintptr{at(1), at(2), at(3), 0, at(1)}}
	keepAtomicPeers(m, rs)
	want := []bool{true, true, false, false, false}
	for p := range want {
		if rs.adds[p] != want[p] {
			t.Fatalf("rank %d (GPU %d, mapped %v): adds %v, want %v", p, rs.mapped[p]>>56, rs.mapped[p] != 0, rs.adds[p], want[p])
		}
	}
}
