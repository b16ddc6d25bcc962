/* Copies: the synchronous ones on a copy stream of the context's pool,
 * the stream-ordered ones on its shared stream (or through its device
 * agent), and the pinned host memory they stage through. */
#include "cuda_internal.h"

/* copy_take locks a copy stream of e that does not share the agent's
 * hardware queue (agent.c, ag_queues) and returns its index. */
static int copy_take(ctxstream* e) {
  unsigned skip = __atomic_load_n(&e->skip, __ATOMIC_ACQUIRE);
  if (!skip) return rmaw_pool_take(e->cmu, &e->next, NCOPY);
  unsigned start = __atomic_fetch_add(&e->next, 1, __ATOMIC_RELAXED);
  int first = -1;
  for (int k = 0; k < NCOPY; k++) {
    int i = (int)((start + (unsigned)k) % NCOPY);
    if (skip >> i & 1) continue;
    if (first < 0) first = i;
    if (pthread_mutex_trylock(&e->cmu[i]) == 0) return i;
  }
  pthread_mutex_lock(&e->cmu[first]);
  return first;
}

/* Synchronous copies run on one of the context's copy streams, made with
 * its shared stream (rmacu_ctx_stream) and never on the data path: creating a
 * stream while a kernel of the application runs can wait for that kernel,
 * and the kernel may be waiting for the very copy (NCCL's GIN alltoall
 * hung so, in a copy's cuStreamCreate on a thread new to the plugin). A
 * copy takes a free stream of the pool, or waits for the one it lands on
 * (rmaw_pool_take): the streams are non-blocking, so copies of different
 * threads overlap. */

enum { COPY_DTOH, COPY_HTOD, COPY_DTOD };

/* pool_copy makes one copy of n bytes (kind COPY_*; dst and src are host
 * or device addresses as kind says) on a copy stream of ctx's pool and
 * waits for it; *r is the driver's status, -1 when ctx has no streams. */
static int pool_copy(uintptr_t ctx, int kind, uint64_t dst, uint64_t src, uint64_t n, CUresult* r) {
  /* The calling thread (an NCCL progress thread, a Go goroutine's thread)
   * may have no context: set the one captured at registration. */
  ctxstream* e = rmacu_ctx_stream(ctx, r); /* makes ctx current */
  if (!e) return -1;
  int i = copy_take(e);
  CUstream s = e->copy[i];
  void* h = (void*)(uintptr_t)(kind == COPY_DTOH ? dst : src);
  *r = kind == COPY_HTOD   ? rmacu_cu.htod((CUdeviceptr)dst, h, (size_t)n, s)
       : kind == COPY_DTOH ? rmacu_cu.dtoh(h, (CUdeviceptr)src, (size_t)n, s)
                           : rmacu_cu.dtod((CUdeviceptr)dst, (CUdeviceptr)src, (size_t)n, s);
  if (*r == 0) *r = rmacu_cu.streamSynchronize(s);
  pthread_mutex_unlock(&e->cmu[i]);
  return 0;
}

int rmacu_copy(uintptr_t ctx, int to_device, void* host, uint64_t dev, uint64_t n, char* err,
               size_t errlen) {
  CUresult r;
  uint64_t h = (uint64_t)(uintptr_t)host;
  if (pool_copy(ctx, to_device ? COPY_HTOD : COPY_DTOH, to_device ? dev : h, to_device ? h : dev, n, &r) != 0)
    return rmaw_fail(err, errlen, "copy: no streams for the context: %s", rmacu_errstr(r));
  if (r != 0)
    return rmaw_fail(err, errlen, "%s of %llu bytes: %s", to_device ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync",
                     (unsigned long long)n, rmacu_errstr(r));
  return 0;
}

/* A device-to-device copy in one context, waited for, on a copy stream
 * as rmacu_copy's: an operation of a rank to itself. Returns 1 (no
 * message) when the driver lacks cuMemcpyDtoDAsync_v2. */
int rmacu_copy_dtod(uintptr_t ctx, uint64_t dst, uint64_t src, uint64_t n, char* err, size_t errlen) {
  if (!rmacu_cu.dtod) return 1;
  CUresult r;
  if (pool_copy(ctx, COPY_DTOD, dst, src, n, &r) != 0)
    return rmaw_fail(err, errlen, "copy: no streams for the context: %s", rmacu_errstr(r));
  if (r != 0) return rmaw_fail(err, errlen, "cuMemcpyDtoDAsync of %llu bytes: %s", (unsigned long long)n, rmacu_errstr(r));
  return 0;
}

/* Pinned host memory. The device agent (agent.c) is paused around the
 * calls that can wait for a context's kernels, and told the host memory it
 * may touch. */

/* Portable page-locked memory: usable by copies of every context (and
 * reached by the device at the same address: UVA). */
int rmacu_host_alloc(uintptr_t ctx, uint64_t n, void** p, char* err, size_t errlen) {
  struct agent* a = rmacu_ag_pause(ctx);
  CUresult r = rmacu_cu.ctxSetCurrent((CUcontext)ctx);
  /* DEVICEMAP where the agent may run: cuMemHostGetDevicePointer, which
   * tells the agent's memory (rmacu_hr_add), answers only for such memory. */
  if (r == 0) r = rmacu_cu.memHostAlloc(p, (size_t)n, MEMHOSTALLOC_PORTABLE | (rmacu_agent_mode ? 2 : 0));
  rmacu_ag_resume(a);
  if (r != 0) return rmaw_fail(err, errlen, "cuMemHostAlloc of %llu bytes: %s", (unsigned long long)n, rmacu_errstr(r));
  rmacu_hr_add(*p, n);
  return 0;
}

