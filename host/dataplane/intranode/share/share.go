// Package share hands device windows between the processes of a host
// (SPEC.md §4, NCCL_RMA_WASM_INTRANODE_IPC): the descriptor exchange
// behind the intra-node path's mapped puts and gets. A rank that registers
// device memory with peers on its host offers it in its MsgReg: a token
// naming its descriptor server, an abstract unix socket (host/fdpass).
// Each such peer, before its own regMrSym returns, asks that server for
// the registration's allocations, which come as POSIX fds (cuMem export),
// maps them, and from then on copies device payloads straight into the
// target's memory: one copy on the device, the target applying only the
// signal. The server exports on request and only while the registration
// lives, so a late or hostile request gets nothing stale; only the pids
// of our intra-node peers, of our user, are served. Anything that fails
// keeps the staged path for that peer and registration, with one INFO
// line.
//
// An Exchange is one communicator's side of it. It reaches the plugin's
// registrations through a Registry and the mesh's intra-node peers
// through an IPC (host/dataplane's IPC implements it); host/plugin wires
// the two and decides whether the feature is on.
package share

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/link"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/inbox"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fdpass"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// Registry is what the exchange needs of the communicator's registrations
// (host/plugin's coll).
type Registry interface {
	// Resolve returns registration id's memory and device context (0:
	// host memory), pinned until the caller releases the Pin; ok is false
	// when there is no such registration (link.Owner's Resolve).
	Resolve(id uint32) (base unsafe.Pointer, size uint64, ctx uintptr, pin link.Pin, ok bool)
	// DeviceContext is the device context of our registration id, 0 when
	// it is host memory or there is no such registration.
	DeviceContext(id uint32) uintptr
	// MarkShared records that registration id was handed to a peer of
	// this host: puts into it land before they are acknowledged from now
	// on (dataplane.SharedOwner).
	MarkShared(id uint32)
}

// IPC is what the exchange needs of the mesh: which intra-node peer a
// process is, and the interprocess events of mapped put+signals
// (host/dataplane's IPC). It answers for the ranks the intra-node path
// carries; for any other, as for a rank it does not know.
type IPC interface {
	// Pid is the pid of rank's process when the intra-node path carries
	// its operations, else 0.
	Pid(rank int) int
	// MakeEvents makes, once, the events our mapped put+signals to rank
	// record (in ctx) and returns their handles.
	MakeEvents(rank int, ctx uintptr) ([][64]byte, error)
	// EventHandles returns the handles of the events MakeEvents made for
	// rank, or nil.
	EventHandles(rank int) [][64]byte
	// SetEventsReady records that rank opened our events.
	SetEventsReady(rank int)
	// EventsReady reports whether rank opened our events.
	EventsReady(rank int) bool
	// OpenPeerEvents opens rank's event handles in ctx, once.
	OpenPeerEvents(rank int, ctx uintptr, handles [][64]byte) error
	// OpenPeerMarks maps rank's mark page from fd (which the caller
	// closes), once; SetMarksReady records that rank mapped ours, and
	// MarksReady reports it (staging's marks.go).
	OpenPeerMarks(rank int, fd int) error
	SetMarksReady(rank int)
	MarksReady(rank int) bool
	// PeerMarks is rank's mark page mapped here, or nil; SetPeerInbox
	// keeps rank's inbox row mapped here (false: closed, or one already);
	// SetInboxRow records the row of ours that rank got
	// (host/devmem/inbox).
	PeerMarks(rank int) *staging.PeerMarks
	SetPeerInbox(rank int, p *inbox.Peer) bool
	SetInboxRow(rank, row int)
}

