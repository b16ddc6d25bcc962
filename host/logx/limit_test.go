package logx

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
)

func capture(t *testing.T) func() []string {
	var mu sync.Mutex
	var lines []string
	SetSink(func(_ abi.LogLevel, _ uint64, _ string, _ int, msg string) {
		mu.Lock()
		lines = append(lines, msg)
		mu.Unlock()
	})
	t.Cleanup(func() { SetSink(nil) })
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), lines...)
	}
}

// TestLimitedBurst: a flood yields Burst lines; the next line after the
// budget refills says how many were dropped, once.
func TestLimitedBurst(t *testing.T) {
	got := capture(t)
	l := Limited{Burst: 3, Every: time.Hour}
	out := 0
	for i := 0; i < 1000; i++ {
		if l.Warn(abi.SubsysNet, "line %d", i) {
			out++
		}
	}
	if lines := got(); out != 3 || len(lines) != 3 || lines[2] != "line 2" {
		t.Fatalf("%d lines reported out, logged %q", out, lines)
	}
	l2 := Limited{Burst: 1, Every: 10 * time.Millisecond}
	l2.Warn(abi.SubsysNet, "first")
	for i := 0; i < 50; i++ {
		l2.Warn(abi.SubsysNet, "dropped")
	}
	time.Sleep(30 * time.Millisecond)
	if !l2.Warn(abi.SubsysNet, "later") {
		t.Fatal("no line after the budget refilled")
	}
	time.Sleep(30 * time.Millisecond)
	l2.Warn(abi.SubsysNet, "again")
	lines := got()
	if n := len(lines); n < 3 || !strings.HasPrefix(lines[n-2], "later (") || !strings.Contains(lines[n-2], "similar lines suppressed)") || lines[n-1] != "again" {
		t.Fatalf("the line after a flood must count the dropped ones, the next must not: %q", lines)
	}
}
