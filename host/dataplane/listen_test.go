package dataplane

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/handshake"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/handshake/admission"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx/logtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// warnings captures the WARN lines logged until the test ends.
func warnings(t *testing.T) func() []string {
	t.Helper()
	return logtest.Warnings(t)
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func countMatching(lines []string, sub string) int {
	n := 0
	for _, l := range lines {
		if strings.Contains(l, sub) {
			n++
		}
	}
	return n
}

// TestAcceptSurvivesEMFILE runs in a child process whose descriptor limit
// it lowers: strangers' connections use up every descriptor, so accept
// fails with EMFILE. Once they are gone, the listener must answer again
// and a full connect must succeed (before the fix the accept loop ended
// on the first error, silently, and connect timed out).
func TestAcceptSurvivesEMFILE(t *testing.T) {
	if os.Getenv("RMAW_TEST_EMFILE_CHILD") != "1" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestAcceptSurvivesEMFILE$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "RMAW_TEST_EMFILE_CHILD=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestAcceptSurvivesEMFILE") {
			t.Fatalf("child: %v\n%s", err, out)
		}
		return
	}
	got := warnings(t)
	resetLimits()
	ls := make([]*Listener, 2)
	hs := make([]*wire.Handle, 2)
	for i := range ls {
		l, h, err := Listen(ListenOptions{Addr: "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ls[i], hs[i] = l, h
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	// Room for the connect below (2 ranks: 4 streams, 8 descriptors) and
	// little more.
	lim := syscall.Rlimit{Cur: uint64(len(fds)) + 24, Max: old.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	defer syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old)

	var strangers []net.Conn
	for i := 0; i < 200; i++ {
		c, err := net.DialTimeout("tcp", ls[0].Addr().String(), time.Second)
		if err != nil {
			if !errors.Is(err, syscall.EMFILE) {
				t.Logf("stranger %d: %v", i, err)
			}
			break
		}
		strangers = append(strangers, c)
	}
	if len(strangers) == 200 {
		t.Fatal("never ran out of descriptors")
	}
	// The kernel completed handshakes that accept cannot take: it fails.
	waitFor(t, "an accept failure WARN", func() bool { return countMatching(got(), "too many open files") > 0 })
	for _, c := range strangers {
		c.Close()
	}
	owners := []*memOwner{{mem: make([]byte, 64), done: map[uint64]abi.Result{}}, {mem: make([]byte, 64), done: map[uint64]abi.Result{}}}
	ms := make([]*Mesh, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range ms {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			ms[i], errs[i] = Connect(ls[i], hs, i, owners[i], Options{Timeout: 20 * time.Second, Lanes: 1, CloseTimeout: time.Second})
		}(i)
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("connect after the descriptors came back: %v / %v", errs[0], errs[1])
	}
	ms[0].Close()
	ms[1].Close()
	if n := countMatching(got(), "NET/wasm: accept on"); n > 11 {
		t.Fatalf("%d accept failure lines: not rate limited", n)
	}
}

// TestStrangerCap: idle connections beyond maxStrangers are closed at
// accept with a rate-limited WARN; once the hello deadline frees the slots
// a real dialer gets in.
func TestStrangerCap(t *testing.T) {
	got := warnings(t)
	resetLimits()
	defer func(n int32, d time.Duration) { maxStrangers, helloTimeout = n, d }(maxStrangers, helloTimeout)
	maxStrangers, helloTimeout = 4, 500*time.Millisecond
	l, h, err := Listen(ListenOptions{Addr: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	hi, _ := wire.DecodeHandle(h)
	var idle []net.Conn
	for i := 0; i < 40; i++ {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle = append(idle, c)
	}
	// The listener holds 4; the other 36 are closed without a word.
	closed := 0
	for _, c := range idle {
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		var b [1]byte
		if _, err := c.Read(b[:]); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			closed++
		}
	}
	if closed < 36 {
		t.Fatalf("%d of 40 idle strangers closed at once, want at least 36", closed)
	}
	if n := l.gate.Strangers(); n > 4 {
		t.Fatalf("listener holds %d strangers, cap 4", n)
	}
	lines := got()
	if n := countMatching(lines, "have not authenticated"); n == 0 || n > 11 {
		t.Fatalf("%d cap lines for 36 refusals (want 1..11): %q", n, lines)
	}
	// The held ones time out; then a real dialer is admitted.
	waitFor(t, "the strangers' hello deadline", func() bool { return l.gate.Strangers() == 0 })
	l.setPeers([]wire.HandleInfo{hi}, false)
	c, err := dial(hi, &l.id, handshake.Claim{Rank: 0, NRanks: 1, Lane: 0, Lanes: 1}, time.Now().Add(5*time.Second))
	if err != nil {
		t.Fatalf("a real dialer after the strangers left: %v", err)
	}
	c.Close()
}

// resetLimits gives the process-wide rate limits a full budget, so a test
// sees its own lines.
func resetLimits() {
	admission.Warn.Reset()
	acceptWarn.Reset()
}
