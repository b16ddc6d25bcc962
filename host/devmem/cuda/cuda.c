/* The CUDA driver, found with dlopen at run time and never linked, so the
 * library loads on machines without a GPU. Declarations are our own minimal
 * subset of the driver API (types are plain integers and pointers). Copies
 * run on non-blocking streams and wait for their stream only: the legacy
 * default stream would wait for user kernels, and a GIN kernel that spins
 * on a signal we are about to write would then never finish. Every stream
 * is made once per context, before the data path (ctx_stream, called at
 * registration): a pool of copy streams, so that lanes copy at once, and
 * the shared stream of stream-ordered work. */
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_shim.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void* CUcontext;
typedef void* CUstream;
typedef int CUdevice;
/* CUipcEventHandle: 64 opaque bytes, passed by value. */
typedef struct {
  unsigned char reserved[64];
} cuIpcEventHandle;

enum {
  ATTR_CONTEXT = 1,
  ATTR_MEMORY_TYPE = 2,
  ATTR_DEVICE_ORDINAL = 9,
  MEMTYPE_DEVICE = 2,
  STREAM_NON_BLOCKING = 1,
  ATTR_64_BIT_MEM_OPS_V1 = 93,  /* CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1 */
  ATTR_64_BIT_MEM_OPS = 122,    /* CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS */
  EVENT_DISABLE_TIMING = 2,
  ERROR_NOT_READY = 600,
  ATTR_ATOMIC_REDUCTION = 148,  /* CU_DEVICE_ATTRIBUTE_ATOMIC_REDUCTION_SUPPORTED (CUDA 13.1) */
  MEMOP_BARRIER = 6,            /* CU_STREAM_MEM_OP_BARRIER; flags 0: system scope */
  MEMOP_ATOMIC_REDUCTION = 8,   /* CU_STREAM_MEM_OP_ATOMIC_REDUCTION (CUDA 13.1) */
  REDUCTION_OP_ADD = 0,         /* CU_STREAM_ATOMIC_REDUCTION_OP_ADD = CU_ATOMIC_OPERATION_INTEGER_ADD */
};

/* One operation of cuStreamBatchMemOp_v2: the driver's union is 48 bytes;
 * an atomic reduction fills the first 40 (operation, flags, reduction op
 * and data type as 32-bit enums, then address, operand and a word the
 * driver uses). A barrier uses the first two fields. */
typedef union {
  struct {
    uint32_t operation, flags, reductionOp, dataType;
    uint64_t address, value, alias;
  } reduce;
  uint64_t pad[6];
} memop;
_Static_assert(sizeof(memop) == 48, "CUstreamBatchMemOpParams is 48 bytes");

static struct {
  CUresult (*init)(unsigned);
  CUresult (*deviceGetCount)(int*);
  CUresult (*deviceGet)(CUdevice*, int);
  CUresult (*primaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*pointerGetAttribute)(void*, int, CUdeviceptr);
  CUresult (*ctxSetCurrent)(CUcontext);
  CUresult (*streamCreate)(CUstream*, unsigned);
  CUresult (*streamSynchronize)(CUstream);
  CUresult (*dtoh)(void*, CUdeviceptr, size_t, CUstream);
  CUresult (*htod)(CUdeviceptr, const void*, size_t, CUstream);
  CUresult (*dtod)(CUdeviceptr, CUdeviceptr, size_t, CUstream); /* optional */
  CUresult (*getErrorString)(CUresult, const char**);
  CUresult (*memHostAlloc)(void**, size_t, unsigned);
  CUresult (*memFreeHost)(void*);
  CUresult (*memGetAddressRange)(CUdeviceptr*, size_t*, CUdeviceptr);
  CUresult (*memHostRegister)(void*, size_t, unsigned);   /* optional */
  CUresult (*memHostUnregister)(void*);                   /* optional */
  CUresult (*getHandleForRange)(void*, CUdeviceptr, size_t, int, unsigned long long); /* optional, 11.7 */
  /* Optional, for stream-ordered signals and asynchronous copies. */
  CUresult (*ctxGetDevice)(CUdevice*);
  CUresult (*deviceGetAttribute)(int*, int, CUdevice);
  CUresult (*writeValue64)(CUstream, CUdeviceptr, unsigned long long, unsigned);
  /* Optional, for the copy context (rmaw_cuda_copy_context). */
  CUresult (*ctxCreate)(CUcontext*, unsigned, CUdevice);
  CUresult (*memRetain)(unsigned long long*, void*);
  CUresult (*memRelease)(unsigned long long);
  int writeValueAttr; /* the attribute saying writeValue64 works */
  CUresult (*moduleLoadData)(void**, const void*);
  CUresult (*moduleGetFunction)(void**, void*, const char*);
  CUresult (*launchKernel)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                           void**, void**);
  CUresult (*eventCreate)(void**, unsigned);
  CUresult (*eventRecord)(void*, CUstream);
  CUresult (*eventQuery)(void*);
  CUresult (*eventDestroy)(void*);
  /* Optional, for stream atomics (CUDA 13.1 drivers): see reduce_probe. */
  CUresult (*batchMemOp)(CUstream, unsigned, memop*, unsigned);
  CUresult (*memAlloc)(CUdeviceptr*, size_t);
  /* Optional, for IPC between the processes of a host (cuda_ipc_*). */
  CUresult (*memExport)(void*, unsigned long long, int, unsigned long long);
  CUresult (*memImport)(unsigned long long*, void*, int);
  CUresult (*addressReserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*addressFree)(CUdeviceptr, size_t);
  CUresult (*memMap)(CUdeviceptr, size_t, size_t, unsigned long long, unsigned long long);
  CUresult (*memUnmap)(CUdeviceptr, size_t);
  CUresult (*memSetAccess)(CUdeviceptr, size_t, const void*, size_t);
  CUresult (*ipcGetEventHandle)(void*, void*);
  CUresult (*ipcOpenEventHandle)(void**, cuIpcEventHandle);
  CUresult (*streamWaitEvent)(CUstream, void*, unsigned);
  /* Optional, for the device agent (agent.h). */
  CUresult (*waitValue64)(CUstream, CUdeviceptr, unsigned long long, unsigned);
  CUresult (*memHostGetDevicePointer)(CUdeviceptr*, void*, unsigned);
  CUresult (*streamQuery)(CUstream);
} cu;

enum { MEMHOSTALLOC_PORTABLE = 1 };

#define MAX_CTX 64
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

/* A context's shared stream (ctx_stream, below). */
#define NCOPY 8
typedef struct {
  CUcontext ctx;
  CUstream stream;
  int caps;
  void* add;         /* the rmaw_add64 kernel, NULL: none */
  uint32_t reduceTy; /* the data type verified as a 64-bit add (reduce_probe), 0: none */
  /* The synchronous copies' streams (rmaw_pool_take), each owned by one copy
   * at a time. */
  CUstream copy[NCOPY];
  pthread_mutex_t cmu[NCOPY];
  unsigned next;
  struct agent* ag; /* the device agent (agent.h), NULL: none */
  unsigned skip;    /* bit i: copy[i] shares the agent's hardware queue, unused */
} ctxstream;

