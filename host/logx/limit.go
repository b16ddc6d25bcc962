package logx

import (
	"sync"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
)

// Limited is a WARN line that a remote party can trigger as often as it
// likes (a rejected connection, a failed accept): at most Burst lines at
// once, then one per Every; the lines in between are counted and the next
// one that goes out says how many were dropped. The zero value allows 10
// lines, then one a second.
type Limited struct {
	Burst int
	Every time.Duration

	mu      sync.Mutex
	started bool
	tokens  float64
	last    time.Time
	dropped uint64
}

// Warn logs like logx.Warn unless the budget is spent; it reports whether
// the line went out.
func (l *Limited) Warn(subsys uint64, format string, args ...any) bool {
	return l.log(abi.LogWarn, subsys, format, args)
}

// Info is Warn at INFO level, for events worth telling an operator that
// are not failures (a liveness backstop that had to act).
func (l *Limited) Info(subsys uint64, format string, args ...any) bool {
	return l.log(abi.LogInfo, subsys, format, args)
}

func (l *Limited) log(level abi.LogLevel, subsys uint64, format string, args []any) bool {
	burst, every := l.Burst, l.Every
	if burst <= 0 {
		burst = 10
	}
	if every <= 0 {
		every = time.Second
	}
	now := time.Now()
	l.mu.Lock()
	if !l.started {
		l.started, l.tokens = true, float64(burst)
	} else {
		l.tokens = min(float64(burst), l.tokens+float64(now.Sub(l.last))/float64(every))
	}
	l.last = now
	if l.tokens < 1 {
		l.dropped++
		l.mu.Unlock()
		return false
	}
	l.tokens--
	dropped := l.dropped
	l.dropped = 0
	l.mu.Unlock()
	if dropped > 0 {
		format += " (%d similar lines suppressed)"
		args = append(args, dropped)
	}
	emit(level, subsys, format, args)
	return true
}

// Reset gives the limiter its full budget back (tests).
func (l *Limited) Reset() {
	l.mu.Lock()
	l.started, l.dropped = false, 0
	l.mu.Unlock()
}
