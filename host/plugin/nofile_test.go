package plugin

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRaiseNoFile: a soft RLIMIT_NOFILE below the hard one is raised to it.
func TestRaiseNoFile(t *testing.T) {
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	defer unix.Setrlimit(unix.RLIMIT_NOFILE, &old)
	if old.Max < 512 {
		t.Skipf("hard limit %d", old.Max)
	}
	low := unix.Rlimit{Cur: 256, Max: old.Max}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	raiseNoFile()
	var now unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NOFILE, &now)
	if now.Cur != old.Max {
		t.Fatalf("soft limit %d after raiseNoFile, want the hard limit %d", now.Cur, old.Max)
	}
}

// TestNoFileWarn: when even the hard limit is short of what connect needs,
// one WARN names the need; when it is not, nothing is logged.
func TestNoFileWarn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("lowers the hard limit, which only root can raise back")
	}
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	defer unix.Setrlimit(unix.RLIMIT_NOFILE, &old)
	warns := warnings(t)
	lim := unix.Rlimit{Cur: 4096, Max: 4096}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	checkNoFile(1024, 1, false) // 2,048 + what is open fits 4,096
	if w := warns(); len(w) != 0 {
		t.Fatalf("warned with enough descriptors: %q", w)
	}
	checkNoFile(4096, 1, false) // 8,192 do not
	if w := warns(); len(w) != 1 || !strings.Contains(w[0], "4096 ranks x 1 lanes x 2 descriptors") || !strings.Contains(w[0], "hard limit 4096") {
		t.Fatalf("WARN lines %q, want one naming 4096 ranks x 1 lanes x 2 descriptors and the hard limit", w)
	}
	checkNoFile(1024, 1, true) // sealed: 6,144 + what is open do not fit
	if w := warns(); len(w) != 2 || !strings.Contains(w[1], "1024 ranks x 1 lanes x 6 descriptors") {
		t.Fatalf("WARN lines %q, want a second naming 6 descriptors a rank when sealed", w)
	}
}
