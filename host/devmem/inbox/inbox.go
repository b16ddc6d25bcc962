// Package inbox is the device agent's peer inbox (SPEC.md §4, "Device
// windows mapped"; NCCL_RMA_WASM_INTRANODE_INBOX; host/devmem/cuda's
// inbox.c and agent.ptx's ISCAN).
//
// A small put+signal between two processes of a host otherwise reaches the
// target's signal word through the target's host: its lane reads the
// header, waits for the sender's agent mark, and hands its own agent an add
// through the pinned ring. With the inbox, the sender's agent, right after
// its copy into the target's mapped window, writes one 8-byte entry into a
// row of device memory the target shared with it; the target's agent,
// which looks at its rows between commands, adds the entry's value to the
// signal word the entry names through a table only the target writes.
// The header still goes, its signal marked applied, so that the target
// numbers and acknowledges the operation; the target's host applies it in
// sequence order by waiting until its agent took the entry, so that every
// signal it applies itself later follows this one's payload.
//
// Target side: Claim enters a device registration into the table (one
// inbox per process, in the first context that claims), Row hands a row
// to a peer, Wait and Reached follow a row. Sender side: Open maps a peer's
// row, Queue writes an entry behind a copy. The counts of entries taken
// live in the second half of the process's mark page (staging's marks.go),
// which the peers map read-only: a sender writes a position only once the
// target took the one a row's length before it.
package inbox

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/profile"
)

const (
	// Rows is how many peers one inbox serves (inbox.c's IB_ROWS).
	Rows = 16
	// TableSize is how many registrations its table holds.
	TableSize = 64
	// MaxValue is the largest signal value an entry carries.
	MaxValue = 1<<28 - 1
	// MaxOffset bounds a signal word's offset in its registration.
	MaxOffset = 1 << 25
	// refused is the bit of a row's count set once its agent refused an
	// entry (one naming a word outside the table).
	refused = 1 << 62
)

// Entry is the entry for position pos of a row of e entries: add v (at
// most MaxValue) to the word at byte off (a multiple of 8, below
// MaxOffset) of table entry idx.
func Entry(pos, e uint64, idx int, off, v uint64) uint64 {
	return ((pos/e)%255+1)<<56 | uint64(idx)<<50 | (off/8)<<28 | v
}

// Fits reports whether a signal of v at byte off fits an entry.
func Fits(off, v uint64) bool { return v <= MaxValue && off < MaxOffset && off%8 == 0 }

var box struct {
	mu  sync.Mutex      // makes the inbox, takes and frees table entries
	err error           // why there is none (said once; under mu)
	tab [TableSize]bool // entries taken (under mu)
	// ctx is the context whose agent keeps the inbox (0: none yet) and e
	// a row's entries (Row's): set under mu, read with loads on the
	// operations' path.
	ctx atomic.Uintptr
	e   atomic.Uint64
}

// Claim enters the n bytes at base, device memory of ctx (a registration
// being made), into the table's first free entry, opening the inbox in ctx at the
// first call: the entry's index (the registration's MsgReg names it), or
// false (no inbox here: no agent in ctx, another context has it, the table
// is full). Registrations of every communicator of the process share it.
func Claim(ctx uintptr, base uintptr, n uint64) (int, bool) {
	d, ok := devmem.Get().(devmem.Inboxer)
	if !ok || !staging.AgentRuns(ctx) {
		return 0, false
	}
	box.mu.Lock()
	defer box.mu.Unlock()
	if box.ctx.Load() == 0 {
		if box.err != nil {
			return 0, false
		}
		err := staging.MarkPage(ctx)
		if err == nil {
			err = d.InboxOpen(ctx, staging.MarkPageRest())
		}
		if err != nil {
			box.err = err
			logx.Info(abi.SubsysReg, "NET/wasm: no peer inbox (NCCL_RMA_WASM_INTRANODE_INBOX): %v", err)
			return 0, false
		}
		box.ctx.Store(ctx)
	}
	idx := 0
	for idx < TableSize && box.tab[idx] {
		idx++
	}
	if ctx != box.ctx.Load() || idx == TableSize {
		if ctx == box.ctx.Load() {
			logx.Info(abi.SubsysReg, "NET/wasm: the registration at %#x is not in the peer inbox's table: its %d entries are taken", base, TableSize)
		}
		return 0, false
	}
	if err := d.InboxTable(ctx, idx, base, n); err != nil {
		logx.Info(abi.SubsysReg, "NET/wasm: the registration at %#x is not in the peer inbox's table: %v", base, err)
		return 0, false
	}
	box.tab[idx] = true
	return idx, true
}

