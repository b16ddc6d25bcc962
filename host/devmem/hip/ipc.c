/* IPC and events: events on the device's stream, DMA-BUF export for a
 * NIC, and sharing device memory and events with the other processes of
 * the host. */
#include "hip_internal.h"

int rmahip_event_record(uintptr_t ctx, uintptr_t* ev, char* err, size_t errlen) {
  DEV_STREAM(k, "hipEventRecord");
  if (!*ev) {
    void* x = NULL;
    r = rmahip_rt.eventCreateWithFlags(&x, 2); /* hipEventDisableTiming */
    if (r != 0) return rmaw_fail(err, errlen, "hipEventCreateWithFlags: %s", rmahip_errstr(r));
    *ev = (uintptr_t)x;
  }
  r = rmahip_rt.eventRecord((void*)*ev, rmahip_devs[k].stream);
  if (r != 0) return rmaw_fail(err, errlen, "hipEventRecord: %s", rmahip_errstr(r));
  return 0;
}

int rmahip_event_query(uintptr_t ctx, uintptr_t ev) {
  if (rmahip_rt.setDevice((int)ctx - 1) != 0) return -1;
  hipError_t r = rmahip_rt.eventQuery((void*)ev);
  return r == 0 ? 1 : r == 600 ? 0 : -1; /* hipErrorNotReady */
}

void rmahip_event_destroy(uintptr_t ctx, uintptr_t ev) {
  if (ev && rmahip_rt.setDevice((int)ctx - 1) == 0) rmahip_rt.eventDestroy((void*)ev);
}

int rmahip_stream_sync(uintptr_t ctx, char* err, size_t errlen) {
  DEV_STREAM(k, "hipStreamSynchronize");
  r = rmahip_rt.streamSynchronize(rmahip_devs[k].stream);
  if (r != 0) return rmaw_fail(err, errlen, "hipStreamSynchronize: %s", rmahip_errstr(r));
  return 0;
}

/* Exports [base, base+n) (page-aligned by the caller) as a DMA-BUF fd
 * (hipMemRangeHandleTypeDmaBufFd), for a NIC that imports it; the memory's
 * device is made current first. */
int rmahip_export_dmabuf(uintptr_t ctx, uint64_t base, uint64_t n, int* fd, char* err, size_t errlen) {
  if (!rmahip_rt.getHandleForRange) return rmaw_fail(err, errlen, "the runtime has no hipMemGetHandleForAddressRange");
  hipError_t r = rmahip_rt.setDevice((int)ctx - 1);
  if (r == 0) r = rmahip_rt.getHandleForRange(fd, (void*)(uintptr_t)base, (size_t)n, 1, 0);
  if (r != 0)
    return rmaw_fail(err, errlen, "hipMemGetHandleForAddressRange of %llu bytes: %s", (unsigned long long)n, rmahip_errstr(r));
  return 0;
}

/* IPC between the processes of a host: the hipMalloc allocation under a
 * registration travels as a hipIpcMemHandle_t, which the peer opens with
 * lazy peer access (its device may be another one of the host). One
 * allocation per registration: a range over several keeps the staged
 * path. */
enum { IPC_LAZY_PEER_ACCESS = 1 };

static int ipc_ready(void) {
  return rmahip_rt.memGetAddressRange && rmahip_rt.ipcGetMemHandle && rmahip_rt.ipcOpenMemHandle && rmahip_rt.ipcCloseMemHandle;
}

int rmahip_ipc_export(uintptr_t ctx, uint64_t ptr, uint64_t size, int max, rmaw_ipc_seg* segs, int* n, char* err,
                      size_t errlen) {
  *n = 0;
  if (!ipc_ready()) return rmaw_fail(err, errlen, "the runtime lacks the hipIpc calls");
  if (max < 1) return rmaw_fail(err, errlen, "no room for a segment");
  void* base = NULL;
  size_t len = 0;
  hipError_t r = rmahip_rt.setDevice((int)ctx - 1);
  if (r == 0) r = rmahip_rt.memGetAddressRange(&base, &len, (void*)(uintptr_t)ptr);
  if (r != 0) return rmaw_fail(err, errlen, "hipMemGetAddressRange: %s", rmahip_errstr(r));
  if (ptr + size > (uint64_t)(uintptr_t)base + len) return rmaw_fail(err, errlen, "the range spans more than one allocation");
  memset(&segs[0], 0, sizeof segs[0]);
  if ((r = rmahip_rt.ipcGetMemHandle(segs[0].handle, base)) != 0) return rmaw_fail(err, errlen, "hipIpcGetMemHandle: %s", rmahip_errstr(r));
  segs[0].fd = -1;
  segs[0].base = (uint64_t)(uintptr_t)base;
  segs[0].size = len;
  *n = 1;
  return 0;
}

