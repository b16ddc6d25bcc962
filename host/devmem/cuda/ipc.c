/* IPC and events: events on the context's stream (tickets where the
 * device agent runs), DMA-BUF export for a NIC, and sharing device memory
 * and events with the other processes of the host. */
#include <unistd.h>

#include "cuda_internal.h"

/* An event handle is the driver's pointer with its low bits free: bit 0
 * set makes it an agent's ticket (agent.c), bit 1 marks an interprocess
 * event we made (rmacu_ipc_event_new), which stays a real event where the
 * agent runs, since another process waits for it. */
#define EV_IPC 2
static void* ev_ptr(uintptr_t ev) { return (void*)(ev & ~(uintptr_t)EV_IPC); }

/* Events of the context's stream; where the agent runs, an event is a
 * ticket (agent.c). */
int rmacu_event_record(uintptr_t ctx, uintptr_t* ev, char* err, size_t errlen) {
  CTX_STREAM(e, "cuEventRecord");
  struct agent* a = rmacu_ag_live(e);
  /* A real event made before the agent started (the bounce slots' are
   * made at registration) becomes a ticket: recorded on the stream it
   * would cost a stream wait for the agent and the record, two driver
   * submissions, every time. Interprocess events stay real. */
  if (a && *ev && !(*ev & (1 | EV_IPC))) {
    rmacu_cu.eventDestroy((void*)*ev); /* released once it completed */
    *ev = 0;
  }
  /* A ticket: the agent's last command, after the stream's work. */
  if (a && (*ev == 0 || (*ev & 1))) return rmacu_ag_record(e, a, ev, err, errlen);
  if (rmacu_on_stream(e, &a, err, errlen) != 0) return -1;
  rmacu_off_stream(a, 0);
  if (*ev & 1) *ev = 0; /* a ticket of an agent that stopped since */
  if (!*ev) {
    void* x = NULL;
    r = rmacu_cu.eventCreate(&x, EVENT_DISABLE_TIMING);
    if (r != 0) return rmaw_fail(err, errlen, "cuEventCreate: %s", rmacu_errstr(r));
    *ev = (uintptr_t)x;
  }
  r = rmacu_cu.eventRecord(ev_ptr(*ev), e->stream);
  if (r != 0) return rmaw_fail(err, errlen, "cuEventRecord: %s", rmacu_errstr(r));
  return 0;
}

/* cuEventQuery needs no current context. */
int rmacu_event_query(uintptr_t ctx, uintptr_t ev) {
  if (ev & 1) return rmacu_ag_ticket(ctx, ev);
  CUresult r = rmacu_cu.eventQuery(ev_ptr(ev));
  return r == 0 ? 1 : r == ERROR_NOT_READY ? 0 : -1;
}

void rmacu_event_destroy(uintptr_t ctx, uintptr_t ev) {
  if (ev && !(ev & 1) && rmacu_cu.ctxSetCurrent((CUcontext)ctx) == 0) rmacu_cu.eventDestroy(ev_ptr(ev));
}

int rmacu_stream_sync(uintptr_t ctx, char* err, size_t errlen) {
  CTX_STREAM(e, "cuStreamSynchronize");
  /* Where the agent's last command came after the stream's last work,
   * its done word says when everything ran: waited for on the host, with
   * no driver call (a stream wait and a synchronize cost a submission). */
  int done = rmacu_ag_sync(e);
  if (done == 0) return 0;
  if (done < 0) return rmaw_fail(err, errlen, "the device agent stopped before the context's work ran");
  struct agent* a;
  if (rmacu_on_stream(e, &a, err, errlen) != 0) return -1;
  rmacu_off_stream(a, 0);
  r = rmacu_cu.streamSynchronize(e->stream);
  if (r != 0) return rmaw_fail(err, errlen, "cuStreamSynchronize: %s", rmacu_errstr(r));
  return 0;
}

/* Exports [base, base+n) (page-aligned by the caller) as a DMA-BUF fd
 * (CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD), for a NIC that imports it. */
