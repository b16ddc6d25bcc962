/* Contexts and pools. Copies run on non-blocking streams and wait for
 * their stream only: the legacy default stream would wait for user
 * kernels, and a GIN kernel that spins on a signal we are about to write
 * would then never finish. Every stream is made once per context, before
 * the data path (rmacu_ctx_stream, called at registration): a pool of copy
 * streams, so that lanes copy at once, and the shared stream of
 * stream-ordered work. */
#include "cuda_internal.h"

pthread_mutex_t rmacu_mu = PTHREAD_MUTEX_INITIALIZER;

/* copyContext: make copy contexts (NCCL_RMA_WASM_COPY_CONTEXT). Work
 * queued on a stream of the application's context shares that context's
 * hardware queues (CUDA_DEVICE_MAX_CONNECTIONS of them, streams assigned
 * round-robin) with the application's streams: a copy that lands behind
 * kernels queued after one that spins waiting for that very copy never
 * runs (NCCL's GIN alltoall, 200 kernels launched back to back, hung in
 * the target's synchronous copy into its window). Another context has
 * queues of its own. A registration of a cuMem* mapping, which every
 * context of the device reaches (NCCL's windows and GIN signal arrays),
 * gets the copy context as its context at inspection (rmacu_inspect), so
 * its copies, signal writes and streams are that context's with no
 * per-operation test; other memory keeps the application's context. */
static int copyContext;

void rmaw_cuda_copy_context(int on) { copyContext = on; }

/* The copy contexts made, one per application context (under rmacu_mu). */
static struct {
  CUcontext app, own;
} copyCtxs[MAX_CTX];
static int copyContexts;

int rmaw_cuda_copy_contexts(void) { return __atomic_load_n(&copyContexts, __ATOMIC_RELAXED); }

/* copyCtxFailed: the last failed cuCtxCreate's status (0: none failed). */
static int copyCtxFailed;

int rmaw_cuda_copy_context_failed(void) { return __atomic_load_n(&copyCtxFailed, __ATOMIC_RELAXED); }

/* vmm reports whether dev lies in a cuMem* mapping, which every context
 * of the device reaches. */
static int vmm(uint64_t dev) {
  unsigned long long h = 0;
  if (!rmacu_cu.memRetain || rmacu_cu.memRetain(&h, (void*)(uintptr_t)dev) != 0) return 0;
  rmacu_cu.memRelease(h);
  return 1;
}

/* copy_context returns app's copy context, made on first use with app's
 * device; NULL when none can be made (the caller keeps app). Registration
 * calls it, never the data path: creating a context can wait. */
static CUcontext copy_context(CUcontext app) {
  CUcontext own = NULL;
  pthread_mutex_lock(&rmacu_mu);
  for (int i = 0; i < copyContexts; i++)
    if (copyCtxs[i].app == app) own = copyCtxs[i].own;
  CUdevice dev = 0;
  CUresult r = 0;
  if (!own && copyContexts < MAX_CTX && rmacu_cu.ctxCreate && rmacu_cu.ctxGetDevice && rmacu_cu.ctxSetCurrent(app) == 0 &&
      rmacu_cu.ctxGetDevice(&dev) == 0) {
    /* Under MPS a client may be refused more contexts: the memory then
     * stays on the application's (rmaw_cuda_copy_context_failed). */
    if ((r = rmacu_cu.ctxCreate(&own, 0, dev)) != 0) {
      own = NULL;
      __atomic_store_n(&copyCtxFailed, r, __ATOMIC_RELAXED);
    } else {
      copyCtxs[copyContexts].app = app;
      copyCtxs[copyContexts].own = own;
      __atomic_store_n(&copyContexts, copyContexts + 1, __ATOMIC_RELAXED);
    }
    rmacu_cu.ctxSetCurrent(app); /* cuCtxCreate made its context current */
  }
  pthread_mutex_unlock(&rmacu_mu);
  return own;
}

/* rmacu_own_context reports whether ctx is one of the copy contexts made
 * (rmaw_cuda_agent_start: the agent runs in those only). */