// Forget drops what the process knew of its inbox once the agents stopped
// (the plugin's last finalize frees the inbox with them, and the mark
// page): a later registration opens a new one.
func Forget() {
	box.mu.Lock()
	defer box.mu.Unlock()
	box.err = nil
	box.tab = [TableSize]bool{}
	box.ctx.Store(0)
	box.e.Store(0)
}

// Release takes registration id's entry idx (Claim's) out of the table
// before its memory goes: the agent adds nothing there afterwards.
func Release(id uint32, idx int) {
	d, ok := devmem.Get().(devmem.Inboxer)
	box.mu.Lock()
	defer box.mu.Unlock()
	if !ok || idx < 0 || idx >= TableSize || !box.tab[idx] {
		return
	}
	box.tab[idx] = false
	if err := d.InboxTable(box.ctx.Load(), idx, 0, 0); err != nil {
		logx.Warn(abi.SubsysReg, "NET/wasm: emptying the peer inbox's entry of registration %d: %v", id, err)
	}
}

// Row hands out a row of the inbox for a peer, with the rows' allocation
// for it to map (the fd the caller's to send and close) and the row's
// entries.
func Row() (int, devmem.Segment, int, error) {
	d, ok := devmem.Get().(devmem.Inboxer)
	box.mu.Lock()
	defer box.mu.Unlock()
	if !ok || box.ctx.Load() == 0 {
		return 0, devmem.Segment{Fd: -1}, 0, errors.New("no peer inbox here")
	}
	row, seg, e, err := d.InboxRow(box.ctx.Load())
	if err == nil {
		box.e.Store(uint64(e))
	}
	return row, seg, e, err
}

// ErrRefused is a wait's error when the agent refused one of the row's
// entries: the peer named a word outside our table. ErrAhead is one for
// a position more than a row ahead of what the agent took, which no
// sender writes (it waits for room).
var (
	ErrRefused = errors.New("the peer's inbox entry named a signal word outside our table")
	ErrAhead   = errors.New("the peer named an inbox position more than a row ahead of what our agent took")
)

// callerWait is how long a polling caller waits for an entry (Reached's
// d for the TCP link's callers); see SetCallerWait.
var callerWait atomic.Int64

// SetCallerWait sets how long NCCL's proxy thread, reading a header whose
// entry the agent has not taken yet, waits for it before it leaves the
// header to the stream's service (NCCL_RMA_WASM_INTRANODE_INBOX_CALLER_WAIT_US).
// The entry needs no host to reach its signal word, so a wait only holds
// the proxy from posting its own operations.
func SetCallerWait(d time.Duration) { callerWait.Store(int64(d)) }

// CallerWait is SetCallerWait's value (0 by default: only look).
func CallerWait() time.Duration { return time.Duration(callerWait.Load()) }

// Reached reports whether the agent took row's entry pos - 1 within d,
// polling its count with loads: a polling caller's short wait for an
// entry a few microseconds behind its header, which costs less than
// handing the header to a goroutine that must be woken. A refused entry
// is for the waiter (Wait) to report.
func Reached(row int, pos uint64, d time.Duration) bool {
	w := counts(row)
	if w == nil {
		return false
	}
	for start := time.Now(); ; {
		for range 64 {
			if t := w.Load(); t&refused == 0 && t >= pos {
				return true
			}
		}
		if time.Since(start) >= d {
			return false
		}
	}
}