// Config is what New needs of a communicator.
type Config struct {
	Rank, Ranks int
	// Regs resolves the registration ids peers ask for.
	Regs Registry
	// Closed is set once the communicator closes: a request waiting for
	// its asker's token gives up.
	Closed *atomic.Bool
	// Events says whether mapped put+signals are ordered by interprocess
	// events (NCCL_RMA_WASM_INTRANODE_IPC_EVENTS), asked when a peer's
	// registration was mapped; nil: never.
	Events func() bool
	// Marks says whether mapped put+signals whose copy is the device
	// agent's are ordered by agent marks
	// (NCCL_RMA_WASM_INTRANODE_AGENT_MARKS), asked likewise; nil: never.
	Marks func() bool
	// Inbox says whether our signals go through the peers' inboxes
	// (NCCL_RMA_WASM_INTRANODE_INBOX), asked likewise; nil: never.
	Inbox func() bool
}

// Exchange is one communicator's side of the descriptor exchange: its
// descriptor server, the peers' tokens and the INFO lines said once.
type Exchange struct {
	rank, nranks int
	regs         Registry
	closed       *atomic.Bool
	events       func() bool
	marks        func() bool
	inbox        func() bool
	ipc          IPC

	mu     sync.Mutex
	srv    *fdpass.Server
	token  uint64
	said   bool           // the INFO line about a failed mapping was written
	tokens map[int]uint64 // each peer's server, from its offers
	evSaid bool           // the INFO line about events was written
	mkSaid bool           // the INFO line about marks was written
	ibSaid bool           // the INFO line about the inbox was written
	rows   map[int]bool   // the ranks that got a row of our inbox
	asked  map[int]bool   // the ranks whose inbox row we asked for
}

// New returns a communicator's exchange; it records peers' offers at once
// and serves or imports once Attach gave it the mesh.
func New(cfg Config) *Exchange {
	closed := cfg.Closed
	if closed == nil {
		closed = new(atomic.Bool)
	}
	return &Exchange{rank: cfg.Rank, nranks: cfg.Ranks, regs: cfg.Regs, closed: closed, events: cfg.Events, marks: cfg.Marks, inbox: cfg.Inbox}
}

// Attach gives the exchange the mesh's side, once the communicator is
// connected, before its first Offer or Import.
func (x *Exchange) Attach(ipc IPC) { x.ipc = ipc }

// Local is one of our registrations of device memory.
type Local struct {
	ID   uint32
	Ctx  uintptr // its device context
	Base uintptr
	Size uint64
}

// Remote is a registration as the other ranks announced it in their
// MsgReg, indexed by rank.
type Remote struct {
	Tokens []uint64 // each rank's descriptor server (0: none offered), nil when none offered one
	Dev    []bool   // device memory there
	Bases  []uint64 // its address in rank's process
	Sizes  []uint64
}

// Keys of a descriptor server: a registration id (below 2^32), or one of
// these kinds in the high word.
const (
	keyOpenEvents   = 1 << 32 // | asker's rank << 40 | registration id: open its events, in that registration's context
	keyEventHandles = 2 << 32 // | rank: the handles of our events for that rank (the asker)
	keyMarkPage     = 3 << 32 // | rank: our mark page, for that rank (the asker)
	keyOpenMarks    = 4 << 32 // | asker's rank: map its mark page
	keyInboxRow     = 5 << 32 // | afresh << 48 | slot << 40 | asker's rank: a row of our peer inbox for it (inbox.Row)
	keyKind         = 0xff << 32
	keyRankShift    = 40 // the asker's rank in keyOpenEvents (several ranks may share a process)
	segEvents       = 3  // an answer's kind: event handles
	segMarks        = 4  // an answer's kind: the mark page's fd
	segInbox        = 5  // an answer's kind: an inbox row and the rows' fd
	segInboxHost    = 6  // an answer's kind: an inbox row, the rows' fd, and the host rows' size and memfd
)

// DirectAdds is a bit no token has: set in a registration's offer, it
// says that the registration takes its peers' device agents' atomic adds
// (NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL): its owner adds to its signal
// words atomically on the device and keeps no never-reset shadow.
const DirectAdds = 1 << 63