void rmacu_host_free(void* p) {
  struct agent* a[MAX_CTX];
  rmacu_hr_drop(p);
  rmacu_ag_pause_all(a, MAX_CTX);
  rmacu_cu.memFreeHost(p);
  rmacu_ag_resume_all(a, MAX_CTX);
}

/* host_register pins [p, p+n) from ctx with flags, ctx's agent paused
 * around the call (it can wait for the context's kernels). */
static int host_register(uintptr_t ctx, void* p, uint64_t n, unsigned flags, const char* what, char* err, size_t errlen) {
  if (!rmacu_cu.memHostRegister) return rmaw_fail(err, errlen, "the driver has no cuMemHostRegister");
  struct agent* a = rmacu_ag_pause(ctx);
  CUresult r = rmacu_cu.ctxSetCurrent((CUcontext)ctx);
  if (r == 0) r = rmacu_cu.memHostRegister(p, (size_t)n, flags);
  rmacu_ag_resume(a);
  if (r != 0) return rmaw_fail(err, errlen, "%s of %llu bytes: %s", what, (unsigned long long)n, rmacu_errstr(r));
  return 0;
}

/* Pins memory we mapped ourselves (the intra-node staging ring, shared
 * with another process), portable to every context. */
int rmacu_host_register(uintptr_t ctx, void* p, uint64_t n, char* err, size_t errlen) {
  /* DEVICEMAP where the agent may run, so that it reaches the ring. */
  if (host_register(ctx, p, n, MEMHOSTALLOC_PORTABLE | (rmacu_agent_mode ? 2 : 0), "cuMemHostRegister", err, errlen) != 0)
    return -1;
  if (rmacu_agent_mode) rmacu_hr_add(p, n);
  return 0;
}

/* rmaw_cuda_host_register_ro pins memory mapped read-only here (a peer's
 * mark page) for the agent to read: CU_MEMHOSTREGISTER_READ_ONLY (8), which
 * a mapping without write access needs, with PORTABLE and DEVICEMAP. */
int rmaw_cuda_host_register_ro(uintptr_t ctx, void* p, uint64_t n, char* err, size_t errlen) {
  if (host_register(ctx, p, n, MEMHOSTALLOC_PORTABLE | 2 | 8, "cuMemHostRegister (read-only)", err, errlen) != 0) return -1;
  /* The agent reads host memory at its host address only (rmacu_hr_ok). */
  CUdeviceptr d = 0;
  if (!rmacu_cu.memHostGetDevicePointer || rmacu_cu.memHostGetDevicePointer(&d, p, 0) != 0 || d != (CUdeviceptr)(uintptr_t)p) {
    rmacu_host_unregister(ctx, p);
    return rmaw_fail(err, errlen, "the device does not see the pinned page at its host address");
  }
  rmacu_hr_add(p, n);
  return 0;
}

/* Called from threads with no context (closeColl's, a service goroutine's
 * at teardown): set the registering one. */
void rmacu_host_unregister(uintptr_t ctx, void* p) {
  rmacu_hr_drop(p);
  struct agent* a = rmacu_ag_pause(ctx);
  if (rmacu_cu.memHostUnregister && rmacu_cu.ctxSetCurrent((CUcontext)ctx) == 0) rmacu_cu.memHostUnregister(p);
  rmacu_ag_resume(a);
}

int rmacu_copy_async(uintptr_t ctx, int to_device, void* host, uint64_t dev, uint64_t n, char* err,
                     size_t errlen) {
  CTX_STREAM(e, "asynchronous copy");
  if (rmacu_ag_live(e) && n <= rmacu_agent_max && rmacu_hr_ok(host, n)) {
    uint64_t h = (uint64_t)(uintptr_t)host;
    return to_device ? rmacu_ag_submit(e, AG_COPY, n, h, dev, 0, err, errlen) : rmacu_ag_submit(e, AG_COPY, n, dev, h, 0, err, errlen);
  }
  struct agent* a;
  if (rmacu_on_stream(e, &a, err, errlen) != 0) return -1;
  r = to_device ? rmacu_cu.htod((CUdeviceptr)dev, host, (size_t)n, e->stream)
                : rmacu_cu.dtoh(host, (CUdeviceptr)dev, (size_t)n, e->stream);
  rmacu_off_stream(a, r == 0);
  if (r != 0)
    return rmaw_fail(err, errlen, "%s of %llu bytes: %s", to_device ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync",
                     (unsigned long long)n, rmacu_errstr(r));
  return 0;
}

int rmacu_copy_dtod_async(uintptr_t ctx, uint64_t dst, uint64_t src, uint64_t n, char* err, size_t errlen) {
  if (!rmacu_cu.dtod) return 1;
  CTX_STREAM(e, "asynchronous device-to-device copy");
  /* The agent's kernel reads and writes device memory as it does host
   * memory: a small copy into a peer's mapped window costs no driver
   * submission. Only cuMem mappings reach a copy context (its agent's
   * memory), so both ends are reachable from its kernel. */
  if (rmacu_ag_live(e) && n <= rmacu_agent_max) return rmacu_ag_submit(e, AG_COPY, n, src, dst, 0, err, errlen);
  struct agent* a;
  if (rmacu_on_stream(e, &a, err, errlen) != 0) return -1;
  r = rmacu_cu.dtod((CUdeviceptr)dst, (CUdeviceptr)src, (size_t)n, e->stream);
  rmacu_off_stream(a, r == 0);
  if (r != 0) return rmaw_fail(err, errlen, "cuMemcpyDtoDAsync of %llu bytes: %s", (unsigned long long)n, rmacu_errstr(r));
  return 0;
}
