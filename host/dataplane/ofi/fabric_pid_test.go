package ofi_test

import (
	"os/exec"
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/ofi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/tcp"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fabric/endpoint"
)

// TestFabricPeerExited: an shm link sees its peer's process exit (before
// it is even reaped) without allocating; other providers are not armed.
func TestFabricPeerExited(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	defer cmd.Process.Kill()
	link := func(prov string) *ofi.Link {
		f := ofi.BareLink(&endpoint.Endpoint{}, tcp.NewLink(dataplane.BarePeer(1), nil, nil))
		f.EP().Info.Provider = prov
		f.WatchPid(cmd.Process.Pid)
		return f
	}
	tcp, shm := link("tcp;ofi_rxm"), link("shm")
	if tcp.Pid().Armed() {
		t.Fatal("a tcp link watches its peer's pid")
	}
	if !shm.Pid().Armed() {
		t.Skip("no pidfd on this kernel")
	}
	if shm.Pid().Exited() || shm.PeerGone() != nil {
		t.Fatal("a live peer reported exited")
	}
	if a := testing.AllocsPerRun(100, func() { shm.Pid().Exited() }); a != 0 {
		t.Fatalf("exited allocates %.0f times", a)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !shm.Pid().Exited(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the peer's exit was not seen")
		}
	}
	if err := shm.PeerGone(); err == nil {
		t.Fatal("peerGone is nil for an exited peer")
	}
	_ = cmd.Wait()
}
