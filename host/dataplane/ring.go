package dataplane

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/config"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
)

// The intra-node staging ring (SPEC.md §4, "Device memory"). Neither
// process_vm_writev nor a socket can reach GPU memory, and staging through
// the TCP lanes caps a device put at what one loopback stream carries. So a
// put between two processes of one host whose source or target is device
// memory moves through a ring of chunk-sized slots in shared memory: a memfd
// the sending lane creates on its first such put and the target maps
// through /proc/<pid>/fd (ptrace read access, which Yama's ptrace_scope=1
// grants to siblings that it refuses process_vm_writev). The sender copies chunk k from its device into slot k mod
// ringSlots while the target copies earlier chunks out to its device; two
// counters in the ring's first page are the flow control, waited on with
// futexes. Both sides pin the slots once (cuMemHostRegister), so both copies
// are pinned DMA, and no byte crosses a socket or the CPU. The stream still
// carries the put's header, in order with everything else, and the target
// applies the signal only after its last copy completed.

const (
	ringSlots   = 4
	ringMaxSlot = 16
	ringHdrSize = 4096                // the header page; the slots follow
	ringMagic   = 0x474e4952_57414d52 // "RMAWRING"
	// Word offsets in the header page. filled and freed are written by
	// different processes: a cache line each.
	ringOffMagic    = 0
	ringOffSlots    = 8
	ringOffChunk    = 16
	ringOffAttached = 64  // target: 1 once it mapped the ring
	ringOffFilled   = 128 // sender: chunks written, ever (wraps)
	ringOffFreed    = 192 // target: chunks copied out, ever (wraps)
	ringOffAbort    = 256 // sender: 1 when it gave up in the middle of a put
	// ringWait bounds one futex wait; the waiter then checks that the peer
	// still lives (a process killed mid-put never wakes us).
	ringWait = 20 * time.Millisecond
	// statusRing marks a put header whose payload is in the ring, not on
	// the stream (requests use status for the payload's codec otherwise).
	statusRing = 0x8000
)

// The sending lane's ring state, kept by whoever holds the stream.
const (
	ringUnknown = iota // not tried yet
	ringOn             // attached by the target
	ringOff            // refused, disabled or failed: the stream carries it
)

// errRingAbort: the sender gave up in the middle of a put (its lane failed,
// or a copy). To the target it is a stream that ended mid-message: with
// other lanes live, that lane alone fails and the sender resends the put on
// another (tcp_failover.go); otherwise the peer is dropped.
var errRingAbort = fmt.Errorf("the sender abandoned a put in the staging ring: %w", io.ErrUnexpectedEOF)

// ring is one mapping of a staging ring, at either end.
type ring struct {
	mem   []byte
	fd    int // the sender's memfd, kept open for the target to reopen; -1 at the target
	slots uint32
	chunk uint64

	pinTried bool
	pinned   devmem.HostRegisterer // non-nil: the slots are registered with it
	pinCtx   uintptr               // the context they were registered from
}

func (r *ring) word(off int) *uint32 { return (*uint32)(unsafe.Pointer(&r.mem[off])) }

// slot is the host address of the slot chunk k goes to.
func (r *ring) slot(k uint32) unsafe.Pointer {
	return unsafe.Pointer(&r.mem[ringHdrSize+uint64(k%r.slots)*r.chunk])
}

// pin registers the slots with the device once, so that its copies of them
// run at pinned speed; without it they still work, slower.
func (r *ring) pin(d devmem.Device, ctx uintptr) {
	if r.pinTried {
		return
	}
	r.pinTried = true
	hr, ok := d.(devmem.HostRegisterer)
	if !ok {
		return
	}
	if err := hr.HostRegister(ctx, unsafe.Pointer(&r.mem[ringHdrSize]), uint64(len(r.mem)-ringHdrSize)); err != nil {
		logx.Info(abi.SubsysNet, "NET/wasm: cannot pin the intra-node staging ring (%v); its device copies run at pageable speed", err)
		return
	}
	r.pinned, r.pinCtx = hr, ctx
}

func (r *ring) close() {
	if r.pinned != nil {
		r.pinned.HostUnregister(r.pinCtx, unsafe.Pointer(&r.mem[ringHdrSize]))
	}
	unix.Munmap(r.mem)
	if r.fd >= 0 {
		unix.Close(r.fd)
	}
}

// newSenderRing makes a ring of slots chunks in a sealed memfd (the target
// checks the seals: a ring that could shrink under its mapping would fault).
func newSenderRing(slots uint32, chunk uint64) (*ring, error) {
	size := ringHdrSize + uint64(slots)*chunk
	fd, err := unix.MemfdCreate("rccl-rma-wasm-ring", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	if err = unix.Ftruncate(fd, int64(size)); err == nil {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL)
	}
	var mem []byte
	if err == nil {
		mem, err = unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("staging ring of %d bytes: %w", size, err)
	}
	r := &ring{mem: mem, fd: fd, slots: slots, chunk: chunk}
	*(*uint64)(unsafe.Pointer(&mem[ringOffSlots])) = uint64(slots)
	*(*uint64)(unsafe.Pointer(&mem[ringOffChunk])) = chunk
	atomic.StoreUint64((*uint64)(unsafe.Pointer(&mem[ringOffMagic])), ringMagic)
	return r, nil
}

