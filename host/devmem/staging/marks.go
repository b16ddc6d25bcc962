package staging

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
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/profile"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/shmstream"
)

// Agent marks (SPEC.md §4, "Device windows mapped";
// NCCL_RMA_WASM_INTRANODE_AGENT_MARKS). A put+signal into a peer's mapped
// window whose copy is the device agent's is queued as one agent command:
// the copy, then the write of the command's number to this process's
// word of its agent in the mark page, shared memory pinned here and mapped
// read-only by the peers of this host. The header leaves at once, naming
// the word and the number; the target applies the signal once the word
// reached it (PeerMarks.Wait). Neither host waits for the copy, and no
// driver call is made: the agent's answer to the interprocess event.

// MarkWords is how many words the mark page holds: one per copy context
// whose agent marks (host/devmem/cuda's MAX_CTX).
const MarkWords = 64

// markPageSize is the page's size: MarkWords words, a page of memory.
const markPageSize = 4096

// markPage is the process's mark page: word i is written by the agent of
// ctxs[i] alone, with its commands' numbers, so it only grows.
type markPage struct {
	fd   int
	mem  []byte
	ctx  uintptr // the context it was registered from
	ctxs [MarkWords]atomic.Uintptr
}

var marks struct {
	mu   sync.Mutex // makes and frees the page
	page atomic.Pointer[markPage]
	err  error // why it could not be made (asked once)
}

// MarkPage makes the process's mark page once, pinned from ctx, for
// peers to map (host/dataplane/intranode/share hands it over,
// MarkPageReadOnly). An error says why there is none; it is made once, so
// the same error comes back.
func MarkPage(ctx uintptr) error {
	if marks.page.Load() != nil {
		return nil
	}
	marks.mu.Lock()
	defer marks.mu.Unlock()
	if marks.page.Load() != nil || marks.err != nil {
		return marks.err
	}
	p, err := newMarkPage(ctx)
	if err != nil {
		marks.err = err
		return err
	}
	marks.page.Store(p)
	pinPending(ctx)
	return nil
}

// MarkPageReadOnly opens the mark page again, read-only, for a peer: the
// caller sends and closes the fd. A peer that holds it can map the page
// for reading only, so it cannot write the marks we send other peers.
func MarkPageReadOnly() (int, error) {
	p := marks.page.Load()
	if p == nil {
		return -1, errors.New("no mark page")
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", p.fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("mark page, read-only: %w", err)
	}
	return fd, nil
}

func newMarkPage(ctx uintptr) (*markPage, error) {
	d := devmem.Get()
	hr, ok := d.(devmem.HostRegisterer)
	if _, ok2 := d.(devmem.CopyMarker); !ok || !ok2 {
		return nil, errors.New("the device runtime has no agent marks")
	}
	// Sealed against resizing, as the staging ring: a peer's mapping of
	// it can never fault, whatever a process holding the fd does.
	fd, mem, err := shmstream.CreateSealed("rccl-rma-wasm-marks", markPageSize)
	if err != nil {
		return nil, fmt.Errorf("mark page: %w", err)
	}
	if err := hr.HostRegister(ctx, unsafe.Pointer(&mem[0]), markPageSize); err != nil {
		unix.Munmap(mem)
		unix.Close(fd)
		return nil, fmt.Errorf("mark page: %w", err)
	}
	return &markPage{fd: fd, mem: mem, ctx: ctx}, nil
}

// releaseMarks frees the page (finalize, the agents stopped): the peers
// keep their own mappings of it.
func releaseMarks() {
	marks.mu.Lock()
	defer marks.mu.Unlock()
	freeReleaseWords()
	p := marks.page.Swap(nil)
	marks.err = nil
	if p == nil {
		return
	}
	if hr, ok := devmem.Get().(devmem.HostRegisterer); ok {
		hr.HostUnregister(p.ctx, unsafe.Pointer(&p.mem[0]))
	}
	unix.Munmap(p.mem)
	unix.Close(p.fd)
}

// word returns the index of ctx's word, claiming a free one at its first
// mark; false when every word is taken.
func (p *markPage) word(ctx uintptr) (int, bool) {
	// Words are claimed in order and never given back: ctx's, if any,
	// comes before the first free one.
	for i := range p.ctxs {
		c := p.ctxs[i].Load()
		if c == 0 && p.ctxs[i].CompareAndSwap(0, ctx) {
			return i, true
		}
		if c == 0 {
			c = p.ctxs[i].Load() // another thread claimed it first
		}
		if c == ctx {
			return i, true
		}
	}
	return 0, false
}

