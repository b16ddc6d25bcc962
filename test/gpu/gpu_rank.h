/* gpu_rank.h: what the GPU test programs (cuda_check.c, staging_bench.c)
 * share: the CUDA driver entry points they dlopen (or HIP's, mapped onto
 * them), the failure macros, the socketpair bootstrap between their two
 * ranks, and the one set-up of a rank's communicator the way RCCL drives
 * the plugin (init, listen, handle exchange, connect, createContext).
 * Definitions in gpu_rank.c; each program links it. */
#ifndef RMAW_GPU_RANK_H
#define RMAW_GPU_RANK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "rma_plugin.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
/* The driver calls the programs make, filled by device_open / cuda_open. */
typedef struct {
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
} cuda_calls_t;
extern cuda_calls_t cu;

/* htod_done copies n > 0 bytes to the device and returns once they are
 * there. cuMemcpyHtoD from pageable memory may return before its DMA
 * reached the device (the driver stages the bytes and lets the copy run
 * on), and a copy the plugin makes in another stream or context, told to
 * read them right after, could then read the old bytes: a one-byte
 * synchronous read-back on the same stream waits for the copy. */
CUresult htod_done(CUdeviceptr d, const void* h, size_t n);

/* who names the process in failure lines ("rank 1", "bounds"). */
extern const char* who;
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

/* now is CLOCK_MONOTONIC in seconds. */
double now(void);

/* cuda_open loads the driver (never linked, as the plugin does) and makes
 * device 0's primary context current. */
void cuda_open(void);

/* hip_mode: SAMPLE_RUNTIME=hip asks for AMD HIP instead of CUDA. */
bool hip_mode(void);

/* device_open opens CUDA (device 0) or, under SAMPLE_RUNTIME=hip, HIP
 * (device rank % count; cu's allocation and copy calls then map onto HIP's)
 * and returns the device used. */
int device_open(int rank);

/* xchg swaps n bytes with the other rank over the socketpair bootstrap. */
void xchg(int fd, const void* mine, void* theirs, size_t n);

/* wait_req tests a request until it completes, for at most 60 s. */
void wait_req(const ncclRma_v15_t* t, void* coll, void* req);

/* open_plugin dlopens the library as NCCL does and returns its v15 table. */
const ncclRma_v15_t* open_plugin(const char* lib);

/* One rank's communicator with the other rank, and its RMA context. */
typedef struct {
  void* pctx; /* init's plugin context */
  void* coll; /* connect's communicator */
  void* rma;  /* createContext's context (one context, any traffic class) */
} gpu_rank_t;

/* gpu_rank_connect sets up rank `rank` of two as RCCL drives the plugin:
 * init with logger, (with need_cuda: getProperties must offer
 * NCCL_PTR_CUDA), listen, swap handles with the other rank over fd,
 * connect both ranks, closeListen, createContext. Any failure ends the
 * process with RESULT FAIL. */
void gpu_rank_connect(const ncclRma_v15_t* t, ncclDebugLogger_t logger, int rank, int fd, bool need_cuda,
                      gpu_rank_t* r);

/* gpu_rank_close tears down in NCCL's order: deregMrSym of the n
 * registrations in mhs, destroyContext, closeColl, finalize. */
void gpu_rank_close(const ncclRma_v15_t* t, gpu_rank_t* r, void* const* mhs, int n);

/* The CUDA virtual memory management calls a multi-segment window needs
 * (optional: a driver without them skips what needs them). Struct layouts are
 * the driver API's (CUmemAllocationProp is 32 bytes, CUmemAccessDesc 12). */
typedef unsigned long long CUmemHandle;
typedef struct {
  int type; /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
  int requestedHandleTypes;
  int locType; /* CU_MEM_LOCATION_TYPE_DEVICE = 1 */
  int locId;
  void* win32;
  unsigned char compression, gpuDirectRDMACapable;
  unsigned short usage;
  unsigned char reserved[4];
} memProp;
typedef struct {
  int locType, locId;
  int flags; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 */
} memAccess;
typedef struct {
  CUresult (*granularity)(size_t*, const memProp*, int);
  CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*create)(CUmemHandle*, size_t, const memProp*, unsigned long long);
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemHandle, unsigned long long);
  CUresult (*setAccess)(CUdeviceptr, size_t, const memAccess*, size_t);
  CUresult (*unmap)(CUdeviceptr, size_t);
  CUresult (*release)(CUmemHandle);
  CUresult (*addressFree)(CUdeviceptr, size_t);
  CUresult (*rangeHandle)(void*, CUdeviceptr, size_t, int, unsigned long long);
} vmm_calls_t;
extern vmm_calls_t vmm;

/* vmm_open fills vmm (CUDA only); false when the driver lacks a call. */
bool vmm_open(void);
/* vmm_alloc maps one n-byte allocation of device 0, readable and
 * writable by it, rounded up to the granularity, exportable as a POSIX fd
 * unless GPU_VMM_FD=0; 0 on success. */
CUresult vmm_alloc(size_t n, CUdeviceptr* out);
#endif