int rmacu_own_context(uintptr_t ctx) {
  int own = 0;
  pthread_mutex_lock(&rmacu_mu);
  for (int i = 0; i < copyContexts; i++)
    if ((uintptr_t)copyCtxs[i].own == ctx) own = 1;
  pthread_mutex_unlock(&rmacu_mu);
  return own;
}

/* rmacu_inspect accepts [ptr, ptr+size) when every byte of it is CUDA
 * device memory of one device: one allocation, or several mapped next to
 * each other in one VMM reservation (NCCL's symmetric windows), walked
 * allocation by allocation with cuMemGetAddressRange. */
int rmacu_inspect(uint64_t ptr, uint64_t size, uintptr_t* ctx, char* err, size_t errlen) {
  int ordinal = -1;
  uint64_t end = ptr + (size ? size : 1);
  for (uint64_t p = ptr; p < end;) {
    unsigned int memtype = 0;
    CUresult r = rmacu_cu.pointerGetAttribute(&memtype, ATTR_MEMORY_TYPE, (CUdeviceptr)p);
    if (r != 0 || memtype != MEMTYPE_DEVICE)
      return rmaw_fail(err, errlen, "%s CUDA device memory (at offset %llu: memory type %u, status %s)",
                       p == ptr ? "not" : "the range leaves", (unsigned long long)(p - ptr), memtype, rmacu_errstr(r));
    int o = -1;
    if (rmacu_cu.pointerGetAttribute(&o, ATTR_DEVICE_ORDINAL, (CUdeviceptr)p) != 0 || (ordinal >= 0 && o != ordinal))
      return rmaw_fail(err, errlen, "the range spans allocations of more than one device");
    ordinal = o;
    CUdeviceptr base = 0;
    size_t n = 0;
    if (rmacu_cu.memGetAddressRange(&base, &n, (CUdeviceptr)p) != 0 || base + n <= p) {
      /* No range known: the first and last bytes decide, as before. */
      if (p == ptr && size > 1) {
        p = end - 1;
        continue;
      }
      break;
    }
    p = base + n;
  }
  CUcontext c = NULL;
  CUresult r = rmacu_cu.pointerGetAttribute(&c, ATTR_CONTEXT, (CUdeviceptr)ptr);
  if (r != 0 || c == NULL) {
    /* VMM allocations carry no context: use the device's primary one. */
    CUdevice dev;
    if (ordinal < 0 || rmacu_cu.deviceGet(&dev, ordinal) != 0 || rmacu_cu.primaryCtxRetain(&c, dev) != 0)
      return rmaw_fail(err, errlen, "cannot find the CUDA context of this memory");
  }
  if (copyContext && rmacu_cu.memRetain && rmacu_cu.memRelease && vmm(ptr)) {
    CUcontext own = copy_context(c);
    if (own) c = own;
  }
  *ctx = (uintptr_t)c;
  return 0;
}

/* rmaw_cuda_p2p_atomics reports whether device a's atomics reach device
 * b's memory natively (CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED, 3:
 * NVLink; PCIe mostly not); 1 for one device. */
int rmaw_cuda_p2p_atomics(int a, int b) {
  if (a == b) return 1;
  CUdevice da, db;
  int v = 0;
  if (!rmacu_cu.deviceGetP2PAttribute || rmacu_cu.deviceGet(&da, a) != 0 || rmacu_cu.deviceGet(&db, b) != 0 ||
      rmacu_cu.deviceGetP2PAttribute(&v, 3, da, db) != 0)
    return 0;
  return v == 1;
}

/* rmaw_cuda_ordinal is the device ordinal of a CUDA address (-1: none). */
int rmaw_cuda_ordinal(uint64_t ptr) {
  int o = -1;
  if (rmacu_cu.pointerGetAttribute(&o, ATTR_DEVICE_ORDINAL, (CUdeviceptr)ptr) != 0) return -1;
  return o;
}