// counts is row's count of entries taken, in our mark page's second half
// (where the agent publishes it), nil without an inbox.
func counts(row int) *atomic.Uint64 {
	if box.ctx.Load() == 0 || row < 0 || row >= Rows {
		return nil
	}
	return staging.MarkPageRestWord(row)
}

// waitTimeout bounds a wait for a live peer's entry; waitSpin is how long
// a wait yields before it sleeps (an entry is usually a few microseconds
// behind its header, and a sleep costs tens of them), launching a parked
// agent first.
var (
	waitTimeout = 30 * time.Second
	waitSpin    = 200 * time.Microsecond
)

// Wait returns once the agent took row's entry pos - 1, launching it when
// it parked (an entry does not wake it); it gives up when the sender's
// process (pid) is gone before it wrote the entry, after waitTimeout, or
// when the agent refused an entry of the row.
func Wait(row int, pos uint64, pid int) error {
	d, ok := devmem.Get().(devmem.Inboxer)
	w := counts(row)
	ctx, e := box.ctx.Load(), box.e.Load()
	if !ok || w == nil {
		return errors.New("no peer inbox here")
	}
	take := func() (bool, error) {
		t := w.Load()
		if t&refused != 0 {
			return false, ErrRefused
		}
		if pos > t+e {
			return false, ErrAhead
		}
		return t >= pos, nil
	}
	if done, err := take(); done || err != nil {
		return err
	}
	if profile.On() {
		defer profile.InboxWait.Since(profile.Now())
	}
	start := time.Now()
	for kicked := false; time.Since(start) < waitSpin; {
		for range 64 {
			if done, err := take(); done || err != nil {
				return err
			}
			runtime.Gosched()
		}
		if !kicked && time.Since(start) > waitSpin/8 {
			// Parked (idle past its limit): the host launches it.
			if err := d.InboxKick(ctx); err != nil {
				return fmt.Errorf("peer inbox: %w", err)
			}
			kicked = true
		}
	}
	for n := 0; ; n++ {
		if done, err := take(); done || err != nil {
			return err
		}
		if n%100 == 0 {
			if err := d.InboxKick(ctx); err != nil {
				return fmt.Errorf("peer inbox: %w", err)
			}
			if pid > 0 && unix.Kill(pid, 0) == unix.ESRCH {
				if done, err := take(); done || err != nil {
					return err
				}
				return fmt.Errorf("peer inbox row %d: the sender (pid %d) exited before its entry %d", row, pid, pos-1)
			}
			if time.Since(start) > waitTimeout {
				return fmt.Errorf("peer inbox row %d: entry %d not taken in %s (taken %d)", row, pos-1, waitTimeout, w.Load())
			}
		}
		time.Sleep(10 * time.Microsecond)
	}
}

// Peer is a peer's inbox row mapped here (the sender's side).
type Peer struct {
	ctx   uintptr // the context whose agent writes our entries
	va    uintptr // the peer's rows, mapped
	size  uint64
	row   int
	e     uint64
	marks *staging.PeerMarks // the peer's mark page: its counts
	// mu queues one entry at a time, in position order (lane 0's writer
	// alone, unless that lane failed over); next counts the positions
	// queued (under mu).
	mu   sync.Mutex
	next uint64
}

// Open maps seg, a peer's inbox rows, into ctx: row is ours, of entries
// entries; marks is the peer's mark page mapped here, whose second half
// holds its counts.
func Open(ctx uintptr, seg devmem.Segment, row, entries int, marks *staging.PeerMarks) (*Peer, error) {
	sh, ok := devmem.Get().(devmem.IPCSharer)
	if !ok || marks == nil || row < 0 || row >= Rows || entries <= 0 || entries&(entries-1) != 0 ||
		uint64(Rows)*uint64(entries)*8 > seg.Size {
		return nil, fmt.Errorf("peer inbox: row %d of %d entries in %d bytes", row, entries, seg.Size)
	}
	va, err := sh.IPCImport(ctx, []devmem.Segment{seg})
	if err != nil {
		return nil, fmt.Errorf("peer inbox: %w", err)
	}
	return &Peer{ctx: ctx, va: va, size: seg.Size, row: row, e: uint64(entries), marks: marks}, nil
}

