package plugin

import (
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/dataplane/intranode/share"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/inbox"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/wire"
)

// mr is one symmetric registration. Its id is the same on every rank because
// registration is collective and ordered; peers' sizes are exchanged so that
// an initiator can reject a put outside the target's registration up front.
type mr struct {
	id     uint32
	handle uint64
	base   unsafe.Pointer // C memory owned by the caller
	size   uint64
	typ    int32
	devCtx uintptr // non-zero for device memory: the context to copy in
	flags  uint64
	refs   int
	// pins counts target-side operations using the memory (dataplane.Pin);
	// dropped is set before deregMrSym waits for them to finish.
	pins    atomic.Int32
	dropped atomic.Bool
	remote  atomic.Pointer[remoteRegs] // this registration on every rank
	// shadow is the host copy of a never-reset device signal array
	// (abi.MrFlagSignalNeverReset), nil for other registrations.
	shadow *staging.Shadow
	// adds: the registration is offered for peers' device agents' adds to
	// its signal words where it is shared at all
	// (NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL; direct.go), so it has no
	// shadow and its own adds are atomics on the device.
	adds bool
	// inbox is 1 + the entry of our peer inbox's table that holds the
	// registration (NCCL_RMA_WASM_INTRANODE_INBOX; host/devmem/inbox): the
	// peers' agents have ours add to its signal words, so it too has no
	// shadow. 0: not in the table.
	inbox uint8
	// maps are the peers' parts of this registration mapped here
	// (share.go), unmapped when it is deregistered; shared is set once
	// our part was handed to a peer.
	maps   share.Mapped
	shared atomic.Bool
}

// RegMr registers host memory collectively. A second registration of the
// same address (no larger) with the same flags returns the same handle and
// takes a reference; with other flags it is a registration of its own.
func RegMr(h uint64, data uintptr, size uint64, typ int32, flags uint64) (uint64, abi.Result) {
	return regMr(h, data, size, typ, flags, -1, 0)
}

// regMr is RegMr with the DMA-BUF of device memory (fd -1: none), which
// the fabric transport hands its provider where it can (FI_MR_DMABUF).
func regMr(h uint64, data uintptr, size uint64, typ int32, flags uint64, fd int, fdOff uint64) (uint64, abi.Result) {
	c := lookupColl(h)
	if c == nil {
		logx.Warn(abi.SubsysReg, "NET/wasm: regMrSym: unknown collComm %#x", h)
		return 0, abi.InvalidArgument
	}
	var devCtx uintptr
	switch {
	case typ == abi.PtrCuda:
		d := devmem.Get()
		if d == nil {
			logx.Warn(abi.SubsysReg, "NET/wasm: regMrSym: device memory (NCCL_PTR_CUDA) needs the CUDA driver (libcuda.so.1), which could not be loaded; this process advertises ptrSupport=HOST")
			return 0, abi.InvalidUsage
		}
		ctx, err := d.Inspect(data, size)
		if err != nil {
			logx.Warn(abi.SubsysReg, "NET/wasm: regMrSym: %d bytes at %#x registered as NCCL_PTR_CUDA: %v", size, data, err)
			return 0, abi.InvalidArgument
		}
		devCtx = ctx
	case typ != abi.PtrHost:
		logx.Warn(abi.SubsysReg, "NET/wasm: regMrSym: unknown memory type %d", typ)
		return 0, abi.InvalidArgument
	case data == 0 && size > 0:
		logx.Warn(abi.SubsysReg, "NET/wasm: regMrSym: NULL buffer of %d bytes", size)
		return 0, abi.InvalidArgument
	case size > abi.MaxNetSizeBytes:
		logx.Warn(abi.SubsysReg, "NET/wasm: regMrSym: size %d too large", size)
		return 0, abi.InvalidArgument
	}
	if m := c.regs.reuse(data, size, flags); m != nil {
		return m.handle, abi.Success // same range, same flags (registry.reuse)
	}
	m := &mr{base: *(*unsafe.Pointer)(unsafe.Pointer(&data)), size: size, typ: typ, devCtx: devCtx, flags: flags, refs: 1}
	if devCtx != 0 {
		// Pinned staging memory and the context's stream are made now:
		// on the data path a kernel may be running, and a pinned
		// allocation can wait for it.
		staging.Prewarm(devCtx, uint64(config.StageChunkKiB.Get())<<10)
	}
	m.adds = devCtx != 0 && directSignal.Load() && ipcOn() && staging.DeviceAtomicAdds(devCtx)
	if devCtx != 0 && directSignal.Load() && !m.adds {
		directNotOurs()
	}
	if devCtx != 0 && inboxOn.Load() && ipcOn() && staging.DeviceAtomicAdds(devCtx) {
		if idx, ok := inbox.Claim(devCtx, data, size); ok {
			m.inbox, m.adds = uint8(idx+1), true
		}
	}
	if devCtx != 0 && flags&abi.MrFlagSignalNeverReset != 0 && config.SignalShadow.Get() && !m.adds {
		m.shadow = staging.NewShadow(data, size)
	}
	c.regs.add(m, data)
	m.handle = makeHandle(kindMR, c.id<<32|uint64(m.id))

	// Register with the fabric endpoint, if any, so the key can travel
	// with the size. Device memory only where the provider reaches it
	// (FI_HMEM); otherwise its operations are staged.
	var key uint64
	var err error
	if devCtx != 0 {
		key, _ = c.mesh.RegisterDevice(m.id, data, size, deviceMemory(devCtx, data, size, fd, fdOff))
	} else if key, err = c.mesh.RegisterMemory(m.id, m.base, size, false); err != nil {
		logx.Warn(abi.SubsysReg, "NET/wasm: regMrSym: rank %d, %d bytes at %#x: %v", c.rank, size, data, err)
		c.regs.drop(m)
		return 0, abi.SystemError
	}
	// Tell every peer our size; wait until every peer told us theirs.
	reg := dataplane.Op{Request: dataplane.Request{Msg: wire.MsgReg, MrID: m.id, Size: size, Off: uint64(data), Dev: devCtx != 0, SigValue: key}}
	if m.inbox != 0 {
		reg.SigOff = 1<<63 | uint64(m.inbox-1) // the inbox's table entry (tcp_service.go)
	}
	if tok := c.offerShare(m); tok != 0 {
		if m.adds {
			tok |= share.DirectAdds
		}
		reg.SigMrID, reg.Tag = dataplane.ShareOffer, tok
	}
	for p := 0; p < c.nranks; p++ {
		op := reg
		c.mesh.Post(p, &op, false, 0)
	}
	sizes, err := c.regs.awaitPeers(m.id, config.ConnectTimeout.Get())
	if err != nil {
		logx.Warn(abi.SubsysReg, "NET/wasm: regMrSym: rank %d, registration %d (%d bytes at %#x): %v", c.rank, m.id, size, data, err)
		c.regs.drop(m)
		c.mesh.DeregisterMemory(m.id)
		m.releaseInbox() // the caller may free the memory: no entry may name it
		return 0, abi.SystemError
	}
	c.importShares(m, sizes)
	m.remote.Store(sizes)
	logx.Trace(abi.SubsysReg, "NET/wasm: registered %d bytes at %#x as %d", size, data, m.id)
	return m.handle, abi.Success
}

