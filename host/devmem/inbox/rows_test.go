package inbox

import (
	"encoding/binary"
	"os"
	"os/exec"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/abi"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
)

// TestRowsPerSender: a row belongs to a sender (a process and its context
// slot), not to a communicator: the same sender asking again gets its row
// back, unchanged, however often; asking afresh empties it; a sender
// beyond the 16 rows is refused while every holder lives, and takes the
// row of one that exited, emptied.
func TestRowsPerSender(t *testing.T) {
	f := withFake(t)
	if _, ok := Claim(7, 0x1000, 64); !ok {
		t.Fatal("no inbox")
	}
	me := os.Getpid()
	row := func(pid, slot int, fresh bool) int {
		t.Helper()
		r, seg, e, err := Row(pid, slot, fresh)
		if err != nil || e != 64 || seg.Size == 0 {
			t.Fatalf("pid %d slot %d: row %d of %d entries: %v", pid, slot, r, e, err)
		}
		return r
	}
	if r := row(me, 0, true); r != 0 || f.resets[0] != 0 {
		t.Fatalf("first sender: row %d, emptied %d times", r, f.resets[0])
	}
	staging.MarkPageRestWord(0).Store(9) // nine entries taken
	for i := 0; i < 20; i++ {            // communicators come and go
		if r := row(me, 0, false); r != 0 {
			t.Fatalf("the same sender again: row %d", r)
		}
	}
	if f.rows != 1 || f.resets[0] != 0 || staging.MarkPageRestWord(0).Load() != 9 {
		t.Fatalf("asking again: %d rows handed out, row 0 emptied %d times, its count %d", f.rows, f.resets[0], staging.MarkPageRestWord(0).Load())
	}
	if r := row(me, 0, true); r != 0 || f.resets[0] != 1 || staging.MarkPageRestWord(0).Load() != 0 {
		t.Fatalf("afresh: row %d, emptied %d times, count %d", r, f.resets[0], staging.MarkPageRestWord(0).Load())
	}
	if r := row(me, 1, false); r != 1 {
		t.Fatalf("another context of the same process: row %d, want 1", r)
	}
	for slot := 2; slot < maxRowsPerProcess; slot++ {
		if r := row(me, slot, false); r != slot {
			t.Fatalf("slot %d: row %d", slot, r)
		}
	}
	if _, _, _, err := Row(me, maxRowsPerProcess, false); err == nil || !strings.Contains(err.Error(), "holds 8 rows already") {
		t.Fatalf("a process past its share of the rows: %v", err)
	}
	var kids []*exec.Cmd
	for i := maxRowsPerProcess; i < Rows; i++ {
		child := exec.Command("sleep", "60")
		if err := child.Start(); err != nil {
			t.Fatal(err)
		}
		defer child.Process.Kill()
		kids = append(kids, child)
		if r := row(child.Process.Pid, 0, true); r != i {
			t.Fatalf("child %d: row %d", i, r)
		}
	}
	last := kids[len(kids)-1]
	if _, _, _, err := Row(last.Process.Pid, 1, false); err == nil || !strings.Contains(err.Error(), "held by live processes") {
		t.Fatalf("a 17th sender while the 16 live: %v", err)
	}
	if r := row(last.Process.Pid, 0, false); r != Rows-1 || f.resets[Rows-1] != 0 {
		t.Fatalf("the last child again: row %d, emptied %d times", r, f.resets[Rows-1])
	}
	last.Process.Kill()
	last.Wait()
	if r := row(kids[0].Process.Pid, 1, false); r != Rows-1 || f.resets[Rows-1] != 1 {
		t.Fatalf("after the last child exited: row %d (want its row %d), emptied %d times", r, Rows-1, f.resets[Rows-1])
	}
	if f.rows != Rows {
		t.Fatalf("%d rows handed out", f.rows)
	}
	if _, _, _, err := Row(0, 0, false); err == nil {
		t.Fatal("a row for pid 0")
	}
}

