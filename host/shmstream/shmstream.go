// Package shmstream is a byte stream from one process to another of the
// same host through shared memory: a ring in a sealed memfd that the
// writer creates and the reader maps through /proc/<pid>/fd. It replaces
// a loopback socket's bytes, not its framing: host/dataplane writes the
// same messages into it that it would write to the socket, and the reader
// parses them with the same code, so everything a hostile writer can put
// in the ring it could have sent over TCP. What it saves is the kernel: a
// write is a copy and a store, a read a load and a copy, with no system
// call while the reader polls.
//
// The reader sleeps on something else (host/dataplane: the lane's socket,
// in the netpoller); before it does it sets the ring's sleeping word and
// looks once more, and a writer that finds the word set after it published
// its bytes wakes it (Write's bell). A writer that finds the ring full
// waits on a futex on the reader's published position, 20 ms at a time,
// asking its Liveness between waits.
//
// Only the counters cross between the processes, and the reader checks
// each one it loads: a writer whose tail runs ahead of what the ring holds,
// or back, has corrupted the stream, and Read fails for good.
//
// CreateSealed, OpenSealed, FutexWait and FutexWake are the memory both
// ends share and the waits on it; host/devmem/staging's ring uses them too.
package shmstream

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	hdrSize = 4096                  // the header page; the data follows
	magic   = 0x4d52_5453_5741_4d52 // "RMAWSTRM"
	// Offsets in the header page; words written by different processes
	// are a cache line apart.
	offMagic    = 0
	offSize     = 8
	offAttached = 64  // reader: 1 once it mapped the ring
	offTail     = 128 // writer: bytes written, ever
	offHead     = 192 // reader: bytes read, ever (its low half is the writer's futex)
	offSleeping = 256 // reader: 1 while it may sleep; the writer clears it when it rings
	offWaiting  = 320 // writer: 1 while it waits for room
	// MinSize and MaxSize bound the data area (a power of two).
	MinSize = 4 << 10
	MaxSize = 64 << 20
	// wait bounds one futex wait; the waiter then asks its Liveness.
	wait = 20 * time.Millisecond
)

// ErrCorrupt: the writer's counters are not those of a stream (a tail that
// ran back, or ahead of what the ring holds).
var ErrCorrupt = errors.New("shared-memory stream corrupted by its writer")

// ErrGone: the writer gave up waiting for room, because its Liveness said
// the stream is gone.
var ErrGone = errors.New("shared-memory stream: reader gone while the writer waited for room")

// Liveness is what a waiting writer asks between futex waits.
type Liveness interface{ Gone() bool }

// Bell wakes a sleeping reader (host/dataplane: a byte on the socket).
type Bell interface{ Ring() }

// Ring is one end of a stream: the writer's (New) or the reader's (Attach).
type Ring struct {
	mem  []byte
	data []byte
	mask uint64
	fd   int    // the writer's memfd, open for the reader to reopen; -1 at the reader
	pos  uint64 // the writer's tail, or the reader's head: private, never loaded from the ring
	bad  bool   // the reader saw corruption: every later read fails
}

func (r *Ring) u64(off int) *uint64 { return (*uint64)(unsafe.Pointer(&r.mem[off])) }
func (r *Ring) u32(off int) *uint32 { return (*uint32)(unsafe.Pointer(&r.mem[off])) }

// New makes a writer's ring with size bytes of data (a power of two between
// MinSize and MaxSize) in a memfd sealed against shrinking and growing: a
// reader's mapping can never fault.
func New(size uint64) (*Ring, error) {
	if size < MinSize || size > MaxSize || size&(size-1) != 0 {
		return nil, fmt.Errorf("shared-memory stream of %d bytes: not a power of two in [%d, %d]", size, MinSize, MaxSize)
	}
	fd, mem, err := CreateSealed("rccl-rma-wasm-stream", hdrSize+size)
	if err != nil {
		return nil, fmt.Errorf("shared-memory stream: %w", err)
	}
	r := &Ring{mem: mem, data: mem[hdrSize:], mask: size - 1, fd: fd}
	*r.u64(offSize) = size
	atomic.StoreUint64(r.u64(offMagic), magic)
	return r, nil
}

// Offer is what the writer tells the reader: its memfd's number and the
// ring's data size.
func (r *Ring) Offer() (fd, size uint64) { return uint64(r.fd), r.mask + 1 }

// Attach maps the ring that process pid offered (fd and size as Offer
// gave them), checking the file's size and seals and the ring's header.
func Attach(pid int, fd, size uint64) (*Ring, error) {
	if size < MinSize || size > MaxSize || size&(size-1) != 0 {
		return nil, fmt.Errorf("bad shared-memory stream offer (%d bytes)", size)
	}
	mem, err := OpenSealed(pid, fd, hdrSize+size)
	if err != nil {
		return nil, err // the caller says what it attached
	}
	r := &Ring{mem: mem, data: mem[hdrSize:], mask: size - 1, fd: -1}
	if atomic.LoadUint64(r.u64(offMagic)) != magic || atomic.LoadUint64(r.u64(offSize)) != size {
		unix.Munmap(mem)
		return nil, errors.New("the shared-memory stream's header does not match the offer")
	}
	// The stream starts where the writer's tail is: nothing was written
	// yet (the writer waits for the attach), but a hostile one may have.
	r.pos = atomic.LoadUint64(r.u64(offTail))
	atomic.StoreUint64(r.u64(offHead), r.pos)
	return r, nil
}

