package dataplane_test

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/meshtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/handshake"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

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
	got := meshtest.Warnings(t)
	meshtest.ResetLimits()
	ls := make([]*dataplane.Listener, 2)
	hs := make([]*wire.Handle, 2)
	for i := range ls {
		l, h, err := dataplane.Listen(dataplane.ListenOptions{Addr: "127.0.0.1"})
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
	meshtest.WaitFor(t, "an accept failure WARN", func() bool { return meshtest.CountMatching(got(), "too many open files") > 0 })
	for _, c := range strangers {
		c.Close()
	}
	opt := dataplane.Options{Timeout: 20 * time.Second, Lanes: 1, CloseTimeout: time.Second}
	ms, _, errs := meshtest.ConnectPairOpt(t, ls, [][]*wire.Handle{hs, hs}, []dataplane.Options{opt, opt}, 64)
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("connect after the descriptors came back: %v / %v", errs[0], errs[1])
	}
	ms[0].Close()
	ms[1].Close()
	if n := meshtest.CountMatching(got(), "NET/wasm: accept on"); n > 11 {
		t.Fatalf("%d accept failure lines: not rate limited", n)
	}
}

// TestStrangerCap: idle connections beyond maxStrangers are closed at
// accept with a rate-limited WARN; once the hello deadline frees the slots
// a real dialer gets in.
func TestStrangerCap(t *testing.T) {
	got := meshtest.Warnings(t)
	meshtest.ResetLimits()
	defer func(n int32, d time.Duration) { *dataplane.MaxStrangers(), *dataplane.HelloTimeout() = n, d }(*dataplane.MaxStrangers(), *dataplane.HelloTimeout())
	// Long enough that no held stranger times out before all 40 were
	// accepted, however slowly this machine runs the accept loop.
	*dataplane.MaxStrangers(), *dataplane.HelloTimeout() = 4, 5*time.Second
	l, h, err := dataplane.Listen(dataplane.ListenOptions{Addr: "127.0.0.1"})
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
	// The listener holds 4; the other 36 are closed without a word, long
	// before the held ones' hello deadline.
	var closed atomic.Int32
	for _, c := range idle {
		go func() {
			c.SetReadDeadline(time.Now().Add(time.Minute))
			var b [1]byte
			if _, err := c.Read(b[:]); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				closed.Add(1)
			}
		}()
	}
	meshtest.WaitFor(t, "36 strangers closed", func() bool { return closed.Load() >= 36 })
	if n := l.Gate().Strangers(); n > 4 {
		t.Fatalf("listener holds %d strangers, cap 4", n)
	}
	lines := got()
	if n := meshtest.CountMatching(lines, "have not authenticated"); n == 0 || n > 11 {
		t.Fatalf("%d cap lines for 36 refusals (want 1..11): %q", n, lines)
	}
	// The held ones time out; then a real dialer is admitted.
	meshtest.WaitFor(t, "the strangers' hello deadline", func() bool { return l.Gate().Strangers() == 0 })
	l.SetPeers([]wire.HandleInfo{hi}, false)
	c, err := dataplane.Dial(hi, l.ID(), handshake.Claim{Rank: 0, NRanks: 1, Lane: 0, Lanes: 1}, time.Now().Add(5*time.Second))
	if err != nil {
		t.Fatalf("a real dialer after the strangers left: %v", err)
	}
	c.Close()
}
