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
	var mu sync.Mutex
	var lines []string
	logx.SetSink(func(level abi.LogLevel, _ uint64, _ string, _ int, msg string) {
		if level != abi.LogWarn {
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
