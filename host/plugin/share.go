package plugin

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/fdpass"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// Device windows mapped between the processes of a host (SPEC.md §4,
// NCCL_RMA_WASM_INTRANODE_IPC). A rank that registers device memory with
// peers on its host offers it in its MsgReg: a token naming its
// descriptor server, an abstract unix socket (host/fdpass). Each such
// peer, before its own regMrSym returns, asks that server for the
// registration's allocations, which come as POSIX fds (cuMem export),
// maps them, and from then on copies device payloads straight into the
// target's memory: one copy on the device, the target applying only the
// signal. The server exports on request and only while the registration
// lives, so a late or hostile request gets nothing stale; only the pids of
// our intra-node peers, of our user, are served. Anything that fails keeps
// the staged path for that peer and registration, with one INFO line.

// shares is a communicator's side of it.
type shares struct {
	mu     sync.Mutex
	srv    *fdpass.Server
	token  uint64
	said   bool           // the INFO line about a failed mapping was written
	tokens map[int]uint64 // each peer's server, from its offers
	evSaid bool           // the INFO line about events was written
}

// Keys of a descriptor server: a registration id (below 2^32), or one of
// these kinds in the high word.
const (
	keyOpenEvents   = 1 << 32 // | asker's rank << 40 | registration id: open its events, in that registration's context
	keyEventHandles = 2 << 32 // | rank: the handles of our events for that rank (the asker)
	keyKind         = 0xff << 32
	keyRankShift    = 40 // the asker's rank in keyOpenEvents (several ranks may share a process)
	segEvents       = 3  // an answer's kind: event handles
)

// shareName is the abstract socket of pid's server for token.
func shareName(pid int, token uint64) string {
	return fmt.Sprintf("rccl-rma-wasm/%d/%016x", pid, token)
}

// ipcOn says whether device windows are mapped between the ranks of a
// host: NCCL_RMA_WASM_INTRANODE_IPC where set, else on with CUDA (measured
// on an H100) and off with HIP (not yet measured on an AMD GPU).
func ipcOn() bool {
	if config.IntraIPC.Lookup() == "" {
		d := devmem.Get()
		return d != nil && d.Name() == "CUDA"
	}
	return config.IntraIPC.Get()
}

// offerShare returns the token to put in m's MsgReg, starting the server
// on first use; 0: nothing to offer (off, host memory, a runtime without
// IPC, no peer on this host).
func (c *coll) offerShare(m *mr) uint64 {
	if m.devCtx == 0 || !ipcOn() {
		return 0
	}
	sh, ok := devmem.Get().(devmem.IPCSharer)
	if !ok {
		return 0
	}
	local := false
	for r := 0; r < c.nranks && !local; r++ {
		local = c.mesh.IPC().Pid(r) != 0
	}
	if !local {
		return 0
	}
	// A trial export: memory without shareable handles (cuMemAlloc's, or
	// cuMem allocations made without POSIX fds) is not offered.
	segs, err := sh.IPCExport(m.devCtx, uintptr(m.base), m.size)
	if err != nil {
		logx.Trace(abi.SubsysReg, "NET/wasm: rank %d: registration %d is not shared with peers on this host: %v", c.rank, m.id, err)
		return 0
	}
	closeSegments(segs)
	s := &c.shares
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return s.token
	}
	var b [8]byte
	rand.Read(b[:])
	tok := binary.LittleEndian.Uint64(b[:]) | 1
	srv, err := fdpass.Listen(shareName(os.Getpid(), tok), c.sharePeer, c.serveShare)
	if err != nil {
		logx.Info(abi.SubsysReg, "NET/wasm: rank %d: device windows are not shared with peers on this host: %v", c.rank, err)
		return 0
	}
	s.srv, s.token = srv, tok
	return tok
}

// sharePeer says whether pid is one of our intra-node peers.
func (c *coll) sharePeer(pid int) bool {
	for r := 0; r < c.nranks; r++ {
		if p := c.mesh.IPC().Pid(r); p != 0 && p == pid {
			return true
		}
	}
	return false
}