// shareName is the abstract socket of pid's server for token.
func shareName(pid int, token uint64) string {
	return fmt.Sprintf("rccl-rma-wasm/%d/%016x", pid, token)
}

// PeerOffered records the descriptor server token peer offered in its
// MsgReg (0: none).
func (x *Exchange) PeerOffered(peer int, token uint64) {
	if token == 0 {
		return
	}
	x.mu.Lock()
	if x.tokens == nil {
		x.tokens = map[int]uint64{}
	}
	x.tokens[peer] = token
	x.mu.Unlock()
}

// Offer returns the token to put in m's MsgReg, starting the server on
// first use; 0: nothing to offer (a runtime without IPC, memory without
// shareable handles, no peer on this host). The caller has checked that
// the feature is on.
func (x *Exchange) Offer(m Local) uint64 {
	sh, ok := devmem.Get().(devmem.IPCSharer)
	if !ok {
		return 0
	}
	local := false
	for r := 0; r < x.nranks && !local; r++ {
		local = x.ipc.Pid(r) != 0
	}
	if !local {
		return 0
	}
	// A trial export: memory without shareable handles (cuMemAlloc's, or
	// cuMem allocations made without POSIX fds) is not offered.
	segs, err := sh.IPCExport(m.Ctx, m.Base, m.Size)
	if err != nil {
		logx.Trace(abi.SubsysReg, "NET/wasm: rank %d: registration %d is not shared with peers on this host: %v", x.rank, m.ID, err)
		return 0
	}
	closeSegments(segs)
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.srv != nil {
		return x.token
	}
	var b [8]byte
	rand.Read(b[:])
	tok := (binary.LittleEndian.Uint64(b[:]) | 1) &^ DirectAdds
	srv, err := fdpass.Listen(shareName(os.Getpid(), tok), x.sharePeer, x.serve)
	if err != nil {
		logx.Info(abi.SubsysReg, "NET/wasm: rank %d: device windows are not shared with peers on this host: %v", x.rank, err)
		return 0
	}
	x.srv, x.token = srv, tok
	return tok
}

// sharePeer says whether pid is one of our intra-node peers.
func (x *Exchange) sharePeer(pid int) bool {
	for r := 0; r < x.nranks; r++ {
		if p := x.ipc.Pid(r); p != 0 && p == pid {
			return true
		}
	}
	return false
}

// serve answers a peer's request for key (fdpass.Serve).
func (x *Exchange) serve(pid int, key uint64) ([]byte, []int, error) {
	switch {
	case key&^0xffffffff == 0:
		return x.serveRegistration(pid, uint32(key))
	case key&keyKind == keyOpenEvents:
		return x.serveOpenEvents(pid, int(key>>keyRankShift), uint32(key))
	case key&^0xffffffff == keyEventHandles:
		return x.serveEventHandles(pid, int(uint32(key)))
	case key&^0xffffffff == keyMarkPage:
		return x.serveMarkPage(pid, int(uint32(key)))
	case key&^0xffffffff == keyOpenMarks:
		return x.serveOpenMarks(pid, int(uint32(key)))
	case key&keyKind == keyInboxRow && key>>49 == 0:
		return x.serveInboxRow(pid, int(uint32(key)), int(key>>keyRankShift&0xff), key>>48&1 == 1)
	}
	return nil, nil, errors.New("no such registration")
}

