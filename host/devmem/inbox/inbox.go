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
//
// With host rows (SetHostRows; NCCL_RMA_WASM_INTRANODE_INBOX_HOST_ROWS)
// each sender's device row has a twin among 16 host rows, a sealed memfd
// pinned at both ends, which the target's agent looks at when its ring is
// empty (counts in words Rows.. of the page's second half). The sender's
// host writes a signal alone there itself when it can pass nothing (its
// device-row entries taken, nothing queued on its device before it: no
// agent command, no device round trip at the sender); an entry for the
// device row waits until the host row's were taken. A header names row
// Rows + r for an entry of host row r.
//
// A row belongs to a sender, a process of the host and the context its
// agent writes from, not to a communicator: every communicator between the
// two processes shares it and its positions (Attach, Row), so that the 16
// rows serve 16 peer processes however many communicators come and go. A
// row comes back only when its process exited, and is emptied for a
// sender that asks afresh (its plugin finalized and started again).
package inbox

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/profile"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/shmstream"
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
	// rows is how many rows the device handed out, held who holds each
	// (under mu).
	rows int
	held [Rows]holder
	// host is the host rows' memory (under mu): a sealed memfd, mapped
	// and pinned from the inbox's context; mem nil: none.
	host hostRows
}

// hostRows is the memory of an inbox's host rows.
type hostRows struct {
	fd  int
	mem []byte
	ctx uintptr // the context it was pinned from
}

// maxHostRowsBytes bounds the host rows a peer may hand us to map and pin.
const maxHostRowsBytes = 1 << 20

// hostRowsSize is the host rows' bytes: Rows rows of inbox.c's IB_E (64)
// entries, a whole number of pages.
const hostRowsSize = Rows * 64 * 8

// hostWanted is SetHostRows's.
var hostWanted atomic.Bool

// SetHostRows asks for host rows beside the device rows
// (NCCL_RMA_WASM_INTRANODE_INBOX_HOST_ROWS) for an inbox opened later.
func SetHostRows(on bool) { hostWanted.Store(on) }

// hostOn is set while our inbox has host rows (RowsInHost).
var hostOn atomic.Bool

// RowsInHost reports whether our inbox has host rows beside its device
// rows: a header may name a sender's row there (Rows + its row). No lock:
// headers ask it.
func RowsInHost() bool { return hostOn.Load() }

// makeHostRows makes the host rows' memfd, mapped and pinned from ctx.
func makeHostRows(ctx uintptr) (hostRows, error) {
	hr, ok := devmem.Get().(devmem.HostRegisterer)
	if !ok {
		return hostRows{fd: -1}, errors.New("the device runtime cannot pin host memory")
	}
	fd, mem, err := shmstream.CreateSealed("rccl-rma-wasm-inbox", hostRowsSize)
	if err != nil {
		return hostRows{fd: -1}, err
	}
	if err := hr.HostRegister(ctx, unsafe.Pointer(&mem[0]), hostRowsSize); err != nil {
		unix.Munmap(mem)
		unix.Close(fd)
		return hostRows{fd: -1}, err
	}
	return hostRows{fd: fd, mem: mem, ctx: ctx}, nil
}

// free unpins, unmaps and closes h (the inbox freed first).
func (h *hostRows) free() {
	if h.mem == nil {
		return
	}
	unmapHost(h.ctx, h.mem)
	unix.Close(h.fd)
	*h = hostRows{fd: -1}
}

// maxRowsPerProcess bounds the rows one process holds (one per context it
// writes from), so that no peer takes them all.
const maxRowsPerProcess = Rows / 2

// holder is the sender a row of ours is for: process pid's context slot
// (the sender's numbering), pidfd its process (-1: none could be opened,
// kill(pid, 0) then).
type holder struct {
	pid, slot int
	pidfd     int
}

// hold returns the holder for process pid's slot, its process opened.
func hold(pid, slot int) holder {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		fd = -1
	}
	return holder{pid: pid, slot: slot, pidfd: fd}
}

