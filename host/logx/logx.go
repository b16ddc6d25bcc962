// Package logx writes the plugin's log lines through the logger NCCL/RCCL
// handed to init. Until a logger is installed lines go to stderr only when
// NCCL_RMA_WASM_DEBUG_STDERR is set, so a stray library load stays quiet.
package logx

import (
	"fmt"
	"os"
	"sync/atomic"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
)

// Sink receives one preformatted line. capi installs a sink that calls the
// variadic C logger with "%s".
type Sink func(level abi.LogLevel, subsys uint64, file string, line int, msg string)

var sink atomic.Pointer[Sink]

// SetSink installs (or with nil removes) the process-wide sink.
func SetSink(s Sink) {
	if s == nil {
		sink.Store(nil)
		return
	}
	sink.Store(&s)
}

func emit(level abi.LogLevel, subsys uint64, format string, args []any) {
	if level == abi.LogWarn {
		// NCCL and RCCL drop a line whose flags miss NCCL_DEBUG_SUBSYS
		// (default INIT,BOOTSTRAP,ENV), WARN included; their own WARNs pass
		// NCCL_ALL. A WARN of ours is an error's only explanation, so it
		// must show under the defaults too: it goes out with every flag.
		subsys = abi.SubsysAll
	}
	msg := format
	if len(args) > 0 {
		msg = fmt.Sprintf(format, args...)
	}
	if s := sink.Load(); s != nil {
		(*s)(level, subsys, "rccl-rma-wasm", 0, msg)
		return
	}
	if debugStderr() != "" {
		fmt.Fprintf(os.Stderr, "rccl-rma-wasm %d: %s\n", level, msg)
	}
}

// Warn logs at WARN. Every error returned to NCCL is accompanied by one.
func Warn(subsys uint64, format string, args ...any) { emit(abi.LogWarn, subsys, format, args) }

// Info logs at INFO.
func Info(subsys uint64, format string, args ...any) { emit(abi.LogInfo, subsys, format, args) }

// Trace logs at TRACE.
func Trace(subsys uint64, format string, args ...any) { emit(abi.LogTrace, subsys, format, args) }

// Version logs at VERSION.
func Version(subsys uint64, format string, args ...any) { emit(abi.LogVersion, subsys, format, args) }

// debugStderr reads the variable through config, i.e. libc getenv inside
// the library, so a value set after load is seen.
func debugStderr() string { return config.DebugStderr.Get() }

// config reports malformed variables through here: it cannot import logx,
// which reads DebugStderr from it.
func init() { config.SetWarn(func(msg string) { Warn(abi.SubsysEnv, "%s", msg) }) }