// Close unmaps the rows (the lane carries no more entries).
func (p *Peer) Close() {
	if sh, ok := devmem.Get().(devmem.IPCSharer); ok && p != nil && p.va != 0 {
		sh.IPCUnmap(p.ctx, p.va, []uint64{p.size})
		p.va = 0
	}
}

// Ctx is the context whose agent writes the entries.
func (p *Peer) Ctx() uintptr { return p.ctx }

// Row is our row of the peer's inbox.
func (p *Peer) Row() int { return p.row }

// roomWait bounds how long Queue waits for the peer to take the entry a
// row's length back: its agent takes one within microseconds unless it
// parked, and then its host, reading the header, launches it again.
var roomWait = 200 * time.Microsecond

// Queue joins to g, as ctx's agent command after what g queued, the copy
// of n bytes from src to dst (a peer's window mapped here; n 0: none) and
// then the write of the entry adding v to the word at off of the peer's
// table entry idx; it returns the position + 1, which the header carries.
// Entries go to the agent one at a time, in position order. false (and no
// error): no room in the row in time, or the agent took no command.
func (p *Peer) Queue(g *staging.Gather, dst, src uintptr, n uint64, idx int, off, v uint64) (uint64, bool, error) {
	return p.queue(inBatch, g, dst, src, n, idx, off, v, nil, 0)
}

// QueueMapped is Queue for a payload (n > 0) whose request waits for the
// command itself: c.Complete(tag, ...) once it executed
// (staging.CopyMappedWrite), so the header need not wait for it.
func (p *Peer) QueueMapped(dst, src uintptr, n uint64, idx int, off, v uint64, c staging.Completer, tag uint64) (uint64, bool, error) {
	return p.queue(withCopy, nil, dst, src, n, idx, off, v, c, tag)
}

// QueueSignal is Queue for a signal alone: the entry's write, queued on
// ctx's agent after what was queued on the device before it, with nothing
// waiting for it (the target waits for the entry), so that its header and
// the operations behind it leave at once.
func (p *Peer) QueueSignal(idx int, off, v uint64) (uint64, bool, error) {
	return p.queue(alone, nil, 0, 0, 0, idx, off, v, nil, 0)
}

// how an entry goes to the agent (queue).
type how int

const (
	inBatch  how = iota // joined to a lane's gathered batch (Queue)
	withCopy            // behind its copy, its request waiting for the command (QueueMapped)
	alone               // a signal alone's entry (QueueSignal)
)

func (p *Peer) queue(h how, g *staging.Gather, dst, src uintptr, n uint64, idx int, off, v uint64, c staging.Completer, tag uint64) (uint64, bool, error) {
	d, ok := devmem.Get().(devmem.Inboxer)
	if !ok || p.va == 0 || !Fits(off, v) || idx < 0 || idx >= TableSize || (h == withCopy && n == 0) {
		return 0, false, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	pos := p.next
	if pos >= p.e && !p.room(pos) {
		return 0, false, nil
	}
	w := p.va + uintptr((uint64(p.row)*p.e+pos%p.e)*8)
	e := Entry(pos, p.e, idx, off, v)
	var err error
	switch h {
	case inBatch:
		ok, err = g.AddAgent(p.ctx, func() (bool, error) { return d.CopyWrite(p.ctx, dst, src, n, w, e) })
	case withCopy:
		ok, err = staging.CopyMappedWrite(p.ctx, dst, src, n, w, e, c, tag)
	default:
		ok, err = staging.AgentWrite(p.ctx, w, e)
	}
	if !ok || err != nil {
		return 0, false, err
	}
	p.next++
	return pos + 1, true, nil
}

// room waits up to roomWait for the peer to take position pos - e.
func (p *Peer) room(pos uint64) bool {
	want := pos - p.e + 1
	for start := time.Now(); ; {
		if p.marks.Rest(p.row)&(refused-1) >= want {
			return true
		}
		if time.Since(start) > roomWait {
			return false
		}
	}
}