// serveRegistration exports the allocations under registration id for a
// peer. The answer is the segments' count and kind, then each one's
// address and size (and, for handles, its 64 bytes); fds ride with it.
func (x *Exchange) serveRegistration(pid int, id uint32) ([]byte, []int, error) {
	base, size, ctx, pin, ok := x.regs.Resolve(id)
	if !ok {
		return nil, nil, errors.New("no such registration")
	}
	defer pin.Release()
	sh, _ := devmem.Get().(devmem.IPCSharer)
	if ctx == 0 || sh == nil {
		return nil, nil, errors.New("not device memory")
	}
	segs, err := sh.IPCExport(ctx, uintptr(base), size)
	if err != nil {
		logx.Info(abi.SubsysReg, "NET/wasm: rank %d: registration %d cannot be shared with pid %d: %v", x.rank, id, pid, err)
		return nil, nil, err
	}
	// Landings into it are waited for from now on: the peer reads and
	// writes it without us (dataplane.SharedOwner).
	x.regs.MarkShared(id)
	kind := uint32(segFds)
	if len(segs) > 0 && segs[0].Fd < 0 {
		kind = segHandles
	}
	payload := binary.LittleEndian.AppendUint32(nil, uint32(len(segs)))
	payload = binary.LittleEndian.AppendUint32(payload, kind)
	var fds []int
	for _, s := range segs {
		payload = binary.LittleEndian.AppendUint64(payload, s.Base)
		payload = binary.LittleEndian.AppendUint64(payload, s.Size)
		if kind == segHandles {
			payload = append(payload, s.Handle[:]...)
		} else {
			fds = append(fds, s.Fd)
		}
	}
	return payload, fds, nil
}

// serveOpenEvents opens the events of the intra-node peer pid, which
// orders its mapped put+signals to us by them (intranode's
// ipc_events.go): their handles are fetched from its server.
func (x *Exchange) serveOpenEvents(pid, r int, id uint32) ([]byte, []int, error) {
	if r < 0 || r >= x.nranks || x.ipc.Pid(r) != pid {
		return nil, nil, errors.New("no such peer or registration")
	}
	ctx := x.regs.DeviceContext(id)
	if ctx == 0 {
		return nil, nil, errors.New("no such peer or registration")
	}
	tok, err := x.peerToken(r)
	if err != nil {
		return nil, nil, err
	}
	payload, fds, err := fdpass.Fetch(shareName(pid, tok), keyEventHandles|uint64(x.rank), pid)
	closeFds(fds)
	if err != nil {
		return nil, nil, err
	}
	n := 0
	if len(payload) >= 8 {
		n = int(binary.LittleEndian.Uint32(payload))
	}
	if n < 1 || n > 256 || binary.LittleEndian.Uint32(payload[4:]) != segEvents || len(payload) != 8+64*n {
		return nil, nil, fmt.Errorf("malformed event handles from rank %d", r)
	}
	handles := make([][64]byte, n)
	for i := range handles {
		copy(handles[i][:], payload[8+64*i:])
	}
	if err := x.ipc.OpenPeerEvents(r, ctx, handles); err != nil {
		logx.Info(abi.SubsysReg, "NET/wasm: rank %d: the events of rank %d cannot be opened here: %v", x.rank, r, err)
		return nil, nil, err
	}
	return []byte{1}, nil, nil
}

// peerToken returns rank r's descriptor server. It is named in r's
// MsgReg, which our service may not have read yet: it was sent before the
// asker's wait for ours.
func (x *Exchange) peerToken(r int) (uint64, error) {
	var tok uint64
	for deadline := time.Now().Add(time.Second); ; time.Sleep(time.Millisecond) {
		x.mu.Lock()
		tok = x.tokens[r]
		x.mu.Unlock()
		if tok != 0 || time.Now().After(deadline) || x.closed.Load() {
			break
		}
	}
	if tok == 0 {
		return 0, fmt.Errorf("rank %d offered no descriptor server", r)
	}
	return tok, nil
}

// serveEventHandles answers the handles of our events for rank, which
// must be process pid.
func (x *Exchange) serveEventHandles(pid, r int) ([]byte, []int, error) {
	if r < 0 || r >= x.nranks || x.ipc.Pid(r) != pid {
		return nil, nil, errors.New("not that rank")
	}
	hs := x.ipc.EventHandles(r)
	if hs == nil {
		return nil, nil, errors.New("no events")
	}
	payload := binary.LittleEndian.AppendUint32(nil, uint32(len(hs)))
	payload = binary.LittleEndian.AppendUint32(payload, segEvents)
	for _, h := range hs {
		payload = append(payload, h[:]...)
	}
	return payload, nil, nil
}