// attachRing maps the ring the sender (process pid) offered in h: its fd
// number, size, chunk and slot count, all checked against the memfd.
func attachRing(pid int, h *header) (*ring, error) {
	slots, chunk := uint64(h.context), h.sigValue
	if slots < 2 || slots > ringMaxSlot || chunk < 4<<10 || chunk > 64<<20 || chunk%4096 != 0 ||
		h.size != ringHdrSize+slots*chunk || h.off > math.MaxInt32 {
		return nil, fmt.Errorf("bad ring offer (%d slots of %d bytes, %d bytes)", slots, chunk, h.size)
	}
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/%d", pid, h.off), os.O_RDWR|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fd := int(f.Fd())
	var st unix.Stat_t
	if err = unix.Fstat(fd, &st); err != nil || uint64(st.Size) != h.size {
		return nil, fmt.Errorf("ring file of %d bytes, offered %d (%v)", st.Size, h.size, err)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&unix.F_SEAL_SHRINK == 0 {
		return nil, fmt.Errorf("ring file not sealed against shrinking (%v)", err)
	}
	mem, err := unix.Mmap(fd, 0, int(h.size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map the ring: %w", err)
	}
	r := &ring{mem: mem, fd: -1, slots: uint32(slots), chunk: chunk}
	if atomic.LoadUint64((*uint64)(unsafe.Pointer(&mem[ringOffMagic]))) != ringMagic ||
		*(*uint64)(unsafe.Pointer(&mem[ringOffSlots])) != slots || *(*uint64)(unsafe.Pointer(&mem[ringOffChunk])) != chunk {
		unix.Munmap(mem)
		return nil, errors.New("the ring's header does not match the offer")
	}
	return r, nil
}

const (
	futexWaitOp = 0 // FUTEX_WAIT, shared (the ring is mapped by two processes)
	futexWakeOp = 1 // FUTEX_WAKE, shared
)

// futexWait sleeps while *w == val, at most d (or until a wake).
func futexWait(w *uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWaitOp, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

func futexWake(w *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWakeOp, math.MaxInt32, 0, 0, 0)
}

// ringReady reports whether this lane's put goes through the staging ring,
// offering one to the target on the first call and waiting for its answer
// (the ring's attached word, or msgRingNo on the reply stream). Called by
// whoever holds the stream, after what was gathered before was written.
func (l *lane) ringReady() (bool, error) {
	switch l.ringState {
	case ringOn:
		return true, nil
	case ringOff:
		return false, nil
	}
	l.ringState = ringOff
	if !config.IntraRing.Get() {
		return false, nil
	}
	r, err := newSenderRing(ringSlots, stageChunk())
	if err != nil {
		logx.Info(abi.SubsysNet, "NET/wasm: intra-node path to rank %d: no staging ring (%v); device payloads ride the TCP lanes", l.p.rank, err)
		return false, nil
	}
	l.ring.Store(r)
	h := header{typ: msgRing, off: uint64(r.fd), size: uint64(len(r.mem)), context: r.slots, sigValue: r.chunk}
	var hb [hdrSize]byte
	h.encode(hb[:])
	if err := l.writeIov([][]byte{hb[:]}); err != nil {
		return false, err
	}
	att := r.word(ringOffAttached)
	for atomic.LoadUint32(att) == 0 {
		if l.ringNo.Load() {
			return false, nil // the target said why in its log
		}
		if l.p.dead.Load() || l.isDown() {
			return false, errors.New("peer or lane gone while it considered the staging ring")
		}
		futexWait(att, 0, ringWait)
	}
	l.ringState = ringOn
	logx.Info(abi.SubsysNet, "NET/wasm: intra-node path to rank %d, lane %d: device payloads through a shared staging ring (%d slots of %d KiB)",
		l.p.rank, l.idx, r.slots, r.chunk>>10)
	return true, nil
}

// ringRefused is the reply stream's msgRingNo: wake the offer's wait.
func (l *lane) ringRefused() {
	l.ringNo.Store(true)
	if r := l.ring.Load(); r != nil {
		futexWake(r.word(ringOffAttached))
	}
}

// ringSend moves op's payload through the ring; its header (statusRing) is
// on the stream already.
func (l *lane) ringSend(op *Op) error {
	r := l.ring.Load()
	var d devmem.Device
	if op.LocalCtx != 0 {
		if d = devmem.Get(); d == nil {
			r.abort()
			return errNoDevice
		}
		r.pin(d, op.LocalCtx)
	}
	filled, freed := r.word(ringOffFilled), r.word(ringOffFreed)
	k := l.ringFilled
	for done := uint64(0); done < op.Size; {
		m := min(r.chunk, op.Size-done)
		for {
			f := atomic.LoadUint32(freed)
			if k-f < r.slots {
				break
			}
			if l.p.dead.Load() || l.isDown() {
				r.abort()
				return errors.New("peer or lane gone during a put through the staging ring")
			}
			futexWait(freed, f, ringWait)
		}
		if d != nil {
			if err := d.DtoH(op.LocalCtx, r.slot(k), uintptr(op.Local)+uintptr(done), m); err != nil {
				r.abort()
				return fmt.Errorf("copy from device: %w", err)
			}
		} else {
			copy(unsafe.Slice((*byte)(r.slot(k)), m), unsafe.Slice((*byte)(unsafe.Add(op.Local, done)), m))
		}
		k++
		atomic.StoreUint32(filled, k)
		futexWake(filled)
		done += m
	}
	l.ringFilled = k
	return nil
}

func (r *ring) abort() {
	atomic.StoreUint32(r.word(ringOffAbort), 1)
	futexWake(r.word(ringOffFilled))
}

// releaseRing frees the lane's ring once its goroutines ended.
func (l *lane) releaseRing() {
	if r := l.ring.Swap(nil); r != nil {
		r.close()
	}
}

// attachHook, when set (tests), refuses every ring offer with its error.
var attachHook func() error

// ringRx is the target's end of one incoming stream's ring.
type ringRx struct {
	r     *ring
	freed uint32
}

// attach answers the sender's offer: map the ring and say so in it, or
// refuse on the reply stream (the sender then uses the stream).
func (t *tcpLink) attachRing(in *net.TCPConn, rx *ringRx, h *header, resp []byte) error {
	p := t.p
	if rx.r != nil {
		return fmt.Errorf("protocol error: rank %d offered a second staging ring on one stream", p.rank)
	}
	x, ok := t.side.(*intraLink)
	var err error
	switch {
	case !ok:
		err = errors.New("not an intra-node link")
	case attachHook != nil:
		err = attachHook()
	default:
		rx.r, err = attachRing(x.pid, h)
	}
	if err != nil {
		logx.Info(abi.SubsysNet, "NET/wasm: refusing rank %d's intra-node staging ring (%v); its device payloads ride the TCP lanes", p.rank, err)
		return t.reply(in, msgRingNo, h, abi.InternalError, nil, resp)
	}
	atomic.StoreUint32(rx.r.word(ringOffAttached), 1)
	futexWake(rx.r.word(ringOffAttached))
	return nil
}

// drain takes n bytes out of the ring, chunk by chunk as the sender fills
// it, into dst: device memory of ctx, host memory when ctx is 0, nowhere
// when land is false (a rejected put still empties its slots). It returns
// once every copy completed, so what follows sees the whole payload.
func (rx *ringRx) drain(p *peer, ctx uintptr, dst unsafe.Pointer, n uint64, land bool) error {
	r := rx.r
	if r == nil {
		return fmt.Errorf("protocol error: rank %d sent a put through a staging ring it never offered", p.rank)
	}
	var d devmem.Device
	if land && ctx != 0 {
		if d = devmem.Get(); d == nil {
			return errNoDevice
		}
		r.pin(d, ctx)
	}
	filled, freed := r.word(ringOffFilled), r.word(ringOffFreed)
	for done := uint64(0); done < n; {
		m := min(r.chunk, n-done)
		for {
			f := atomic.LoadUint32(filled)
			if f-rx.freed > r.slots {
				return fmt.Errorf("protocol error: rank %d filled %d ring slots of %d", p.rank, f-rx.freed, r.slots)
			}
			if f != rx.freed {
				break
			}
			if atomic.LoadUint32(r.word(ringOffAbort)) != 0 {
				return errRingAbort
			}
			if p.dead.Load() {
				return errors.New("peer gone during a put through the staging ring")
			}
			futexWait(filled, f, ringWait)
		}
		if land {
			if d != nil {
				if err := d.HtoD(ctx, uintptr(dst)+uintptr(done), r.slot(rx.freed), m); err != nil {
					return fmt.Errorf("copy to device: %w", err)
				}
			} else {
				copy(unsafe.Slice((*byte)(unsafe.Add(dst, done)), m), unsafe.Slice((*byte)(r.slot(rx.freed)), m))
			}
		}
		rx.freed++
		atomic.StoreUint32(freed, rx.freed)
		futexWake(freed)
		done += m
	}
	return nil
}

func (rx *ringRx) close() {
	if rx.r != nil {
		rx.r.close()
		rx.r = nil
	}
}