/* copy_take locks a copy stream of e that does not share the agent's
 * hardware queue (agent.h, ag_queues) and returns its index. */
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

/* copyContext: make copy contexts (NCCL_RMA_WASM_COPY_CONTEXT). Work
 * queued on a stream of the application's context shares that context's
 * hardware queues (CUDA_DEVICE_MAX_CONNECTIONS of them, streams assigned
 * round-robin) with the application's streams: a copy that lands behind
 * kernels queued after one that spins waiting for that very copy never
 * runs (NCCL's GIN alltoall, 200 kernels launched back to back, hung in
 * the target's synchronous copy into its window). Another context has
 * queues of its own. A registration of a cuMem* mapping, which every
 * context of the device reaches (NCCL's windows and GIN signal arrays),
 * gets the copy context as its context at inspection (cuda_inspect), so
 * its copies, signal writes and streams are that context's with no
 * per-operation test; other memory keeps the application's context. */
static int copyContext;

void rmaw_cuda_copy_context(int on) { copyContext = on; }

/* The copy contexts made, one per application context (under mu). */
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
  if (!cu.memRetain || cu.memRetain(&h, (void*)(uintptr_t)dev) != 0) return 0;
  cu.memRelease(h);
  return 1;
}

/* copy_context returns app's copy context, made on first use with app's
 * device; NULL when none can be made (the caller keeps app). Registration
 * calls it, never the data path: creating a context can wait. */
static CUcontext copy_context(CUcontext app) {
  CUcontext own = NULL;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < copyContexts; i++)
    if (copyCtxs[i].app == app) own = copyCtxs[i].own;
  CUdevice dev = 0;
  CUresult r = 0;
  if (!own && copyContexts < MAX_CTX && cu.ctxCreate && cu.ctxGetDevice && cu.ctxSetCurrent(app) == 0 &&
      cu.ctxGetDevice(&dev) == 0) {
    /* Under MPS a client may be refused more contexts: the memory then
     * stays on the application's (rmaw_cuda_copy_context_failed). */
    if ((r = cu.ctxCreate(&own, 0, dev)) != 0) {
      own = NULL;
      __atomic_store_n(&copyCtxFailed, r, __ATOMIC_RELAXED);
    } else {
      copyCtxs[copyContexts].app = app;
      copyCtxs[copyContexts].own = own;
      __atomic_store_n(&copyContexts, copyContexts + 1, __ATOMIC_RELAXED);
    }
    cu.ctxSetCurrent(app); /* cuCtxCreate made its context current */
  }
  pthread_mutex_unlock(&mu);
  return own;
}
static ctxstream* ctx_stream(uintptr_t ctx, CUresult* r);

static const char* errstr(CUresult r) {
  const char* s = NULL;
  if (cu.getErrorString && cu.getErrorString(r, &s) == 0 && s) return s;
  return "unknown CUDA error";
}

int rmaw_cuda_open(char* err, size_t errlen) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) return rmaw_fail(err, errlen, "%s", dlerror());
#define SYM(field, name)                                                          \
  do {                                                                            \
    *(void**)&cu.field = dlsym(h, name);                                          \
    if (!cu.field) return rmaw_fail(err, errlen, "libcuda.so.1 has no %s", name); \
  } while (0)
  SYM(init, "cuInit");
  SYM(deviceGetCount, "cuDeviceGetCount");
  SYM(deviceGet, "cuDeviceGet");
  SYM(primaryCtxRetain, "cuDevicePrimaryCtxRetain");
  SYM(pointerGetAttribute, "cuPointerGetAttribute");
  SYM(ctxSetCurrent, "cuCtxSetCurrent");
  SYM(streamCreate, "cuStreamCreate");
  SYM(streamSynchronize, "cuStreamSynchronize");
  SYM(dtoh, "cuMemcpyDtoHAsync_v2");
  SYM(htod, "cuMemcpyHtoDAsync_v2");
  SYM(getErrorString, "cuGetErrorString");
  SYM(memHostAlloc, "cuMemHostAlloc");
  SYM(memFreeHost, "cuMemFreeHost");
  SYM(memGetAddressRange, "cuMemGetAddressRange_v2");
#undef SYM
  *(void**)&cu.memHostRegister = dlsym(h, "cuMemHostRegister_v2");
  *(void**)&cu.memHostUnregister = dlsym(h, "cuMemHostUnregister");
  if (!cu.memHostRegister || !cu.memHostUnregister) cu.memHostRegister = NULL;
  *(void**)&cu.getHandleForRange = dlsym(h, "cuMemGetHandleForAddressRange");
  *(void**)&cu.dtod = dlsym(h, "cuMemcpyDtoDAsync_v2");
  *(void**)&cu.ctxGetDevice = dlsym(h, "cuCtxGetDevice");
  *(void**)&cu.deviceGetAttribute = dlsym(h, "cuDeviceGetAttribute");
  /* cuda.h maps cuStreamWriteValue64 to the _v2 entry point from CUDA 11.7
   * on, whose 64-bit support CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS
   * (122) reports; the older entry point answers to the _V1 attribute (93). */
  *(void**)&cu.writeValue64 = dlsym(h, "cuStreamWriteValue64_v2");
  cu.writeValueAttr = ATTR_64_BIT_MEM_OPS;
  if (!cu.writeValue64) {
    *(void**)&cu.writeValue64 = dlsym(h, "cuStreamWriteValue64");
    cu.writeValueAttr = ATTR_64_BIT_MEM_OPS_V1;
  }
  *(void**)&cu.ctxCreate = dlsym(h, "cuCtxCreate_v2");
  *(void**)&cu.memRetain = dlsym(h, "cuMemRetainAllocationHandle");
  *(void**)&cu.memRelease = dlsym(h, "cuMemRelease");
  *(void**)&cu.moduleLoadData = dlsym(h, "cuModuleLoadData");
  *(void**)&cu.moduleGetFunction = dlsym(h, "cuModuleGetFunction");
  *(void**)&cu.launchKernel = dlsym(h, "cuLaunchKernel");
  *(void**)&cu.eventCreate = dlsym(h, "cuEventCreate");
  *(void**)&cu.eventRecord = dlsym(h, "cuEventRecord");
  *(void**)&cu.eventQuery = dlsym(h, "cuEventQuery");
  *(void**)&cu.eventDestroy = dlsym(h, "cuEventDestroy_v2");
  *(void**)&cu.batchMemOp = dlsym(h, "cuStreamBatchMemOp_v2");
  *(void**)&cu.memAlloc = dlsym(h, "cuMemAlloc_v2");
  *(void**)&cu.memExport = dlsym(h, "cuMemExportToShareableHandle");
  *(void**)&cu.memImport = dlsym(h, "cuMemImportFromShareableHandle");
  *(void**)&cu.addressReserve = dlsym(h, "cuMemAddressReserve");
  *(void**)&cu.addressFree = dlsym(h, "cuMemAddressFree");
  *(void**)&cu.memMap = dlsym(h, "cuMemMap");
  *(void**)&cu.memUnmap = dlsym(h, "cuMemUnmap");
  *(void**)&cu.memSetAccess = dlsym(h, "cuMemSetAccess");
  *(void**)&cu.ipcGetEventHandle = dlsym(h, "cuIpcGetEventHandle");
  *(void**)&cu.ipcOpenEventHandle = dlsym(h, "cuIpcOpenEventHandle");
  *(void**)&cu.streamWaitEvent = dlsym(h, "cuStreamWaitEvent");
  *(void**)&cu.waitValue64 = dlsym(h, "cuStreamWaitValue64_v2");
  if (!cu.waitValue64 || cu.writeValueAttr != ATTR_64_BIT_MEM_OPS) cu.waitValue64 = NULL;
  *(void**)&cu.memHostGetDevicePointer = dlsym(h, "cuMemHostGetDevicePointer_v2");
  *(void**)&cu.streamQuery = dlsym(h, "cuStreamQuery");
  CUresult r = cu.init(0);
  if (r != 0) return rmaw_fail(err, errlen, "cuInit: %s (%d)", errstr(r), r);
  int n = 0;
  r = cu.deviceGetCount(&n);
  if (r != 0 || n < 1) return rmaw_fail(err, errlen, "no CUDA device (cuDeviceGetCount: %d devices, status %d)", n, r);
  return n;
}

