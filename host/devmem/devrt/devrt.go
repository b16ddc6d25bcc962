// Package devrt is the one Go binding of a device runtime (CUDA, HIP): each
// runtime's C file fills a C ops table (devrt.h: inspect, copy, pinned
// allocation, host registration, DMA-BUF export) with its own functions,
// and Runtime implements devmem.Device's copies and the optional
// HostRegisterer and DmaBufExporter by calling through that table. A
// runtime's package embeds Runtime and adds what differs: its Name, Locate,
// and anything only it has (GDRCopy for CUDA).
//
// The table is C memory the runtime's C file defines; Go never hands C a
// pointer to keep: the host buffers given to copies are Go memory pinned
// for the duration of the call, as the cgo rules allow.
package devrt

/*
#cgo CFLAGS: -Wall -Werror=incompatible-pointer-types -Werror=int-conversion -Werror=implicit-function-declaration
#include "devrt.h"

// Go cannot call a C function pointer: one trampoline per slot.
static int devrt_inspect(const rmaw_devrt_ops* o, uint64_t ptr, uint64_t size, uintptr_t* ctx, char* err, size_t errlen) {
  return o->inspect(ptr, size, ctx, err, errlen);
}
// One trampoline for both copy slots: synchronous (async 0) or queued
// on the context's stream.
static int devrt_copy(const rmaw_devrt_ops* o, int async, uintptr_t ctx, int to_device, void* host, uint64_t dev,
                      uint64_t n, char* err, size_t errlen) {
  return (async ? o->copy_async : o->copy)(ctx, to_device, host, dev, n, err, errlen);
}
static int devrt_host_alloc(const rmaw_devrt_ops* o, uintptr_t ctx, uint64_t n, void** p, char* err, size_t errlen) {
  return o->host_alloc(ctx, n, p, err, errlen);
}
static void devrt_host_free(const rmaw_devrt_ops* o, void* p) { o->host_free(p); }
static int devrt_host_register(const rmaw_devrt_ops* o, uintptr_t ctx, void* p, uint64_t n, char* err, size_t errlen) {
  return o->host_register(ctx, p, n, err, errlen);
}
static void devrt_host_unregister(const rmaw_devrt_ops* o, uintptr_t ctx, void* p) { o->host_unregister(ctx, p); }
static int devrt_copy_dtod(const rmaw_devrt_ops* o, uintptr_t ctx, uint64_t dst, uint64_t src, uint64_t n, char* err,
                           size_t errlen) {
  if (!o->copy_dtod) return 1;
  return o->copy_dtod(ctx, dst, src, n, err, errlen);
}
static int devrt_export_dmabuf(const rmaw_devrt_ops* o, uintptr_t ctx, uint64_t base, uint64_t n, int* fd, char* err,
                               size_t errlen) {
  return o->export_dmabuf(ctx, base, n, fd, err, errlen);
}

// The stream-ordered slots run once per operation: their error buffers
// stay on the Go stack.
#cgo noescape devrt_write64
#cgo noescape devrt_add64
#cgo noescape devrt_copy
#cgo noescape devrt_event_record
#cgo noescape devrt_stream_sync
#cgo nocallback devrt_caps
#cgo nocallback devrt_write64
#cgo nocallback devrt_add64
#cgo nocallback devrt_copy
#cgo nocallback devrt_event_record
#cgo nocallback devrt_event_query
#cgo nocallback devrt_stream_sync
static int devrt_caps(const rmaw_devrt_ops* o, uintptr_t ctx) { return o->caps ? o->caps(ctx) : 0; }
static int devrt_write64(const rmaw_devrt_ops* o, uintptr_t ctx, uint64_t dev, uint64_t v, char* err, size_t errlen) {
  return o->write64(ctx, dev, v, err, errlen);
}
static int devrt_add64(const rmaw_devrt_ops* o, uintptr_t ctx, uint64_t dev, uint64_t v, char* err, size_t errlen) {
  return o->add64(ctx, dev, v, err, errlen);
}
static int devrt_event_record(const rmaw_devrt_ops* o, uintptr_t ctx, uintptr_t* ev, char* err, size_t errlen) {
  return o->event_record(ctx, ev, err, errlen);
}
static int devrt_event_query(const rmaw_devrt_ops* o, uintptr_t ctx, uintptr_t ev) { return o->event_query(ctx, ev); }
static void devrt_event_destroy(const rmaw_devrt_ops* o, uintptr_t ctx, uintptr_t ev) { o->event_destroy(ctx, ev); }
static int devrt_stream_sync(const rmaw_devrt_ops* o, uintptr_t ctx, char* err, size_t errlen) {
  return o->stream_sync(ctx, err, errlen);
}
#cgo noescape devrt_copy_dtod_async
#cgo nocallback devrt_copy_dtod_async
static int devrt_copy_dtod_async(const rmaw_devrt_ops* o, uintptr_t ctx, uint64_t dst, uint64_t src, uint64_t n,
                                 char* err, size_t errlen) {
  if (!o->copy_dtod_async) return 1;
  return o->copy_dtod_async(ctx, dst, src, n, err, errlen);
}
static int devrt_ipc_export(const rmaw_devrt_ops* o, uintptr_t ctx, uint64_t ptr, uint64_t size, int max,
                            rmaw_ipc_seg* segs, int* n, char* err, size_t errlen) {
  if (!o->ipc_export) return 1;
  return o->ipc_export(ctx, ptr, size, max, segs, n, err, errlen);
}
static int devrt_ipc_import(const rmaw_devrt_ops* o, uintptr_t ctx, int n, const rmaw_ipc_seg* segs, uint64_t* va,
                            char* err, size_t errlen) {
  if (!o->ipc_import) return 1;
  return o->ipc_import(ctx, n, segs, va, err, errlen);
}
static int devrt_ipc_unmap(const rmaw_devrt_ops* o, uintptr_t ctx, uint64_t va, int n, const uint64_t* sizes, char* err,
                           size_t errlen) {
  if (!o->ipc_unmap) return 1;
  return o->ipc_unmap(ctx, va, n, sizes, err, errlen);
}
#cgo noescape devrt_stream_wait
#cgo nocallback devrt_stream_wait
static int devrt_ipc_event_new(const rmaw_devrt_ops* o, uintptr_t ctx, uintptr_t* ev, unsigned char* handle, char* err,
                               size_t errlen) {
  if (!o->ipc_event_new || !o->ipc_event_open || !o->stream_wait) return 1;
  return o->ipc_event_new(ctx, ev, handle, err, errlen);
}
static int devrt_ipc_event_open(const rmaw_devrt_ops* o, uintptr_t ctx, const unsigned char* handle, uintptr_t* ev,
                                char* err, size_t errlen) {
  if (!o->ipc_event_open) return 1;
  return o->ipc_event_open(ctx, handle, ev, err, errlen);
}
static int devrt_stream_wait(const rmaw_devrt_ops* o, uintptr_t ctx, uintptr_t ev, char* err, size_t errlen) {
  if (!o->stream_wait) return 1;
  return o->stream_wait(ctx, ev, err, errlen);
}
*/
import "C"