func (p *markPage) addr(i int) uintptr { return uintptr(unsafe.Pointer(&p.mem[i*8])) }

// MarkPageRest is the page's second half, after the mark words: the peer
// inbox's counts live there (host/devmem/inbox), where the peers that map
// the page read them. 0: no page (MarkPage first).
func MarkPageRest() uintptr {
	p := marks.page.Load()
	if p == nil {
		return 0
	}
	return uintptr(unsafe.Pointer(&p.mem[markPageSize/2]))
}

// MarkPageRestWord is word i of our page's second half (MarkPageRest),
// nil without a page or past its end.
func MarkPageRestWord(i int) *atomic.Uint64 {
	p := marks.page.Load()
	if p == nil || i < 0 || i >= markPageSize/16 {
		return nil
	}
	return (*atomic.Uint64)(unsafe.Pointer(&p.mem[markPageSize/2+i*8]))
}

// Rest is word i of the page's second half (MarkPageRest), 0 past its end.
func (m *PeerMarks) Rest(i int) uint64 {
	if i < 0 || i >= markPageSize/16 || m.mem == nil {
		return 0
	}
	return (*atomic.Uint64)(unsafe.Pointer(&m.mem[markPageSize/2+i*8])).Load()
}

// CopyMappedMark queues the copy of n bytes (at most a bounce slot) from
// our device memory src to dst, a peer's window mapped here, as one
// command of ctx's device agent that then writes its number v to ctx's
// word k of the mark page; the target applies the signal once word k
// reached v (PeerMarks.Wait). c.Complete(tag, ...) once the copy executed,
// as CopyMappedAsync. false (and no error): no page, no agent in ctx, no
// free word or slot; the caller's other ways.
func CopyMappedMark(ctx, dst, src uintptr, n uint64, c Completer, tag uint64) (bool, int, uint64, error) {
	p := marks.page.Load()
	if p == nil || n > bounceSize.Load() {
		return false, 0, 0, nil
	}
	k, ok := p.word(ctx)
	if !ok {
		return false, 0, 0, nil
	}
	ok, v, err := copyQueued(ctx, dst, src, n, c, tag, 0, p.addr(k), 0, 0)
	return ok, k, v, err
}

// PeerMarks is a peer's mark page, mapped read-only here (the target's
// side of agent marks).
type PeerMarks struct {
	mem []byte
	w   *[MarkWords]atomic.Uint64
	pid int // the peer's process: gone, its agent writes nothing more
	// id is the page's file (device and inode), which no other page has
	// while this mapping holds it; refs counts Open and Retain less Close.
	id   [2]uint64
	refs atomic.Int32
	// pinCtx: the context the page is pinned from for the device to read
	// (marksig.go), 0: not pinned; rel, its release word's address (0:
	// none), relw the word, relIdx its index (set under devicePins before
	// the page is listed in pinnedPages) and released whether releaseDead
	// set it (under pinnedPages).
	pinCtx   atomic.Uintptr
	rel      atomic.Uintptr
	relw     *atomic.Uint64
	relIdx   int
	released bool
}

// OpenPeerMarks maps the mark page of process pid from fd (the caller
// keeps fd and closes it).
func OpenPeerMarks(fd, pid int) (*PeerMarks, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("mark page of pid %d: %w", pid, err)
	}
	if st.Size != markPageSize {
		return nil, fmt.Errorf("mark page of pid %d: %d bytes, want %d", pid, st.Size, markPageSize)
	}
	// Sealed against resizing, or a sender that shrank it would fault our
	// reads of the mapping.
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&(unix.F_SEAL_SHRINK|unix.F_SEAL_GROW) != unix.F_SEAL_SHRINK|unix.F_SEAL_GROW {
		return nil, fmt.Errorf("mark page of pid %d: not sealed against resizing (%v)", pid, err)
	}
	mem, err := unix.Mmap(fd, 0, markPageSize, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mark page of pid %d: mmap: %w", pid, err)
	}
	m := &PeerMarks{mem: mem, w: (*[MarkWords]atomic.Uint64)(unsafe.Pointer(&mem[0])), pid: pid, id: [2]uint64{uint64(st.Dev), st.Ino}}
	m.refs.Store(1)
	m.pinForDevice()
	return m, nil
}

