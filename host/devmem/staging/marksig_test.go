package staging

import (
	"errors"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// markWaitDev is a device whose agent (its one slow stream) can wait
// for a peer's mark before a signal (devmem.MarkWaiter) and marks its own
// copies (devmem.CopyMarker, so that our mark page can be made).
type markWaitDev struct {
	agentDevice
	mu       sync.Mutex
	pinned   map[uintptr]bool // read-only pins, by address
	mapped   [][]byte         // AllocPinned's
	pinFail  atomic.Bool      // HostRegisterReadOnly fails
	refuse   atomic.Bool      // SignalAfterMark declines
	waits    atomic.Int64     // SignalAfterMark commands queued
	timeouts atomic.Uint64
	limit    time.Duration // how long a command waits for its mark
}

func newMarkWaitDev(delay time.Duration) *markWaitDev {
	return &markWaitDev{agentDevice: agentDevice{newStreamDevice(1<<20, asyncCaps, delay)}, pinned: map[uintptr]bool{}, limit: 10 * time.Second}
}

// AllocPinned maps memory outside Go's heap, as the driver's pinned memory
// is: the release words are handed to the device by address.
func (d *markWaitDev) AllocPinned(_ uintptr, n uint64) (unsafe.Pointer, error) {
	b, err := unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.mapped = append(d.mapped, b)
	d.mu.Unlock()
	return unsafe.Pointer(&b[0]), nil
}
func (d *markWaitDev) FreePinned(p unsafe.Pointer) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, b := range d.mapped {
		if unsafe.Pointer(&b[0]) == p {
			unix.Munmap(b)
			d.mapped = append(d.mapped[:i], d.mapped[i+1:]...)
			return
		}
	}
}
func (d *markWaitDev) HostRegister(uintptr, unsafe.Pointer, uint64) error { return nil }
func (d *markWaitDev) HostUnregister(_ uintptr, p unsafe.Pointer) {
	d.mu.Lock()
	delete(d.pinned, uintptr(p))
	d.mu.Unlock()
}
func (d *markWaitDev) CopyMark(ctx, dst, src uintptr, n uint64, mark uintptr) (uint64, bool, error) {
	return 0, false, nil
}
func (d *markWaitDev) HostRegisterReadOnly(_ uintptr, p unsafe.Pointer, n uint64) error {
	if d.pinFail.Load() {
		return errors.New("injected: no read-only registration")
	}
	d.mu.Lock()
	d.pinned[uintptr(p)] = true
	d.mu.Unlock()
	return nil
}
func (d *markWaitDev) MarkWaitsSkipped() uint64 { return d.timeouts.Load() }
func (d *markWaitDev) SignalAfterMark(_, sig uintptr, v uint64, add bool, mark uintptr, mv uint64, release uintptr) (bool, error) {
	if d.refuse.Load() {
		return false, nil
	}
	d.waits.Add(1)
	// mark is the mapped page's address (not Go memory).
	w := (*atomic.Uint64)(unsafe.Add(unsafe.Pointer(nil), mark))
	var rel *atomic.Uint64
	if release != 0 {
		rel = (*atomic.Uint64)(unsafe.Add(unsafe.Pointer(nil), release))
	}
	d.enqueue(func() {
		for start := time.Now(); w.Load() < mv; time.Sleep(20 * time.Microsecond) {
			if time.Since(start) > d.limit || (rel != nil && rel.Load() != 0) {
				d.timeouts.Add(1)
				return // skipped, as the kernel does
			}
		}
		if add {
			atomic.AddUint64(d.word(sig), v)
		} else {
			atomic.StoreUint64(d.word(sig), v)
		}
	})
	return true, nil
}

// markWaitSetup registers d with asynchronous copies, the device's mark
// waits on and our mark page made from context 1, and maps a peer's page
// (ours here, written through w) as the target does.
func markWaitSetup(t *testing.T, d *markWaitDev) (*PeerMarks, *[MarkWords]atomic.Uint64) {
	t.Helper()
	asyncSetup(t, d)
	markWaitsWarned.Store(0) // (a global: each test's device counts from 0)
	SetMarkWaitDevice(true)
	t.Cleanup(func() { SetMarkWaitDevice(false) })
	if err := MarkPage(1); err != nil {
		t.Fatal(err)
	}
	fd, w := markFile(t)
	pm, err := OpenPeerMarks(fd, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pm.Close)
	return pm, w
}