import (
	"errors"
	"unsafe"

	"github.com/rccl-rma-wasm/rccl-rma-wasm/host/devmem"
)

// Table names one runtime's ops table: Ops returns the address of the
// rmaw_devrt_ops its C file defines (static C memory, filled before use).
type Table interface {
	Ops() unsafe.Pointer
}

// Runtime calls through T's ops table. Its zero value is ready: the table
// comes from the type, so a runtime's device is a plain value.
type Runtime[T Table] struct{}

func (Runtime[T]) ops() *C.rmaw_devrt_ops {
	var t T
	return (*C.rmaw_devrt_ops)(t.Ops())
}

// errBuf receives a C function's failure message.
type errBuf [256]C.char

func (b *errBuf) err() error { return ErrText(unsafe.Pointer(&b[0]), len(b)) }

// ErrText is the NUL-terminated message a C function wrote into the n
// bytes at p, as an error. It reads in Go rather than with C.GoString,
// which would move every caller's buffer to the heap (the per-operation
// calls keep it on the stack).
func ErrText(p unsafe.Pointer, n int) error {
	b := unsafe.Slice((*byte)(p), n)
	k := 0
	for k < n && b[k] != 0 {
		k++
	}
	return errors.New(string(b[:k]))
}

// Inspect checks that [ptr, ptr+size) is device memory of one device and
// returns the context its copies run in.
func (r Runtime[T]) Inspect(ptr uintptr, size uint64) (uintptr, error) {
	var ctx C.uintptr_t
	var buf errBuf
	if C.devrt_inspect(r.ops(), C.uint64_t(ptr), C.uint64_t(size), &ctx, &buf[0], C.size_t(len(buf))) != 0 {
		return 0, buf.err()
	}
	return uintptr(ctx), nil
}

