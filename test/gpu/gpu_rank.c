/* gpu_rank.c: the shared part of the GPU test programs (see gpu_rank.h). */
#include "gpu_rank.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

cuda_calls_t cu;
const char* who = "main";

double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void cuda_open(void) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) FAIL("dlopen libcuda.so.1: %s", dlerror());
#define SYM(f, n) \
  if (!(*(void**)&cu.f = dlsym(h, n))) FAIL("libcuda.so.1 has no %s", n)
  SYM(init, "cuInit");
  SYM(deviceGet, "cuDeviceGet");
  SYM(primaryCtxRetain, "cuDevicePrimaryCtxRetain");
  SYM(ctxSetCurrent, "cuCtxSetCurrent");
  SYM(memAlloc, "cuMemAlloc_v2");
  SYM(memFree, "cuMemFree_v2");
  SYM(memHostAlloc, "cuMemHostAlloc");
  SYM(memFreeHost, "cuMemFreeHost");
  SYM(htod, "cuMemcpyHtoD_v2");
  SYM(dtoh, "cuMemcpyDtoH_v2");
  SYM(htodAsync, "cuMemcpyHtoDAsync_v2");
  SYM(dtohAsync, "cuMemcpyDtoHAsync_v2");
  SYM(streamCreate, "cuStreamCreate");
  SYM(streamSynchronize, "cuStreamSynchronize");
#undef SYM
  CU(cu.init(0));
  int dev;
  void* ctx;
  CU(cu.deviceGet(&dev, 0));
  CU(cu.primaryCtxRetain(&ctx, dev));
  CU(cu.ctxSetCurrent(ctx));
}

/* AMD HIP instead of CUDA (SAMPLE_RUNTIME=hip): the same entry points,
 * mapped onto libamdhip64.so, rank r on device r % count. RCCL hands HIP
 * memory to the plugin as NCCL_PTR_CUDA, as this does. */
static struct {
  int (*init)(unsigned);
  int (*count)(int*);
  int (*setDevice)(int);
  int (*malloc)(void**, size_t);
  int (*free)(void*);
  int (*memcpy)(void*, const void*, size_t, int); /* kind 1: to device, 2: to host */
} hipr;
static CUresult hip_alloc(CUdeviceptr* p, size_t n) { return hipr.malloc((void**)p, n); }
static CUresult hip_free(CUdeviceptr p) { return hipr.free((void*)(uintptr_t)p); }
static CUresult hip_htod(CUdeviceptr d, const void* h, size_t n) { return hipr.memcpy((void*)(uintptr_t)d, h, n, 1); }
static CUresult hip_dtoh(void* h, CUdeviceptr d, size_t n) { return hipr.memcpy(h, (void*)(uintptr_t)d, n, 2); }

bool hip_mode(void) {
  const char* s = getenv("SAMPLE_RUNTIME");
  return s && strcmp(s, "hip") == 0;
}

int device_open(int rank) {
  if (!hip_mode()) {
    cuda_open();
    return 0;
  }
  void* h = dlopen("libamdhip64.so", RTLD_NOW | RTLD_LOCAL);
  if (!h) FAIL("dlopen libamdhip64.so: %s", dlerror());
#define SYM(f, n) \
  if (!(*(void**)&hipr.f = dlsym(h, n))) FAIL("libamdhip64.so has no %s", n)
  SYM(init, "hipInit");
  SYM(count, "hipGetDeviceCount");
  SYM(setDevice, "hipSetDevice");
  SYM(malloc, "hipMalloc");
  SYM(free, "hipFree");
  SYM(memcpy, "hipMemcpy");
#undef SYM
  int n = 0;
  CU(hipr.init(0));
  CU(hipr.count(&n));
  if (n < 1) FAIL("no HIP device");
  CU(hipr.setDevice(rank % n));
  cu.memAlloc = hip_alloc;
  cu.memFree = hip_free;
  cu.htod = hip_htod;
  cu.dtoh = hip_dtoh;
  return rank % n;
}

void xchg(int fd, const void* mine, void* theirs, size_t n) {
  if (write(fd, mine, n) != (ssize_t)n) FAIL("bootstrap write");
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char*)theirs + got, n - got);
    if (r <= 0) FAIL("bootstrap read (peer died?)");
    got += (size_t)r;
  }
}

