package inbox

import (
	"math/rand/v2"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/staging"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/shmstream"
)

// TestEntryLayout: an entry decodes, with the kernel's shifts and masks
// (agent.ptx's ISCAN), to its lap, table entry, offset and value; the
// lap is never 0, so a zeroed row holds no entry.
func TestEntryLayout(t *testing.T) {
	for i := 0; i < 10000; i++ {
		e := uint64(1) << (1 + rand.IntN(10))
		pos, idx := rand.Uint64N(1<<40), rand.IntN(TableSize)
		off, v := rand.Uint64N(MaxOffset/8)*8, rand.Uint64N(MaxValue+1)
		w := Entry(pos, e, idx, off, v)
		if lap := w >> 56; lap != (pos/e)%255+1 || lap == 0 {
			t.Fatalf("pos %d of %d: lap %d", pos, e, lap)
		}
		if got := int(w >> 50 & 63); got != idx {
			t.Fatalf("table entry %d, want %d", got, idx)
		}
		if got := (w >> 28 & 4194303) * 8; got != off {
			t.Fatalf("offset %d, want %d", got, off)
		}
		if got := w & 268435455; got != v {
			t.Fatalf("value %d, want %d", got, v)
		}
	}
	if Fits(MaxOffset, 1) || Fits(8, MaxValue+1) || Fits(4, 1) || !Fits(MaxOffset-8, MaxValue) {
		t.Fatal("Fits takes what an entry cannot carry, or refuses what it can")
	}
}

// TestKernelDecodesSo: the kernel's ISCAN uses the shifts and masks
// TestEntryLayout decodes with, and this package's sizes are the C
// side's (inbox.c).
func TestKernelDecodesSo(t *testing.T) {
	ptx, err := os.ReadFile("../cuda/agent.ptx")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"shr.u64 %rd79, %rd77, 56;", "shr.u64 %rd79, %rd77, 50;\n  and.b64 %rd79, %rd79, 63;",
		"shr.u64 %rd95, %rd77, 28;\n  and.b64 %rd95, %rd95, 4194303;", "and.b64 %rd76, %rd77, 268435455;",
		"rem.u64 %rd76, %rd76, 255;\n  add.u64 %rd76, %rd76, 1;", "selp.u64 %rd76, 4611686018427387904, 0, %p33;",
	} {
		if !strings.Contains(string(ptx), want) {
			t.Errorf("agent.ptx lacks %q", want)
		}
	}
	c, err := os.ReadFile("../cuda/inbox.c")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"#define IB_ROWS 16\n", "#define IB_TABLE 64\n"} {
		if !strings.Contains(string(c), want) {
			t.Errorf("inbox.c lacks %q (Rows %d, TableSize %d)", want, Rows, TableSize)
		}
	}
	if refused != 1<<62 {
		t.Fatal("the refused bit is not the kernel's")
	}
}

// TestRoomWaitsForTheTarget: a sender writes position pos of a row of e
// entries only once the target took position pos - e (its count in the
// target's mark page, mapped here), and gives up after roomWait.
func TestRoomWaitsForTheTarget(t *testing.T) {
	fd, mem, err := shmstream.CreateSealed("inbox-room", 4096)
	if err != nil {
		t.Skipf("sealed memfd: %v", err)
	}
	defer unix.Close(fd)
	defer unix.Munmap(mem)
	pm, err := staging.OpenPeerMarks(fd, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer pm.Close()
	p := &Peer{row: 3, e: 4, marks: pm}
	count := (*atomic.Uint64)(unsafe.Pointer(&mem[2048+3*8]))
	count.Store(1) // position 0 taken
	if !p.room(4) {
		t.Fatal("position 4 refused with position 0 taken")
	}
	if p.room(5) {
		t.Fatal("position 5 written over position 1, not taken yet")
	}
	count.Store(1 | refused)
	if !p.room(4) {
		t.Fatal("the refused bit kept a taken position from counting")
	}
	go func() {
		time.Sleep(50 * time.Microsecond)
		count.Store(2)
	}()
	old := roomWait
	roomWait = 10 * time.Second
	defer func() { roomWait = old }()
	if !p.room(5) {
		t.Fatal("position 5 refused once position 1 was taken")
	}
}
