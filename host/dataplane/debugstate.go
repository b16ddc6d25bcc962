package dataplane

import (
	"fmt"
	"io"
	"time"
)

// WriteState writes what every peer's transport holds (diagnostics: the
// plugin's stall report): per TCP lane, whether it is open, its queue,
// whether someone holds the stream, the puts written and not yet
// acknowledged, and the gets awaiting replies. It takes each lane's locks
// briefly; it allocates.
func (m *Mesh) WriteState(w io.Writer) {
	// The wall clock, so that the reports of two processes line up.
	fmt.Fprintf(w, "=== NET/wasm mesh of rank %d: %d peers (at %s)\n", m.rank, len(m.peers), time.Now().Format("15:04:05.000000"))
	for i, p := range m.peers {
		name := p.t.Props().Name
		fmt.Fprintf(w, "  rank %d: %s dead=%v opened=%#x down=%#x idle=%v\n", i, name, p.dead.Load(), p.opened.Load(), p.down.Load(), p.t.Idle())
		p.t.WriteState(w)
	}
}