void wait_req(const ncclRma_v15_t* t, void* coll, void* req) {
  int done = 0;
  double t0 = now();
  while (!done) {
    NC(t->test(coll, req, &done));
    if (now() - t0 > 60) FAIL("request did not complete in 60 s");
  }
}

const ncclRma_v15_t* open_plugin(const char* lib) {
  void* ph = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!ph) FAIL("dlopen %s: %s", lib, dlerror());
  const ncclRma_v15_t* t = dlsym(ph, "ncclRmaPlugin_v15");
  if (!t) FAIL("no ncclRmaPlugin_v15");
  return t;
}

void gpu_rank_connect(const ncclRma_v15_t* t, ncclDebugLogger_t logger, int rank, int fd, bool need_cuda,
                      gpu_rank_t* r) {
  NC(t->init(&r->pctx, 42, logger));
  if (need_cuda) {
    ncclNetProperties_v12_t p;
    NC(t->getProperties(0, &p));
    if (!(p.ptrSupport & NCCL_PTR_CUDA)) FAIL("ptrSupport %#x lacks NCCL_PTR_CUDA", p.ptrSupport);
  }
  char handles[2][NCCL_NET_HANDLE_MAXSIZE];
  void* listen;
  NC(t->listen(r->pctx, 0, handles[rank], &listen));
  xchg(fd, handles[rank], handles[1 - rank], NCCL_NET_HANDLE_MAXSIZE);
  void* hp[2] = {handles[0], handles[1]};
  NC(t->connect(r->pctx, hp, 2, rank, listen, &r->coll));
  NC(t->closeListen(listen));
  ncclRmaConfig_v15_t cfg = {1, -2147483647 - 1, 1};
  NC(t->createContext(r->coll, &cfg, &r->rma));
}

void gpu_rank_close(const ncclRma_v15_t* t, gpu_rank_t* r, void* const* mhs, int n) {
  for (int i = 0; i < n; i++) NC(t->deregMrSym(r->coll, mhs[i]));
  NC(t->destroyContext(r->rma));
  NC(t->closeColl(r->coll));
  NC(t->finalize(r->pctx));
}

vmm_calls_t vmm;

bool vmm_open(void) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) return false;
  *(void**)&vmm.granularity = dlsym(h, "cuMemGetAllocationGranularity");
  *(void**)&vmm.reserve = dlsym(h, "cuMemAddressReserve");
  *(void**)&vmm.create = dlsym(h, "cuMemCreate");
  *(void**)&vmm.map = dlsym(h, "cuMemMap");
  *(void**)&vmm.setAccess = dlsym(h, "cuMemSetAccess");
  *(void**)&vmm.unmap = dlsym(h, "cuMemUnmap");
  *(void**)&vmm.release = dlsym(h, "cuMemRelease");
  *(void**)&vmm.addressFree = dlsym(h, "cuMemAddressFree");
  *(void**)&vmm.rangeHandle = dlsym(h, "cuMemGetHandleForAddressRange");
  return vmm.granularity && vmm.reserve && vmm.create && vmm.map && vmm.setAccess && vmm.unmap && vmm.release &&
         vmm.addressFree;
}


CUresult vmm_alloc(size_t n, CUdeviceptr* out) {
  /* POSIX fds (requestedHandleTypes 1), as NCCL's ncclMemAlloc asks for,
   * so that the plugin can map the allocation into the other ranks of the
   * host; GPU_VMM_FD=0 makes one that cannot be shared. */
  int fd = !getenv("GPU_VMM_FD") || atoi(getenv("GPU_VMM_FD"));
  memProp prop = {.type = 1, .requestedHandleTypes = fd ? 1 : 0, .locType = 1, .locId = 0, .gpuDirectRDMACapable = 1};
  size_t gran = 0;
  CUmemHandle h;
  CUresult r = vmm.granularity(&gran, &prop, 0);
  if (r != 0) return r;
  n = (n + gran - 1) / gran * gran;
  if ((r = vmm.reserve(out, n, gran, 0, 0)) != 0) return r;
  if ((r = vmm.create(&h, n, &prop, 0)) != 0) return r;
  if ((r = vmm.map(*out, n, 0, h, 0)) != 0) return r;
  memAccess acc = {1, 0, 3};
  return vmm.setAccess(*out, n, &acc, 1);
}

CUresult htod_done(CUdeviceptr d, const void* h, size_t n) {
  CUresult r = cu.htod(d, h, n);
  unsigned char b;
  return r != 0 ? r : cu.dtoh(&b, d, 1);
}