// releaseInbox takes m out of our peer inbox's table, if it is there: our
// agent adds nothing more to its words for the peers.
func (m *mr) releaseInbox() {
	if m.inbox != 0 {
		inbox.Release(m.id, int(m.inbox-1))
		m.inbox = 0
	}
}

// RegMrDmaBuf registers device memory NCCL exported as a DMA-BUF. The
// range is registered as NCCL_PTR_CUDA: payloads are staged through host
// memory by copies of the virtual address range, unless the fabric
// transport's provider reaches device memory (FI_HMEM), which then gets
// the DMA-BUF itself (FI_MR_DMABUF, libfabric 1.20 or later) or the
// range. The fd is dup'ed for the length of the registration call (the
// provider imports the buffer then) and not kept: the caller closes its
// own. Anything else is refused, and NCCL_PTR_DMABUF is advertised only
// when a device runtime is loaded.
func RegMrDmaBuf(h uint64, data uintptr, size uint64, typ int32, offset uint64, fd int32, flags uint64) (uint64, abi.Result) {
	if typ != abi.PtrCuda || devmem.Get() == nil {
		logx.Warn(abi.SubsysReg, "NET/wasm: regMrSymDmaBuf: memory type %d: DMA-BUF registration works for device memory (NCCL_PTR_CUDA) with a device runtime loaded only", typ)
		return 0, abi.InvalidUsage
	}
	own := -1
	if fd >= 0 {
		if d, err := unix.Dup(int(fd)); err == nil {
			own = d
			defer unix.Close(d)
		} else {
			logx.Info(abi.SubsysReg, "NET/wasm: regMrSymDmaBuf: dup of fd %d: %v; registering the address range", fd, err)
		}
	}
	return regMr(h, data, size, typ, flags, own, offset)
}

// deviceMemory describes a device range for the fabric transport: its
// interface and device where the device runtime says (devmem.Locator).
func deviceMemory(ctx, data uintptr, size uint64, fd int, off uint64) dataplane.DeviceMemory {
	d := dataplane.DeviceMemory{Iface: devmem.IfaceCUDA, DMABUFFd: fd, DMABUFOff: off}
	if x, ok := devmem.Get().(devmem.DmaBufExporter); ok {
		d.Export = func() (int, uint64, error) { return x.ExportDmaBuf(ctx, data, size) }
	}
	if l, ok := devmem.Get().(devmem.Locator); ok {
		if iface, dev, err := l.Locate(ctx, data); err == nil {
			d.Iface, d.Device = iface, dev
		}
	}
	return d
}