// SetAttached tells the writer the reader mapped the ring (and wakes its
// AwaitAttach).
func (r *Ring) SetAttached() {
	atomic.StoreUint32(r.u32(offAttached), 1)
	FutexWake(r.u32(offAttached))
}

// AwaitAttach waits until the reader mapped the ring (true), refused it
// (false: refused says so), or l says the stream is gone (an error). The
// memfd closes then, whatever the answer: the mapping is all either end
// needs from now on, and a descriptor per lane would count against the
// process's limit.
func (r *Ring) AwaitAttach(refused func() bool, l Liveness) (bool, error) {
	defer r.closeFD()
	att := r.u32(offAttached)
	for atomic.LoadUint32(att) == 0 {
		if refused() {
			return false, nil
		}
		if l.Gone() {
			return false, errors.New("peer or lane gone while it considered the shared-memory stream")
		}
		FutexWait(att, 0, wait)
	}
	// The reader may have started from a tail other than ours only if we
	// wrote before the attach, which we never do.
	return true, nil
}

// WakeAttach ends the writer's AwaitAttach after a refusal.
func (r *Ring) WakeAttach() { FutexWake(r.u32(offAttached)) }

// Write copies the bytes of iov into the ring, in order, publishing them
// as it goes; with the ring full it rings b (a reader that went to sleep
// must drain it) and waits for room while l lives. It rings b again when
// the reader sleeps after the last bytes were published. Only one
// goroutine writes a ring at a time.
func (r *Ring) Write(iov [][]byte, b Bell, l Liveness) error {
	size := r.mask + 1
	tail := r.pos
	for _, p := range iov {
		for len(p) > 0 {
			head := atomic.LoadUint64(r.u64(offHead))
			room := size - (tail - head)
			if tail-head > size {
				room = 0 // a reader's head ahead of our tail: wait until it is sane (or gone)
			}
			if room == 0 {
				r.publish(tail, b)
				if err := r.awaitRoom(head, l); err != nil {
					return err
				}
				continue
			}
			n := uint64(len(p))
			if n > room {
				n = room
			}
			at := tail & r.mask
			c := copy(r.data[at:], p[:n])
			copy(r.data, p[c:n])
			tail += n
			p = p[n:]
		}
	}
	r.publish(tail, b)
	return nil
}

// publish stores the tail and rings b if the reader is asleep: it set
// sleeping before its last look at the tail, so either it sees this tail
// or this load sees its word (both are sequentially consistent).
func (r *Ring) publish(tail uint64, b Bell) {
	if tail == r.pos {
		return
	}
	r.pos = tail
	raceRelease()
	atomic.StoreUint64(r.u64(offTail), tail)
	if atomic.LoadUint32(r.u32(offSleeping)) != 0 && atomic.CompareAndSwapUint32(r.u32(offSleeping), 1, 0) {
		b.Ring()
	}
}

// awaitRoom waits until the reader's head moves from head.
func (r *Ring) awaitRoom(head uint64, l Liveness) error {
	hw := r.u32(offHead) // the low half (little endian)
	for spin := 0; ; spin++ {
		if atomic.LoadUint64(r.u64(offHead)) != head {
			raceAcquire() // the reader is done with what we overwrite
			return nil
		}
		if l.Gone() {
			return ErrGone
		}
		if spin < 64 {
			runtime.Gosched() // the reader may share this core
			continue
		}
		atomic.StoreUint32(r.u32(offWaiting), 1)
		if atomic.LoadUint64(r.u64(offHead)) == head {
			FutexWait(hw, uint32(head), wait)
		}
		atomic.StoreUint32(r.u32(offWaiting), 0)
	}
}

// Read copies what the ring holds, up to len(b) bytes, into b without
// waiting: 0 when it is empty. ErrCorrupt, once seen, is returned for good.
func (r *Ring) Read(b []byte) (int, error) {
	avail, err := r.Avail()
	if err != nil || avail == 0 || len(b) == 0 {
		return 0, err
	}
	raceAcquire()
	n := uint64(len(b))
	if n > avail {
		n = avail
	}
	at := r.pos & r.mask
	c := copy(b[:n], r.data[at:])
	copy(b[c:n], r.data)
	r.pos += n
	raceRelease()
	atomic.StoreUint64(r.u64(offHead), r.pos)
	if atomic.LoadUint32(r.u32(offWaiting)) != 0 {
		FutexWake(r.u32(offHead))
	}
	return int(n), nil
}