// DtoH copies n bytes from device address src to host memory dst. The host
// buffers of both copies are pinned for the duration of the call, which the
// cgo rules allow: C does not keep them.
func (r Runtime[T]) DtoH(ctx uintptr, dst unsafe.Pointer, src uintptr, n uint64) error {
	return r.copy(ctx, 0, 0, dst, src, n)
}

// HtoD copies n bytes from host memory src to device address dst.
func (r Runtime[T]) HtoD(ctx uintptr, dst uintptr, src unsafe.Pointer, n uint64) error {
	return r.copy(ctx, 0, 1, src, dst, n)
}

func (r Runtime[T]) copy(ctx uintptr, async, toDevice C.int, host unsafe.Pointer, dev uintptr, n uint64) error {
	var buf errBuf
	slot := -1
	if async == 0 {
		slot = beginCopy(n, toDevice != 0) // stuck.go
	}
	rc := C.devrt_copy(r.ops(), async, C.uintptr_t(ctx), toDevice, host, C.uint64_t(dev), C.uint64_t(n), &buf[0], C.size_t(len(buf)))
	endCopy(slot)
	if rc != 0 {
		return buf.err()
	}
	return nil
}

// DtoD copies n bytes between two device addresses of ctx and waits for
// the copy; devmem.ErrUnsupported where the runtime has no such copy.
func (r Runtime[T]) DtoD(ctx, dst, src uintptr, n uint64) error {
	var buf errBuf
	slot := beginCopy(n, true)
	rc := C.devrt_copy_dtod(r.ops(), C.uintptr_t(ctx), C.uint64_t(dst), C.uint64_t(src), C.uint64_t(n), &buf[0], C.size_t(len(buf)))
	endCopy(slot)
	switch rc {
	case 0:
		return nil
	case 1:
		return devmem.ErrUnsupported
	}
	return buf.err()
}

// DtoDAsync queues a copy of n bytes between two device addresses of ctx
// on its stream and returns; devmem.ErrUnsupported where the runtime has
// no such copy.
func (r Runtime[T]) DtoDAsync(ctx, dst, src uintptr, n uint64) error {
	var buf errBuf
	switch C.devrt_copy_dtod_async(r.ops(), C.uintptr_t(ctx), C.uint64_t(dst), C.uint64_t(src), C.uint64_t(n), &buf[0], C.size_t(len(buf))) {
	case 0:
		return nil
	case 1:
		return devmem.ErrUnsupported
	}
	return buf.err()
}

// AllocPinned returns pinned staging memory, which is C memory: Go never
// moves or frees it, and C may keep pointers to it.
func (r Runtime[T]) AllocPinned(ctx uintptr, n uint64) (unsafe.Pointer, error) {
	var p unsafe.Pointer
	var buf errBuf
	if C.devrt_host_alloc(r.ops(), C.uintptr_t(ctx), C.uint64_t(n), &p, &buf[0], C.size_t(len(buf))) != 0 {
		return nil, buf.err()
	}
	return p, nil
}

// FreePinned releases memory from AllocPinned.
func (r Runtime[T]) FreePinned(p unsafe.Pointer) { C.devrt_host_free(r.ops(), p) }

// HostRegister pins memory mapped outside Go's heap (the staging ring).
func (r Runtime[T]) HostRegister(ctx uintptr, p unsafe.Pointer, n uint64) error {
	var buf errBuf
	if C.devrt_host_register(r.ops(), C.uintptr_t(ctx), p, C.uint64_t(n), &buf[0], C.size_t(len(buf))) != 0 {
		return buf.err()
	}
	return nil
}

// HostUnregister undoes HostRegister with ctx current.
func (r Runtime[T]) HostUnregister(ctx uintptr, p unsafe.Pointer) {
	C.devrt_host_unregister(r.ops(), C.uintptr_t(ctx), p)
}

// ExportDmaBuf exports the pages under [ptr, ptr+size) as a DMA-BUF, for
// the RDMA path, and returns ptr's offset in it.
func (r Runtime[T]) ExportDmaBuf(ctx, ptr uintptr, size uint64) (int, uint64, error) {
	base, n, off := devmem.PageSpan(ptr, size)
	var fd C.int
	var buf errBuf
	if C.devrt_export_dmabuf(r.ops(), C.uintptr_t(ctx), C.uint64_t(base), C.uint64_t(n), &fd, &buf[0], C.size_t(len(buf))) != 0 {
		return -1, 0, buf.err()
	}
	return int(fd), off, nil
}