// TestSignalAfterMark: with the mark not yet there, the signal (a
// never-reset shadow's write, then an agent's add to a plain word) is
// queued at once and stays unapplied until the peer's word reaches the
// mark; a host-visible fence (a host signal word's) waits for it as for a
// queued copy; a mark already there, another context, an agent that
// declines, or the setting off leave the signal to the caller, and a
// declined shadow write leaves the shadow as it was.
func TestSignalAfterMark(t *testing.T) {
	for _, shadow := range []bool{true, false} {
		d := newMarkWaitDev(0)
		pm, w := markWaitSetup(t, d)
		SetAgentAdds(!shadow)
		if !pm.DeviceWaits() {
			t.Fatal("the peer's page was not pinned for the device")
		}
		var sh *Shadow
		if shadow {
			sh = NewShadow(d.Base+4096, 64)
		}
		sig := d.Base + 4096 + 8
		want := uint64(0)
		for k, mv := range []uint64{3, 4, 9} {
			ok, err := AddSignalAfterMark(1, sig, uint64(k+1), sh, pm, 5, mv)
			if err != nil || !ok {
				t.Fatalf("shadow %v, mark %d: AddSignalAfterMark = %v, %v; want it queued", shadow, mv, ok, err)
			}
			fenced := make(chan error, 1)
			go func() { fenced <- Fence() }()
			time.Sleep(20 * time.Millisecond)
			// (A load, not a peek: a peek waits for the stream's
			// operation, which waits for the mark.)
			if got := atomic.LoadUint64(d.word(sig)); got != want {
				t.Fatalf("shadow %v, mark %d: the signal reads %d before its mark (want %d)", shadow, mv, got, want)
			}
			select {
			case err := <-fenced:
				t.Fatalf("shadow %v: a fence passed a signal still waiting for its mark (%v)", shadow, err)
			default:
			}
			w[5].Store(mv)
			want += uint64(k + 1)
			if err := <-fenced; err != nil {
				t.Fatal(err)
			}
			waitWord(t, d.streamDevice, sig, want)
		}
		// The mark there already: the caller's path.
		if ok, _ := AddSignalAfterMark(1, sig, 1, sh, pm, 5, 9); ok {
			t.Fatalf("shadow %v: queued a signal whose mark was there", shadow)
		}
		// Another context than the page's, an agent that declines: not
		// queued, and the shadow holds only what was written.
		if ok, _ := AddSignalAfterMark(2, sig, 1, sh, pm, 5, 10); ok {
			t.Fatalf("shadow %v: queued in a context the page is not pinned from", shadow)
		}
		d.refuse.Store(true)
		if ok, err := AddSignalAfterMark(1, sig, 1, sh, pm, 5, 10); ok || err != nil {
			t.Fatalf("shadow %v: declined = %v, %v", shadow, ok, err)
		}
		d.refuse.Store(false)
		if shadow {
			if got := sh.words[1].val.Load(); got != want {
				t.Fatalf("a declined write left the shadow at %d, want %d", got, want)
			}
		}
		SetMarkWaitDevice(false)
		if ok, _ := AddSignalAfterMark(1, sig, 1, sh, pm, 5, 10); ok || pm.DeviceWaits() {
			t.Fatal("queued with the setting off")
		}
		SetMarkWaitDevice(true)
		if err := Quiesce(1); err != nil {
			t.Fatal(err)
		}
		SetAgentAdds(false)
		if d.waits.Load() != 3 {
			t.Fatalf("%d commands waited for marks, want 3", d.waits.Load())
		}
	}
}

