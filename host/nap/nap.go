// Package nap gives goroutines naps shorter than a millisecond that end
// on time.
//
// Go's timers end such a wait late when the process is otherwise idle:
// the thread that waits for the next timer blocks in epoll_wait, whose
// timeout is whole milliseconds, so a 200 µs timer fires after about
// 1.1 ms (BENCH.md). A service that naps while NCCL's proxy polls the
// stream for it, and whose caller then stops calling, would leave a
// message waiting that long. Here one keeper thread of the process sleeps
// with nanosleep (a high-resolution timer, its slack set to the least)
// while any nap is pending and ends the naps whose time came; it parks
// when none is.
//
// On fewer than four cores the keeper's wake-ups, and the services'
// shorter naps, take more from the threads they share the cores with
// than the late naps cost (the 2-vCPU figures in BENCH.md): there a
// Napper is a Go timer, as before.
package nap

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// maxSleep bounds one sleep of the keeper, so that a nap started while it
// sleeps towards a later one still ends within this of its time.
const maxSleep = 50 * time.Microsecond

// maxArmed bounds the naps the keeper holds at once; more take Go timers.
// Its list is scanned on each wake and locked on each nap: with a
// thousand busy streams the process is not idle anyway, and there Go's
// timers end on time.
const maxArmed = 64

// Napper is one goroutine's nap: Start arms it, C fires once its time
// came, Stop disarms it. Its zero value is not ready: use New.
type Napper struct {
	ch    chan struct{}
	due   int64       // monotonic ns; 0: not armed (keeper.mu)
	idx   int         // in keeper.armed while armed
	t     *time.Timer // the nap where the keeper does not take it
	timed bool        // the current nap is t's
}

// precise: naps are kept by the keeper (four cores or more).
var precise = runtime.NumCPU() >= 4

// Precise reports whether naps end on time here (else they are Go timers).
func Precise() bool { return precise }

// New returns a disarmed Napper.
func New() *Napper {
	n := &Napper{ch: make(chan struct{}, 1), idx: -1}
	n.t = time.AfterFunc(time.Hour, n.fire)
	n.t.Stop()
	return n
}

func (n *Napper) fire() {
	select {
	case n.ch <- struct{}{}:
	default:
	}
}

// C receives once per nap that ran its time (a Stop that lost the race
// with the keeper may leave one behind: Start drains it).
func (n *Napper) C() <-chan struct{} { return n.ch }

var keeper struct {
	mu    sync.Mutex
	cond  *sync.Cond
	armed []*Napper
	run   bool
}

// armedN is len(keeper.armed), read without the lock.
var armedN atomic.Int32

var epoch = time.Now()

func now() int64 { return int64(time.Since(epoch)) }

// Start arms n to fire after d, replacing a nap it had.
func (n *Napper) Start(d time.Duration) {
	select {
	case <-n.ch: // a nap that ended unseen
	default:
	}
	if !precise || (n.idx < 0 && armedN.Load() >= maxArmed) {
		n.timed = true
		n.t.Reset(d)
		return
	}
	if n.timed {
		n.t.Stop()
		n.timed = false
	}
	keeper.mu.Lock()
	if n.idx < 0 {
		n.idx = len(keeper.armed)
		keeper.armed = append(keeper.armed, n)
		armedN.Store(int32(len(keeper.armed)))
	}
	n.due = now() + int64(d)
	if !keeper.run {
		keeper.run = true
		keeper.cond = sync.NewCond(&keeper.mu)
		go keep()
	}
	if len(keeper.armed) == 1 {
		keeper.cond.Signal()
	}
	keeper.mu.Unlock()
}

// Stop disarms n; a nap that already fired may still be in C.
func (n *Napper) Stop() {
	if n.timed {
		n.t.Stop()
		n.timed = false
		return
	}
	keeper.mu.Lock()
	n.removeLocked()
	keeper.mu.Unlock()
}

func (n *Napper) removeLocked() {
	if n.idx < 0 {
		return
	}
	last := len(keeper.armed) - 1
	keeper.armed[n.idx] = keeper.armed[last]
	keeper.armed[n.idx].idx = n.idx
	keeper.armed[last] = nil
	keeper.armed = keeper.armed[:last]
	armedN.Store(int32(last))
	n.idx, n.due = -1, 0
}

// Sleep blocks the calling goroutine for d with n.
func (n *Napper) Sleep(d time.Duration) {
	n.Start(d)
	<-n.ch
}

// keep is the keeper: it runs on a thread of its own, whose timer slack
// it sets to the least, and sleeps towards the earliest nap's time.
func keep() {
	runtime.LockOSThread()
	unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0) // best effort: default slack is 50 µs
	keeper.mu.Lock()
	for {
		for len(keeper.armed) == 0 {
			keeper.cond.Wait()
		}
		t := now()
		next := int64(-1)
		for i := 0; i < len(keeper.armed); {
			n := keeper.armed[i]
			if n.due <= t {
				n.removeLocked() // moves the last one to i
				n.fire()
				continue
			}
			if next < 0 || n.due < next {
				next = n.due
			}
			i++
		}
		if next < 0 {
			continue
		}
		keeper.mu.Unlock()
		ts := unix.NsecToTimespec(min(next-t, int64(maxSleep)))
		for unix.Nanosleep(&ts, &ts) == unix.EINTR {
		}
		keeper.mu.Lock()
	}
}
