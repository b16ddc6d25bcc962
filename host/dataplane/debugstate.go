package dataplane

import (
	"fmt"
	"io"
)

// WriteState writes what every peer's transport holds (diagnostics: the
// plugin's stall report): per TCP lane, whether it is open, its queue,
// whether someone holds the stream, the puts written and not yet
// acknowledged, and the gets awaiting replies. It takes each lane's locks
// briefly; it allocates.
func (m *Mesh) WriteState(w io.Writer) {
	fmt.Fprintf(w, "=== NET/wasm mesh of rank %d: %d peers\n", m.rank, len(m.peers))
	for i, p := range m.peers {
		name := p.t.props().Name
		fmt.Fprintf(w, "  rank %d: %s dead=%v opened=%#x down=%#x idle=%v\n", i, name, p.dead.Load(), p.opened.Load(), p.down.Load(), p.t.idle())
		if x, ok := p.t.(*intraLink); ok && (x.mapped.Load() > 0 || !x.mapOn.Load()) {
			fmt.Fprintf(w, "    mapped device memory: %d operations, usable=%v\n", x.mapped.Load(), x.mapOn.Load())
		}
		t := streamsOf(p.t)
		if t == nil {
			continue
		}
		for _, l := range t.lanes {
			l.mu.Lock()
			open, opening, qlen, writing, down := l.out != nil, l.opening, l.q.Len(), l.writing, l.down
			var head string
			if qlen > 0 {
				op := l.q.At(0)
				head = fmt.Sprintf(" head{msg %d size %d seq %d notBefore %d}", op.Msg, op.Size, op.Seq, op.NotBefore)
			}
			l.mu.Unlock()
			var shm string
			if s := l.sring.Load(); s != nil {
				tail, read, sleeping, waiting := s.State()
				shm = fmt.Sprintf(" shm{written %d read %d sleeping %v waiting %v bells %d}", tail, read, sleeping, waiting, l.bells.Load())
			}
			var wait string
			if since := l.waitSince.Load(); since != 0 {
				wait = fmt.Sprintf(" oldest ack wait %d µs", (Now()-since)/1000)
			}
			fmt.Fprintf(w, "    lane %d: open=%v opening=%v queued=%d%s writing=%v down=%v armed=%v unacked puts=%d%s gets=%d batches=%d backstop asks %d rescued %d%s\n",
				l.idx, open, opening, qlen, head, writing, down, l.armed.Load(), l.pendingPuts(), wait, l.pendingGets(), l.batches.Load(),
				l.bsAsks.Load(), l.bsRescued.Load(), shm)
		}
		// The incoming streams: what their ackers owe, who serves them, and
		// what their rings hold.
		for i, a := range t.acks {
			a.tmu.Lock()
			armed := a.armed
			a.tmu.Unlock()
			fmt.Fprintf(w, "    acker %d: pub %d sent %d owed %d armed %v rides %v alone %d\n",
				i, a.pub.Load(), a.sent.Load(), a.owed(), armed, a.rides(), a.alone.Load())
			r := a.rd.Load()
			if r == nil {
				continue
			}
			var shm string
			r.smu.Lock()
			if s := r.sview; s != nil {
				tail, read, sleeping, waiting := s.State()
				shm = fmt.Sprintf(" shm{written %d read %d sleeping %v waiting %v}", tail, read, sleeping, waiting)
			}
			r.smu.Unlock()
			fmt.Fprintf(w, "    in %d: role=%#x active=%v napping=%v left=%v polled=%v rx %d µs ago, caller msgs %d, handoffs %d, ended=%v%s\n",
				i, r.role.Load(), r.active.Load(), r.napping.Load(), r.left.Load(), r.polled.Load(), (Now()-r.rx.Load())/1000,
				r.callerMsgs.Load(), r.handoffs.Load(), r.endErr(), shm)
		}
	}
}

// streamsOf returns the TCP lanes a transport carries: its own, or those
// under the intra-node and libfabric links; nil for none.
func streamsOf(tr transport) *tcpLink {
	switch x := tr.(type) {
	case *tcpLink:
		return x
	case *intraLink:
		return x.tcpLink
	case *fabricLink:
		return x.tcpLink
	}
	return nil
}
