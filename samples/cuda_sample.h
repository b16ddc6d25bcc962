/* cuda_sample.h: what the device-memory samples (cuda_check.c,
 * staging_bench.c) share: the CUDA driver entry points they dlopen, the
 * failure macros, and the socketpair bootstrap between their two ranks.
 * Header-only on purpose: each sample stays one file to compile. */
#ifndef RMAW_CUDA_SAMPLE_H
#define RMAW_CUDA_SAMPLE_H

#include <dlfcn.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "rma_plugin.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
static struct {
  CUresult (*init)(unsigned);
  CUresult (*deviceGet)(int*, int);
  CUresult (*primaryCtxRetain)(void**, int);
  CUresult (*ctxSetCurrent)(void*);
  CUresult (*memAlloc)(CUdeviceptr*, size_t);
  CUresult (*memFree)(CUdeviceptr);
  CUresult (*memHostAlloc)(void**, size_t, unsigned);
  CUresult (*memFreeHost)(void*);
  CUresult (*htod)(CUdeviceptr, const void*, size_t);
  CUresult (*dtoh)(void*, CUdeviceptr, size_t);
  CUresult (*htodAsync)(CUdeviceptr, const void*, size_t, void*);
  CUresult (*dtohAsync)(void*, CUdeviceptr, size_t, void*);
  CUresult (*streamCreate)(void**, unsigned);
  CUresult (*streamSynchronize)(void*);
} cu;

/* who names the process in failure lines ("rank 1", "bounds"). */
static const char* who = "main";
#define FAIL(...)                     \
  do {                                \
    printf("[%s] RESULT FAIL ", who); \
    printf(__VA_ARGS__);              \
    printf("\n");                     \
    fflush(stdout);                   \
    _exit(1);                         \
  } while (0)
#define CU(x)                                         \
  do {                                                \
    CUresult r_ = (x);                                \
    if (r_ != 0) FAIL("%s -> CUDA error %d", #x, r_); \
  } while (0)
#define NC(x)                                        \
  do {                                               \
    ncclResult_t r_ = (x);                           \
    if (r_ != ncclSuccess) FAIL("%s -> %d", #x, r_); \
  } while (0)

static inline double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* cuda_open loads the driver (never linked, as the plugin does) and makes
 * device 0's primary context current. */
static inline void cuda_open(void) {
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
static inline CUresult hip_alloc(CUdeviceptr* p, size_t n) { return hipr.malloc((void**)p, n); }
static inline CUresult hip_free(CUdeviceptr p) { return hipr.free((void*)(uintptr_t)p); }
static inline CUresult hip_htod(CUdeviceptr d, const void* h, size_t n) { return hipr.memcpy((void*)(uintptr_t)d, h, n, 1); }
static inline CUresult hip_dtoh(void* h, CUdeviceptr d, size_t n) { return hipr.memcpy(h, (void*)(uintptr_t)d, n, 2); }

static inline bool hip_mode(void) {
  const char* s = getenv("SAMPLE_RUNTIME");
  return s && strcmp(s, "hip") == 0;
}

/* device_open opens CUDA (device 0) or, under SAMPLE_RUNTIME=hip, HIP
 * (device rank % count) and returns the device used. */
static inline int device_open(int rank) {
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

/* xchg swaps n bytes with the other rank over the socketpair bootstrap. */
static inline void xchg(int fd, const void* mine, void* theirs, size_t n) {
  if (write(fd, mine, n) != (ssize_t)n) FAIL("bootstrap write");
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char*)theirs + got, n - got);
    if (r <= 0) FAIL("bootstrap read (peer died?)");
    got += (size_t)r;
  }
}

/* wait_req tests a request until it completes, for at most 60 s. */
static inline void wait_req(const ncclRma_v15_t* t, void* coll, void* req) {
  int done = 0;
  double t0 = now();
  while (!done) {
    NC(t->test(coll, req, &done));
    if (now() - t0 > 60) FAIL("request did not complete in 60 s");
  }
}

/* open_plugin dlopens the library as NCCL does and returns its v15 table. */
static inline const ncclRma_v15_t* open_plugin(const char* lib) {
  void* ph = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!ph) FAIL("dlopen %s: %s", lib, dlerror());
  const ncclRma_v15_t* t = dlsym(ph, "ncclRmaPlugin_v15");
  if (!t) FAIL("no ncclRmaPlugin_v15");
  return t;
}

#endif
