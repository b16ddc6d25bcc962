package cuda

/*
#include <string.h>
#include "cuda_internal.h"

// ibc_alloc makes n bytes of device 0's memory with a POSIX fd (as
// ncclMemAlloc does) and returns its address.
static int ibc_alloc(uint64_t n, uint64_t* ptr, char* err, size_t errlen) {
  CUdevice dev;
  CUcontext c;
  unsigned long long h = 0;
  CUresult r;
  if ((r = rmacu_cu.deviceGet(&dev, 0)) != 0 || (r = rmacu_cu.primaryCtxRetain(&c, dev)) != 0 ||
      (r = rmacu_cu.ctxSetCurrent(c)) != 0)
    return rmaw_fail(err, errlen, "device 0: %s", rmacu_errstr(r));
  if (!rmacu_cu.granularity || !rmacu_cu.memCreate || !rmacu_cu.addressReserve || !rmacu_cu.memMap)
    return rmaw_fail(err, errlen, "the driver lacks cuMemCreate");
  allocProp prop = {.type = 1, .handleTypes = 1, .locType = 1, .locId = dev};
  size_t gran = 0;
  if ((r = rmacu_cu.granularity(&gran, &prop, 0)) != 0) return rmaw_fail(err, errlen, "granularity: %s", rmacu_errstr(r));
  n = (n + gran - 1) / gran * gran;
  CUdeviceptr p = 0;
  int acc[3] = {1, dev, 3};
  if ((r = rmacu_cu.memCreate(&h, n, &prop, 0)) != 0 || (r = rmacu_cu.addressReserve(&p, n, 0, 0, 0)) != 0 ||
      (r = rmacu_cu.memMap(p, n, 0, h, 0)) != 0 || (r = rmacu_cu.memSetAccess(p, n, acc, 1)) != 0)
    return rmaw_fail(err, errlen, "a cuMem allocation of %llu bytes: %s", (unsigned long long)n, rmacu_errstr(r));
  *ptr = p;
  return 0;
}
*/
import "C"

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem/devrt"
)

// InboxEntry is a peer inbox entry (inbox.c, agent.ptx's ISCAN): for
// position pos of a row of e entries, add v (below 2^28) to the word at
// byte off (a multiple of 8, below 32 MiB) of table entry idx (below 64).
func InboxEntry(pos uint64, e int, idx int, off, v uint64) uint64 {
	return ((pos/uint64(e))%255+1)<<56 | uint64(idx)<<50 | (off/8)<<28 | v
}

