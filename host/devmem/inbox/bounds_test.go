package inbox

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/devtest"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
)

// fakeInboxer is a device whose agent runs in context 7 and whose inbox
// calls only record what they were asked.
type fakeInboxer struct {
	*devtest.Pipe
	rows   int
	tab    map[int]uint64 // entry -> size
	kicks  atomic.Int32
	counts uintptr
	resets map[int]int     // row -> times emptied
	maps   map[uintptr]int // imported rows' address -> 1 while mapped
	nmaps  int
}

func (f *fakeInboxer) AgentRuns(ctx uintptr) bool                         { return ctx == 7 }
func (f *fakeInboxer) HostRegister(uintptr, unsafe.Pointer, uint64) error { return nil }
func (f *fakeInboxer) HostUnregister(uintptr, unsafe.Pointer)             {}
func (f *fakeInboxer) CopyMark(_, _, _ uintptr, _ uint64, _ uintptr) (uint64, bool, error) {
	return 0, false, nil
}
func (f *fakeInboxer) InboxOpen(_, taken, _ uintptr, _ uint64) error { f.counts = taken; return nil }
func (f *fakeInboxer) InboxRow(_ uintptr, row int) (int, devmem.Segment, int, error) {
	if row >= f.rows {
		return 0, devmem.Segment{Fd: -1}, 0, errors.New("a row not handed out")
	}
	if row < 0 {
		f.rows++
		row = f.rows - 1
	}
	return row, devmem.Segment{Fd: -1, Size: 1 << 21}, 64, nil
}

// InboxReset empties the row as the agent would see it: its count 0.
func (f *fakeInboxer) InboxReset(_ uintptr, row int) error {
	f.resets[row]++
	staging.MarkPageRestWord(row).Store(0)
	return nil
}
func (f *fakeInboxer) IPCExport(uintptr, uintptr, uint64) ([]devmem.Segment, error) { return nil, nil }
func (f *fakeInboxer) IPCImport(uintptr, []devmem.Segment) (uintptr, error) {
	f.nmaps++
	va := uintptr(0x7000_0000 + f.nmaps<<21)
	f.maps[va] = 1
	return va, nil
}
func (f *fakeInboxer) IPCUnmap(_, va uintptr, _ []uint64) error {
	if f.maps[va] != 1 {
		return errors.New("not mapped")
	}
	delete(f.maps, va)
	return nil
}
func (f *fakeInboxer) InboxTable(_ uintptr, idx int, _ uintptr, n uint64) error {
	f.tab[idx] = n
	return nil
}
func (f *fakeInboxer) InboxKick(uintptr) error { f.kicks.Add(1); return nil }
func (f *fakeInboxer) CopyWrite(_, _, _ uintptr, _ uint64, _ uintptr, _ uint64) (bool, error) {
	return false, nil
}

func withFake(t *testing.T) *fakeInboxer {
	t.Helper()
	f := &fakeInboxer{Pipe: &devtest.Pipe{Mem: make([]byte, 4096), Base: 1 << 20}, tab: map[int]uint64{}, resets: map[int]int{}, maps: map[uintptr]int{}}
	devmem.Register(f)
	t.Cleanup(func() {
		Forget()
		staging.Release() // the mark page
		devmem.Register(nil)
	})
	return f
}

// TestTableBound: a registration outside the agent's context is not
// entered, the table holds TableSize and refuses the next, and an entry
// released is taken again; the counts live in the mark page.
func TestTableBound(t *testing.T) {
	f := withFake(t)
	if _, ok := Claim(8, 0x1000, 64); ok {
		t.Fatal("a registration of a context without an agent entered")
	}
	for i := 0; i < TableSize; i++ {
		if idx, ok := Claim(7, 0x1000, 64); !ok || idx != i {
			t.Fatalf("registration %d: entry %d, %v", i, idx, ok)
		}
	}
	if _, ok := Claim(7, 0x1000, 64); ok {
		t.Fatal("a registration entered into a full table")
	}
	Release(10, 10)
	if f.tab[10] != 0 {
		t.Fatal("a released entry still names its words")
	}
	if idx, ok := Claim(7, 0x1000, 64); !ok || idx != 10 {
		t.Fatalf("after a release: entry %d, %v; want 10", idx, ok)
	}
	if f.counts == 0 || f.counts != uintptr(unsafe.Pointer(staging.MarkPageRestWord(0))) {
		t.Fatal("the counts are not in the mark page's second half")
	}
}

// TestWaitBounds: the target's wait returns once the count passes the
// position (launching the agent while it waits), and gives up on a
// refused entry, a position more than a row ahead, and a sender that
// exited.
func TestWaitBounds(t *testing.T) {
	f := withFake(t)
	if _, ok := Claim(7, 0x1000, 64); !ok {
		t.Fatal("no inbox")
	}
	row, _, e, err := Row(os.Getpid(), 0, true)
	if err != nil || e != 64 {
		t.Fatalf("row %d of %d entries: %v", row, e, err)
	}
	count := staging.MarkPageRestWord(row)
	count.Store(5)
	if err := Wait(row, 5, os.Getpid()); err != nil {
		t.Fatalf("an entry taken: %v", err)
	}
	if err := Wait(row, 5+64+1, os.Getpid()); !errors.Is(err, ErrAhead) {
		t.Fatalf("a position more than a row ahead: %v", err)
	}
	go func() {
		// Taken only once the wait, past its spin, launched the agent: a
		// wait that never kicks never returns.
		for f.kicks.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		count.Store(6)
	}()
	if err := Wait(row, 6, os.Getpid()); err != nil {
		t.Fatalf("an entry taken later: %v", err)
	}
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skipf("no process to outlive: %v", err)
	}
	if err := Wait(row, 7, cmd.Process.Pid); err == nil || !strings.Contains(err.Error(), "exited") {
		t.Fatalf("a sender gone: %v", err)
	}
	count.Store(7 | refused)
	if err := Wait(row, 7, os.Getpid()); !errors.Is(err, ErrRefused) {
		t.Fatalf("a refused entry: %v", err)
	}
	if Reached(row, 7, time.Microsecond) {
		t.Fatal("a caller served a header whose row had an entry refused")
	}
}
