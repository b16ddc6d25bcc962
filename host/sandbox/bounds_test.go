package sandbox

// Hostile guests against the bounds of SPEC.md §8.6 that metering alone
// did not give: tables, bulk instructions, call depth, guest output.

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi/guestabi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/backend"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx/logtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/sandbox/meter"
)

func planPeer(c backend.Context, peer uint32, size uint64) error {
	p := backend.OpPlan{Lane: -1}
	return c.PlanOp(&backend.Op{Kind: backend.OpPut, Peer: peer, Size: size}, &p)
}

// TestTableCap: a table without a maximum grows to meter.MaxTableElements
// and no further; a table that starts above it is refused.
func TestTableCap(t *testing.T) {
	if _, err := Open(testOptions(t, wat(t, "tables"), "")); err == nil || !strings.Contains(err.Error(), "status -3") {
		t.Fatalf("growing a table past %d elements: %v, want rmaw_init's status -3 (table.grow refused)", meter.MaxTableElements, err)
	}
	if _, err := Open(testOptions(t, wat(t, "table_big"), "")); err == nil || !strings.Contains(err.Error(), "starts with 1048576 elements") {
		t.Fatalf("a table of 2^20 elements: %v, want refused", err)
	}
}

// TestBulkFuel: bulk instructions pay for their length (1 unit per 64 bytes
// or 8 table elements), so one of them over 2x the budget runs out of fuel
// instead of running for free.
func TestBulkFuel(t *testing.T) {
	path := wat(t, "bulk")
	for _, tc := range []struct {
		name string
		peer uint32
		unit uint64
	}{{"memory.fill", 1, 64}, {"memory.copy", 2, 64}, {"memory.init", 3, 64}, {"table.fill", 4, 8}, {"table.copy", 5, 8}, {"table.grow", 7, 8}} {
		t.Run(tc.name, func(t *testing.T) {
			o := testOptions(t, path, "")
			o.CallTimeout = time.Millisecond // plan_op: the minimum of 10000 units
			b := mustOpen(t, o)
			c, err := b.NewContext(info)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if tc.peer != 3 { // a small one fits (memory.init's segment is empty)
				if err := planPeer(c, tc.peer, 1024); err != nil {
					t.Fatalf("a %s of 1024: %v", tc.name, err)
				}
			}
			n := uint64(b.planFuel) * tc.unit * 2
			if err := planPeer(c, tc.peer, n); !errors.Is(err, ErrTimeout) {
				t.Fatalf("a %s of %d with %d units of fuel: %v, want ErrTimeout", tc.name, n, b.planFuel, err)
			}
		})
	}
	// memory.fill of 60000 bytes in a loop: stopped after ~budget/940 rounds.
	b := mustOpen(t, testOptions(t, path, ""))
	c, err := b.NewContext(info)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if err := planPeer(c, 6, 60000); !errors.Is(err, ErrTimeout) {
		t.Fatalf("memory.fill loop: %v, want ErrTimeout", err)
	}
	t.Logf("memory.fill loop stopped after %v (budget %d units)", time.Since(start), b.planFuel)
}

// TestCallDepth: calls nest up to meter.MaxCallDepth; every way out of a
// function (return, a branch to its label) gives its frame back, and the
// call that would go deeper traps (a fault, not a timeout).
func TestCallDepth(t *testing.T) {
	b := mustOpen(t, testOptions(t, wat(t, "depth"), ""))
	c, err := b.NewContext(info)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// plan_op and $down's frames: MaxCallDepth-1 levels of $down fit, three
	// times in one call.
	for i := 0; i < 3; i++ {
		if err := planPeer(c, 1, meter.MaxCallDepth-2); err != nil {
			t.Fatalf("recursion %d deep: %v", meter.MaxCallDepth-2, err)
		}
	}
	if err := planPeer(c, 7, 0); err != nil {
		t.Fatalf("multi-value return: %v", err)
	}
	err = planPeer(c, 1, meter.MaxCallDepth)
	if err == nil || !strings.Contains(err.Error(), "call depth limit") || errors.Is(err, ErrTimeout) {
		t.Fatalf("recursion %d deep: %v, want a call depth trap", meter.MaxCallDepth, err)
	}
	if err := planPeer(c, 1, 10); err != nil || b.Disabled() {
		t.Fatalf("after one depth fault the replaced instance should serve: %v", err)
	}
}

