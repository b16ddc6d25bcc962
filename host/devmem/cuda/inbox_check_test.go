package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestInboxFakeDriver runs inboxCheck in a child process whose libcuda.so.1
// is test/gpu/fakecuda.c, the stand-in driver, its agent 20 µs late per
// command and entry: the peer inbox's rows, table, counts, refusals and
// kick, through the C files as the plugin calls them.
func TestInboxFakeDriver(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the stand-in driver")
	}
	dir := t.TempDir()
	cc := exec.Command("cc", "-shared", "-fPIC", "-o", filepath.Join(dir, "libcuda.so.1"), "../../../test/gpu/fakecuda.c", "-lpthread")
	if out, err := cc.CombinedOutput(); err != nil {
		t.Skipf("no C compiler for the stand-in driver: %v\n%s", err, out)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestInboxChild$", "-test.v")
	cmd.Env = append(os.Environ(), "RMAW_INBOX_CHILD=1", "LD_LIBRARY_PATH="+dir, "FAKECUDA_AGENT_US=20")
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	for _, want := range []string{"fakecuda: the device agent added a peer's inbox entry", "fakecuda: the device agent refused an inbox entry", "fakecuda: the device agent parked", "PASS"} {
		if !contains(out, want) {
			t.Errorf("child's output lacks %q", want)
		}
	}
}

// TestInboxChild is TestInboxFakeDriver's child; on a GPU machine,
// RMAW_INBOX_CHILD=1 runs it on the real driver (cuda.test built with go
// test -c).
func TestInboxChild(t *testing.T) {
	if os.Getenv("RMAW_INBOX_CHILD") != "1" {
		t.Skip("the child of TestInboxFakeDriver")
	}
	got, err := inboxCheck(200)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(got)
}

func contains(b []byte, s string) bool { return strings.Contains(string(b), s) }