int rmacu_export_dmabuf(uintptr_t ctx, uint64_t base, uint64_t n, int* fd, char* err, size_t errlen) {
  if (!rmacu_cu.getHandleForRange) return rmaw_fail(err, errlen, "the driver has no cuMemGetHandleForAddressRange");
  CUresult r = rmacu_cu.ctxSetCurrent((CUcontext)ctx);
  if (r == 0) r = rmacu_cu.getHandleForRange(fd, (CUdeviceptr)base, (size_t)n, 1, 0);
  if (r != 0)
    return rmaw_fail(err, errlen, "cuMemGetHandleForAddressRange of %llu bytes: %s", (unsigned long long)n, rmacu_errstr(r));
  return 0;
}

/* IPC between the processes of a host: the cuMem allocations under a
 * registration are exported as POSIX fds (CU_MEM_HANDLE_TYPE_POSIX_FILE_
 * DESCRIPTOR), which NCCL's ncclMemAlloc requests for its windows; the peer
 * imports and maps them back to back in a reservation of its own. Memory
 * from cuMemAlloc has no shareable handle: its export fails, and its
 * operations keep the staged path. */
enum { HANDLE_POSIX_FD = 1, LOC_DEVICE = 1, ACCESS_RW = 3 };
typedef struct {
  int locType, locId, flags;
} accessDesc; /* CUmemAccessDesc */
_Static_assert(sizeof(accessDesc) == 12, "CUmemAccessDesc is 12 bytes");

static int ipc_ready(void) {
  return rmacu_cu.memRetain && rmacu_cu.memRelease && rmacu_cu.memExport && rmacu_cu.memImport &&
         rmacu_cu.addressReserve && rmacu_cu.addressFree && rmacu_cu.memMap && rmacu_cu.memUnmap &&
         rmacu_cu.memSetAccess && rmacu_cu.ctxGetDevice;
}

int rmacu_ipc_export(uintptr_t ctx, uint64_t ptr, uint64_t size, int max, rmaw_ipc_seg* segs, int* n, char* err,
                     size_t errlen) {
  *n = 0;
  if (!ipc_ready()) return rmaw_fail(err, errlen, "the driver lacks the cuMem IPC calls");
  CUresult r = rmacu_cu.ctxSetCurrent((CUcontext)ctx);
  if (r != 0) return rmaw_fail(err, errlen, "cuCtxSetCurrent: %s", rmacu_errstr(r));
  uint64_t end = ptr + (size ? size : 1);
  for (uint64_t p = ptr; p < end;) {
    CUdeviceptr base = 0;
    size_t len = 0;
    unsigned long long h = 0;
    const char* what = NULL;
    if (*n == max) what = "too many allocations";
    else if ((r = rmacu_cu.memGetAddressRange(&base, &len, (CUdeviceptr)p)) != 0 || base + len <= p) what = "cuMemGetAddressRange";
    else if (*n > 0 && base != segs[*n - 1].base + segs[*n - 1].size) what = "allocations not back to back";
    else if ((r = rmacu_cu.memRetain(&h, (void*)(uintptr_t)base)) != 0) what = "cuMemRetainAllocationHandle (not a cuMem allocation)";
    else {
      int fd = -1;
      r = rmacu_cu.memExport(&fd, h, HANDLE_POSIX_FD, 0);
      rmacu_cu.memRelease(h);
      if (r != 0 || fd < 0) what = "cuMemExportToShareableHandle (POSIX fd)";
      else {
        memset(&segs[*n], 0, sizeof segs[*n]);
        segs[*n].fd = fd;
        segs[*n].base = base;
        segs[*n].size = len;
        (*n)++;
        p = base + len;
        continue;
      }
    }
    for (int i = 0; i < *n; i++) close(segs[i].fd);
    int k = *n;
    *n = 0;
    return rmaw_fail(err, errlen, "export of allocation %d: %s%s%s", k, what, r ? ": " : "", r ? rmacu_errstr(r) : "");
  }
  return 0;
}