// captureLog collects log lines until the test ends.
func captureLog(t *testing.T) func() []string { return logtest.All(t) }

// TestGuestOutputBounds: a guest that floods stdout or rmaw.log gets
// maxOutLinesPerCall lines per call and maxOutLinesPerInstance per
// instance, lines cut at guestabi.MaxLogLen bytes, one WARN per call for
// the rest, and pays fuel per byte.
func TestGuestOutputBounds(t *testing.T) {
	logged := captureLog(t)
	start := time.Now()
	b := mustOpen(t, testOptions(t, wat(t, "stdio"), ""))
	t.Logf("rmaw_init writing 1 MiB of newlines took %v", time.Since(start))
	count := func(lines []string) (stdio, hello, dropped int) {
		for _, l := range lines {
			switch {
			case strings.Contains(l, "(stdio): "):
				stdio++
				if body := l[strings.Index(l, "(stdio): ")+9:]; len(body) > guestabi.MaxLogLen {
					t.Errorf("a stdio line of %d bytes", len(body))
				}
			case strings.HasSuffix(l, ": hello"):
				hello++
			case strings.Contains(l, "dropped"):
				dropped++
			}
		}
		return
	}
	lines := logged()
	stdio, hello, dropped := count(lines)
	if stdio != maxOutLinesPerCall || hello != 0 || dropped != 1 {
		t.Fatalf("init: %d stdio lines, %d rmaw.log lines, %d drop warnings; want %d, 0, 1", stdio, hello, dropped, maxOutLinesPerCall)
	}
	if l := lines[0]; !strings.HasSuffix(l, strings.Repeat("A", guestabi.MaxLogLen)) {
		t.Errorf("the 5000-byte line was logged as %d bytes, want it cut at %d", len(l), guestabi.MaxLogLen)
	}
	for _, l := range lines {
		if strings.Contains(l, "dropped") {
			t.Logf("the warning: %s", l)
		}
	}

	// A new instance: its init, then plan_ops of 64 Ki newlines each, up to
	// the per-instance limit.
	c, err := b.NewContext(info)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := 0; i < 20; i++ {
		if err := planPeer(c, 1, 64<<10); err != nil {
			t.Fatal(err)
		}
	}
	stdio, _, dropped = count(logged())
	if want := maxOutLinesPerCall + maxOutLinesPerInstance; stdio != want {
		t.Errorf("%d stdio lines from two instances, want %d", stdio, want)
	}
	if dropped > 2+maxOutLinesPerInstance/maxOutLinesPerCall {
		t.Errorf("%d drop warnings: once the instance's limit is reported it should go quiet", dropped)
	}
	// 1 MiB written in plan_op costs more than its budget.
	if err := planPeer(c, 1, 1<<20); !errors.Is(err, ErrTimeout) {
		t.Fatalf("plan_op writing 1 MiB: %v, want ErrTimeout (output bytes cost fuel)", err)
	}
}

// TestModuleFileBounds: a backend path that is a FIFO, a directory or a file
// over MaxModuleBytes, or a configuration over guestabi.MaxConfigLen, is
// refused at once with a clear error (before: a FIFO blocked the load
// until a writer came, and any size was read).
func TestModuleFileBounds(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.wasm")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.wasm")
	if err := os.WriteFile(big, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, MaxModuleBytes+1); err != nil { // sparse
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "dir.wasm"), 0o700); err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(cguest(t, "planner"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "planner.wasm"), src)
	writeFile(t, filepath.Join(dir, "planner.conf"), make([]byte, guestabi.MaxConfigLen+1))
	for _, c := range []struct{ name, want string }{
		{"fifo", "not a regular file"},
		{"dir", "not a regular file"},
		{"big", "the limit is 268435456"},
		{"planner", "more than 65536 bytes"},
	} {
		done := make(chan error, 1)
		go func() {
			_, err := Open(Options{Name: c.name, Dir: dir, CacheDir: "off"})
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: Open = %v, want an error containing %q", c.name, err, c.want)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s: Open blocked", c.name)
		}
	}
}