// orderByEvents makes our mapped put+signals to rank r (process pid)
// ordered by our interprocess events, once per peer: the events are made
// in m's context and r (whose server is tok) is asked to open them. Any
// failure keeps the host's wait for each copy (an INFO line, once).
func (x *Exchange) orderByEvents(m Local, tok uint64, r, pid int) {
	if x.events == nil || !x.events() || x.ipc.EventsReady(r) {
		return
	}
	if _, ok := devmem.Get().(devmem.IPCEvents); !ok {
		return
	}
	_, err := x.ipc.MakeEvents(r, m.Ctx)
	if err == nil {
		err = askYes(tok, pid, keyOpenEvents|uint64(x.rank)<<keyRankShift|uint64(m.ID))
	}
	first := x.first(&x.evSaid)
	if err != nil {
		if first {
			logx.Info(abi.SubsysReg, "NET/wasm: rank %d: mapped put+signals to rank %d wait for their copies on the host: %v", x.rank, r, err)
		}
		return
	}
	x.ipc.SetEventsReady(r)
	if first {
		logx.Info(abi.SubsysReg, "NET/wasm: rank %d: mapped put+signals to rank %d are ordered by interprocess events: no host waits for their copies", x.rank, r)
	}
}

// askYes asks the server tok of process pid for key, which it answers
// with the single byte 1 once done.
func askYes(tok uint64, pid int, key uint64) error {
	p, fds, err := fdpass.Fetch(shareName(pid, tok), key, pid)
	closeFds(fds)
	if err == nil && (len(p) != 1 || p[0] != 1) {
		err = errors.New("malformed answer")
	}
	return err
}

// first reports whether *said was still unset, and sets it (under x.mu):
// each feature's INFO line is written once per communicator.
func (x *Exchange) first(said *bool) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	f := !*said
	*said = true
	return f
}

// orderByMarks makes our mapped put+signals to rank r (process pid)
// whose copy is the device agent's ordered by agent marks, once per peer:
// our mark page is made (pinned from m's context) and r (whose server is
// tok) is asked to map it. Any failure keeps the lane's wait for each
// copy (an INFO line, once).
func (x *Exchange) orderByMarks(m Local, tok uint64, r, pid int) {
	if x.marks == nil || !x.marks() || x.ipc.MarksReady(r) || !staging.AgentWanted() {
		return
	}
	err := staging.MarkPage(m.Ctx)
	if err == nil {
		err = askYes(tok, pid, keyOpenMarks|uint64(x.rank))
	}
	first := x.first(&x.mkSaid)
	if err != nil {
		if first {
			logx.Info(abi.SubsysReg, "NET/wasm: rank %d: mapped put+signals to rank %d are not ordered by device agent marks: %v", x.rank, r, err)
		}
		return
	}
	x.ipc.SetMarksReady(r)
	if first {
		logx.Info(abi.SubsysReg, "NET/wasm: rank %d: mapped put+signals to rank %d are ordered by device agent marks: no host waits for their copies", x.rank, r)
	}
}

// serveOpenMarks maps the mark page of the intra-node peer pid (rank r),
// which orders its mapped put+signals to us by it: the page comes from
// its server.
func (x *Exchange) serveOpenMarks(pid, r int) ([]byte, []int, error) {
	if r < 0 || r >= x.nranks || x.ipc.Pid(r) != pid {
		return nil, nil, errors.New("no such peer")
	}
	tok, err := x.peerToken(r)
	if err != nil {
		return nil, nil, err
	}
	if err := x.mapPeerMarks(tok, r, pid); err != nil {
		return nil, nil, err
	}
	return []byte{1}, nil, nil
}