// inboxCheck drives the peer inbox of one agent through the driver at
// hand (a GPU, or test/gpu/fakecuda.c): the agent writes iters entries into
// a row of its own inbox, each after a 64-byte copy, and takes them, adding
// to a table's word; then entries naming an empty table entry and a word
// past its entry's end are refused and flagged; after the agent parked
// (idle), a kick makes it take the next. It returns what it saw, or the
// first thing that went wrong.
func inboxCheck(iters int) (string, error) {
	var buf [256]C.char
	errText := func() error { return devrt.ErrText(unsafe.Pointer(&buf[0]), len(buf)) }
	C.rmaw_cuda_copy_context(1)
	C.rmaw_cuda_agent(1, 64<<10, 2000, 0, 0, 0)
	if C.rmaw_cuda_open(&buf[0], C.size_t(len(buf))) < 1 {
		return "", fmt.Errorf("driver: %w", errText())
	}
	var mem C.uint64_t
	if C.ibc_alloc(1<<20, &mem, &buf[0], C.size_t(len(buf))) != 0 {
		return "", errText()
	}
	var cctx C.uintptr_t
	if C.rmacu_inspect(mem, 1<<20, &cctx, &buf[0], C.size_t(len(buf))) != 0 {
		return "", errText()
	}
	ctx := uintptr(cctx)
	C.rmaw_cuda_agent_start(cctx)
	if C.rmaw_cuda_agent_runs(cctx) == 0 {
		var note [240]C.char
		C.rmaw_cuda_agent_note(&note[0], C.size_t(len(note)))
		return "", fmt.Errorf("no device agent: %s", C.GoString(&note[0]))
	}
	defer C.rmaw_cuda_agents_stop()
	d := cudaDevice{}
	sig, src, dst := uintptr(mem), uintptr(mem)+4096, uintptr(mem)+8192
	// Host rows beside the device rows: pinned host memory the host
	// writes entries into itself, as a peer's proxy thread would.
	hmem, err := syscall.Mmap(-1, 0, 16*64*8, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_ANONYMOUS)
	if err != nil {
		return "", err
	}
	defer syscall.Munmap(hmem)
	if err := d.HostRegister(ctx, unsafe.Pointer(&hmem[0]), uint64(len(hmem))); err != nil {
		return "", err
	}
	defer func() {
		C.rmaw_cuda_agents_stop() // the inbox closed first: the kernel reads the host rows
		d.HostUnregister(ctx, unsafe.Pointer(&hmem[0]))
	}()
	if err := d.InboxOpen(ctx, 0, uintptr(unsafe.Pointer(&hmem[0])), uint64(len(hmem))); err != nil {
		return "", err
	}
	if err := d.InboxTable(ctx, 5, sig, 16); err != nil {
		return "", err
	}
	row, seg, e, err := d.InboxRow(ctx, -1)
	if err != nil {
		return "", err
	}
	va, err := d.IPCImport(ctx, []devmem.Segment{seg})
	syscall.Close(seg.Fd)
	if err != nil {
		return "", fmt.Errorf("mapping the inbox: %w", err)
	}
	slot := func(pos uint64) uintptr { return va + uintptr((uint64(row)*uint64(e)+pos%uint64(e))*8) }
	const low62 = 1<<62 - 1
	wait := func(pos uint64, kick bool) error {
		for t0 := time.Now(); d.InboxTaken(ctx, row)&low62 < pos; {
			if kick {
				if err := d.InboxKick(ctx); err != nil {
					return err
				}
			}
			if time.Since(t0) > 10*time.Second {
				return fmt.Errorf("entry %d of row %d not taken in 10 s (taken %d)", pos, row, d.InboxTaken(ctx, row)&low62)
			}
			time.Sleep(20 * time.Microsecond)
		}
		return nil
	}
	host := make([]byte, 64)
	var pos uint64
	for i := 0; i < iters; i++ {
		for k := range host {
			host[k] = byte(i*7 + k)
		}
		if C.rmacu_copy(cctx, 1, unsafe.Pointer(&host[0]), C.uint64_t(src), 64, &buf[0], C.size_t(len(buf))) != 0 {
			return "", errText()
		}
		ok, err := d.CopyWrite(ctx, dst, src, 64, slot(pos), InboxEntry(pos, e, 5, 8, 1))
		if err != nil || !ok {
			return "", fmt.Errorf("entry %d: queued %v: %v", pos, ok, err)
		}
		pos++
		// The agent parks between the rounds now and then: a kick brings it back.
		if err := wait(pos, true); err != nil {
			return "", err
		}
		got := make([]byte, 64)
		if C.rmacu_copy(cctx, 0, unsafe.Pointer(&got[0]), C.uint64_t(dst), 64, &buf[0], C.size_t(len(buf))) != 0 {
			return "", errText()
		}
		for k := range got {
			if got[k] != host[k] {
				return "", fmt.Errorf("entry %d: byte %d of the copy is %d, want %d", pos-1, k, got[k], host[k])
			}
		}
		if i%16 == 15 {
			time.Sleep(5 * time.Millisecond) // past the agent's 2 ms idle: it parks
		}
	}
	var words [2]uint64
	if C.rmacu_copy(cctx, 0, unsafe.Pointer(&words[0]), C.uint64_t(sig), 16, &buf[0], C.size_t(len(buf))) != 0 {
		return "", errText()
	}
	if words[0] != 0 || words[1] != uint64(iters) {
		return "", fmt.Errorf("table word after %d entries: %d (its neighbour %d)", iters, words[1], words[0])
	}
	if d.InboxTaken(ctx, row)>>62 != 0 {
		return "", fmt.Errorf("an entry was refused before any bad one")
	}
	// A parked agent takes no entry until the host kicks it: the writer
	// here is the host (a driver copy into the row), as a peer's agent
	// would be, which launches nothing.
	time.Sleep(10 * time.Millisecond)
	ent := InboxEntry(pos, e, 5, 8, 1)
	if C.rmacu_copy(cctx, 1, unsafe.Pointer(&ent), C.uint64_t(slot(pos)), 8, &buf[0], C.size_t(len(buf))) != 0 {
		return "", errText()
	}
	pos++
	time.Sleep(20 * time.Millisecond)
	if d.InboxTaken(ctx, row)&low62 >= pos {
		return "", fmt.Errorf("a parked agent took an entry before it was kicked")
	}
	if err := wait(pos, true); err != nil {
		return "", err
	}
	iters++
	// Host rows: entries the host writes into the row's twin in host
	// memory, taken with their own count (16 + row).
	hslot := func(pos uint64) *uint64 {
		return (*uint64)(unsafe.Pointer(&hmem[(uint64(row)*uint64(e)+pos%uint64(e))*8]))
	}
	hwait := func(pos uint64) error {
		for t0 := time.Now(); d.InboxTaken(ctx, 16+row)&low62 < pos; {
			if err := d.InboxKick(ctx); err != nil {
				return err
			}
			if time.Since(t0) > 10*time.Second {
				return fmt.Errorf("host entry %d of row %d not taken in 10 s (taken %d)", pos, row, d.InboxTaken(ctx, 16+row)&low62)
			}
			time.Sleep(20 * time.Microsecond)
		}
		return nil
	}
	const hostEntries = 3 * 64 / 2 // a lap and a half: the laps tell new from old
	for hp := uint64(0); hp < hostEntries; hp++ {
		atomic.StoreUint64(hslot(hp), InboxEntry(hp, e, 5, 8, 1)) // one 8-byte store: the agent reads it whole
		if err := hwait(hp + 1); err != nil {
			return "", err
		}
	}
	iters += hostEntries
	// Refused: an empty table entry, then a word past its entry's end;
	// the row moves on, flagged, and adds nothing.
	for _, bad := range [][2]uint64{{9, 0}, {5, 16}} {
		if ok, err := d.CopyWrite(ctx, 0, 0, 0, slot(pos), InboxEntry(pos, e, int(bad[0]), bad[1], 1)); err != nil || !ok {
			return "", fmt.Errorf("bad entry: queued %v: %v", ok, err)
		}
		pos++
	}
	if err := wait(pos, true); err != nil {
		return "", err
	}
	if C.rmacu_copy(cctx, 0, unsafe.Pointer(&words[0]), C.uint64_t(sig), 16, &buf[0], C.size_t(len(buf))) != 0 {
		return "", errText()
	}
	if d.InboxTaken(ctx, row)>>62 != 1 || words[1] != uint64(iters) || words[0] != 0 || d.InboxTaken(ctx, 16+row)>>62 != 0 {
		return "", fmt.Errorf("bad entries: flag %d, words %d %d", d.InboxTaken(ctx, row)>>62, words[0], words[1])
	}
	// Reset for a new sender: first-lap entries in every slot, which the
	// agent ignores now (the row is laps past them), must not be taken once
	// the row starts again at 0, nor the refused flag stay; the row handed
	// again is the same row, and a new first entry adds once.
	stale := make([]uint64, e)
	for k := range stale {
		stale[k] = InboxEntry(uint64(k), e, 5, 8, 1)
	}
	if C.rmacu_copy(cctx, 1, unsafe.Pointer(&stale[0]), C.uint64_t(slot(0)), C.uint64_t(8*e), &buf[0], C.size_t(len(buf))) != 0 {
		return "", errText()
	}
	if err := d.InboxKick(ctx); err != nil {
		return "", err
	}
	time.Sleep(20 * time.Millisecond)
	if got := d.InboxTaken(ctx, row) & low62; got != pos {
		return "", fmt.Errorf("entries of a lap long past taken: count %d, want %d", got, pos)
	}
	if err := d.InboxReset(ctx, row); err != nil {
		return "", err
	}
	if err := d.InboxKick(ctx); err != nil {
		return "", err
	}
	time.Sleep(20 * time.Millisecond)
	if got := d.InboxTaken(ctx, row); got != 0 || d.InboxTaken(ctx, 16+row) != 0 {
		return "", fmt.Errorf("the row reset: counts %#x and %#x, want 0 (an old entry taken, or the refused flag kept)", got, d.InboxTaken(ctx, 16+row))
	}
	again, s2, _, err := d.InboxRow(ctx, row)
	if err != nil {
		return "", err
	}
	syscall.Close(s2.Fd)
	if again != row {
		return "", fmt.Errorf("row %d handed again as row %d", row, again)
	}
	if ok, err := d.CopyWrite(ctx, 0, 0, 0, slot(0), InboxEntry(0, e, 5, 8, 1)); err != nil || !ok {
		return "", fmt.Errorf("the reset row's first entry: queued %v: %v", ok, err)
	}
	if err := wait(1, true); err != nil {
		return "", err
	}
	if C.rmacu_copy(cctx, 0, unsafe.Pointer(&words[0]), C.uint64_t(sig), 16, &buf[0], C.size_t(len(buf))) != 0 {
		return "", errText()
	}
	if words[1] != uint64(iters)+1 || d.InboxTaken(ctx, row) != 1 {
		return "", fmt.Errorf("the reset row's first entry: word %d, want %d; count %#x, want 1", words[1], iters+1, d.InboxTaken(ctx, row))
	}
	rows := 1
	for ; rows < 32; rows++ {
		_, s, _, err := d.InboxRow(ctx, -1)
		if err != nil {
			break
		}
		syscall.Close(s.Fd)
	}
	if rows != 16 {
		return "", fmt.Errorf("%d rows handed out, want 16", rows)
	}
	return fmt.Sprintf("%d entries taken (the last after a kick, %d from the host rows), their copies there, 2 bad ones refused and flagged, the row reset and taken again from 0, %d rows", iters, hostEntries, rows), nil
}