// TestSignalAfterMarkSlots: a command's slot goes back once it ran, so
// many signals in a row (more than the context's slots) all take the way;
// with every slot a fence can use held, the caller's path takes over.
func TestSignalAfterMarkSlots(t *testing.T) {
	d := newMarkWaitDev(0)
	pm, w := markWaitSetup(t, d)
	SetAgentAdds(true)
	defer SetAgentAdds(false)
	sig := d.Base + 4096
	for i := uint64(1); i <= 3*bounceSlots; i++ {
		if ok, err := AddSignalAfterMark(1, sig, 1, nil, pm, 0, i); !ok || err != nil {
			t.Fatalf("signal %d: %v, %v", i, ok, err)
		}
		w[0].Store(i)
		waitWord(t, d.streamDevice, sig, i)
	}
	// Marks that do not come hold their slots: past half of them, no more.
	n := 0
	for i := uint64(1000); i < 1000+bounceSlots; i++ {
		if ok, _ := AddSignalAfterMark(1, sig, 1, nil, pm, 1, i); ok {
			n++
		}
	}
	if n != bounceSlots/2 {
		t.Fatalf("%d signals queued behind marks that do not come, want %d (half the slots)", n, bounceSlots/2)
	}
	w[1].Store(2000)
	if err := Quiesce(1); err != nil {
		t.Fatal(err)
	}
}

// TestSignalAfterMarkTimeout: a mark that never comes holds the agent for
// its bound, then the signal is dropped and counted, and the watch says so
// once.
func TestSignalAfterMarkTimeout(t *testing.T) {
	d := newMarkWaitDev(0)
	d.limit = 30 * time.Millisecond
	pm, _ := markWaitSetup(t, d)
	SetAgentAdds(true)
	defer SetAgentAdds(false)
	sig := d.Base + 4096
	if ok, err := AddSignalAfterMark(1, sig, 1, nil, pm, 2, 7); !ok || err != nil {
		t.Fatalf("%v, %v", ok, err)
	}
	if err := Quiesce(1); err != nil {
		t.Fatal(err)
	}
	if d.timeouts.Load() != 1 || d.peekWord(sig) != 0 {
		t.Fatalf("timeouts %d, word %d: want the signal skipped and counted", d.timeouts.Load(), d.peekWord(sig))
	}
	was := markWaitsWarned.Load()
	watchMarkWaits()
	if markWaitsWarned.Load() != was+1 {
		t.Fatal("the watch did not report the skipped signal")
	}
	watchMarkWaits()
	if markWaitsWarned.Load() != was+1 {
		t.Fatal("the watch reported it twice")
	}
}