// TestAttachShares: a process's links to one peer, from one context, share
// one mapping of its row and its positions; the row is asked for afresh
// only the first time; closing every link keeps it for the next; a peer
// process found replaced (another mark page) gets a new mapping, the old
// one going with its last link; Forget unmaps the rest.
func TestAttachShares(t *testing.T) {
	f := withFake(t)
	if _, ok := Claim(7, 0x1000, 64); !ok {
		t.Fatal("no inbox")
	}
	me := os.Getpid()
	marks := func() *staging.PeerMarks {
		t.Helper()
		fd, err := staging.MarkPageReadOnly()
		if err != nil {
			t.Fatal(err)
		}
		defer os.NewFile(uintptr(fd), "marks").Close()
		m, err := staging.OpenPeerMarks(fd, me)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	var asked []bool
	fetch := func(slot int, fresh bool) (int, devmem.Segment, int, devmem.Segment, error) {
		asked = append(asked, fresh)
		row, seg, e, err := Row(me, slot, fresh)
		return row, seg, e, devmem.Segment{Fd: -1}, err
	}
	m1 := marks()
	a, err := Attach(7, me, m1, fetch)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Attach(7, me, m1, fetch)
	if err != nil {
		t.Fatal(err)
	}
	if a != b || len(f.maps) != 1 || len(asked) != 2 || !asked[0] || asked[1] {
		t.Fatalf("two links: shared %v, %d mappings, asked afresh %v", a == b, len(f.maps), asked)
	}
	a.next = 5 // positions queued through a
	a.Close()
	b.Close()
	m1.Close() // the link's own hold on the page
	c, err := Attach(7, me, m1, fetch)
	if err != nil {
		t.Fatal(err)
	}
	if c != a || c.next != 5 || len(f.maps) != 1 || asked[2] {
		t.Fatalf("after every link closed: the same row %v, position %d, %d mappings, afresh %v", c == a, c.next, len(f.maps), asked[2])
	}
	if c.marks.Rest(0) != staging.MarkPageRestWord(0).Load() {
		t.Fatal("the row's counts are not read from the peer's page")
	}
	// The peer's process replaced: a new mark page, hence a new mapping.
	staging.Release()
	if err := staging.MarkPage(7); err != nil {
		t.Fatal(err)
	}
	m2 := marks()
	if m2.ID() == m1.ID() {
		t.Fatal("two pages with one identity")
	}
	d, err := Attach(7, me, m2, fetch)
	if err != nil {
		t.Fatal(err)
	}
	if d == c || !asked[3] || d.next != 0 || len(f.maps) != 2 {
		t.Fatalf("a replaced peer: new row %v, afresh %v, position %d, %d mappings", d != c, asked[3], d.next, len(f.maps))
	}
	c.Close()
	if len(f.maps) != 1 || c.va != 0 {
		t.Fatalf("the replaced peer's row after its last link: %d mappings", len(f.maps))
	}
	e, err := Attach(8, me, m2, fetch)
	if err != nil {
		t.Fatal(err)
	}
	if e == d || !asked[4] || len(f.maps) != 2 {
		t.Fatalf("another context: its own row %v, afresh %v, %d mappings", e != d, asked[4], len(f.maps))
	}
	m2.Close()
	Forget()
	if len(f.maps) != 0 {
		t.Fatalf("after Forget: %d mappings", len(f.maps))
	}
}

// idleFake is fakeInboxer whose device says, through WriteIdle, whether
// everything queued ran (idle), storing the entry then into mem (the
// sender's mapping of the host rows), and whose agent takes every write
// (counted).
type idleFake struct {
	*fakeInboxer
	idle   bool
	mem    []byte
	writes int
}

func (f *idleFake) WriteIdle(_, w uintptr, v uint64) bool {
	if f.idle {
		binary.LittleEndian.PutUint64(f.mem[w-uintptr(unsafe.Pointer(&f.mem[0])):], v)
	}
	return f.idle
}

func (f *idleFake) CopyWrite(_, _, _ uintptr, _ uint64, _ uintptr, _ uint64) (bool, error) {
	f.writes++
	return true, nil
}

// completions records Complete's calls.
type completions map[uint64]abi.Result

func (c completions) Complete(tag uint64, r abi.Result) { c[tag] = r }

// TestHostRows: with host rows the target hands a sealed memfd beside its
// device rows, which the sender maps; it writes a signal alone there
// itself only when nothing is queued on its device and the peer took
// every entry of its device row (completing a placed one at once), and
// an entry for the device row waits until the peer took its host-row
// entries; host rows too large, or a memfd that is not sealed, are
// refused.
func TestHostRows(t *testing.T) {
	f := &idleFake{fakeInboxer: withFake(t)}
	devmem.Register(f)
	SetHostRows(true)
	defer SetHostRows(false)
	idx, ok := Claim(7, 0x1000, 64)
	if !ok || !RowsInHost() {
		t.Fatalf("no inbox with host rows (%v, %v)", ok, RowsInHost())
	}
	me := os.Getpid()
	fd, err := staging.MarkPageReadOnly()
	if err != nil {
		t.Fatal(err)
	}
	pm, err := staging.OpenPeerMarks(fd, me)
	os.NewFile(uintptr(fd), "marks").Close()
	if err != nil {
		t.Fatal(err)
	}
	defer pm.Close()
	var fds []int
	fetch := func(slot int, fresh bool) (int, devmem.Segment, int, devmem.Segment, error) {
		row, seg, e, err := Row(me, slot, fresh)
		hfd, hsize, herr := HostRowsFd()
		if err == nil {
			err = herr
		}
		fds = append(fds, seg.Fd, hfd)
		return row, seg, e, devmem.Segment{Fd: hfd, Size: hsize}, err
	}
	p, err := Attach(7, me, pm, fetch)
	for _, fd := range fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.host == nil {
		t.Fatal("the host rows were not mapped")
	}
	f.mem = p.host // its own mapping: the entries reach the target's through the memfd
	at := func(pos uint64) uint64 {
		return binary.LittleEndian.Uint64(box.host.mem[(uint64(p.row)*p.e+pos)*8:])
	}
	f.idle = true
	before := HostWrites()
	if pos, ok, err := p.QueueSignal(idx, 8, 3); !ok || err != nil || pos != 1|HostPos {
		t.Fatalf("a signal alone, nothing queued: position %#x, %v, %v", pos, ok, err)
	}
	if at(0) != Entry(0, p.e, idx, 8, 3) || HostWrites() != before+1 || f.writes != 0 {
		t.Fatalf("host entry 0 is %#x, want %#x (host writes %d, agent writes %d)", at(0), Entry(0, p.e, idx, 8, 3), HostWrites()-before, f.writes)
	}
	c := completions{}
	if pos, ok, err := p.QueueSignalPlaced(idx, 16, 1, c, 42); !ok || err != nil || pos != 2|HostPos || c[42] != abi.Success {
		t.Fatalf("a placed signal alone, nothing queued: position %#x, %v, %v, completed %v", pos, ok, err, c)
	}
	// Work queued on the device: the agent must write it, to the device
	// row, but not before the peer took the two host entries.
	f.idle = false
	if _, ok, err := p.QueueSignal(idx, 8, 1); ok || err != nil || f.writes != 0 {
		t.Fatalf("a device entry passed host entries not yet taken (%v, %v, %d agent writes)", ok, err, f.writes)
	}
	staging.MarkPageRestWord(Rows + p.row).Store(2) // the peer took them
	if pos, ok, err := p.QueueSignal(idx, 8, 1); !ok || err != nil || pos != 1 || f.writes != 1 || at(2) != 0 {
		t.Fatalf("a signal alone behind queued work: position %#x, %v, %v, %d agent writes, host entry %#x", pos, ok, err, f.writes, at(2))
	}
	// Idle again, but the device row's entry not taken yet: the device row.
	f.idle = true
	if pos, ok, err := p.QueueSignal(idx, 8, 1); !ok || err != nil || pos != 2 || f.writes != 2 {
		t.Fatalf("a signal alone behind an untaken device entry: position %#x, %v, %v, %d agent writes", pos, ok, err, f.writes)
	}
	staging.MarkPageRestWord(p.row).Store(2)
	if pos, ok, err := p.QueueSignal(idx, 8, 1); !ok || err != nil || pos != 3|HostPos {
		t.Fatalf("a signal alone, the device row taken: position %#x, %v, %v", pos, ok, err)
	}
	// A memfd a peer could shrink under our mapping, or too large: refused.
	bad, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(bad)
	if err := unix.Ftruncate(bad, hostRowsSize); err != nil {
		t.Fatal(err)
	}
	if _, err := mapHost(8, devmem.Segment{Fd: bad, Size: hostRowsSize}); err == nil || !strings.Contains(err.Error(), "sealed") {
		t.Fatalf("an unsealed memfd as host rows: %v", err)
	}
	if _, err := mapHost(8, devmem.Segment{Fd: bad, Size: 64 << 20}); err == nil || !strings.Contains(err.Error(), "bytes") {
		t.Fatalf("64 MiB of host rows: %v", err)
	}
}
