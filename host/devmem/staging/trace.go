package staging

import (
	"fmt"
	"io"
	"sync/atomic"
	"time"
)

// The signal trace: the last traceLen device signal updates (AddSignal),
// kept while a diagnostic asks for it (the plugin's stall report) and
// written out with it, so that a hang can be told apart: a signal never
// applied here, or applied and not seen by the kernel.

const traceLen = 256

type traceEntry struct {
	at, dev, v, val, path atomic.Uint64
}

var trace struct {
	on   atomic.Bool
	next atomic.Uint64
	ring [traceLen]traceEntry
}

var traceEpoch = time.Now()

// Trace paths.
const (
	pathShadow = 1 + iota
	pathFolded
	pathGDR
	pathAtomic
	pathRMW
)

var pathNames = [...]string{"?", "shadow write", "folded into a pending write", "GDRCopy", "atomic kernel", "read-modify-write"}

// SetTrace turns the signal trace on or off.
func SetTrace(on bool) { trace.on.Store(on) }

func traceSignal(dev uintptr, v, val uint64, path int) {
	if !trace.on.Load() {
		return
	}
	e := &trace.ring[(trace.next.Add(1)-1)%traceLen]
	e.at.Store(uint64(time.Since(traceEpoch)))
	e.dev.Store(uint64(dev))
	e.v.Store(v)
	e.val.Store(val)
	e.path.Store(uint64(path))
}

// WriteTrace writes the traced signal updates, oldest first.
func WriteTrace(w io.Writer) {
	n := trace.next.Load()
	first := uint64(0)
	if n > traceLen {
		first = n - traceLen
	}
	fmt.Fprintf(w, "=== NET/wasm device signal updates %d..%d (time since start, word, add, value written, path)\n", first, n)
	for i := first; i < n; i++ {
		e := &trace.ring[i%traceLen]
		p := e.path.Load()
		if p >= uint64(len(pathNames)) {
			p = 0
		}
		fmt.Fprintf(w, "  %12v %#x +%d -> %d %s\n", time.Duration(e.at.Load()), e.dev.Load(), e.v.Load(), e.val.Load(), pathNames[p])
	}
}