// serveShare answers a peer's request for key (fdpass.Serve).
func (c *coll) serveShare(pid int, key uint64) ([]byte, []int, error) {
	switch {
	case key&^0xffffffff == 0:
		return c.serveRegistration(pid, uint32(key))
	case key&keyKind == keyOpenEvents:
		return c.serveOpenEvents(pid, int(key>>keyRankShift), uint32(key))
	case key&^0xffffffff == keyEventHandles:
		return c.serveEventHandles(pid, int(uint32(key)))
	}
	return nil, nil, errors.New("no such registration")
}

// serveRegistration exports the allocations under registration id for a
// peer. The answer is the segments' count and kind, then each one's
// address and size (and, for handles, its 64 bytes); fds ride with it.
func (c *coll) serveRegistration(pid int, id uint32) ([]byte, []int, error) {
	base, size, ctx, pin, ok := c.Resolve(id)
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
		logx.Info(abi.SubsysReg, "NET/wasm: rank %d: registration %d cannot be shared with pid %d: %v", c.rank, id, pid, err)
		return nil, nil, err
	}
	if m := c.regs.lookup(id); m != nil {
		// Landings into it are waited for from now on: the peer reads and
		// writes it without us (dataplane.SharedOwner).
		m.shared.Store(true)
	}
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
// orders its mapped put+signals to us by them (dataplane's
// ipc_events.go): their handles are fetched from its server.
func (c *coll) serveOpenEvents(pid, r int, id uint32) ([]byte, []int, error) {
	m := c.regs.lookup(id)
	if r < 0 || r >= c.nranks || c.mesh.IPC().Pid(r) != pid || m == nil || m.devCtx == 0 {
		return nil, nil, errors.New("no such peer or registration")
	}
	// The asker's server is named in its MsgReg, which our service may
	// not have read yet: it was sent before the asker's wait for ours.
	var tok uint64
	for deadline := time.Now().Add(time.Second); ; time.Sleep(time.Millisecond) {
		c.shares.mu.Lock()
		tok = c.shares.tokens[r]
		c.shares.mu.Unlock()
		if tok != 0 || time.Now().After(deadline) || c.closed.Load() {
			break
		}
	}
	if tok == 0 {
		return nil, nil, fmt.Errorf("rank %d offered no descriptor server", r)
	}
	payload, fds, err := fdpass.Fetch(shareName(pid, tok), keyEventHandles|uint64(c.rank), pid)
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
	if err := c.mesh.IPC().OpenPeerEvents(r, m.devCtx, handles); err != nil {
		logx.Info(abi.SubsysReg, "NET/wasm: rank %d: the events of rank %d cannot be opened here: %v", c.rank, r, err)
		return nil, nil, err
	}
	return []byte{1}, nil, nil
}