/* rmacu_ipc_unmap unmaps each segment (cuMemUnmap takes what one cuMemMap
 * mapped), then frees the reservation; it goes on past a failure and
 * reports the first. */
static int ipc_unmap_now(uintptr_t ctx, uint64_t va, int n, const uint64_t* sizes, char* err, size_t errlen);
int rmacu_ipc_unmap(uintptr_t ctx, uint64_t va, int n, const uint64_t* sizes, char* err, size_t errlen) {
  struct agent* a = rmacu_ag_pause(ctx);
  int rc = ipc_unmap_now(ctx, va, n, sizes, err, errlen);
  rmacu_ag_resume(a);
  return rc;
}
static int ipc_unmap_now(uintptr_t ctx, uint64_t va, int n, const uint64_t* sizes, char* err, size_t errlen) {
  if (!ipc_ready()) return rmaw_fail(err, errlen, "the driver lacks the cuMem IPC calls");
  CUresult r = rmacu_cu.ctxSetCurrent((CUcontext)ctx), first = r;
  const char* what = r ? "cuCtxSetCurrent" : NULL;
  uint64_t off = 0;
  for (int i = 0; i < n; i++) {
    if ((r = rmacu_cu.memUnmap((CUdeviceptr)(va + off), (size_t)sizes[i])) != 0 && !what) {
      what = "cuMemUnmap";
      first = r;
    }
    off += sizes[i];
  }
  if ((r = rmacu_cu.addressFree((CUdeviceptr)va, (size_t)off)) != 0 && !what) {
    what = "cuMemAddressFree";
    first = r;
  }
  if (what)
    return rmaw_fail(err, errlen, "%s of %llu bytes at %#llx: %s", what, (unsigned long long)off, (unsigned long long)va,
                     rmacu_errstr(first));
  return 0;
}

static int ipc_import_now(uintptr_t ctx, int n, const rmaw_ipc_seg* segs, uint64_t* va, char* err, size_t errlen);
int rmacu_ipc_import(uintptr_t ctx, int n, const rmaw_ipc_seg* segs, uint64_t* va, char* err, size_t errlen) {
  struct agent* a = rmacu_ag_pause(ctx);
  int rc = ipc_import_now(ctx, n, segs, va, err, errlen);
  rmacu_ag_resume(a);
  return rc;
}
static int ipc_import_now(uintptr_t ctx, int n, const rmaw_ipc_seg* segs, uint64_t* va, char* err, size_t errlen) {
  *va = 0;
  if (!ipc_ready()) return rmaw_fail(err, errlen, "the driver lacks the cuMem IPC calls");
  CUdevice dev = 0;
  CUresult r = rmacu_cu.ctxSetCurrent((CUcontext)ctx);
  if (r == 0) r = rmacu_cu.ctxGetDevice(&dev);
  if (r != 0) return rmaw_fail(err, errlen, "the context's device: %s", rmacu_errstr(r));
  uint64_t span = 0;
  for (int i = 0; i < n; i++) {
    if (segs[i].fd < 0) return rmaw_fail(err, errlen, "segment %d has no POSIX fd", i);
    span += segs[i].size;
  }
  CUdeviceptr base = 0;
  if ((r = rmacu_cu.addressReserve(&base, (size_t)span, 0, 0, 0)) != 0)
    return rmaw_fail(err, errlen, "cuMemAddressReserve of %llu bytes: %s", (unsigned long long)span, rmacu_errstr(r));
  int mapped = 0;
  uint64_t off = 0;
  const char* what = NULL;
  for (; mapped < n; mapped++) {
    unsigned long long h = 0;
    if ((r = rmacu_cu.memImport(&h, (void*)(uintptr_t)segs[mapped].fd, HANDLE_POSIX_FD)) != 0) {
      what = "cuMemImportFromShareableHandle";
      break;
    }
    r = rmacu_cu.memMap(base + off, (size_t)segs[mapped].size, 0, h, 0);
    rmacu_cu.memRelease(h); /* the mapping holds the memory now */
    if (r != 0) {
      what = "cuMemMap";
      break;
    }
    off += segs[mapped].size;
  }
  if (!what) {
    accessDesc a = {LOC_DEVICE, dev, ACCESS_RW};
    if ((r = rmacu_cu.memSetAccess(base, (size_t)span, &a, 1)) != 0) what = "cuMemSetAccess";
  }
  if (what) {
    off = 0;
    for (int i = 0; i < mapped; i++) {
      rmacu_cu.memUnmap(base + off, (size_t)segs[i].size);
      off += segs[i].size;
    }
    rmacu_cu.addressFree(base, (size_t)span);
    return rmaw_fail(err, errlen, "import of allocation %d of %d: %s: %s", mapped, n, what, rmacu_errstr(r));
  }
  *va = base;
  return 0;
}