// exited reports whether h's process ended (it writes no entry any more).
func (h *holder) exited() bool {
	if h.pidfd >= 0 {
		fds := []unix.PollFd{{Fd: int32(h.pidfd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		return err == nil && n == 1
	}
	return unix.Kill(h.pid, 0) == unix.ESRCH
}

// drop closes h's process handle and frees its place.
func (h *holder) drop() {
	if h.pidfd >= 0 {
		unix.Close(h.pidfd)
	}
	*h = holder{}
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
		if err == nil && hostWanted.Load() {
			h, herr := makeHostRows(ctx)
			if herr == nil {
				herr = d.InboxOpen(ctx, staging.MarkPageRest(), uintptr(unsafe.Pointer(&h.mem[0])), hostRowsSize)
				if herr == nil {
					box.host = h
					hostOn.Store(true)
				} else {
					h.free()
				}
			}
			if herr != nil {
				logx.Info(abi.SubsysReg, "NET/wasm: the peer inbox has no host rows (NCCL_RMA_WASM_INTRANODE_INBOX_HOST_ROWS): %v", herr)
			}
		}
		if err == nil && box.host.mem == nil {
			err = d.InboxOpen(ctx, staging.MarkPageRest(), 0, 0)
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
	box.err = nil
	box.tab = [TableSize]bool{}
	box.ctx.Store(0)
	box.e.Store(0)
	for i := range box.held {
		box.held[i].drop()
	}
	box.rows = 0
	hostOn.Store(false)
	box.host.free()
	box.mu.Unlock()
	forgetPeers()
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

// Row hands a row of the inbox to the sender that is process pid's
// context slot, with the rows' allocation for it to map (the fd the
// caller's to send and close) and the row's entries: the row it holds
// already (emptied first when it asks afresh, its earlier entries being
// from a plugin that finalized, or when its process is a new one of the
// same pid), else a row never handed out, else one whose process exited,
// emptied.
func Row(pid, slot int, fresh bool) (int, devmem.Segment, int, error) {
	d, ok := devmem.Get().(devmem.Inboxer)
	box.mu.Lock()
	defer box.mu.Unlock()
	ctx := box.ctx.Load()
	if !ok || ctx == 0 {
		return 0, devmem.Segment{Fd: -1}, 0, errors.New("no peer inbox here")
	}
	if pid <= 0 {
		return 0, devmem.Segment{Fd: -1}, 0, fmt.Errorf("peer inbox: no row for process %d", pid)
	}
	r, mine := -1, 0
	for i := 0; i < box.rows; i++ {
		if h := &box.held[i]; h.pid == pid {
			mine++
			if h.slot == slot {
				r = i
			}
		}
	}
	if r < 0 && mine >= maxRowsPerProcess {
		return 0, devmem.Segment{Fd: -1}, 0, fmt.Errorf("peer inbox: process %d holds %d rows already", pid, mine)
	}
	switch {
	case r >= 0 && (fresh || box.held[r].exited()):
		if err := rehold(d, ctx, r, pid, slot); err != nil {
			return 0, devmem.Segment{Fd: -1}, 0, err
		}
	case r < 0 && box.rows < Rows:
		row, seg, e, err := d.InboxRow(ctx, -1)
		if err != nil {
			return row, seg, e, err
		}
		box.rows++
		box.held[row] = hold(pid, slot)
		box.e.Store(uint64(e))
		return row, seg, e, nil
	case r < 0:
		for i := 0; i < box.rows && r < 0; i++ {
			if box.held[i].exited() {
				r = i
			}
		}
		if r < 0 {
			return 0, devmem.Segment{Fd: -1}, 0, fmt.Errorf("peer inbox: its %d rows are held by live processes", Rows)
		}
		if err := rehold(d, ctx, r, pid, slot); err != nil {
			return 0, devmem.Segment{Fd: -1}, 0, err
		}
	}
	return d.InboxRow(ctx, r)
}

// HostRowsFd returns, with host rows, an fd of their memfd for a peer to
// map (the caller's to send and close) and its size; -1 without.
func HostRowsFd() (int, uint64, error) {
	box.mu.Lock()
	defer box.mu.Unlock()
	if box.host.mem == nil {
		return -1, 0, nil
	}
	fd, err := unix.FcntlInt(uintptr(box.host.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, 0, fmt.Errorf("peer inbox: the host rows' fd: %w", err)
	}
	return fd, uint64(len(box.host.mem)), nil
}

// rehold empties row r and gives it to process pid's slot (under box.mu).
func rehold(d devmem.Inboxer, ctx uintptr, r, pid, slot int) error {
	if err := d.InboxReset(ctx, r); err != nil {
		return fmt.Errorf("peer inbox: %w", err)
	}
	box.held[r].drop()
	box.held[r] = hold(pid, slot)
	return nil
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
// The entry needs no host to reach its signal word, but the sender's
// request waits for our acknowledgement, which a service woken for the
// header sends later than the proxy that waited a few microseconds.
func SetCallerWait(d time.Duration) { callerWait.Store(int64(d)) }

// CallerWait is SetCallerWait's value (0: only look).
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
	if box.ctx.Load() == 0 || row < 0 || row >= 2*Rows {
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

// Peer is a peer's inbox row mapped here (the sender's side), shared by
// every communicator of ours with that process from one context.
type Peer struct {
	ctx   uintptr // the context whose agent writes our entries
	va    uintptr // the peer's rows, mapped
	size  uint64
	row   int
	e     uint64
	marks *staging.PeerMarks // the peer's mark page: its counts
	// host is the peer's host rows mapped here (nil: none): our host
	// writes a signal alone into row Rows + row when nothing is queued
	// before it (hnext positions, under mu).
	host []byte
	// refs counts the links that use it and stale is set once the peer's
	// process was found replaced (under senders.mu): unmapped when both.
	refs  int
	stale bool
	// mu queues one entry at a time, in position order (lane 0's writer
	// of each link to the peer); next counts the positions queued (under
	// mu).
	mu    sync.Mutex
	next  uint64
	hnext uint64
}

// peerKey names a Peer: the target's process and our context.
type peerKey struct {
	pid int
	ctx uintptr
}

// senders are the rows of peers' inboxes mapped here.
var senders struct {
	// open makes one Attach at a time, so that a row is asked for afresh
	// once; it is held across the peer's answer, which mu is not.
	open sync.Mutex
	mu   sync.Mutex
	m    map[peerKey]*Peer
	// slots are our contexts in the order they first asked for a row: a
	// context's index is its slot in the target's rows (Row).
	slots []uintptr
}

// maxSlots bounds our contexts that write to inboxes.
const maxSlots = 256

// Fetch asks the target for a row for our context slot (afresh: we map
// none of its rows from that context) and returns it, the rows'
// allocation (its fd the caller's to close, after Attach returned), the
// row's entries, and the peer's host rows (a sealed memfd; Fd -1: none).
type Fetch func(slot int, fresh bool) (row int, seg devmem.Segment, entries int, host devmem.Segment, err error)

// Attach returns the row of process pid's inbox that ctx's agent writes,
// for one more link: the one mapped here already for pid and ctx when the
// target hands the same row again, else the one fetch brings, mapped into
// ctx. marks is pid's mark page mapped here, whose second half holds its
// counts; a Peer keeps it as long as it lives. Each Attach is undone by
// one Close.
func Attach(ctx uintptr, pid int, marks *staging.PeerMarks, fetch Fetch) (*Peer, error) {
	if marks == nil {
		return nil, errors.New("peer inbox: the peer's mark page is not mapped here")
	}
	senders.open.Lock()
	defer senders.open.Unlock()
	k := peerKey{pid, ctx}
	senders.mu.Lock()
	slot := -1
	for i, c := range senders.slots {
		if c == ctx {
			slot = i
			break
		}
	}
	if slot < 0 && len(senders.slots) < maxSlots {
		slot = len(senders.slots)
		senders.slots = append(senders.slots, ctx)
	}
	p := senders.m[k]
	if p != nil && p.marks.ID() != marks.ID() {
		// A new process of the same pid: the old one's row goes once no
		// link uses it.
		p.stale = true
		delete(senders.m, k)
		if p.refs == 0 {
			p.unmap()
		}
		p = nil
	}
	senders.mu.Unlock()
	if slot < 0 {
		return nil, fmt.Errorf("peer inbox: %d contexts of ours write inboxes already", maxSlots)
	}
	row, seg, e, host, err := fetch(slot, p == nil)
	if err != nil {
		return nil, err
	}
	if p != nil {
		if row != p.row || uint64(e) != p.e || seg.Size != p.size || (host.Fd >= 0) != (p.host != nil) {
			return nil, fmt.Errorf("peer inbox: the peer handed row %d (%d entries, %d bytes, host rows %v), where we write row %d (%d entries, %d bytes, host rows %v)",
				row, e, seg.Size, host.Fd >= 0, p.row, p.e, p.size, p.host != nil)
		}
		senders.mu.Lock()
		p.refs++
		senders.mu.Unlock()
		return p, nil
	}
	p, err = open(ctx, seg, row, e, host, marks)
	if err != nil {
		return nil, err
	}
	marks.Retain()
	p.refs = 1
	senders.mu.Lock()
	if senders.m == nil {
		senders.m = map[peerKey]*Peer{}
	}
	senders.m[k] = p
	senders.mu.Unlock()
	return p, nil
}

// open maps seg, a peer's inbox rows, into ctx, and host, its host rows
// (Fd -1: none): row is ours, of entries entries; marks is the peer's
// mark page mapped here.
func open(ctx uintptr, seg devmem.Segment, row, entries int, host devmem.Segment, marks *staging.PeerMarks) (*Peer, error) {
	sh, ok := devmem.Get().(devmem.IPCSharer)
	if !ok || row < 0 || row >= Rows || entries <= 0 || entries&(entries-1) != 0 ||
		uint64(Rows)*uint64(entries)*8 > seg.Size {
		return nil, fmt.Errorf("peer inbox: row %d of %d entries in %d bytes", row, entries, seg.Size)
	}
	var hmem []byte
	if host.Fd >= 0 {
		var err error
		if hmem, err = mapHost(ctx, host); err != nil {
			return nil, err
		}
	}
	va, err := sh.IPCImport(ctx, []devmem.Segment{seg})
	if err != nil {
		unmapHost(ctx, hmem)
		return nil, fmt.Errorf("peer inbox: %w", err)
	}
	return &Peer{ctx: ctx, va: va, size: seg.Size, row: row, e: uint64(entries), marks: marks, host: hmem}, nil
}

// mapHost maps the peer's host rows (a sealed memfd, checked) and pins
// them from ctx, so that our host writes the entries of signals alone
// there.
func mapHost(ctx uintptr, seg devmem.Segment) ([]byte, error) {
	hr, ok := devmem.Get().(devmem.HostRegisterer)
	if !ok {
		return nil, errors.New("peer inbox: the device runtime cannot pin the peer's host rows")
	}
	if seg.Size > maxHostRowsBytes || seg.Size < hostRowsSize {
		// Pinned here for as long as we write to the peer: a peer's
		// word alone must not make us pin much.
		return nil, fmt.Errorf("peer inbox: host rows of %d bytes (%d to %d)", seg.Size, hostRowsSize, maxHostRowsBytes)
	}
	mem, err := shmstream.MapSealed(seg.Fd, seg.Size)
	if err != nil {
		return nil, fmt.Errorf("peer inbox: its host rows: %w", err)
	}
	if err := hr.HostRegister(ctx, unsafe.Pointer(&mem[0]), seg.Size); err != nil {
		unix.Munmap(mem)
		return nil, fmt.Errorf("peer inbox: its host rows: %w", err)
	}
	return mem, nil
}

// unmapHost undoes mapHost (nil: nothing).
func unmapHost(ctx uintptr, mem []byte) {
	if mem == nil {
		return
	}
	if hr, ok := devmem.Get().(devmem.HostRegisterer); ok {
		hr.HostUnregister(ctx, unsafe.Pointer(&mem[0]))
	}
	unix.Munmap(mem)
}

// Close ends a link's use of the row (Attach's). The row stays mapped for
// the next communicator with the peer, until its process is found
// replaced or the plugin finalizes (Forget).
func (p *Peer) Close() {
	if p == nil {
		return
	}
	senders.mu.Lock()
	defer senders.mu.Unlock()
	if p.refs--; p.refs <= 0 && p.stale {
		p.unmap()
	}
}

// unmap unmaps the rows and lets the mark page go (under senders.mu, or
// once nothing else reaches p).
func (p *Peer) unmap() {
	unmapHost(p.ctx, p.host)
	p.host = nil
	if sh, ok := devmem.Get().(devmem.IPCSharer); ok && p.va != 0 {
		sh.IPCUnmap(p.ctx, p.va, []uint64{p.size})
	}
	p.marks.Close() // nil once unmapped
	p.va, p.marks = 0, nil
}

// forgetPeers unmaps every row of a peer's inbox mapped here (the last
// finalize, the agents stopped): a later plugin asks afresh.
func forgetPeers() {
	senders.mu.Lock()
	defer senders.mu.Unlock()
	for k, p := range senders.m {
		p.unmap()
		delete(senders.m, k)
	}
	senders.slots = nil
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

// QueueSignalPlaced is QueueSignal for a signal alone whose request
// completes once the entry is in the peer's row: c.Complete(tag, ...) once
// the command executed.
func (p *Peer) QueueSignalPlaced(idx int, off, v uint64, c staging.Completer, tag uint64) (uint64, bool, error) {
	return p.queue(alonePlaced, nil, 0, 0, 0, idx, off, v, c, tag)
}

// how an entry goes to the agent (queue).
type how int

const (
	inBatch     how = iota // joined to a lane's gathered batch (Queue)
	withCopy               // behind its copy, its request waiting for the command (QueueMapped)
	alone                  // a signal alone's entry (QueueSignal)
	alonePlaced            // the same, its request waiting for the command (QueueSignalPlaced)
)

func (p *Peer) queue(h how, g *staging.Gather, dst, src uintptr, n uint64, idx int, off, v uint64, c staging.Completer, tag uint64) (uint64, bool, error) {
	d, ok := devmem.Get().(devmem.Inboxer)
	if !ok || p.va == 0 || !Fits(off, v) || idx < 0 || idx >= TableSize || (h == withCopy && n == 0) {
		return 0, false, nil
	}
	p.mu.Lock()
	pos := p.next
	if pos >= p.e && !p.room(pos) {
		p.mu.Unlock()
		return 0, false, nil
	}
	if p.host != nil && (h == alone || h == alonePlaced) {
		// A signal alone with nothing queued before it on our device: our
		// host writes the entry into our host row.
		hp, done, err := p.hostWrite(idx, off, v)
		if err != nil || done {
			p.mu.Unlock()
			if err != nil {
				return 0, false, err
			}
			hostWrites.Add(1)
			if h == alonePlaced {
				c.Complete(tag, abi.Success) // nothing left to place
			}
			return (hp + 1) | HostPos, true, nil
		}
	}
	defer p.mu.Unlock()
	if p.hnext > 0 && !p.hostTaken() {
		// The peer's agent looks at host rows between its commands only
		// when idle: an entry of ours there not taken yet must not be
		// passed by this one.
		return 0, false, nil
	}
	w := p.va + uintptr((uint64(p.row)*p.e+pos%p.e)*8)
	e := Entry(pos, p.e, idx, off, v)
	var err error
	switch h {
	case inBatch:
		ok, err = g.AddAgent(p.ctx, func() (bool, error) { return d.CopyWrite(p.ctx, dst, src, n, w, e) })
	case withCopy, alonePlaced:
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

// HostPos marks a position (Queue's) that names our row of the peer's
// host rows (Rows + Row()) instead of its device row.
const HostPos = 1 << 63

// hostWrite writes, under mu, the entry for a signal alone into our host
// row when every entry of ours in the device row was taken (so that it
// passes none), there is room, and nothing is queued on our device before
// it (staging.WriteIdle): its position, or false.
func (p *Peer) hostWrite(idx int, off, v uint64) (uint64, bool, error) {
	if p.marks.Rest(p.row)&(refused-1) < p.next {
		return 0, false, nil
	}
	hp := p.hnext
	if hp >= p.e && p.marks.Rest(Rows+p.row)&(refused-1) < hp-p.e+1 {
		return 0, false, nil
	}
	w := uintptr(unsafe.Pointer(&p.host[(uint64(p.row)*p.e+hp%p.e)*8]))
	done, err := staging.WriteIdle(p.ctx, w, Entry(hp, p.e, idx, off, v))
	if !done || err != nil {
		return 0, false, err
	}
	p.hnext++
	return hp, true, nil
}

// hostTaken waits up to roomWait for the peer to take every entry of our
// host row (under mu).
func (p *Peer) hostTaken() bool {
	for start := time.Now(); ; {
		if p.marks.Rest(Rows+p.row)&(refused-1) >= p.hnext {
			return true
		}
		if time.Since(start) > roomWait {
			return false
		}
	}
}

// hostWrites counts the entries our host wrote itself (HostWrites).
var hostWrites atomic.Int64

// HostWrites is how many signals alone our host wrote into peers' host
// rows itself, with nothing queued on the device before them.
func HostWrites() int64 { return hostWrites.Load() }

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