/* The context stream: one non-blocking stream per context that every
 * thread's stream-ordered work (signal writes, atomic adds, asynchronous
 * copies, events) queues on, so that a signal queued after a payload copy
 * executes after it whichever thread queued either. Entries are published
 * with a release store of rmacu_nctxs and found without a lock. */
ctxstream rmacu_ctxs[MAX_CTX];
int rmacu_nctxs;

/* rmacu_ctx_stream makes ctx current and returns its stream entry, creating it
 * (and probing what its device supports) on first use; NULL with *r set
 * on failure. */
ctxstream* rmacu_ctx_stream(uintptr_t ctx, CUresult* r) {
  *r = rmacu_cu.ctxSetCurrent((CUcontext)ctx);
  if (*r != 0) return NULL;
  int n = __atomic_load_n(&rmacu_nctxs, __ATOMIC_ACQUIRE);
  for (int i = 0; i < n; i++)
    if (rmacu_ctxs[i].ctx == (CUcontext)ctx) return &rmacu_ctxs[i];
  pthread_mutex_lock(&rmacu_mu);
  ctxstream* e = NULL;
  for (int i = 0; i < rmacu_nctxs; i++)
    if (rmacu_ctxs[i].ctx == (CUcontext)ctx) e = &rmacu_ctxs[i];
  if (!e && rmacu_nctxs == MAX_CTX) *r = 2; /* CUDA_ERROR_OUT_OF_MEMORY */
  if (!e && rmacu_nctxs < MAX_CTX) {
    e = &rmacu_ctxs[rmacu_nctxs];
    memset(e, 0, sizeof *e);
    e->ctx = (CUcontext)ctx;
    *r = rmacu_cu.streamCreate(&e->stream, STREAM_NON_BLOCKING);
    for (int i = 0; *r == 0 && i < NCOPY; i++) {
      *r = rmacu_cu.streamCreate(&e->copy[i], STREAM_NON_BLOCKING);
      pthread_mutex_init(&e->cmu[i], NULL);
    }
    if (*r != 0) {
      e = NULL; /* the streams made so far stay: a failing context is not retried */
    } else {
      CUdevice dev = 0;
      int v = 0;
      int have_dev = rmacu_cu.ctxGetDevice && rmacu_cu.deviceGetAttribute && rmacu_cu.ctxGetDevice(&dev) == 0;
      if (rmacu_cu.writeValue64 && have_dev && rmacu_cu.deviceGetAttribute(&v, rmacu_cu.writeValueAttr, dev) == 0 && v)
        e->caps |= RMAW_CAP_WRITE64;
      if (rmacu_cu.eventCreate && rmacu_cu.eventRecord && rmacu_cu.eventQuery && rmacu_cu.eventDestroy) e->caps |= RMAW_CAP_ASYNC;
      rmacu_reduce_probe(e, have_dev, dev);
      if (e->reduceTy) e->caps |= RMAW_CAP_STREAM_ATOMIC;
      /* The kernel's module is loaded on its first use (rmacu_add64), never
       * here: loading a module can synchronize the context (CUDA lazy
       * loading), and this runs on the data path, where a kernel of the
       * application may be spinning on the very signal being applied
       * (NCCL's ncclWaitSignal under MPS hung here). */
      if (rmacu_cu.moduleLoadData && rmacu_cu.moduleGetFunction && rmacu_cu.launchKernel) e->caps |= RMAW_CAP_ADD64;
      __atomic_store_n(&rmacu_nctxs, rmacu_nctxs + 1, __ATOMIC_RELEASE);
    }
  }
  pthread_mutex_unlock(&rmacu_mu);
  return e;
}

/* With the agent running, the context writes, adds and copies small
 * payloads through it: no SM to find, no submission to wait for. */
int rmacu_caps(uintptr_t ctx) {
  CUresult r;
  ctxstream* e = rmacu_ctx_stream(ctx, &r);
  if (!e) return 0;
  return e->caps | (rmacu_ag_live(e) ? RMAW_CAP_WRITE64 | RMAW_CAP_STREAM_ATOMIC | RMAW_CAP_ASYNC : 0);
}