// mapPeerMarks fetches the mark page of rank r (process pid, server tok)
// and maps it here, once (read-only): the words its agent marks its
// copies into our memory on, and the counts of its peer inbox.
func (x *Exchange) mapPeerMarks(tok uint64, r, pid int) error {
	payload, fds, err := fdpass.Fetch(shareName(pid, tok), keyMarkPage|uint64(x.rank), pid)
	defer closeFds(fds)
	if err != nil {
		return err
	}
	if len(payload) != 8 || binary.LittleEndian.Uint32(payload) != 1 || binary.LittleEndian.Uint32(payload[4:]) != segMarks || len(fds) != 1 {
		return fmt.Errorf("malformed mark page from rank %d", r)
	}
	if err := x.ipc.OpenPeerMarks(r, fds[0]); err != nil {
		logx.Info(abi.SubsysReg, "NET/wasm: rank %d: the mark page of rank %d cannot be mapped here: %v", x.rank, r, err)
		return err
	}
	return nil
}

// serveMarkPage answers our mark page for rank, which must be process
// pid: a read-only fd of it, which the server closes once sent.
func (x *Exchange) serveMarkPage(pid, r int) ([]byte, []int, error) {
	if r < 0 || r >= x.nranks || x.ipc.Pid(r) != pid {
		return nil, nil, errors.New("not that rank")
	}
	fd, err := staging.MarkPageReadOnly()
	if err != nil {
		return nil, nil, err
	}
	payload := binary.LittleEndian.AppendUint32(nil, 1)
	payload = binary.LittleEndian.AppendUint32(payload, segMarks)
	return payload, []int{fd}, nil
}

