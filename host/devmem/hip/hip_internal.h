/* hip_internal.h: what the HIP runtime's C files share. The same shape as
 * the CUDA runtime's (host/devmem/cuda/cuda_internal.h) where HIP has the
 * same concerns; it has no atomics, GDRCopy or device agent. cgo compiles
 * every .c of this directory into the library, and this is their one
 * internal header:
 *
 *   driver.c     the runtime table (libamdhip64.so found with dlopen, never linked), errstr, the ops table
 *   device.c     devices and pools: inspection, each device's shared stream and copy-stream pool, caps
 *   copy.c       copies: synchronous ones on the pool, stream-ordered ones, signal writes, pinned host memory
 *   ipc.c        IPC and events: events, DMA-BUF, hipIpc memory handles, interprocess events
 *   hip_shim.h   what Go calls (hip.go); hip_internal.h includes it
 *
 * What one file defines and another uses is declared here once, named
 * rmahip_* and hidden (the pragma below), so that nothing clashes with the
 * other packages' C in the final library and its exported symbols stay
 * those Go calls; everything else stays static in its file. */
#ifndef RMAHIP_INTERNAL_H
#define RMAHIP_INTERNAL_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "hip_shim.h"

#pragma GCC visibility push(hidden)

typedef int hipError_t;
typedef void* hipStream_t;
/* hipIpcMemHandle_t: 64 opaque bytes, passed by value. */
typedef struct {
  unsigned char reserved[64];
} hipIpcMemHandle;

enum {
  STREAM_NON_BLOCKING = 1,
  HOST_MALLOC_PORTABLE = 1,
  KIND_H2D = 1,
  KIND_D2H = 2,
  KIND_D2D = 3,
};

/* The runtime table (driver.c fills it at rmaw_hip_open). */
typedef struct {
  hipError_t (*init)(unsigned);
  hipError_t (*getDeviceCount)(int*);
  hipError_t (*runtimeGetVersion)(int*);
  hipError_t (*pointerGetAttributes)(void*, const void*);
  hipError_t (*setDevice)(int);
  hipError_t (*streamCreateWithFlags)(hipStream_t*, unsigned);
  hipError_t (*streamSynchronize)(hipStream_t);
  hipError_t (*memcpyAsync)(void*, const void*, size_t, int, hipStream_t);
  hipError_t (*hostMalloc)(void**, size_t, unsigned);
  hipError_t (*hostFree)(void*);
  const char* (*getErrorString)(hipError_t);
  hipError_t (*hostRegister)(void*, size_t, unsigned); /* optional */
  hipError_t (*hostUnregister)(void*);                 /* optional */
  hipError_t (*getHandleForRange)(void*, void*, size_t, int, unsigned long long); /* optional */
  /* Optional, for stream-ordered signals and asynchronous copies. */
  hipError_t (*writeValue64)(hipStream_t, void*, uint64_t, unsigned);
  hipError_t (*eventCreateWithFlags)(void**, unsigned);
  hipError_t (*eventRecord)(void*, hipStream_t);
  hipError_t (*eventQuery)(void*);
  hipError_t (*eventDestroy)(void*);
  /* Optional, for IPC between the processes of a host (ipc.c). */
  hipError_t (*memGetAddressRange)(void**, size_t*, void*);
  hipError_t (*ipcGetMemHandle)(void*, void*);
  hipError_t (*ipcOpenMemHandle)(void**, hipIpcMemHandle, unsigned);
  hipError_t (*ipcCloseMemHandle)(void*);
  /* Optional, for put+signals ordered by interprocess events. */
  hipError_t (*ipcGetEventHandle)(void*, void*);
  hipError_t (*ipcOpenEventHandle)(void**, hipIpcMemHandle);
  hipError_t (*streamWaitEvent)(hipStream_t, void*, unsigned);
} rmahip_runtime;
extern rmahip_runtime rmahip_rt;

/* rmahip_errstr is the runtime's text for r (driver.c). */
const char* rmahip_errstr(hipError_t r);

/* hipMemoryTypeDevice: 1 before ROCm 6, 2 from ROCm 6 on (the enum was
 * renumbered to match CUDA's); driver.c sets it at rmaw_hip_open. */