/* cuda_inspect accepts [ptr, ptr+size) when every byte of it is CUDA
 * device memory of one device: one allocation, or several mapped next to
 * each other in one VMM reservation (NCCL's symmetric windows), walked
 * allocation by allocation with cuMemGetAddressRange. */
static int cuda_inspect(uint64_t ptr, uint64_t size, uintptr_t* ctx, char* err, size_t errlen) {
  int ordinal = -1;
  uint64_t end = ptr + (size ? size : 1);
  for (uint64_t p = ptr; p < end;) {
    unsigned int memtype = 0;
    CUresult r = cu.pointerGetAttribute(&memtype, ATTR_MEMORY_TYPE, (CUdeviceptr)p);
    if (r != 0 || memtype != MEMTYPE_DEVICE)
      return rmaw_fail(err, errlen, "%s CUDA device memory (at offset %llu: memory type %u, status %s)",
                       p == ptr ? "not" : "the range leaves", (unsigned long long)(p - ptr), memtype, errstr(r));
    int o = -1;
    if (cu.pointerGetAttribute(&o, ATTR_DEVICE_ORDINAL, (CUdeviceptr)p) != 0 || (ordinal >= 0 && o != ordinal))
      return rmaw_fail(err, errlen, "the range spans allocations of more than one device");
    ordinal = o;
    CUdeviceptr base = 0;
    size_t n = 0;
    if (cu.memGetAddressRange(&base, &n, (CUdeviceptr)p) != 0 || base + n <= p) {
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
  CUresult r = cu.pointerGetAttribute(&c, ATTR_CONTEXT, (CUdeviceptr)ptr);
  if (r != 0 || c == NULL) {
    /* VMM allocations carry no context: use the device's primary one. */
    CUdevice dev;
    if (ordinal < 0 || cu.deviceGet(&dev, ordinal) != 0 || cu.primaryCtxRetain(&c, dev) != 0)
      return rmaw_fail(err, errlen, "cannot find the CUDA context of this memory");
  }
  if (copyContext && cu.memRetain && cu.memRelease && vmm(ptr)) {
    CUcontext own = copy_context(c);
    if (own) c = own;
  }
  *ctx = (uintptr_t)c;
  return 0;
}

/* rmaw_cuda_ordinal is the device ordinal of a CUDA address (-1: none). */
int rmaw_cuda_ordinal(uint64_t ptr) {
  int o = -1;
  if (cu.pointerGetAttribute(&o, ATTR_DEVICE_ORDINAL, (CUdeviceptr)ptr) != 0) return -1;
  return o;
}

/* Synchronous copies run on one of the context's copy streams, made with
 * its shared stream (ctx_stream) and never on the data path: creating a
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
  ctxstream* e = ctx_stream(ctx, r); /* makes ctx current */
  if (!e) return -1;
  int i = copy_take(e);
  CUstream s = e->copy[i];
  void* h = (void*)(uintptr_t)(kind == COPY_DTOH ? dst : src);
  *r = kind == COPY_HTOD   ? cu.htod((CUdeviceptr)dst, h, (size_t)n, s)
       : kind == COPY_DTOH ? cu.dtoh(h, (CUdeviceptr)src, (size_t)n, s)
                           : cu.dtod((CUdeviceptr)dst, (CUdeviceptr)src, (size_t)n, s);
  if (*r == 0) *r = cu.streamSynchronize(s);
  pthread_mutex_unlock(&e->cmu[i]);
  return 0;
}

static int cuda_copy(uintptr_t ctx, int to_device, void* host, uint64_t dev, uint64_t n, char* err,
                     size_t errlen) {
  CUresult r;
  uint64_t h = (uint64_t)(uintptr_t)host;
  if (pool_copy(ctx, to_device ? COPY_HTOD : COPY_DTOH, to_device ? dev : h, to_device ? h : dev, n, &r) != 0)
    return rmaw_fail(err, errlen, "copy: no streams for the context: %s", errstr(r));
  if (r != 0)
    return rmaw_fail(err, errlen, "%s of %llu bytes: %s", to_device ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync",
                     (unsigned long long)n, errstr(r));
  return 0;
}

/* A device-to-device copy in one context, waited for, on a copy stream
 * as cuda_copy's: an operation of a rank to itself. Returns 1 (no
 * message) when the driver lacks cuMemcpyDtoDAsync_v2. */
static int cuda_copy_dtod(uintptr_t ctx, uint64_t dst, uint64_t src, uint64_t n, char* err, size_t errlen) {
  if (!cu.dtod) return 1;
  CUresult r;
  if (pool_copy(ctx, COPY_DTOD, dst, src, n, &r) != 0)
    return rmaw_fail(err, errlen, "copy: no streams for the context: %s", errstr(r));
  if (r != 0) return rmaw_fail(err, errlen, "cuMemcpyDtoDAsync of %llu bytes: %s", (unsigned long long)n, errstr(r));
  return 0;
}

/* The device agent (agent.h) around calls that can wait for a context's
 * kernels, and the host memory it may touch. */
struct agent;
static struct agent* ag_pause(uintptr_t ctx);
static void ag_resume(struct agent* a);
static void ag_pause_all(struct agent** out, int max);
static void ag_resume_all(struct agent** a, int max);
static void hr_add(void* p, uint64_t n);
static void hr_drop(void* p);
static int agentMode;

/* Portable page-locked memory: usable by copies of every context (and
 * reached by the device at the same address: UVA). */
static int cuda_host_alloc(uintptr_t ctx, uint64_t n, void** p, char* err, size_t errlen) {
  struct agent* a = ag_pause(ctx);
  CUresult r = cu.ctxSetCurrent((CUcontext)ctx);
  /* DEVICEMAP where the agent may run: cuMemHostGetDevicePointer, which
   * tells the agent's memory (hr_add), answers only for such memory. */
  if (r == 0) r = cu.memHostAlloc(p, (size_t)n, MEMHOSTALLOC_PORTABLE | (agentMode ? 2 : 0));
  ag_resume(a);
  if (r != 0) return rmaw_fail(err, errlen, "cuMemHostAlloc of %llu bytes: %s", (unsigned long long)n, errstr(r));
  hr_add(*p, n);
  return 0;
}

static void cuda_host_free(void* p) {
  struct agent* a[MAX_CTX];
  hr_drop(p);
  ag_pause_all(a, MAX_CTX);
  cu.memFreeHost(p);
  ag_resume_all(a, MAX_CTX);
}

/* Pins memory we mapped ourselves (the intra-node staging ring, shared
 * with another process), portable to every context. */
static int cuda_host_register(uintptr_t ctx, void* p, uint64_t n, char* err, size_t errlen) {
  if (!cu.memHostRegister) return rmaw_fail(err, errlen, "the driver has no cuMemHostRegister");
  struct agent* a = ag_pause(ctx);
  CUresult r = cu.ctxSetCurrent((CUcontext)ctx);
  /* DEVICEMAP where the agent may run, so that it reaches the ring. */
  if (r == 0) r = cu.memHostRegister(p, (size_t)n, MEMHOSTALLOC_PORTABLE | (agentMode ? 2 : 0));
  ag_resume(a);
  if (r != 0) return rmaw_fail(err, errlen, "cuMemHostRegister of %llu bytes: %s", (unsigned long long)n, errstr(r));
  if (agentMode) hr_add(p, n);
  return 0;
}

/* Called from threads with no context (closeColl's, a service goroutine's
 * at teardown): set the registering one. */
static void cuda_host_unregister(uintptr_t ctx, void* p) {
  hr_drop(p);
  struct agent* a = ag_pause(ctx);
  if (cu.memHostUnregister && cu.ctxSetCurrent((CUcontext)ctx) == 0) cu.memHostUnregister(p);
  ag_resume(a);
}

/* Exports [base, base+n) (page-aligned by the caller) as a DMA-BUF fd
 * (CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD), for a NIC that imports it. */
static int cuda_export_dmabuf(uintptr_t ctx, uint64_t base, uint64_t n, int* fd, char* err, size_t errlen) {
  if (!cu.getHandleForRange) return rmaw_fail(err, errlen, "the driver has no cuMemGetHandleForAddressRange");
  CUresult r = cu.ctxSetCurrent((CUcontext)ctx);
  if (r == 0) r = cu.getHandleForRange(fd, (CUdeviceptr)base, (size_t)n, 1, 0);
  if (r != 0)
    return rmaw_fail(err, errlen, "cuMemGetHandleForAddressRange of %llu bytes: %s", (unsigned long long)n, errstr(r));
  return 0;
}

/* The context stream: one non-blocking stream per context that every
 * thread's stream-ordered work (signal writes, atomic adds, asynchronous
 * copies, events) queues on, so that a signal queued after a payload copy
 * executes after it whichever thread queued either. Entries are published
 * with a release store of nctxs and found without a lock. */
static ctxstream ctxs[MAX_CTX];
static int nctxs;

/* The atomic add: one thread adds v to *p with atom.global.add.u64 (sm_50
 * PTX, which the driver compiles for any later GPU). membar.sys first
 * (harmless: the stream already orders the kernel after the copies queued
 * before it). */
static const char add64_ptx[] =
    ".version 6.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    ".visible .entry rmaw_add64(.param .u64 p, .param .u64 v)\n"
    "{\n"
    "  .reg .b64 %rd<4>;\n"
    "  ld.param.u64 %rd1, [p];\n"
    "  ld.param.u64 %rd2, [v];\n"
    "  membar.sys;\n"
    "  atom.global.add.u64 %rd3, [%rd1], %rd2;\n"
    "  ret;\n"
    "}\n";

/* Stream atomics. CUDA 13.1 added an atomic reduction to the stream memory
 * operations: an add queued on the stream like a stream write, run without
 * a kernel (so no SM: a kernel holding every SM while it spins on the
 * signal cannot starve it) and without a host wait. This file declares
 * the driver's types from the documented layout, and the data-type enum's
 * values are not among the documented facts it was written from, so
 * reduce_probe verifies one before the data path uses it: at the
 * context's first use (registration, through staging.Prewarm), each
 * candidate is tried on a scratch pair of words in the same batch shape
 * the data path queues (a system-scope barrier, then the add), and kept
 * only if two adds carried across bit 32 exactly as a 64-bit add does and
 * left the next word alone. A driver that refuses every candidate, or
 * computes anything else, leaves the other paths in place (INFO line).
 * Candidates: the unsigned and 64-bit scalar bits of CUatomicOperation-
 * Capability (2 | 16), as the operation enum reuses CUatomicOperation's
 * values, then the first two of a plain enumeration. */
static const uint32_t reduceCandidates[] = {18, 1, 2};
static char reduceNote[240] = "not probed (no CUDA context used yet)";

/* streamAtomic: probe and use stream atomics (NCCL_RMA_WASM_STREAM_ATOMIC). */
static int streamAtomic = 1;

void rmaw_cuda_stream_atomic(int on) { streamAtomic = on; }

static void reduce_fill(memop* ops, uint32_t ty, CUdeviceptr w, uint64_t v) {
  memset(ops, 0, 2 * sizeof *ops);
  ops[0].reduce.operation = MEMOP_BARRIER; /* flags 0: system scope */
  ops[1].reduce.operation = MEMOP_ATOMIC_REDUCTION;
  ops[1].reduce.reductionOp = REDUCTION_OP_ADD;
  ops[1].reduce.dataType = ty;
  ops[1].reduce.address = (uint64_t)w;
  ops[1].reduce.value = v;
}

/* reduce_probe sets e->reduceTy (under mu, ctx current). The scratch words
 * are never freed: cuMemFree can synchronize the device, and a kernel of
 * the application may be waiting for a signal. */
static void reduce_probe(ctxstream* e, int have_dev, CUdevice dev) {
  int v = 0;
  CUresult r = 0;
  if (!streamAtomic) {
    snprintf(reduceNote, sizeof reduceNote, "off (NCCL_RMA_WASM_STREAM_ATOMIC=0)");
    return;
  }
  if (!cu.batchMemOp || !cu.memAlloc) {
    snprintf(reduceNote, sizeof reduceNote, "the driver has no cuStreamBatchMemOp_v2");
    return;
  }
  if (!have_dev || (r = cu.deviceGetAttribute(&v, ATTR_ATOMIC_REDUCTION, dev)) != 0 || !v) {
    snprintf(reduceNote, sizeof reduceNote, "the device reports no stream atomic reductions (attribute %d: %d, status %d)",
             ATTR_ATOMIC_REDUCTION, v, r);
    return;
  }
  CUdeviceptr w = 0;
  if ((r = cu.memAlloc(&w, 32)) != 0) { /* one 32-byte sector; two words used */
    snprintf(reduceNote, sizeof reduceNote, "no scratch word to verify them on (cuMemAlloc: %s)", errstr(r));
    return;
  }
  const uint64_t guard = 0x5a5a5a5a5a5a5a5aull, want = 0x300000003ull;
  int n = 0;
  for (size_t i = 0; i < sizeof reduceCandidates / sizeof reduceCandidates[0]; i++) {
    uint32_t ty = reduceCandidates[i];
    uint64_t init[2] = {0xffffffffull, guard}, got[2] = {0, 0};
    memop a[2], b[2];
    reduce_fill(a, ty, w, 1);
    reduce_fill(b, ty, w, 0x200000003ull);
    r = cu.htod(w, init, sizeof init, e->stream);
    if (r == 0) r = cu.batchMemOp(e->stream, 2, a, 0);
    if (r == 0) r = cu.batchMemOp(e->stream, 2, b, 0);
    if (r == 0) r = cu.dtoh(got, w, sizeof got, e->stream);
    CUresult rs = cu.streamSynchronize(e->stream); /* nothing queued outlives init and got */
    if (r == 0) r = rs;
    if (r == 0 && got[0] == want && got[1] == guard) {
      e->reduceTy = ty;
      snprintf(reduceNote, sizeof reduceNote, "stream atomic adds (cuStreamBatchMemOp_v2, data type %u verified as 64-bit)", ty);
      return;
    }
    n += snprintf(reduceNote + n, n < (int)sizeof reduceNote ? sizeof reduceNote - n : 0, "%stype %u: %s",
                  i ? "; " : "no data type verified as a 64-bit add: ", ty,
                  r ? errstr(r) : got[1] != guard ? "wrote past the word" : "not a 64-bit add");
  }
}

/* rmaw_cuda_stream_atomic_note copies what reduce_probe found last. */
void rmaw_cuda_stream_atomic_note(char* out, size_t n) {
  pthread_mutex_lock(&mu);
  snprintf(out, n, "%s", reduceNote);
  pthread_mutex_unlock(&mu);
}

/* ctx_stream makes ctx current and returns its stream entry, creating it
 * (and probing what its device supports) on first use; NULL with *r set
 * on failure. */
static ctxstream* ctx_stream(uintptr_t ctx, CUresult* r) {
  *r = cu.ctxSetCurrent((CUcontext)ctx);
  if (*r != 0) return NULL;
  int n = __atomic_load_n(&nctxs, __ATOMIC_ACQUIRE);
  for (int i = 0; i < n; i++)
    if (ctxs[i].ctx == (CUcontext)ctx) return &ctxs[i];
  pthread_mutex_lock(&mu);
  ctxstream* e = NULL;
  for (int i = 0; i < nctxs; i++)
    if (ctxs[i].ctx == (CUcontext)ctx) e = &ctxs[i];
  if (!e && nctxs == MAX_CTX) *r = 2; /* CUDA_ERROR_OUT_OF_MEMORY */
  if (!e && nctxs < MAX_CTX) {
    e = &ctxs[nctxs];
    memset(e, 0, sizeof *e);
    e->ctx = (CUcontext)ctx;
    *r = cu.streamCreate(&e->stream, STREAM_NON_BLOCKING);
    for (int i = 0; *r == 0 && i < NCOPY; i++) {
      *r = cu.streamCreate(&e->copy[i], STREAM_NON_BLOCKING);
      pthread_mutex_init(&e->cmu[i], NULL);
    }
    if (*r != 0) {
      e = NULL; /* the streams made so far stay: a failing context is not retried */
    } else {
      CUdevice dev = 0;
      int v = 0;
      int have_dev = cu.ctxGetDevice && cu.deviceGetAttribute && cu.ctxGetDevice(&dev) == 0;
      if (cu.writeValue64 && have_dev && cu.deviceGetAttribute(&v, cu.writeValueAttr, dev) == 0 && v)
        e->caps |= RMAW_CAP_WRITE64;
      if (cu.eventCreate && cu.eventRecord && cu.eventQuery && cu.eventDestroy) e->caps |= RMAW_CAP_ASYNC;
      reduce_probe(e, have_dev, dev);
      if (e->reduceTy) e->caps |= RMAW_CAP_STREAM_ATOMIC;
      /* The kernel's module is loaded on its first use (cuda_add64), never
       * here: loading a module can synchronize the context (CUDA lazy
       * loading), and this runs on the data path, where a kernel of the
       * application may be spinning on the very signal being applied
       * (NCCL's ncclWaitSignal under MPS hung here). */
      if (cu.moduleLoadData && cu.moduleGetFunction && cu.launchKernel) e->caps |= RMAW_CAP_ADD64;
      __atomic_store_n(&nctxs, nctxs + 1, __ATOMIC_RELEASE);
    }
  }
  pthread_mutex_unlock(&mu);
  return e;
}

#include "agent.h"

/* With the agent running, the context writes, adds and copies small
 * payloads through it: no SM to find, no submission to wait for. */
static int cuda_caps(uintptr_t ctx) {
  CUresult r;
  ctxstream* e = ctx_stream(ctx, &r);
  if (!e) return 0;
  return e->caps | (ag_live(e) ? RMAW_CAP_WRITE64 | RMAW_CAP_STREAM_ATOMIC | RMAW_CAP_ASYNC : 0);
}

/* on_stream locks e's agent, if any (*a, NULL: none), and makes the
 * stream's next work wait for the agent's commands; on failure it unlocks
 * and returns -1. off_stream records whether the stream got work and
 * unlocks. */
static int on_stream(ctxstream* e, struct agent** a, char* err, size_t errlen) {
  *a = __atomic_load_n(&e->ag, __ATOMIC_ACQUIRE);
  if (!*a) return 0;
  pthread_mutex_lock(&(*a)->mu);
  if ((*a)->live && ag_lead(e, err, errlen) != 0) {
    pthread_mutex_unlock(&(*a)->mu);
    return -1;
  }
  return 0;
}
static void off_stream(struct agent* a, int queued) {
  if (!a) return;
  if (queued) a->streamLast = 1;
  pthread_mutex_unlock(&a->mu);
}

#define CTX_STREAM(e, what)           \
  CUresult r;                         \
  ctxstream* e = ctx_stream(ctx, &r); \
  if (!e) return rmaw_fail(err, errlen, "%s: no stream for the context: %s", what, errstr(r))

static int cuda_write64(uintptr_t ctx, uint64_t dev, uint64_t v, char* err, size_t errlen) {
  CTX_STREAM(e, "cuStreamWriteValue64");
  if (ag_live(e)) {
    if (dev & 7) return rmaw_fail(err, errlen, "signal word %#llx not 8-byte aligned", (unsigned long long)dev);
    return ag_submit(e, AG_WRITE, 8, 0, dev, v, err, errlen);
  }
  /* Flags 0: the write is ordered after the stream's earlier work and
   * preceded by a memory barrier. */
  r = cu.writeValue64(e->stream, (CUdeviceptr)dev, (unsigned long long)v, 0);
  if (r != 0) return rmaw_fail(err, errlen, "cuStreamWriteValue64: %s", errstr(r));
  return 0;
}

static int cuda_add64(uintptr_t ctx, uint64_t dev, uint64_t v, char* err, size_t errlen) {
  CTX_STREAM(e, "atomic add");
  if (ag_live(e)) {
    if (dev & 7) return rmaw_fail(err, errlen, "signal word %#llx not 8-byte aligned", (unsigned long long)dev);
    return ag_submit(e, AG_ADD, 8, 0, dev, v, err, errlen);
  }
  if (e->reduceTy) {
    memop ops[2];
    reduce_fill(ops, e->reduceTy, (CUdeviceptr)dev, v);
    r = cu.batchMemOp(e->stream, 2, ops, 0);
    if (r != 0) return rmaw_fail(err, errlen, "cuStreamBatchMemOp_v2 (atomic add): %s", errstr(r));
    return 0;
  }
  if (!__atomic_load_n(&e->add, __ATOMIC_ACQUIRE)) {
    /* Only NCCL_RMA_WASM_DEVICE_ATOMIC=1 gets here: the one place a module
     * is loaded, and the reason that switch is documented as needing no
     * kernel to spin on the signal meanwhile. */
    pthread_mutex_lock(&mu);
    void* mod = NULL;
    void* f = e->add;
    if (!f && cu.moduleLoadData(&mod, add64_ptx) == 0) cu.moduleGetFunction(&f, mod, "rmaw_add64");
    if (f) __atomic_store_n(&e->add, f, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&mu);
    if (!f) return rmaw_fail(err, errlen, "no atomic-add kernel for this context (cuModuleLoadData of its PTX failed)");
  }
  unsigned long long p = dev, x = v;
  void* args[] = {&p, &x}; /* copied by the launch */
  r = cu.launchKernel(e->add, 1, 1, 1, 1, 1, 1, 0, e->stream, args, NULL);
  if (r != 0) return rmaw_fail(err, errlen, "cuLaunchKernel (atomic add): %s", errstr(r));
  return 0;
}

static int cuda_copy_async(uintptr_t ctx, int to_device, void* host, uint64_t dev, uint64_t n, char* err,
                           size_t errlen) {
  CTX_STREAM(e, "asynchronous copy");
  if (ag_live(e) && n <= agentMax && hr_ok(host, n)) {
    uint64_t h = (uint64_t)(uintptr_t)host;
    return to_device ? ag_submit(e, AG_COPY, n, h, dev, 0, err, errlen) : ag_submit(e, AG_COPY, n, dev, h, 0, err, errlen);
  }
  struct agent* a;
  if (on_stream(e, &a, err, errlen) != 0) return -1;
  r = to_device ? cu.htod((CUdeviceptr)dev, host, (size_t)n, e->stream)
                : cu.dtoh(host, (CUdeviceptr)dev, (size_t)n, e->stream);
  off_stream(a, r == 0);
  if (r != 0)
    return rmaw_fail(err, errlen, "%s of %llu bytes: %s", to_device ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync",
                     (unsigned long long)n, errstr(r));
  return 0;
}

static int cuda_copy_dtod_async(uintptr_t ctx, uint64_t dst, uint64_t src, uint64_t n, char* err, size_t errlen) {
  if (!cu.dtod) return 1;
  CTX_STREAM(e, "asynchronous device-to-device copy");
  struct agent* a;
  if (on_stream(e, &a, err, errlen) != 0) return -1;
  r = cu.dtod((CUdeviceptr)dst, (CUdeviceptr)src, (size_t)n, e->stream);
  off_stream(a, r == 0);
  if (r != 0) return rmaw_fail(err, errlen, "cuMemcpyDtoDAsync of %llu bytes: %s", (unsigned long long)n, errstr(r));
  return 0;
}

static int cuda_event_record(uintptr_t ctx, uintptr_t* ev, char* err, size_t errlen) {
  CTX_STREAM(e, "cuEventRecord");
  struct agent* a = ag_live(e);
  if (a && (*ev == 0 || (*ev & 1))) {
    /* A ticket: the agent's last command, after the stream's work. */
    pthread_mutex_lock(&a->mu);
    int rc = a->live ? ag_follow(e, err, errlen) : rmaw_fail(err, errlen, "the device agent stopped");
    if (rc == 0) *ev = (uintptr_t)(a->seq << 1 | 1);
    pthread_mutex_unlock(&a->mu);
    return rc;
  }
  if (on_stream(e, &a, err, errlen) != 0) return -1;
  off_stream(a, 0);
  if (*ev & 1) *ev = 0; /* a ticket of an agent that stopped since */
  if (!*ev) {
    void* x = NULL;
    r = cu.eventCreate(&x, EVENT_DISABLE_TIMING);
    if (r != 0) return rmaw_fail(err, errlen, "cuEventCreate: %s", errstr(r));
    *ev = (uintptr_t)x;
  }
  r = cu.eventRecord((void*)*ev, e->stream);
  if (r != 0) return rmaw_fail(err, errlen, "cuEventRecord: %s", errstr(r));
  return 0;
}

/* cuEventQuery needs no current context. */
static int cuda_event_query(uintptr_t ctx, uintptr_t ev) {
  if (ev & 1) return ag_ticket(ctx, ev);
  CUresult r = cu.eventQuery((void*)ev);
  return r == 0 ? 1 : r == ERROR_NOT_READY ? 0 : -1;
}

static void cuda_event_destroy(uintptr_t ctx, uintptr_t ev) {
  if (ev && !(ev & 1) && cu.ctxSetCurrent((CUcontext)ctx) == 0) cu.eventDestroy((void*)ev);
}

static int cuda_stream_sync(uintptr_t ctx, char* err, size_t errlen) {
  CTX_STREAM(e, "cuStreamSynchronize");
  struct agent* a;
  if (on_stream(e, &a, err, errlen) != 0) return -1;
  off_stream(a, 0);
  r = cu.streamSynchronize(e->stream);
  if (r != 0) return rmaw_fail(err, errlen, "cuStreamSynchronize: %s", errstr(r));
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
  return cu.memRetain && cu.memRelease && cu.memExport && cu.memImport && cu.addressReserve && cu.addressFree &&
         cu.memMap && cu.memUnmap && cu.memSetAccess && cu.ctxGetDevice;
}

static int cuda_ipc_export(uintptr_t ctx, uint64_t ptr, uint64_t size, int max, rmaw_ipc_seg* segs, int* n, char* err,
                           size_t errlen) {
  *n = 0;
  if (!ipc_ready()) return rmaw_fail(err, errlen, "the driver lacks the cuMem IPC calls");
  CUresult r = cu.ctxSetCurrent((CUcontext)ctx);
  if (r != 0) return rmaw_fail(err, errlen, "cuCtxSetCurrent: %s", errstr(r));
  uint64_t end = ptr + (size ? size : 1);
  for (uint64_t p = ptr; p < end;) {
    CUdeviceptr base = 0;
    size_t len = 0;
    unsigned long long h = 0;
    const char* what = NULL;
    if (*n == max) what = "too many allocations";
    else if ((r = cu.memGetAddressRange(&base, &len, (CUdeviceptr)p)) != 0 || base + len <= p) what = "cuMemGetAddressRange";
    else if (*n > 0 && base != segs[*n - 1].base + segs[*n - 1].size) what = "allocations not back to back";
    else if ((r = cu.memRetain(&h, (void*)(uintptr_t)base)) != 0) what = "cuMemRetainAllocationHandle (not a cuMem allocation)";
    else {
      int fd = -1;
      r = cu.memExport(&fd, h, HANDLE_POSIX_FD, 0);
      cu.memRelease(h);
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
    return rmaw_fail(err, errlen, "export of allocation %d: %s%s%s", k, what, r ? ": " : "", r ? errstr(r) : "");
  }
  return 0;
}

/* cuda_ipc_unmap unmaps each segment (cuMemUnmap takes what one cuMemMap
 * mapped), then frees the reservation; it goes on past a failure and
 * reports the first. */
static int cuda_ipc_unmap_now(uintptr_t ctx, uint64_t va, int n, const uint64_t* sizes, char* err, size_t errlen);
static int cuda_ipc_unmap(uintptr_t ctx, uint64_t va, int n, const uint64_t* sizes, char* err, size_t errlen) {
  struct agent* a = ag_pause(ctx);
  int rc = cuda_ipc_unmap_now(ctx, va, n, sizes, err, errlen);
  ag_resume(a);
  return rc;
}
static int cuda_ipc_unmap_now(uintptr_t ctx, uint64_t va, int n, const uint64_t* sizes, char* err, size_t errlen) {
  if (!ipc_ready()) return rmaw_fail(err, errlen, "the driver lacks the cuMem IPC calls");
  CUresult r = cu.ctxSetCurrent((CUcontext)ctx), first = r;
  const char* what = r ? "cuCtxSetCurrent" : NULL;
  uint64_t off = 0;
  for (int i = 0; i < n; i++) {
    if ((r = cu.memUnmap((CUdeviceptr)(va + off), (size_t)sizes[i])) != 0 && !what) {
      what = "cuMemUnmap";
      first = r;
    }
    off += sizes[i];
  }
  if ((r = cu.addressFree((CUdeviceptr)va, (size_t)off)) != 0 && !what) {
    what = "cuMemAddressFree";
    first = r;
  }
  if (what) return rmaw_fail(err, errlen, "%s of %llu bytes at %#llx: %s", what, (unsigned long long)off, (unsigned long long)va, errstr(first));
  return 0;
}

static int cuda_ipc_import_now(uintptr_t ctx, int n, const rmaw_ipc_seg* segs, uint64_t* va, char* err, size_t errlen);
static int cuda_ipc_import(uintptr_t ctx, int n, const rmaw_ipc_seg* segs, uint64_t* va, char* err, size_t errlen) {
  struct agent* a = ag_pause(ctx);
  int rc = cuda_ipc_import_now(ctx, n, segs, va, err, errlen);
  ag_resume(a);
  return rc;
}
static int cuda_ipc_import_now(uintptr_t ctx, int n, const rmaw_ipc_seg* segs, uint64_t* va, char* err, size_t errlen) {
  *va = 0;
  if (!ipc_ready()) return rmaw_fail(err, errlen, "the driver lacks the cuMem IPC calls");
  CUdevice dev = 0;
  CUresult r = cu.ctxSetCurrent((CUcontext)ctx);
  if (r == 0) r = cu.ctxGetDevice(&dev);
  if (r != 0) return rmaw_fail(err, errlen, "the context's device: %s", errstr(r));
  uint64_t span = 0;
  for (int i = 0; i < n; i++) {
    if (segs[i].fd < 0) return rmaw_fail(err, errlen, "segment %d has no POSIX fd", i);
    span += segs[i].size;
  }
  CUdeviceptr base = 0;
  if ((r = cu.addressReserve(&base, (size_t)span, 0, 0, 0)) != 0)
    return rmaw_fail(err, errlen, "cuMemAddressReserve of %llu bytes: %s", (unsigned long long)span, errstr(r));
  int mapped = 0;
  uint64_t off = 0;
  const char* what = NULL;
  for (; mapped < n; mapped++) {
    unsigned long long h = 0;
    if ((r = cu.memImport(&h, (void*)(uintptr_t)segs[mapped].fd, HANDLE_POSIX_FD)) != 0) {
      what = "cuMemImportFromShareableHandle";
      break;
    }
    r = cu.memMap(base + off, (size_t)segs[mapped].size, 0, h, 0);
    cu.memRelease(h); /* the mapping holds the memory now */
    if (r != 0) {
      what = "cuMemMap";
      break;
    }
    off += segs[mapped].size;
  }
  if (!what) {
    accessDesc a = {LOC_DEVICE, dev, ACCESS_RW};
    if ((r = cu.memSetAccess(base, (size_t)span, &a, 1)) != 0) what = "cuMemSetAccess";
  }
  if (what) {
    off = 0;
    for (int i = 0; i < mapped; i++) {
      cu.memUnmap(base + off, (size_t)segs[i].size);
      off += segs[i].size;
    }
    cu.addressFree(base, (size_t)span);
    return rmaw_fail(err, errlen, "import of allocation %d of %d: %s: %s", mapped, n, what, errstr(r));
  }
  *va = base;
  return 0;
}

/* Interprocess events (CU_EVENT_INTERPROCESS, which needs
 * CU_EVENT_DISABLE_TIMING): the target of a mapped put makes its stream
 * wait for the sender's copy instead of the sender waiting for it. */
enum { EVENT_INTERPROCESS = 4 };

static int cuda_ipc_event_new(uintptr_t ctx, uintptr_t* ev, unsigned char* handle, char* err, size_t errlen) {
  if (!cu.ipcGetEventHandle || !cu.eventCreate) return rmaw_fail(err, errlen, "the driver lacks cuIpcGetEventHandle");
  CUresult r = cu.ctxSetCurrent((CUcontext)ctx);
  void* e = NULL;
  if (r == 0) r = cu.eventCreate(&e, EVENT_DISABLE_TIMING | EVENT_INTERPROCESS);
  if (r != 0) return rmaw_fail(err, errlen, "cuEventCreate (interprocess): %s", errstr(r));
  if ((r = cu.ipcGetEventHandle(handle, e)) != 0) {
    cu.eventDestroy(e);
    return rmaw_fail(err, errlen, "cuIpcGetEventHandle: %s", errstr(r));
  }
  *ev = (uintptr_t)e;
  return 0;
}

static int cuda_ipc_event_open(uintptr_t ctx, const unsigned char* handle, uintptr_t* ev, char* err, size_t errlen) {
  if (!cu.ipcOpenEventHandle) return rmaw_fail(err, errlen, "the driver lacks cuIpcOpenEventHandle");
  cuIpcEventHandle h;
  memcpy(h.reserved, handle, sizeof h.reserved);
  void* e = NULL;
  CUresult r = cu.ctxSetCurrent((CUcontext)ctx);
  if (r == 0) r = cu.ipcOpenEventHandle(&e, h);
  if (r != 0) return rmaw_fail(err, errlen, "cuIpcOpenEventHandle: %s", errstr(r));
  *ev = (uintptr_t)e;
  return 0;
}

static int cuda_stream_wait(uintptr_t ctx, uintptr_t ev, char* err, size_t errlen) {
  if (!cu.streamWaitEvent) return rmaw_fail(err, errlen, "the driver lacks cuStreamWaitEvent");
  CTX_STREAM(e, "cuStreamWaitEvent");
  struct agent* a;
  if (on_stream(e, &a, err, errlen) != 0) return -1;
  r = cu.streamWaitEvent(e->stream, (void*)ev, 0);
  off_stream(a, r == 0); /* the agent's next command follows the wait */
  if (r != 0) return rmaw_fail(err, errlen, "cuStreamWaitEvent: %s", errstr(r));
  return 0;
}

/* The CUDA driver's entries of the ops table package devrt calls through. */
const rmaw_devrt_ops rmaw_cuda_ops = RMAW_DEVRT_OPS(cuda);

/* GDRCopy (libgdrapi.so, loaded at run time and never linked): device
 * signal words are updated through a CPU mapping of their 64 KiB GPU page
 * (BAR1) instead of two copies. Pages are pinned and mapped on first use
 * and kept in a small table; a page that cannot be pinned (not 64 KiB
 * aligned inside one cuMemAlloc allocation, VMM memory with an old
 * gdrdrv) is remembered as such and its words keep the copy path. All
 * accesses hold gmu, so Forget (deregistration) never unmaps a page under
 * a write. */
typedef struct {
  unsigned long h;
} gdr_mh_t;
static struct {
  void* (*open)(void);
  int (*pin)(void*, unsigned long, size_t, uint64_t, uint32_t, gdr_mh_t*);
  int (*unpin)(void*, gdr_mh_t);
  int (*map)(void*, gdr_mh_t, void**, size_t);
  int (*unmap)(void*, gdr_mh_t, void*, size_t);
  int (*callbackFlag)(void*, gdr_mh_t, int*); /* optional */
  CUresult (*setAttr)(const void*, int, CUdeviceptr); /* cuPointerSetAttribute, optional */
} gdr;
static void* gdrh;

#define GDR_PAGE ((uint64_t)1 << 16)
#define GDR_MAX 256
enum { ATTR_SYNC_MEMOPS = 6 };
static pthread_mutex_t gmu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  uint64_t page;
  int ok; /* 1 mapped, 0 cannot be mapped */
  gdr_mh_t mh;
  void* va;
} gmaps[GDR_MAX];
static int ngmaps;

int rmaw_gdr_open(char* err, size_t errlen) {
  void* h = dlopen("libgdrapi.so", RTLD_NOW | RTLD_LOCAL);
  if (!h) h = dlopen("libgdrapi.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!h) return rmaw_fail(err, errlen, "%s", dlerror());
#define SYM(field, name)                                                           \
  do {                                                                             \
    *(void**)&gdr.field = dlsym(h, name);                                          \
    if (!gdr.field) return rmaw_fail(err, errlen, "libgdrapi.so has no %s", name); \
  } while (0)
  SYM(open, "gdr_open");
  SYM(pin, "gdr_pin_buffer");
  SYM(unpin, "gdr_unpin_buffer");
  SYM(map, "gdr_map");
  SYM(unmap, "gdr_unmap");
#undef SYM
  *(void**)&gdr.callbackFlag = dlsym(h, "gdr_get_callback_flag");
  void* cudaLib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (cudaLib) *(void**)&gdr.setAttr = dlsym(cudaLib, "cuPointerSetAttribute");
  gdrh = gdr.open();
  if (!gdrh) return rmaw_fail(err, errlen, "gdr_open failed (is the gdrdrv module loaded, /dev/gdrdrv readable?)");
  return 0;
}

static void gdr_drop(int i) {
  if (gmaps[i].ok) {
    gdr.unmap(gdrh, gmaps[i].mh, gmaps[i].va, GDR_PAGE);
    gdr.unpin(gdrh, gmaps[i].mh);
  }
  gmaps[i] = gmaps[--ngmaps];
}

/* gdr_entry returns the table slot of page, mapping it first; -1 when the
 * table is full. Called with gmu held. */
static int gdr_entry(uintptr_t ctx, uint64_t page) {
  for (int i = 0; i < ngmaps; i++)
    if (gmaps[i].page == page) {
      int flag = 0;
      /* Freed and invalidated by the driver since: map again. */
      if (gmaps[i].ok && gdr.callbackFlag && gdr.callbackFlag(gdrh, gmaps[i].mh, &flag) == 0 && flag) {
        gdr_drop(i);
        break;
      }
      return i;
    }
  if (ngmaps == GDR_MAX) return -1;
  int i = ngmaps++;
  gmaps[i].page = page;
  gmaps[i].ok = 0;
  gmaps[i].va = NULL;
  CUdeviceptr base = 0;
  size_t n = 0;
  if (cu.ctxSetCurrent((CUcontext)ctx) != 0 || cu.memGetAddressRange(&base, &n, (CUdeviceptr)page) != 0 ||
      page < base || page + GDR_PAGE > base + n)
    return i;
  if (gdr.setAttr) {
    unsigned one = 1; /* GDRCopy's rule: copies of this memory complete before they return */
    gdr.setAttr(&one, ATTR_SYNC_MEMOPS, base);
  }
  if (gdr.pin(gdrh, (unsigned long)page, GDR_PAGE, 0, 0, &gmaps[i].mh) != 0) return i;
  if (gdr.map(gdrh, gmaps[i].mh, &gmaps[i].va, GDR_PAGE) != 0) {
    gdr.unpin(gdrh, gmaps[i].mh);
    return i;
  }
  gmaps[i].ok = 1;
  return i;
}

/* rmaw_gdr_add adds v to the word at addr through the mapping: 1 done, 0
 * this word takes the copy path. */
int rmaw_gdr_add(uintptr_t ctx, uint64_t addr, uint64_t v) {
  uint64_t page = addr & ~(GDR_PAGE - 1);
  if ((addr & 7) != 0) return 0;
  pthread_mutex_lock(&gmu);
  int i = gdr_entry(ctx, page);
  if (i < 0 || !gmaps[i].ok) {
    pthread_mutex_unlock(&gmu);
    return 0;
  }
  volatile uint64_t* w = (volatile uint64_t*)((char*)gmaps[i].va + (addr - page));
  uint64_t x = *w;
  *w = x + v;
  /* Drain the write-combining buffer: the store leaves for the GPU now. */
  __sync_synchronize();
  pthread_mutex_unlock(&gmu);
  return 1;
}

/* rmaw_gdr_forget unmaps every page that overlaps [addr, addr+size). */
void rmaw_gdr_forget(uint64_t addr, uint64_t size) {
  pthread_mutex_lock(&gmu);
  for (int i = 0; i < ngmaps;)
    if (gmaps[i].page < addr + size && gmaps[i].page + GDR_PAGE > addr) gdr_drop(i);
    else i++;
  pthread_mutex_unlock(&gmu);
}
