package staging

import (
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/ring"
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
	on  atomic.Bool
	log *ring.Log[traceEntry]
}

func init() { trace.log = ring.NewLog[traceEntry](traceLen) }

var traceEpoch = time.Now()

// Trace paths.
const (
	pathShadow = 1 + iota
	pathFolded
	pathGDR
	pathAtomic
	pathRMW
	pathStreamAtomic
	pathAgentAdd
	pathFused
)

var pathNames = [...]string{"?", "shadow write", "folded into a pending write", "GDRCopy", "atomic kernel", "read-modify-write", "stream atomic", "device agent's add", "device agent's landing and signal in one command"}

// SetTrace turns the signal trace on or off.
func SetTrace(on bool) { trace.on.Store(on) }

func traceSignal(dev uintptr, v, val uint64, path int) {
	if !trace.on.Load() {
		return
	}
	e := trace.log.Claim()
	e.at.Store(uint64(time.Since(traceEpoch)))
	e.dev.Store(uint64(dev))
	e.v.Store(v)
	e.val.Store(val)
	e.path.Store(uint64(path))
}

// WriteTrace writes the traced signal updates, oldest first.
func WriteTrace(w io.Writer) {
	first, n := trace.log.Window()
	fmt.Fprintf(w, "=== NET/wasm device signal updates %d..%d (time since start, word, add, value written, path)\n", first, n)
	for i := first; i < n; i++ {
		e := trace.log.At(i)
		p := e.path.Load()
		if p >= uint64(len(pathNames)) {
			p = 0
		}
		fmt.Fprintf(w, "  %12v %#x +%d -> %d %s\n", time.Duration(e.at.Load()), e.dev.Load(), e.v.Load(), e.val.Load(), pathNames[p])
	}
}