// Avail is how many bytes the reader can read now.
func (r *Ring) Avail() (uint64, error) {
	if r.bad {
		return 0, ErrCorrupt
	}
	d := atomic.LoadUint64(r.u64(offTail)) - r.pos
	if d > r.mask+1 {
		r.bad = true
		return 0, ErrCorrupt
	}
	return d, nil
}

// Pending reports whether the writer published bytes the reader has not
// read (or corrupted the counters: Read then says so). It loads the two
// published counters only, so a thread other than the one reading may ask.
func (r *Ring) Pending() bool {
	return atomic.LoadUint64(r.u64(offTail)) != atomic.LoadUint64(r.u64(offHead))
}

// Sleep marks the reader as about to sleep and looks once more: true when
// the ring is still empty (the reader may sleep; a writer rings its bell),
// false when bytes came or the ring is corrupt (it must read instead).
// Like Pending, it may be called by a thread other than the reading one.
func (r *Ring) Sleep() bool {
	atomic.StoreUint32(r.u32(offSleeping), 1)
	if r.Pending() {
		atomic.StoreUint32(r.u32(offSleeping), 0)
		return false
	}
	return true
}

// Awake clears the sleeping mark (the reader woke on its own).
func (r *Ring) Awake() {
	if atomic.LoadUint32(r.u32(offSleeping)) != 0 {
		atomic.StoreUint32(r.u32(offSleeping), 0)
	}
}

// State is what the ring's shared words say now, for diagnostics: bytes
// written and read, ever, whether the reader said it sleeps and whether
// the writer waits for room.
func (r *Ring) State() (tail, head uint64, sleeping, waiting bool) {
	return atomic.LoadUint64(r.u64(offTail)), atomic.LoadUint64(r.u64(offHead)),
		atomic.LoadUint32(r.u32(offSleeping)) != 0, atomic.LoadUint32(r.u32(offWaiting)) != 0
}

// Size is the ring's data size.
func (r *Ring) Size() uint64 { return r.mask + 1 }

// Close unmaps the ring; the writer's memfd closes if it is still open.
func (r *Ring) Close() error {
	err := unix.Munmap(r.mem)
	if cerr := r.closeFD(); err == nil {
		err = cerr
	}
	return err
}

func (r *Ring) closeFD() error {
	if r.fd < 0 {
		return nil
	}
	err := unix.Close(r.fd)
	r.fd = -1
	return err
}

// CreateSealed makes a memfd of size bytes, sealed against shrinking and
// growing (and further seals), and maps it: what a process shares with a
// peer of its host (a stream here, host/devmem/staging's ring). The
// descriptor is the caller's to close.
func CreateSealed(name string, size uint64) (int, []byte, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, nil, fmt.Errorf("memfd_create: %w", err)
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
		return -1, nil, fmt.Errorf("memfd of %d bytes: %w", size, err)
	}
	return fd, mem, nil
}

// OpenSealed maps memfd number fd of process pid (through /proc, which
// needs ptrace read access to it), after checking that the file is exactly
// size bytes and sealed against shrinking and growing: a mapping of it can
// never fault, whatever the peer does to the file.
func OpenSealed(pid int, fd, size uint64) ([]byte, error) {
	if fd > math.MaxInt32 || pid <= 0 || size == 0 || size > math.MaxInt32 {
		return nil, fmt.Errorf("bad memfd offer (fd %d, %d bytes, pid %d)", fd, size, pid)
	}
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/%d", pid, fd), os.O_RDWR|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return MapSealed(int(f.Fd()), size)
}

// MapSealed maps fd, a memfd a peer handed over (SCM_RIGHTS, or opened
// through /proc), read and write, after checking that the file is exactly
// size bytes and sealed against shrinking and growing: the mapping can
// never fault, whatever the peer does to the file. fd stays the caller's.
func MapSealed(fd int, size uint64) ([]byte, error) {
	if fd < 0 || size == 0 || size > math.MaxInt32 {
		return nil, fmt.Errorf("bad memfd offer (fd %d, %d bytes)", fd, size)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || uint64(st.Size) != size {
		return nil, fmt.Errorf("file of %d bytes, offered %d (%v)", st.Size, size, err)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&(unix.F_SEAL_SHRINK|unix.F_SEAL_GROW) != unix.F_SEAL_SHRINK|unix.F_SEAL_GROW {
		return nil, fmt.Errorf("file not sealed against resizing (%v)", err)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map it: %w", err)
	}
	return mem, nil
}

const (
	futexWaitOp = 0 // FUTEX_WAIT, shared: two processes map the word
	futexWakeOp = 1 // FUTEX_WAKE, shared
)

// FutexWait sleeps while *w == val, at most d, or until a FutexWake of w;
// w may be in memory another process maps (CreateSealed, OpenSealed).
func FutexWait(w *uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWaitOp, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// FutexWake wakes every FutexWait of w, in any process.
func FutexWake(w *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWakeOp, math.MaxInt32, 0, 0, 0)
}