// DeregMr drops a reference; the last one forgets the registration after
// every operation posted so far completed (bounded by the close
// timeout), since the caller may free or reuse the memory once it returns.
func DeregMr(h, mh uint64) abi.Result {
	c := lookupColl(h)
	if c == nil {
		logx.Warn(abi.SubsysReg, "NET/wasm: deregMrSym: unknown collComm %#x", h)
		return abi.InvalidArgument
	}
	m := c.lookupMR(mh)
	if m == nil {
		logx.Warn(abi.SubsysReg, "NET/wasm: deregMrSym: unknown or already released handle %#x", mh)
		return abi.InvalidArgument
	}
	if c.regs.release(m) {
		if !c.closed.Load() {
			c.drain("deregMrSym")
		}
		c.regs.drop(m)
		c.awaitUnpinned(m)
		if m.devCtx != 0 {
			// Signal writes and payload copies queued on the context's
			// stream land before the caller may free the memory.
			if err := staging.Quiesce(m.devCtx); err != nil {
				logx.Warn(abi.SubsysReg, "NET/wasm: deregMrSym: rank %d, registration %d: %v", c.rank, m.id, err)
			}
			// Nothing queued uses the peers' parts mapped here any more.
			c.shares.Unmap(&m.maps)
			m.releaseInbox()
			// The caller may free the memory now: no CPU mapping of it
			// (GDRCopy) may outlive the registration.
			if wa, ok := devmem.Get().(devmem.WordAdder); ok {
				wa.Forget(uintptr(m.base), m.size)
			}
		}
		c.mesh.DeregisterMemory(m.id)
	}
	return abi.Success
}

// SignalShadow is the never-reset shadow of registration id, or nil
// (dataplane.ShadowOwner); the caller holds a Pin of it.
func (c *coll) SignalShadow(id uint32) *staging.Shadow {
	if m := c.regs.lookup(id); m != nil {
		return m.shadow
	}
	return nil
}

// StronglyOrdered reports whether registration id was flagged
// NCCL_NET_MR_FLAG_FORCE_SO (dataplane.StrongOwner).
func (c *coll) StronglyOrdered(id uint32) bool {
	m := c.regs.lookup(id)
	return m != nil && m.flags&abi.MrFlagForceSO != 0
}

// lookupMR resolves a memory handle of this communicator, lock-free.
func (c *coll) lookupMR(mh uint64) *mr {
	k, p := splitHandle(mh)
	if k != kindMR || p>>32 != c.id {
		return nil
	}
	return c.regs.lookup(uint32(p))
}

// ipcMinBytes is NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB in bytes, read at
// init: the per-operation path reads no environment.
var ipcMinBytes atomic.Uint64

// ipcAgentMax is the largest put mapped because the device agent copies
// it (NCCL_RMA_WASM_DEVICE_AGENT_MAX_KB in bytes; 0 with
// NCCL_RMA_WASM_INTRANODE_IPC_AGENT off), read at init.
var ipcAgentMax atomic.Uint64

// target writes where off in rank's part of this registration is, for the
// intra-node paths (remoteRange has already checked the range): op.Remote,
// its address in rank's process, where neither side is device memory
// (which process_vm_writev cannot reach); op.Mapped and op.MapCtx, its
// address here where rank's part is mapped (share.go) and the context to
// copy in (local's, or ours for host memory), for operations of at least
// NCCL_RMA_WASM_INTRANODE_IPC_MIN_KB (op.Size is set), and for puts the
// device agent copies (from device memory whose context runs it, up to
// its largest copy; NCCL_RMA_WASM_INTRANODE_IPC_AGENT): its copy and
// ticket cost no driver call, while a staged put costs the target a
// landing.
func (m *mr) target(op *dataplane.Op, local *mr, rank uint32, off uint64) {
	r := m.remote.Load()
	if !r.dev[rank] && local.devCtx == 0 {
		op.Remote = r.bases[rank] + off
	}
	if r.mapped == nil || r.mapped[rank] == 0 {
		return
	}
	if op.Size >= ipcMinBytes.Load() ||
		(op.Msg != wire.MsgGet && op.Size <= ipcAgentMax.Load() && local.devCtx != 0 && staging.AgentRuns(local.devCtx)) {
		op.Mapped, op.MapCtx = uint64(r.mapped[rank])+off, m.devCtx
		if local.devCtx != 0 {
			op.MapCtx = local.devCtx
		}
	}
}

// awaitUnpinned waits until no target-side operation uses m any more (a
// put landing, a get being served, a signal waiting for its turn), bounded
// by the close timeout: the caller may free the memory when deregMrSym
// returns.
func (c *coll) awaitUnpinned(m *mr) {
	deadline := time.Now().Add(config.CloseTimeout.Get())
	pause := 10 * time.Microsecond
	for m.pins.Load() > 0 {
		if time.Now().After(deadline) {
			logx.Warn(abi.SubsysReg, "NET/wasm: deregMrSym: rank %d: registration %d still in use by %d incoming operations after %s; returning anyway",
				c.rank, m.id, m.pins.Load(), config.CloseTimeout.Name)
			return
		}
		time.Sleep(pause)
		pause = min(2*pause, time.Millisecond)
	}
}