// Caps says which stream-ordered operations ctx's device supports: a slot
// the runtime left NULL, or a device that lacks the feature, reads as 0.
func (r Runtime[T]) Caps(ctx uintptr) devmem.Caps {
	o := r.ops()
	c := devmem.Caps(C.devrt_caps(o, C.uintptr_t(ctx)))
	if o.write64 == nil {
		c &^= devmem.CapWriteWord
	}
	if o.add64 == nil {
		c &^= devmem.CapAtomicAdd | devmem.CapStreamAtomic
	}
	if o.copy_async == nil || o.event_record == nil || o.event_query == nil || o.event_destroy == nil || o.stream_sync == nil {
		c &^= devmem.CapAsync
	}
	return c
}

// WriteWord queues a write of v to the word at addr on ctx's stream.
func (r Runtime[T]) WriteWord(ctx, addr uintptr, v uint64) error {
	var buf errBuf
	if C.devrt_write64(r.ops(), C.uintptr_t(ctx), C.uint64_t(addr), C.uint64_t(v), &buf[0], C.size_t(len(buf))) != 0 {
		return buf.err()
	}
	return nil
}

// AtomicAdd queues an atomic add of v to the word at addr on ctx's stream.
func (r Runtime[T]) AtomicAdd(ctx, addr uintptr, v uint64) error {
	var buf errBuf
	if C.devrt_add64(r.ops(), C.uintptr_t(ctx), C.uint64_t(addr), C.uint64_t(v), &buf[0], C.size_t(len(buf))) != 0 {
		return buf.err()
	}
	return nil
}

// HtoDAsync queues a copy to the device on ctx's stream; src is pinned C
// memory (AllocPinned) that stays untouched until an event recorded after
// it passed.
func (r Runtime[T]) HtoDAsync(ctx, dst uintptr, src unsafe.Pointer, n uint64) error {
	return r.copy(ctx, 1, 1, src, dst, n)
}

// DtoHAsync queues a copy from the device into pinned C memory dst.
func (r Runtime[T]) DtoHAsync(ctx uintptr, dst unsafe.Pointer, src uintptr, n uint64) error {
	return r.copy(ctx, 1, 0, dst, src, n)
}

// Record records *ev (created when 0) after the work queued on ctx's
// stream so far.
func (r Runtime[T]) Record(ctx uintptr, ev *uintptr) error {
	var buf errBuf
	var e C.uintptr_t = C.uintptr_t(*ev)
	if C.devrt_event_record(r.ops(), C.uintptr_t(ctx), &e, &buf[0], C.size_t(len(buf))) != 0 {
		return buf.err()
	}
	*ev = uintptr(e)
	return nil
}

// Passed reports whether the work before ev's last recording executed.
func (r Runtime[T]) Passed(ctx, ev uintptr) (bool, error) {
	switch C.devrt_event_query(r.ops(), C.uintptr_t(ctx), C.uintptr_t(ev)) {
	case 1:
		return true, nil
	case 0:
		return false, nil
	}
	return false, errors.New("the device reported a failed asynchronous copy (event query)")
}

// FreeEvent destroys an event from Record.
func (r Runtime[T]) FreeEvent(ctx, ev uintptr) {
	if ev != 0 {
		C.devrt_event_destroy(r.ops(), C.uintptr_t(ctx), C.uintptr_t(ev))
	}
}

// Sync waits until everything queued on ctx's stream executed.
func (r Runtime[T]) Sync(ctx uintptr) error {
	var buf errBuf
	if C.devrt_stream_sync(r.ops(), C.uintptr_t(ctx), &buf[0], C.size_t(len(buf))) != 0 {
		return buf.err()
	}
	return nil
}

