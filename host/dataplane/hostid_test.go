package dataplane

import (
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
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