// TestPeerMarksPin: a page is pinned for the device only with the setting
// on and our own page made; a pin that fails leaves the host waiting;
// the last Close unpins before it unmaps.
func TestPeerMarksPin(t *testing.T) {
	d := newMarkWaitDev(0)
	pm, _ := markWaitSetup(t, d)
	addr := uintptr(unsafe.Pointer(&pm.mem[0]))
	d.mu.Lock()
	pinned := d.pinned[addr]
	d.mu.Unlock()
	if !pinned || !pm.DeviceWaits() {
		t.Fatal("not pinned")
	}
	pm.Retain()
	pm.Close()
	d.mu.Lock()
	pinned = d.pinned[addr]
	d.mu.Unlock()
	if !pinned {
		t.Fatal("unpinned while a holder remains")
	}
	pm.Close()
	d.mu.Lock()
	pinned = d.pinned[addr]
	d.mu.Unlock()
	if pinned {
		t.Fatal("still pinned after the last Close")
	}
	pm.refs.Store(1) // the setup's cleanup closes it once more

	d.pinFail.Store(true)
	fd, _ := markFile(t)
	pm2, err := OpenPeerMarks(fd, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer pm2.Close()
	if pm2.DeviceWaits() {
		t.Fatal("a page whose pin failed is said to be waited for on the device")
	}
	SetMarkWaitDevice(false)
	d.pinFail.Store(false)
	fd3, _ := markFile(t)
	pm3, err := OpenPeerMarks(fd3, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer pm3.Close()
	if pm3.pinCtx.Load() != 0 {
		t.Fatal("pinned with the setting off")
	}
}

// TestPeerMarksPinLater: a peer's page mapped before our own page was made
// is pinned once ours is, from its context; one closed meanwhile is not.
func TestPeerMarksPinLater(t *testing.T) {
	d := newMarkWaitDev(0)
	asyncSetup(t, d)
	SetMarkWaitDevice(true)
	defer SetMarkWaitDevice(false)
	fd, _ := markFile(t)
	early, err := OpenPeerMarks(fd, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer early.Close()
	fd2, _ := markFile(t)
	gone, err := OpenPeerMarks(fd2, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if early.DeviceWaits() || gone.DeviceWaits() {
		t.Fatal("pinned before our own page (and its context) existed")
	}
	gone.Close()
	if err := MarkPage(1); err != nil {
		t.Fatal(err)
	}
	if !early.DeviceWaitsIn(1) || early.DeviceWaitsIn(2) {
		t.Fatal("the early page was not pinned from our page's context once it was made")
	}
	d.mu.Lock()
	n := len(d.pinned)
	d.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d pages pinned, want 1 (a closed page pinned after its Close?)", n)
	}
}

// TestSignalAfterMarkPeerGone: a wait for the mark of a process that has
// exited ends at the watch's next look (its release word set), the signal
// skipped and counted, long before the 30 s bound; a live peer's page is
// not released.
func TestSignalAfterMarkPeerGone(t *testing.T) {
	d := newMarkWaitDev(0)
	live, _ := markWaitSetup(t, d)
	SetAgentAdds(true)
	defer SetAgentAdds(false)
	c := exec.Command("true")
	if err := c.Run(); err != nil {
		t.Skipf("no child process: %v", err)
	}
	fd, _ := markFile(t)
	gone, err := OpenPeerMarks(fd, c.Process.Pid) // exited and reaped
	if err != nil {
		t.Fatal(err)
	}
	defer gone.Close()
	if !gone.DeviceWaits() {
		t.Fatal("not pinned")
	}
	sig := d.Base + 4096
	if ok, err := AddSignalAfterMark(1, sig, 1, nil, gone, 0, 5); !ok || err != nil {
		t.Fatalf("%v, %v", ok, err)
	}
	start := time.Now()
	watchMarkWaits() // releases it, and then (the skip done) WARNs
	if err := Quiesce(1); err != nil {
		t.Fatal(err)
	}
	if d.timeouts.Load() != 1 || d.peekWord(sig) != 0 || time.Since(start) > 20*time.Second {
		t.Fatalf("skipped %d, word %d after %v: want the wait ended at once, the signal skipped", d.timeouts.Load(), d.peekWord(sig), time.Since(start))
	}
	if live.relw.Load() != 0 {
		t.Fatal("a live peer's page was released")
	}
	watchMarkWaits()
	if markWaitsWarned.Load() != 1 {
		t.Fatalf("the watch reported %d skipped signals, want 1", markWaitsWarned.Load())
	}
}

// TestReleaseDeadWhilePinning: releaseDead does not wait for a pin or an
// unpin in progress, which hold devicePins across driver calls that can
// wait for the very agent it would release.
func TestReleaseDeadWhilePinning(t *testing.T) {
	devicePins.Lock()
	defer devicePins.Unlock()
	done := make(chan struct{})
	go func() { releaseDead(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("releaseDead waited for a pin in progress")
	}
}

// TestPeerMarksPinBound: past releaseWords pinned pages a page is not
// pinned (the host waits for its marks), and a page unpinned gives its
// word back for the next.
func TestPeerMarksPinBound(t *testing.T) {
	d := newMarkWaitDev(0)
	first, _ := markWaitSetup(t, d)
	devicePins.Lock()
	for i := range devicePins.relUse {
		devicePins.relUse[i] = true // every word taken (first's among them)
	}
	devicePins.Unlock()
	fd, _ := markFile(t)
	over, err := OpenPeerMarks(fd, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if over.DeviceWaits() {
		t.Fatal("a page pinned with every release word taken")
	}
	over.Close()
	devicePins.Lock()
	for i := range devicePins.relUse {
		devicePins.relUse[i] = i == first.relIdx
	}
	devicePins.Unlock()
	first.Retain()
	first.Close()
	first.Close() // unpinned: its word free again
	devicePins.Lock()
	free := !devicePins.relUse[first.relIdx]
	devicePins.Unlock()
	if !free {
		t.Fatal("an unpinned page kept its release word")
	}
	first.refs.Store(1) // the setup's cleanup closes it once more
	fd2, _ := markFile(t)
	next, err := OpenPeerMarks(fd2, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	if !next.DeviceWaits() {
		t.Fatal("a freed release word was not given to the next page")
	}
}