func closeFds(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// An answer's segments come as fds (CUDA) or as handles (HIP).
const (
	segFds     = 1
	segHandles = 2
)

// closeSegments closes the fds of exported segments.
func closeSegments(segs []devmem.Segment) {
	for _, s := range segs {
		if s.Fd >= 0 {
			unix.Close(s.Fd)
		}
	}
}

// maxShareSpan bounds what one mapping reserves (a peer's word is not
// trusted with our address space).
const maxShareSpan = 1 << 44

// Mapped is what Import mapped here for one of our registrations: the
// peers' parts, which Unmap undoes.
type Mapped struct {
	id   uint32
	ctx  uintptr
	maps []shareMap
}

// shareMap is one peer's allocations mapped here for a registration.
type shareMap struct {
	va    uintptr
	sizes []uint64 // the segments mapped back to back from va
}

// Import maps, for every intra-node peer that offered registration m, its
// part of it; each failure leaves that peer on the staged path. It
// returns the address here of each rank's registration (0: not mapped;
// nil when none is) and what to unmap when m is deregistered. The caller
// has checked that the feature is on.
func (x *Exchange) Import(m Local, peers Remote) ([]uintptr, Mapped) {
	maps := Mapped{id: m.ID, ctx: m.Ctx}
	if peers.Tokens == nil || m.Ctx == 0 {
		return nil, maps
	}
	sh, ok := devmem.Get().(devmem.IPCSharer)
	if !ok {
		return nil, maps
	}
	var mapped []uintptr
	for r := 0; r < x.nranks; r++ {
		pid := x.ipc.Pid(r)
		if peers.Tokens[r] == 0 || !peers.Dev[r] || pid == 0 {
			continue
		}
		va, err := x.importShare(sh, m, &maps, peers, r, pid)
		if err != nil {
			if x.first(&x.said) {
				logx.Info(abi.SubsysReg, "NET/wasm: rank %d: registration %d of rank %d (pid %d) is not mapped here, its device operations are staged: %v", x.rank, m.ID, r, pid, err)
			}
			continue
		}
		if mapped == nil {
			mapped = make([]uintptr, x.nranks)
		}
		mapped[r] = va
		x.orderByEvents(m, peers.Tokens[r], r, pid)
		x.orderByMarks(m, peers.Tokens[r], r, pid)
		x.openInbox(m, peers.Tokens[r], r, pid)
	}
	return mapped, maps
}

// importShare fetches and maps rank r's part of m (recording it in maps)
// and returns the address of its registration's first byte here.
func (x *Exchange) importShare(sh devmem.IPCSharer, m Local, maps *Mapped, peers Remote, r, pid int) (uintptr, error) {
	payload, fds, err := fdpass.Fetch(shareName(pid, peers.Tokens[r]), uint64(m.ID), pid)
	if err != nil {
		return 0, err
	}
	defer closeFds(fds)
	segs, err := parseSegments(payload, fds)
	if err != nil {
		return 0, err
	}
	first, span := segs[0].Base, uint64(0)
	for _, s := range segs {
		span += s.Size
	}
	if peers.Bases[r] < first || peers.Bases[r]-first > span || peers.Sizes[r] > span-(peers.Bases[r]-first) {
		return 0, fmt.Errorf("its allocations [%#x, +%d) do not hold its registration [%#x, +%d)", first, span, peers.Bases[r], peers.Sizes[r])
	}
	va, err := sh.IPCImport(m.Ctx, segs)
	if err != nil {
		return 0, err
	}
	sizes := make([]uint64, len(segs))
	for i, sg := range segs {
		sizes[i] = sg.Size
	}
	maps.maps = append(maps.maps, shareMap{va: va, sizes: sizes})
	return va + uintptr(peers.Bases[r]-first), nil
}

// parseSegments reads serveRegistration's answer: n segments back to
// back, each with its fd or its handle (then exactly one), of bounded
// total size.
func parseSegments(p []byte, fds []int) ([]devmem.Segment, error) {
	if len(p) < 8 {
		return nil, errors.New("short answer")
	}
	n, kind := int(binary.LittleEndian.Uint32(p)), binary.LittleEndian.Uint32(p[4:])
	rec := 16
	switch {
	case kind == segFds && n == len(fds):
	case kind == segHandles && n == 1 && len(fds) == 0:
		rec += 64
	default:
		return nil, fmt.Errorf("malformed answer: %d segments of kind %d, %d fds", n, kind, len(fds))
	}
	if n < 1 || n > devmem.MaxSegments || len(p) != 8+rec*n {
		return nil, fmt.Errorf("malformed answer: %d segments, %d bytes", n, len(p))
	}
	segs := make([]devmem.Segment, n)
	span := uint64(0)
	for i := range segs {
		b := p[8+rec*i:]
		s := devmem.Segment{Fd: -1, Base: binary.LittleEndian.Uint64(b), Size: binary.LittleEndian.Uint64(b[8:])}
		if kind == segFds {
			s.Fd = fds[i]
		} else {
			copy(s.Handle[:], b[16:80])
		}
		if s.Size == 0 || s.Size > maxShareSpan || (i > 0 && s.Base != segs[i-1].Base+segs[i-1].Size) {
			return nil, fmt.Errorf("malformed answer: segment %d [%#x, +%d)", i, s.Base, s.Size)
		}
		if span += s.Size; span > maxShareSpan {
			return nil, fmt.Errorf("malformed answer: %d bytes mapped", span)
		}
		segs[i] = s
	}
	return segs, nil
}

// Unmap unmaps what Import mapped for a registration (maps): it is
// deregistered, or the mesh is closed, and no operation of ours uses the
// mappings any more.
func (x *Exchange) Unmap(maps *Mapped) {
	if len(maps.maps) == 0 {
		return
	}
	sh, ok := devmem.Get().(devmem.IPCSharer)
	if !ok {
		return
	}
	for _, m := range maps.maps {
		if err := sh.IPCUnmap(maps.ctx, m.va, m.sizes); err != nil {
			logx.Warn(abi.SubsysReg, "NET/wasm: rank %d: unmapping a peer's part of registration %d: %v", x.rank, maps.id, err)
		}
	}
	maps.maps = nil
}

// Stop stops the descriptor server (before the mesh closes: a request
// answered later would open events nobody frees).
func (x *Exchange) Stop() {
	x.mu.Lock()
	srv := x.srv
	x.srv = nil
	x.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
}