/* Interprocess events (CU_EVENT_INTERPROCESS, which needs
 * CU_EVENT_DISABLE_TIMING): the target of a mapped put makes its stream
 * wait for the sender's copy instead of the sender waiting for it. */
enum { EVENT_INTERPROCESS = 4 };

int rmacu_ipc_event_new(uintptr_t ctx, uintptr_t* ev, unsigned char* handle, char* err, size_t errlen) {
  if (!rmacu_cu.ipcGetEventHandle || !rmacu_cu.eventCreate) return rmaw_fail(err, errlen, "the driver lacks cuIpcGetEventHandle");
  CUresult r = rmacu_cu.ctxSetCurrent((CUcontext)ctx);
  void* e = NULL;
  if (r == 0) r = rmacu_cu.eventCreate(&e, EVENT_DISABLE_TIMING | EVENT_INTERPROCESS);
  if (r != 0) return rmaw_fail(err, errlen, "cuEventCreate (interprocess): %s", rmacu_errstr(r));
  if ((r = rmacu_cu.ipcGetEventHandle(handle, e)) != 0) {
    rmacu_cu.eventDestroy(e);
    return rmaw_fail(err, errlen, "cuIpcGetEventHandle: %s", rmacu_errstr(r));
  }
  if ((uintptr_t)e & (1 | EV_IPC)) { /* no room for the marks */
    rmacu_cu.eventDestroy(e);
    return rmaw_fail(err, errlen, "cuEventCreate (interprocess): a handle with its low bits set");
  }
  /* Marked, or the agent would make it a ticket that the peer's wait
   * never sees recorded. */
  *ev = (uintptr_t)e | EV_IPC;
  return 0;
}

int rmacu_ipc_event_open(uintptr_t ctx, const unsigned char* handle, uintptr_t* ev, char* err, size_t errlen) {
  if (!rmacu_cu.ipcOpenEventHandle) return rmaw_fail(err, errlen, "the driver lacks cuIpcOpenEventHandle");
  cuIpcEventHandle h;
  memcpy(h.reserved, handle, sizeof h.reserved);
  void* e = NULL;
  CUresult r = rmacu_cu.ctxSetCurrent((CUcontext)ctx);
  if (r == 0) r = rmacu_cu.ipcOpenEventHandle(&e, h);
  if (r != 0) return rmaw_fail(err, errlen, "cuIpcOpenEventHandle: %s", rmacu_errstr(r));
  *ev = (uintptr_t)e;
  return 0;
}

int rmacu_stream_wait(uintptr_t ctx, uintptr_t ev, char* err, size_t errlen) {
  if (!rmacu_cu.streamWaitEvent) return rmaw_fail(err, errlen, "the driver lacks cuStreamWaitEvent");
  CTX_STREAM(e, "cuStreamWaitEvent");
  struct agent* a;
  if (rmacu_on_stream(e, &a, err, errlen) != 0) return -1;
  r = rmacu_cu.streamWaitEvent(e->stream, ev_ptr(ev), 0);
  rmacu_off_stream(a, r == 0); /* the agent's next command follows the wait */
  if (r != 0) return rmaw_fail(err, errlen, "cuStreamWaitEvent: %s", rmacu_errstr(r));
  return 0;
}