// Retain adds a holder of the page (the peer inbox's sender, which may
// outlive the link that mapped it); each holder calls Close once.
func (m *PeerMarks) Retain() { m.refs.Add(1) }

// ID tells the page apart from any other mapped here: a peer process that
// ended and one that started since have different pages.
func (m *PeerMarks) ID() [2]uint64 { return m.id }

// Close drops a holder; the last one unmaps the page, once nothing waits
// on it any more.
func (m *PeerMarks) Close() {
	if m != nil && m.refs.Add(-1) == 0 && m.mem != nil {
		m.unpinForDevice()
		unix.Munmap(m.mem)
		m.mem, m.w = nil, nil
	}
}

// Reached reports whether word k (a valid index or not) already reached v.
func (m *PeerMarks) Reached(k int, v uint64) bool {
	return k >= 0 && k < MarkWords && v != 0 && m.w[k].Load() >= v
}

// ReachedWithin reports whether word k (a valid index or not) reaches v
// within d, polling: a polling caller's short wait for a mark a few
// microseconds behind its header, which costs less than handing the
// header to a goroutine that must be woken.
func (m *PeerMarks) ReachedWithin(k int, v uint64, d time.Duration) bool {
	if k < 0 || k >= MarkWords || v == 0 {
		return false
	}
	w := &m.w[k]
	if w.Load() >= v {
		return true
	}
	if d <= 0 {
		return false // a look, not a wait: nothing to profile
	}
	if profile.On() {
		defer profile.MarkWait.Since(profile.Now())
	}
	// Loads only: the caller is a foreign thread in a cgo callback, whose
	// goroutine is locked to it, and a yield there hands the thread off
	// and back through the scheduler (microseconds each).
	return reach(w, v, d, false)
}

// reach polls w until it reaches v or d passed, in rounds of loads,
// yielding after each load when yield is set.
func reach(w *atomic.Uint64, v uint64, d time.Duration, yield bool) bool {
	start := time.Now()
	for time.Since(start) < d {
		for range 64 {
			if w.Load() >= v {
				return true
			}
			if yield {
				runtime.Gosched()
			}
		}
	}
	return w.Load() >= v
}

// markTimeout bounds a wait for a live peer's mark: its copy runs on a
// device of this host, so only a stuck device outlasts it. markSpin is how
// long a wait yields before it sleeps: a mark is usually a few
// microseconds behind its header, and a sleep costs tens of them.
var (
	markTimeout = 30 * time.Second
	markSpin    = 200 * time.Microsecond
)

// ErrMarkPeerGone is the error of a wait whose peer process exited before
// its agent wrote the mark: the copy may never have run.
var ErrMarkPeerGone = errors.New("the peer's process exited before its agent marked the copy")

// Wait returns once word k reached v: the peer's agent copied the payload
// of the put+signal that named (k, v), and every copy it queued before.
// It polls, yielding for markSpin, then sleeping; it gives up when the
// peer's process is gone or after markTimeout. A trace marks the moment
// the mark was seen, whichever way it was.
func (m *PeerMarks) Wait(k int, v uint64) error {
	err := m.wait(k, v)
	if err == nil {
		profile.Mark(profile.PtMark)
	}
	return err
}

func (m *PeerMarks) wait(k int, v uint64) error {
	w := &m.w[k]
	if w.Load() >= v {
		return nil
	}
	if profile.On() {
		defer profile.MarkWait.Since(profile.Now())
	}
	start := time.Now()
	if reach(w, v, markSpin, true) {
		return nil
	}
	for n := 0; ; n++ {
		if w.Load() >= v {
			return nil
		}
		if n%100 == 0 {
			if unix.Kill(m.pid, 0) == unix.ESRCH {
				if w.Load() >= v {
					return nil
				}
				return fmt.Errorf("mark %d of word %d (pid %d): %w", v, k, m.pid, ErrMarkPeerGone)
			}
			if time.Since(start) > markTimeout {
				markWarn.Warn(abi.SubsysNet, "NET/wasm: pid %d's device agent did not mark a copy into our memory in %s (word %d at %d, waiting for %d)", m.pid, markTimeout, k, w.Load(), v)
				return fmt.Errorf("mark %d of word %d (pid %d) not reached in %s", v, k, m.pid, markTimeout)
			}
		}
		time.Sleep(10 * time.Microsecond)
	}
}

var markWarn logx.Limited
