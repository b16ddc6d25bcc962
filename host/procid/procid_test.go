package procid

import (
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestHostIDHelper prints this process's host id when run as the child of
// TestHostIDNamespaces.
func TestHostIDHelper(t *testing.T) {
	if os.Getenv("RMAW_HOSTID_HELPER") != "1" {
		t.Skip("helper process only")
	}
	id := HostID()
	fmt.Printf("HOSTID %s\n", hex.EncodeToString(id[:]))
}

// TestHostIDNamespaces: a process of this machine in another network
// namespace, or another pid namespace, has another host id, so it never
// takes the intra-node path to us; one in ours has ours.
func TestHostIDNamespaces(t *testing.T) {
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare (util-linux)")
	}
	self := HostID()
	want := hex.EncodeToString(self[:])
	child := func(t *testing.T, unshare ...string) string {
		args := append(unshare, os.Args[0], "-test.run=^TestHostIDHelper$", "-test.count=1")
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Env = append(os.Environ(), "RMAW_HOSTID_HELPER=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			if len(unshare) > 0 {
				t.Skipf("cannot make namespaces here (%v): %s", err, out)
			}
			t.Fatalf("helper: %v: %s", err, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if h, ok := strings.CutPrefix(l, "HOSTID "); ok {
				return h
			}
		}
		t.Fatalf("helper printed no host id: %s", out)
		return ""
	}
	if got := child(t); got != want {
		t.Fatalf("a child in our namespaces has host id %s, we have %s", got, want)
	}
	for _, c := range []struct {
		name string
		args []string
	}{{"net", []string{"unshare", "--net"}}, {"pid", []string{"unshare", "--pid", "--fork", "--mount-proc"}}} {
		t.Run(c.name, func(t *testing.T) {
			if got := child(t, c.args...); got == want {
				t.Fatalf("a process in another %s namespace has our host id %s", c.name, got)
			}
		})
	}
}

// TestWatch: a watch sees its process exit (before it is reaped) without
// allocating; the zero value and a closed watch see nothing.
func TestWatch(t *testing.T) {
	var none Watch
	if none.Armed() || none.Exited() || none.Open(0) {
		t.Fatal("the zero Watch watches something")
	}
	none.Close()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	defer cmd.Process.Kill()
	var w Watch
	if !w.Open(cmd.Process.Pid) {
		t.Skip("no pidfd on this kernel")
	}
	defer w.Close()
	if !w.Armed() || w.Exited() {
		t.Fatal("a live process reported exited")
	}
	if a := testing.AllocsPerRun(100, func() { w.Exited() }); a != 0 {
		t.Fatalf("Exited allocates %.0f times", a)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !w.Exited(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the process's exit was not seen")
		}
	}
	_ = cmd.Wait()
	w.Close()
	if w.Armed() || w.Exited() {
		t.Fatal("a closed Watch still watches")
	}
}
