// Package logtest captures the plugin's log lines in tests. Only tests
// import it.
package logtest

import (
	"sync"
	"testing"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// Warnings captures the WARN lines logged until the test ends and returns
// a function that reports those seen so far.
func Warnings(t testing.TB) func() []string {
	t.Helper()
	return capture(t, func(l abi.LogLevel) bool { return l == abi.LogWarn })
}

// All captures the lines of every level logged until the test ends.
func All(t testing.TB) func() []string {
	t.Helper()
	return capture(t, func(abi.LogLevel) bool { return true })
}

func capture(t testing.TB, keep func(abi.LogLevel) bool) func() []string {
	var mu sync.Mutex
	var lines []string
	logx.SetSink(func(level abi.LogLevel, _ uint64, _ string, _ int, msg string) {
		if !keep(level) {
			return
		}
		mu.Lock()
		lines = append(lines, msg)
		mu.Unlock()
	})
	t.Cleanup(func() { logx.SetSink(nil) })
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), lines...)
	}
}