extern int rmahip_memtype_device;

/* A device's shared stream and its copy-stream pool (device.c,
 * rmahip_dev_stream). */
#define MAX_DEV 64
#define NCOPY 8
typedef struct {
  int dev;
  hipStream_t stream;
  int caps;
  hipStream_t copy[NCOPY]; /* the synchronous copies' streams (copy_take) */
  pthread_mutex_t cmu[NCOPY];
  unsigned next;
} devstream;
/* The device table: entries published with a release store of
 * rmahip_ndevs and found without a lock. */
extern devstream rmahip_devs[MAX_DEV];
extern int rmahip_ndevs;
/* rmahip_dev_stream sets ctx's device on this thread and returns its
 * shared stream's slot, -1 with *r set on failure. */
int rmahip_dev_stream(uintptr_t ctx, hipError_t* r);

/* DEV_STREAM declares r and k, ctx's slot in rmahip_devs, or fails the
 * calling op with what in its message. */
#define DEV_STREAM(k, what)           \
  hipError_t r;                       \
  int k = rmahip_dev_stream(ctx, &r); \
  if (k < 0) return rmaw_fail(err, errlen, "%s: no stream for device %d: %s", what, (int)ctx - 1, rmahip_errstr(r))

/* The ops table's entries (RMAW_DEVRT_OPS(rmahip) in driver.c). */
int rmahip_inspect(uint64_t ptr, uint64_t size, uintptr_t* ctx, char* err, size_t errlen); /* device.c */
int rmahip_caps(uintptr_t ctx);                                                           /* device.c */
/* copy.c */
int rmahip_copy(uintptr_t ctx, int to_device, void* host, uint64_t dev, uint64_t n, char* err, size_t errlen);
int rmahip_copy_dtod(uintptr_t ctx, uint64_t dst, uint64_t src, uint64_t n, char* err, size_t errlen);
int rmahip_copy_async(uintptr_t ctx, int to_device, void* host, uint64_t dev, uint64_t n, char* err, size_t errlen);
int rmahip_copy_dtod_async(uintptr_t ctx, uint64_t dst, uint64_t src, uint64_t n, char* err, size_t errlen);
int rmahip_host_alloc(uintptr_t ctx, uint64_t n, void** p, char* err, size_t errlen);
void rmahip_host_free(void* p);
int rmahip_host_register(uintptr_t ctx, void* p, uint64_t n, char* err, size_t errlen);
void rmahip_host_unregister(uintptr_t ctx, void* p);
int rmahip_write64(uintptr_t ctx, uint64_t dev, uint64_t v, char* err, size_t errlen);
/* No atomic-add kernel on HIP (it would need a code object per GPU
 * architecture): signal words of other registrations keep the
 * read-modify-write. */
#define rmahip_add64 NULL
/* ipc.c */
int rmahip_event_record(uintptr_t ctx, uintptr_t* ev, char* err, size_t errlen);
int rmahip_event_query(uintptr_t ctx, uintptr_t ev);
void rmahip_event_destroy(uintptr_t ctx, uintptr_t ev);
int rmahip_stream_sync(uintptr_t ctx, char* err, size_t errlen);
int rmahip_export_dmabuf(uintptr_t ctx, uint64_t base, uint64_t n, int* fd, char* err, size_t errlen);
int rmahip_ipc_export(uintptr_t ctx, uint64_t ptr, uint64_t size, int max, rmaw_ipc_seg* segs, int* n, char* err,
                      size_t errlen);
int rmahip_ipc_import(uintptr_t ctx, int n, const rmaw_ipc_seg* segs, uint64_t* va, char* err, size_t errlen);
int rmahip_ipc_unmap(uintptr_t ctx, uint64_t va, int n, const uint64_t* sizes, char* err, size_t errlen);
int rmahip_ipc_event_new(uintptr_t ctx, uintptr_t* ev, unsigned char* handle, char* err, size_t errlen);
int rmahip_ipc_event_open(uintptr_t ctx, const unsigned char* handle, uintptr_t* ev, char* err, size_t errlen);
int rmahip_stream_wait(uintptr_t ctx, uintptr_t ev, char* err, size_t errlen);

#pragma GCC visibility pop
#endif