// IPCExport exports the allocations under [ptr, ptr+size) for another
// process of the host (devmem.IPCSharer).
func (r Runtime[T]) IPCExport(ctx, ptr uintptr, size uint64) ([]devmem.Segment, error) {
	var segs [devmem.MaxSegments]C.rmaw_ipc_seg
	var n C.int
	var buf errBuf
	switch C.devrt_ipc_export(r.ops(), C.uintptr_t(ctx), C.uint64_t(ptr), C.uint64_t(size), devmem.MaxSegments, &segs[0], &n, &buf[0], C.size_t(len(buf))) {
	case 0:
	case 1:
		return nil, devmem.ErrUnsupported
	default:
		return nil, buf.err()
	}
	out := make([]devmem.Segment, n)
	for i := range out {
		s := &segs[i]
		out[i] = devmem.Segment{Fd: int(s.fd), Base: uint64(s.base), Size: uint64(s.size)}
		for j := range out[i].Handle {
			out[i].Handle[j] = byte(s.handle[j])
		}
	}
	return out, nil
}

// IPCImport maps segments another process exported, back to back, and
// returns the address of the first; the fds stay the caller's.
func (r Runtime[T]) IPCImport(ctx uintptr, segs []devmem.Segment) (uintptr, error) {
	if len(segs) == 0 || len(segs) > devmem.MaxSegments {
		return 0, errors.New("IPC import: no segments, or too many")
	}
	var cs [devmem.MaxSegments]C.rmaw_ipc_seg
	for i, s := range segs {
		cs[i].fd, cs[i].base, cs[i].size = C.int(s.Fd), C.uint64_t(s.Base), C.uint64_t(s.Size)
		for j := range s.Handle {
			cs[i].handle[j] = C.uchar(s.Handle[j])
		}
	}
	var va C.uint64_t
	var buf errBuf
	switch C.devrt_ipc_import(r.ops(), C.uintptr_t(ctx), C.int(len(segs)), &cs[0], &va, &buf[0], C.size_t(len(buf))) {
	case 0:
		return uintptr(va), nil
	case 1:
		return 0, devmem.ErrUnsupported
	}
	return 0, buf.err()
}

// IPCUnmap undoes IPCImport, segment by segment.
func (r Runtime[T]) IPCUnmap(ctx, va uintptr, sizes []uint64) error {
	if len(sizes) == 0 || len(sizes) > devmem.MaxSegments {
		return errors.New("IPC unmap: no segments, or too many")
	}
	var sz [devmem.MaxSegments]C.uint64_t
	for i, n := range sizes {
		sz[i] = C.uint64_t(n)
	}
	var buf errBuf
	switch C.devrt_ipc_unmap(r.ops(), C.uintptr_t(ctx), C.uint64_t(va), C.int(len(sizes)), &sz[0], &buf[0], C.size_t(len(buf))) {
	case 0:
		return nil
	case 1:
		return devmem.ErrUnsupported
	}
	return buf.err()
}

// IPCEventNew makes an event of ctx that another process of the host can
// wait for and returns it with its 64-byte handle (devmem.IPCEvents).
func (r Runtime[T]) IPCEventNew(ctx uintptr) (uintptr, [64]byte, error) {
	var ev C.uintptr_t
	var h [64]C.uchar
	var out [64]byte
	var buf errBuf
	switch C.devrt_ipc_event_new(r.ops(), C.uintptr_t(ctx), &ev, &h[0], &buf[0], C.size_t(len(buf))) {
	case 0:
	case 1:
		return 0, out, devmem.ErrUnsupported
	default:
		return 0, out, buf.err()
	}
	for i := range out {
		out[i] = byte(h[i])
	}
	return uintptr(ev), out, nil
}

// IPCEventOpen opens another process's event handle in ctx.
func (r Runtime[T]) IPCEventOpen(ctx uintptr, handle [64]byte) (uintptr, error) {
	var h [64]C.uchar
	for i := range h {
		h[i] = C.uchar(handle[i])
	}
	var ev C.uintptr_t
	var buf errBuf
	switch C.devrt_ipc_event_open(r.ops(), C.uintptr_t(ctx), &h[0], &ev, &buf[0], C.size_t(len(buf))) {
	case 0:
		return uintptr(ev), nil
	case 1:
		return 0, devmem.ErrUnsupported
	}
	return 0, buf.err()
}

// StreamWait makes the work queued on ctx's stream from now on wait for
// the work before ev's latest recording.
func (r Runtime[T]) StreamWait(ctx, ev uintptr) error {
	var buf errBuf
	switch C.devrt_stream_wait(r.ops(), C.uintptr_t(ctx), C.uintptr_t(ev), &buf[0], C.size_t(len(buf))) {
	case 0:
		return nil
	case 1:
		return devmem.ErrUnsupported
	}
	return buf.err()
}