int rmahip_ipc_import(uintptr_t ctx, int n, const rmaw_ipc_seg* segs, uint64_t* va, char* err, size_t errlen) {
  *va = 0;
  if (!ipc_ready()) return rmaw_fail(err, errlen, "the runtime lacks the hipIpc calls");
  if (n != 1 || segs[0].fd >= 0) return rmaw_fail(err, errlen, "HIP opens one allocation's handle, not %d segments", n);
  hipIpcMemHandle h;
  memcpy(h.reserved, segs[0].handle, sizeof h.reserved);
  void* p = NULL;
  hipError_t r = rmahip_rt.setDevice((int)ctx - 1);
  if (r == 0) r = rmahip_rt.ipcOpenMemHandle(&p, h, IPC_LAZY_PEER_ACCESS);
  if (r != 0) return rmaw_fail(err, errlen, "hipIpcOpenMemHandle: %s", rmahip_errstr(r));
  *va = (uint64_t)(uintptr_t)p;
  return 0;
}

int rmahip_ipc_unmap(uintptr_t ctx, uint64_t va, int n, const uint64_t* sizes, char* err, size_t errlen) {
  (void)n, (void)sizes;
  if (!ipc_ready()) return rmaw_fail(err, errlen, "the runtime lacks the hipIpc calls");
  hipError_t r = rmahip_rt.setDevice((int)ctx - 1);
  if (r == 0) r = rmahip_rt.ipcCloseMemHandle((void*)(uintptr_t)va);
  if (r != 0) return rmaw_fail(err, errlen, "hipIpcCloseMemHandle: %s", rmahip_errstr(r));
  return 0;
}

/* Interprocess events (hipEventInterprocess): a mapped put+signal
 * records one after its queued copy, and the target's stream waits for it
 * (hipStreamWaitEvent) before the signal write. Their handles are 64
 * bytes, as hipIpcMemHandle_t. */
enum { EVENT_DISABLE_TIMING = 0x2, EVENT_INTERPROCESS = 0x4 };

int rmahip_ipc_event_new(uintptr_t ctx, uintptr_t* ev, unsigned char* handle, char* err, size_t errlen) {
  if (!rmahip_rt.ipcGetEventHandle || !rmahip_rt.ipcOpenEventHandle || !rmahip_rt.streamWaitEvent || !rmahip_rt.eventCreateWithFlags)
    return rmaw_fail(err, errlen, "the runtime lacks hipIpcGetEventHandle, hipIpcOpenEventHandle or hipStreamWaitEvent");
  void* e = NULL;
  hipError_t r = rmahip_rt.setDevice((int)ctx - 1);
  if (r == 0) r = rmahip_rt.eventCreateWithFlags(&e, EVENT_DISABLE_TIMING | EVENT_INTERPROCESS);
  if (r != 0) return rmaw_fail(err, errlen, "hipEventCreateWithFlags (interprocess): %s", rmahip_errstr(r));
  if ((r = rmahip_rt.ipcGetEventHandle(handle, e)) != 0) {
    rmahip_rt.eventDestroy(e);
    return rmaw_fail(err, errlen, "hipIpcGetEventHandle: %s", rmahip_errstr(r));
  }
  *ev = (uintptr_t)e;
  return 0;
}

int rmahip_ipc_event_open(uintptr_t ctx, const unsigned char* handle, uintptr_t* ev, char* err, size_t errlen) {
  if (!rmahip_rt.ipcOpenEventHandle) return rmaw_fail(err, errlen, "the runtime lacks hipIpcOpenEventHandle");
  hipIpcMemHandle h;
  memcpy(h.reserved, handle, sizeof h.reserved);
  void* e = NULL;
  hipError_t r = rmahip_rt.setDevice((int)ctx - 1);
  if (r == 0) r = rmahip_rt.ipcOpenEventHandle(&e, h);
  if (r != 0) return rmaw_fail(err, errlen, "hipIpcOpenEventHandle: %s", rmahip_errstr(r));
  *ev = (uintptr_t)e;
  return 0;
}

int rmahip_stream_wait(uintptr_t ctx, uintptr_t ev, char* err, size_t errlen) {
  if (!rmahip_rt.streamWaitEvent) return rmaw_fail(err, errlen, "the runtime lacks hipStreamWaitEvent");
  DEV_STREAM(k, "hipStreamWaitEvent");
  r = rmahip_rt.streamWaitEvent(rmahip_devs[k].stream, (void*)ev, 0);
  if (r != 0) return rmaw_fail(err, errlen, "hipStreamWaitEvent: %s", rmahip_errstr(r));
  return 0;
}
