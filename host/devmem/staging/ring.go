package staging

import (
	"errors"
	"fmt"
	"io"
	"math"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/logx"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/shmstream"
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
	// RingSlots is how many chunk-sized slots a sender's ring has.
	RingSlots   = 4
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
)

// ErrAbort: the sender gave up in the middle of a put (its lane failed,
// or a copy). To the target it is a stream that ended mid-message: with
// other lanes live, that lane alone fails and the sender resends the put on
// another (host/dataplane's tcp_failover.go); otherwise the peer is dropped.
var ErrAbort = fmt.Errorf("the sender abandoned a put in the staging ring: %w", io.ErrUnexpectedEOF)

// Liveness is what a ring's waits check between futex waits: the sender's
// lane or the target's peer. An interface value, so the per-put calls
// allocate nothing.
type Liveness interface {
	Gone() bool
}

// Ring is one mapping of a staging ring, at either end.
type Ring struct {
	mem   []byte
	fd    int // the sender's memfd, kept open for the target to reopen; -1 at the target
	slots uint32
	chunk uint64

	pinTried bool
	pinned   devmem.HostRegisterer // non-nil: the slots are registered with it
	pinCtx   uintptr               // the context they were registered from
}

func (r *Ring) word(off int) *uint32 { return (*uint32)(unsafe.Pointer(&r.mem[off])) }

// slot is the host address of the slot chunk k goes to.
func (r *Ring) slot(k uint32) unsafe.Pointer {
	return unsafe.Pointer(&r.mem[ringHdrSize+uint64(k%r.slots)*r.chunk])
}