// serveEventHandles answers the handles of our events for rank, which
// must be process pid.
func (c *coll) serveEventHandles(pid, r int) ([]byte, []int, error) {
	if r < 0 || r >= c.nranks || c.mesh.IPC().Pid(r) != pid {
		return nil, nil, errors.New("not that rank")
	}
	hs := c.mesh.IPC().EventHandles(r)
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
// in m's context and r is asked to open them. Any failure keeps the
// host's wait for each copy (an INFO line, once).
func (c *coll) orderByEvents(m *mr, rs *remoteRegs, r, pid int) {
	if !config.IntraIPCEvents.Get() || c.mesh.IPC().EventsReady(r) {
		return
	}
	if _, ok := devmem.Get().(devmem.IPCEvents); !ok {
		return
	}
	var err error
	if _, err = c.mesh.IPC().MakeEvents(r, m.devCtx); err == nil {
		var p []byte
		var fds []int
		p, fds, err = fdpass.Fetch(shareName(pid, rs.share[r]), keyOpenEvents|uint64(c.rank)<<keyRankShift|uint64(m.id), pid)
		closeFds(fds)
		if err == nil && (len(p) != 1 || p[0] != 1) {
			err = errors.New("malformed answer")
		}
	}
	c.shares.mu.Lock()
	first := !c.shares.evSaid
	c.shares.evSaid = true
	c.shares.mu.Unlock()
	if err != nil {
		if first {
			logx.Info(abi.SubsysReg, "NET/wasm: rank %d: mapped put+signals to rank %d wait for their copies on the host: %v", c.rank, r, err)
		}
		return
	}
	c.mesh.IPC().SetEventsReady(r)
	if first {
		logx.Info(abi.SubsysReg, "NET/wasm: rank %d: mapped put+signals to rank %d are ordered by interprocess events: no host waits for their copies", c.rank, r)
	}
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

// importShares maps, for every intra-node peer that offered registration
// m, its part of it; each failure leaves that peer on the staged path.
func (c *coll) importShares(m *mr, rs *remoteRegs) {
	if rs.share == nil || m.devCtx == 0 || !ipcOn() {
		return
	}
	sh, ok := devmem.Get().(devmem.IPCSharer)
	if !ok {
		return
	}
	for r := 0; r < c.nranks; r++ {
		pid := c.mesh.IPC().Pid(r)
		if rs.share[r] == 0 || !rs.dev[r] || pid == 0 {
			continue
		}
		va, err := c.importShare(sh, m, rs, r, pid)
		if err != nil {
			c.shares.mu.Lock()
			first := !c.shares.said
			c.shares.said = true
			c.shares.mu.Unlock()
			if first {
				logx.Info(abi.SubsysReg, "NET/wasm: rank %d: registration %d of rank %d (pid %d) is not mapped here, its device operations are staged: %v", c.rank, m.id, r, pid, err)
			}
			continue
		}
		if rs.mapped == nil {
			rs.mapped = make([]uintptr, c.nranks)
		}
		rs.mapped[r] = va
		c.orderByEvents(m, rs, r, pid)
	}
}

// importShare fetches and maps rank r's part of m and returns the address
// of its registration's first byte here.
func (c *coll) importShare(sh devmem.IPCSharer, m *mr, rs *remoteRegs, r, pid int) (uintptr, error) {
	payload, fds, err := fdpass.Fetch(shareName(pid, rs.share[r]), uint64(m.id), pid)
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
	if rs.bases[r] < first || rs.bases[r]-first > span || rs.sizes[r] > span-(rs.bases[r]-first) {
		return 0, fmt.Errorf("its allocations [%#x, +%d) do not hold its registration [%#x, +%d)", first, span, rs.bases[r], rs.sizes[r])
	}
	va, err := sh.IPCImport(m.devCtx, segs)
	if err != nil {
		return 0, err
	}
	sizes := make([]uint64, len(segs))
	for i, sg := range segs {
		sizes[i] = sg.Size
	}
	m.maps = append(m.maps, shareMap{va: va, sizes: sizes})
	return va + uintptr(rs.bases[r]-first), nil
}

// parseSegments reads serveShare's answer: n segments back to back, each
// with its fd or its handle (then exactly one), of bounded total size.
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

// shareMap is one peer's allocations mapped here for a registration.
type shareMap struct {
	va    uintptr
	sizes []uint64 // the segments mapped back to back from va
}

// unmapShares unmaps what importShares mapped for m: it is deregistered
// (no operation of ours uses the mappings any more: DeregMr drained).
func (c *coll) unmapShares(m *mr) {
	sh, ok := devmem.Get().(devmem.IPCSharer)
	if !ok {
		return
	}
	for _, x := range m.maps {
		if err := sh.IPCUnmap(m.devCtx, x.va, x.sizes); err != nil {
			logx.Warn(abi.SubsysReg, "NET/wasm: rank %d: unmapping a peer's part of registration %d: %v", c.rank, m.id, err)
		}
	}
	m.maps = nil
}

// stopSharing stops the descriptor server (before the mesh closes: a
// request answered later would open events nobody frees).
func (c *coll) stopSharing() {
	s := &c.shares
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
}

// closeShares unmaps the mappings of registrations the caller never
// deregistered (the mesh is closed: nothing uses them).
func (c *coll) closeShares() {
	c.stopSharing()
	for _, m := range *c.regs.byID.Load() {
		if m != nil && len(m.maps) > 0 {
			c.unmapShares(m)
		}
	}
}

// Shared reports whether registration id was handed to a peer on this
// host (dataplane.SharedOwner): puts into it land before they are
// acknowledged.
func (c *coll) Shared(id uint32) bool {
	m := c.regs.lookup(id)
	return m != nil && m.shared.Load()
}

var (
	_ dataplane.Owner       = (*coll)(nil)
	_ dataplane.SharedOwner = (*coll)(nil)
)