// pin registers the slots with the device once, so that its copies of them
// run at pinned speed; without it they still work, slower.
func (r *Ring) pin(d devmem.Device, ctx uintptr) {
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

// Close unmaps the ring (and unpins it); the sender's memfd closes.
func (r *Ring) Close() {
	if r.pinned != nil {
		r.pinned.HostUnregister(r.pinCtx, unsafe.Pointer(&r.mem[ringHdrSize]))
	}
	unix.Munmap(r.mem)
	if r.fd >= 0 {
		unix.Close(r.fd)
	}
}

// NewRing makes a sender's ring of slots chunks in a sealed memfd (the target
// checks the seals: a ring that could shrink under its mapping would fault).
func NewRing(slots uint32, chunk uint64) (*Ring, error) {
	fd, mem, err := shmstream.CreateSealed("rccl-rma-wasm-ring", ringHdrSize+uint64(slots)*chunk)
	if err != nil {
		return nil, fmt.Errorf("staging ring: %w", err)
	}
	r := &Ring{mem: mem, fd: fd, slots: slots, chunk: chunk}
	*(*uint64)(unsafe.Pointer(&mem[ringOffSlots])) = uint64(slots)
	*(*uint64)(unsafe.Pointer(&mem[ringOffChunk])) = chunk
	atomic.StoreUint64((*uint64)(unsafe.Pointer(&mem[ringOffMagic])), ringMagic)
	return r, nil
}

// Offer is what a sender tells the target of its ring (on the wire, the
// MsgRing header of host/wire): the memfd's number in the sender,
// the mapping's size, the slot count and the chunk size.
type Offer struct {
	FD, Size uint64
	Slots    uint32
	Chunk    uint64
}

// Offer describes the sender's ring for the target.
func (r *Ring) Offer() Offer {
	return Offer{FD: uint64(r.fd), Size: uint64(len(r.mem)), Slots: r.slots, Chunk: r.chunk}
}

// attach maps the ring the sender (process pid) offered: its fd number,
// size, chunk and slot count, all checked against the memfd.
func attach(pid int, o Offer) (*Ring, error) {
	slots, chunk := uint64(o.Slots), o.Chunk
	if slots < 2 || slots > ringMaxSlot || chunk < 4<<10 || chunk > 64<<20 || chunk%4096 != 0 ||
		o.Size != ringHdrSize+slots*chunk || o.FD > math.MaxInt32 {
		return nil, fmt.Errorf("bad ring offer (%d slots of %d bytes, %d bytes)", slots, chunk, o.Size)
	}
	mem, err := shmstream.OpenSealed(pid, o.FD, o.Size)
	if err != nil {
		return nil, err // the caller says what it attached
	}
	r := &Ring{mem: mem, fd: -1, slots: uint32(slots), chunk: chunk}
	if atomic.LoadUint64((*uint64)(unsafe.Pointer(&mem[ringOffMagic]))) != ringMagic ||
		*(*uint64)(unsafe.Pointer(&mem[ringOffSlots])) != slots || *(*uint64)(unsafe.Pointer(&mem[ringOffChunk])) != chunk {
		unix.Munmap(mem)
		return nil, errors.New("the ring's header does not match the offer")
	}
	return r, nil
}

// The waits on the ring's counters (the ring is mapped by two processes).
var (
	futexWait = shmstream.FutexWait
	futexWake = shmstream.FutexWake
)

// AwaitAttach waits until the target mapped the ring (true), refused it
// (false: refused reports the target's MsgRingNo, host/wire), or gone reports the
// peer or lane lost (an error). The sender calls it once, after its offer.
func (r *Ring) AwaitAttach(refused, gone func() bool) (bool, error) {
	att := r.word(ringOffAttached)
	for atomic.LoadUint32(att) == 0 {
		if refused() {
			return false, nil // the target said why in its log
		}
		if gone() {
			return false, errors.New("peer or lane gone while it considered the staging ring")
		}
		futexWait(att, 0, ringWait)
	}
	return true, nil
}

// WakeAttach ends the sender's AwaitAttach after a refusal.
func (r *Ring) WakeAttach() { futexWake(r.word(ringOffAttached)) }

// Slots is how many slots the ring has.
func (r *Ring) Slots() uint32 { return r.slots }

// Chunk is the size of one slot.
func (r *Ring) Chunk() uint64 { return r.chunk }

// Send moves n bytes at src (device memory of ctx, host memory when ctx
// is 0) through the ring, chunk by chunk as the target frees slots; k is
// the count of chunks filled so far, and the new count is returned. g
// ends the wait for a free slot when the target or the lane is gone.
func (r *Ring) Send(k uint32, ctx uintptr, src unsafe.Pointer, n uint64, g Liveness) (uint32, error) {
	var d devmem.Device
	if ctx != 0 {
		if d = devmem.Get(); d == nil {
			r.Abort()
			return k, ErrNoDevice
		}
		if err := fence(d, 0); err != nil {
			r.Abort()
			return k, err
		}
		r.pin(d, ctx)
	}
	filled, freed := r.word(ringOffFilled), r.word(ringOffFreed)
	for done := uint64(0); done < n; {
		m := min(r.chunk, n-done)
		for {
			f := atomic.LoadUint32(freed)
			if k-f < r.slots {
				break
			}
			if g.Gone() {
				r.Abort()
				return k, errors.New("peer or lane gone during a put through the staging ring")
			}
			futexWait(freed, f, ringWait)
		}
		if d != nil {
			if err := d.DtoH(ctx, r.slot(k), uintptr(src)+uintptr(done), m); err != nil {
				r.Abort()
				return k, fmt.Errorf("copy from device: %w", err)
			}
		} else {
			copy(unsafe.Slice((*byte)(r.slot(k)), m), unsafe.Slice((*byte)(unsafe.Add(src, done)), m))
		}
		k++
		atomic.StoreUint32(filled, k)
		futexWake(filled)
		done += m
	}
	return k, nil
}

// Abort tells the target the sender gave up in the middle of a put.
func (r *Ring) Abort() {
	atomic.StoreUint32(r.word(ringOffAbort), 1)
	futexWake(r.word(ringOffFilled))
}

// Receiver is the target's end of one incoming stream's ring.
type Receiver struct {
	r     *Ring
	freed uint32
}

// Attached reports whether a ring was attached already.
func (rx *Receiver) Attached() bool { return rx.r != nil }

// Attach maps the ring the sender (process pid) offered and tells the
// sender so, in the ring.
func (rx *Receiver) Attach(pid int, o Offer) error {
	r, err := attach(pid, o)
	if err != nil {
		return err
	}
	rx.r = r
	atomic.StoreUint32(r.word(ringOffAttached), 1)
	futexWake(r.word(ringOffAttached))
	return nil
}

// Drain takes n bytes out of the ring, chunk by chunk as the sender fills
// it, into dst: device memory of ctx, host memory when ctx is 0, nowhere
// when land is false (a rejected put still empties its slots). It returns
// once every copy completed, so what follows sees the whole payload. rank
// names the sender in errors; g ends the wait when it is gone.
func (rx *Receiver) Drain(rank int, ctx uintptr, dst unsafe.Pointer, n uint64, land bool, g Liveness) error {
	r := rx.r
	if r == nil {
		return fmt.Errorf("protocol error: rank %d sent a put through a staging ring it never offered", rank)
	}
	var d devmem.Device
	if land && ctx != 0 {
		if d = devmem.Get(); d == nil {
			return ErrNoDevice
		}
		// Its copies are synchronous: they follow the asynchronous ones
		// queued before.
		if err := fence(d, 0); err != nil {
			return err
		}
		r.pin(d, ctx)
	}
	filled, freed := r.word(ringOffFilled), r.word(ringOffFreed)
	for done := uint64(0); done < n; {
		m := min(r.chunk, n-done)
		for {
			f := atomic.LoadUint32(filled)
			if f-rx.freed > r.slots {
				return fmt.Errorf("protocol error: rank %d filled %d ring slots of %d", rank, f-rx.freed, r.slots)
			}
			if f != rx.freed {
				break
			}
			if atomic.LoadUint32(r.word(ringOffAbort)) != 0 {
				return ErrAbort
			}
			if g.Gone() {
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

// Close unmaps the ring, if one was attached.
func (rx *Receiver) Close() {
	if rx.r != nil {
		rx.r.Close()
		rx.r = nil
	}
}
