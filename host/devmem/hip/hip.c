/* The AMD HIP runtime, found with dlopen at run time and never linked, so
 * the library loads on machines without ROCm. Declarations are our own
 * minimal subset (types are plain integers and pointers). A "context" here
 * is the device ordinal + 1 (0 means host memory to the data path); every
 * copy sets that device on the calling thread first (hipSetDevice), since
 * NCCL's progress threads and Go's threads have none, and runs on a
 * non-blocking stream of its own per thread and device, for the reasons the
 * CUDA side gives (cuda.c). */
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "hip_shim.h"

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

static struct {
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
  /* Optional, for IPC between the processes of a host (hip_ipc_*). */
  hipError_t (*memGetAddressRange)(void**, size_t*, void*);
  hipError_t (*ipcGetMemHandle)(void*, void*);
  hipError_t (*ipcOpenMemHandle)(void**, hipIpcMemHandle, unsigned);
  hipError_t (*ipcCloseMemHandle)(void*);
  /* Optional, for put+signals ordered by interprocess events. */
  hipError_t (*ipcGetEventHandle)(void*, void*);
  hipError_t (*ipcOpenEventHandle)(void**, hipIpcMemHandle);
  hipError_t (*streamWaitEvent)(hipStream_t, void*, unsigned);
} hip;

/* hipMemoryTypeDevice: 1 before ROCm 6, 2 from ROCm 6 on (the enum was
 * renumbered to match CUDA's). */
static int memtype_device = 2;

static const char* errstr(hipError_t r) {
  const char* s = hip.getErrorString ? hip.getErrorString(r) : NULL;
  return s ? s : "unknown HIP error";
}

/* lib, when not NULL, is the only name tried (tests). */
int rmaw_hip_open(const char* lib, char* err, size_t errlen) {
  static const char* names[] = {"libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"};
  void* h = lib ? dlopen(lib, RTLD_NOW | RTLD_LOCAL) : NULL;
  for (size_t i = 0; !lib && i < sizeof names / sizeof names[0] && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!h) return rmaw_fail(err, errlen, "%s", dlerror());
#define SYM(field, name)                                                             \
  do {                                                                               \
    *(void**)&hip.field = dlsym(h, name);                                            \
    if (!hip.field) return rmaw_fail(err, errlen, "libamdhip64.so has no %s", name); \
  } while (0)
  SYM(init, "hipInit");
  SYM(getDeviceCount, "hipGetDeviceCount");
  SYM(runtimeGetVersion, "hipRuntimeGetVersion");
  SYM(pointerGetAttributes, "hipPointerGetAttributes");
  SYM(setDevice, "hipSetDevice");
  SYM(streamCreateWithFlags, "hipStreamCreateWithFlags");
  SYM(streamSynchronize, "hipStreamSynchronize");
  SYM(memcpyAsync, "hipMemcpyAsync");
  SYM(hostMalloc, "hipHostMalloc");
  SYM(hostFree, "hipHostFree");
  SYM(getErrorString, "hipGetErrorString");
#undef SYM
  *(void**)&hip.hostRegister = dlsym(h, "hipHostRegister");
  *(void**)&hip.hostUnregister = dlsym(h, "hipHostUnregister");
  if (!hip.hostUnregister) hip.hostRegister = NULL;
  *(void**)&hip.getHandleForRange = dlsym(h, "hipMemGetHandleForAddressRange");
  *(void**)&hip.writeValue64 = dlsym(h, "hipStreamWriteValue64");
  *(void**)&hip.eventCreateWithFlags = dlsym(h, "hipEventCreateWithFlags");
  *(void**)&hip.eventRecord = dlsym(h, "hipEventRecord");
  *(void**)&hip.eventQuery = dlsym(h, "hipEventQuery");
  *(void**)&hip.eventDestroy = dlsym(h, "hipEventDestroy");
  *(void**)&hip.memGetAddressRange = dlsym(h, "hipMemGetAddressRange");
  *(void**)&hip.ipcGetMemHandle = dlsym(h, "hipIpcGetMemHandle");
  *(void**)&hip.ipcOpenMemHandle = dlsym(h, "hipIpcOpenMemHandle");
  *(void**)&hip.ipcCloseMemHandle = dlsym(h, "hipIpcCloseMemHandle");
  *(void**)&hip.ipcGetEventHandle = dlsym(h, "hipIpcGetEventHandle");
  *(void**)&hip.ipcOpenEventHandle = dlsym(h, "hipIpcOpenEventHandle");
  *(void**)&hip.streamWaitEvent = dlsym(h, "hipStreamWaitEvent");
  int v = 0;
  if (hip.runtimeGetVersion(&v) == 0 && v > 0 && v < 60000000) memtype_device = 1;
  hipError_t r = hip.init(0);
  int n = 0;
  if (r == 0) r = hip.getDeviceCount(&n);
  if (r != 0 || n < 1)
    return rmaw_fail(err, errlen, "no HIP device (hipGetDeviceCount: %d devices, status %d: %s)", n, r, errstr(r));
  return n;
}

/* attrs reads the memory type and device of one address. Only the first two
 * fields are read, which every ROCm release keeps in place; the buffer is
 * larger than any release's hipPointerAttribute_t. */
static int attrs(uint64_t p, int* type, int* dev) {
  union {
    struct {
      int type;
      int device;
    } head;
    char room[256];
  } a;
  memset(&a, 0, sizeof a);
  hipError_t r = hip.pointerGetAttributes(&a, (const void*)(uintptr_t)p);
  *type = a.head.type;
  *dev = a.head.device;
  return r;
}

static int hip_inspect(uint64_t ptr, uint64_t size, uintptr_t* ctx, char* err, size_t errlen) {
  int type = -1, dev = -1;
  hipError_t r = attrs(ptr, &type, &dev);
  if (r != 0 || type != memtype_device || dev < 0)
    return rmaw_fail(err, errlen, "not HIP device memory (memory type %d, status %s)", type, r ? errstr(r) : "ok");
  if (size > 1) {
    int t2 = -1, d2 = -1;
    if (attrs(ptr + size - 1, &t2, &d2) != 0 || t2 != memtype_device || d2 != dev)
      return rmaw_fail(err, errlen, "the range ends outside HIP device memory of device %d", dev);
  }
  *ctx = (uintptr_t)dev + 1;
  return 0;
}

static int dev_stream(uintptr_t ctx, hipError_t* r);
static int copy_take(int k);
static void copy_give(int k, int i);
static hipStream_t copy_stream(int k, int i);

/* Synchronous copies run on one of the device's copy streams, made with
 * its shared stream (dev_stream) and never on the data path: see cuda.c's
 * copy_take for why (a stream created while a kernel runs can wait for
 * it). */
/* pool_copy makes one hipMemcpyAsync of kind (what names it) on a copy
 * stream of ctx's device and waits for it. */
static int pool_copy(uintptr_t ctx, void* dst, const void* src, uint64_t n, int kind, const char* what, char* err,
                     size_t errlen) {
  hipError_t r;
  int k = dev_stream(ctx, &r);
  if (k < 0) return rmaw_fail(err, errlen, "copy: no streams for device %d: %s", (int)ctx - 1, errstr(r));
  int i = copy_take(k);
  hipStream_t s = copy_stream(k, i);
  r = hip.memcpyAsync(dst, src, (size_t)n, kind, s);
  if (r == 0) r = hip.streamSynchronize(s);
  copy_give(k, i);
  if (r != 0) return rmaw_fail(err, errlen, "hipMemcpyAsync (%s) of %llu bytes: %s", what, (unsigned long long)n, errstr(r));
  return 0;
}

static int hip_copy(uintptr_t ctx, int to_device, void* host, uint64_t dev, uint64_t n, char* err, size_t errlen) {
  void* d = (void*)(uintptr_t)dev;
  if (to_device) return pool_copy(ctx, d, host, n, KIND_H2D, "to device", err, errlen);
  return pool_copy(ctx, host, d, n, KIND_D2H, "from device", err, errlen);
}

/* A device-to-device copy on one device, waited for, on a copy stream. */
static int hip_copy_dtod(uintptr_t ctx, uint64_t dst, uint64_t src, uint64_t n, char* err, size_t errlen) {
  return pool_copy(ctx, (void*)(uintptr_t)dst, (const void*)(uintptr_t)src, n, KIND_D2D, "device to device", err, errlen);
}

static int hip_host_alloc(uintptr_t ctx, uint64_t n, void** p, char* err, size_t errlen) {
  hipError_t r = hip.setDevice((int)ctx - 1);
  if (r == 0) r = hip.hostMalloc(p, (size_t)n, HOST_MALLOC_PORTABLE);
  if (r != 0) return rmaw_fail(err, errlen, "hipHostMalloc of %llu bytes: %s", (unsigned long long)n, errstr(r));
  return 0;
}

static void hip_host_free(void* p) { hip.hostFree(p); }

/* Pins memory we mapped ourselves (the intra-node staging ring). */
static int hip_host_register(uintptr_t ctx, void* p, uint64_t n, char* err, size_t errlen) {
  if (!hip.hostRegister) return rmaw_fail(err, errlen, "the runtime has no hipHostRegister");
  hipError_t r = hip.setDevice((int)ctx - 1);
  if (r == 0) r = hip.hostRegister(p, (size_t)n, HOST_MALLOC_PORTABLE); /* hipHostRegisterPortable = 1 */
  if (r != 0) return rmaw_fail(err, errlen, "hipHostRegister of %llu bytes: %s", (unsigned long long)n, errstr(r));
  return 0;
}

static void hip_host_unregister(uintptr_t ctx, void* p) {
  if (hip.hostUnregister && hip.setDevice((int)ctx - 1) == 0) hip.hostUnregister(p);
}

/* Exports [base, base+n) (page-aligned by the caller) as a DMA-BUF fd
 * (hipMemRangeHandleTypeDmaBufFd), for a NIC that imports it; the memory's
 * device is made current first. */
static int hip_export_dmabuf(uintptr_t ctx, uint64_t base, uint64_t n, int* fd, char* err, size_t errlen) {
  if (!hip.getHandleForRange) return rmaw_fail(err, errlen, "the runtime has no hipMemGetHandleForAddressRange");
  hipError_t r = hip.setDevice((int)ctx - 1);
  if (r == 0) r = hip.getHandleForRange(fd, (void*)(uintptr_t)base, (size_t)n, 1, 0);
  if (r != 0)
    return rmaw_fail(err, errlen, "hipMemGetHandleForAddressRange of %llu bytes: %s", (unsigned long long)n, errstr(r));
  return 0;
}

/* The device stream: one non-blocking stream per device that every
 * thread's stream-ordered work queues on (see cuda.c's context stream),
 * published with a release store of ndevs and found without a lock. */
#define MAX_DEV 64
static pthread_mutex_t dmu = PTHREAD_MUTEX_INITIALIZER;
#define NCOPY 8
static struct {
  int dev;
  hipStream_t stream;
  int caps;
  hipStream_t copy[NCOPY]; /* the synchronous copies' streams (copy_take) */
  pthread_mutex_t cmu[NCOPY];
  unsigned next;
} devs[MAX_DEV];
static int ndevs;

static int copy_take(int k) { return rmaw_pool_take(devs[k].cmu, &devs[k].next, NCOPY); }

static void copy_give(int k, int i) { pthread_mutex_unlock(&devs[k].cmu[i]); }

static hipStream_t copy_stream(int k, int i) { return devs[k].copy[i]; }

/* dev_stream sets ctx's device on this thread and returns its shared
 * stream's slot, -1 with *r set on failure. */
static int dev_stream(uintptr_t ctx, hipError_t* r) {
  int dev = (int)ctx - 1;
  *r = hip.setDevice(dev);
  if (*r != 0) return -1;
  int n = __atomic_load_n(&ndevs, __ATOMIC_ACQUIRE);
  for (int i = 0; i < n; i++)
    if (devs[i].dev == dev) return i;
  pthread_mutex_lock(&dmu);
  int k = -1;
  for (int i = 0; i < ndevs; i++)
    if (devs[i].dev == dev) k = i;
  if (k < 0 && ndevs < MAX_DEV) {
    hipStream_t s = NULL;
    *r = hip.streamCreateWithFlags(&s, STREAM_NON_BLOCKING);
    for (int i = 0; *r == 0 && i < NCOPY; i++) {
      *r = hip.streamCreateWithFlags(&devs[ndevs].copy[i], STREAM_NON_BLOCKING);
      pthread_mutex_init(&devs[ndevs].cmu[i], NULL);
    }
    if (*r == 0) {
      k = ndevs;
      devs[k].dev = dev;
      devs[k].stream = s;
      devs[k].caps = (hip.writeValue64 ? RMAW_CAP_WRITE64 : 0) |
                     (hip.eventCreateWithFlags && hip.eventRecord && hip.eventQuery && hip.eventDestroy ? RMAW_CAP_ASYNC : 0);
      __atomic_store_n(&ndevs, ndevs + 1, __ATOMIC_RELEASE);
    }
  }
  pthread_mutex_unlock(&dmu);
  return k;
}

static int hip_caps(uintptr_t ctx) {
  hipError_t r;
  int k = dev_stream(ctx, &r);
  return k < 0 ? 0 : devs[k].caps;
}

#define DEV_STREAM(k, what)    \
  hipError_t r;                \
  int k = dev_stream(ctx, &r); \
  if (k < 0) return rmaw_fail(err, errlen, "%s: no stream for device %d: %s", what, (int)ctx - 1, errstr(r))

static int hip_write64(uintptr_t ctx, uint64_t dev, uint64_t v, char* err, size_t errlen) {
  DEV_STREAM(k, "hipStreamWriteValue64");
  r = hip.writeValue64(devs[k].stream, (void*)(uintptr_t)dev, v, 0);
  if (r != 0) return rmaw_fail(err, errlen, "hipStreamWriteValue64: %s", errstr(r));
  return 0;
}

/* No atomic-add kernel on HIP (it would need a code object per GPU
 * architecture): signal words of other registrations keep the
 * read-modify-write. */
#define hip_add64 NULL

/* IPC between the processes of a host: the hipMalloc allocation under a
 * registration travels as a hipIpcMemHandle_t, which the peer opens with
 * lazy peer access (its device may be another one of the host). One
 * allocation per registration: a range over several keeps the staged
 * path. */
enum { IPC_LAZY_PEER_ACCESS = 1 };

static int hip_ipc_ready(void) {
  return hip.memGetAddressRange && hip.ipcGetMemHandle && hip.ipcOpenMemHandle && hip.ipcCloseMemHandle;
}

static int hip_ipc_export(uintptr_t ctx, uint64_t ptr, uint64_t size, int max, rmaw_ipc_seg* segs, int* n, char* err,
                          size_t errlen) {
  *n = 0;
  if (!hip_ipc_ready()) return rmaw_fail(err, errlen, "the runtime lacks the hipIpc calls");
  if (max < 1) return rmaw_fail(err, errlen, "no room for a segment");
  void* base = NULL;
  size_t len = 0;
  hipError_t r = hip.setDevice((int)ctx - 1);
  if (r == 0) r = hip.memGetAddressRange(&base, &len, (void*)(uintptr_t)ptr);
  if (r != 0) return rmaw_fail(err, errlen, "hipMemGetAddressRange: %s", errstr(r));
  if (ptr + size > (uint64_t)(uintptr_t)base + len) return rmaw_fail(err, errlen, "the range spans more than one allocation");
  memset(&segs[0], 0, sizeof segs[0]);
  if ((r = hip.ipcGetMemHandle(segs[0].handle, base)) != 0) return rmaw_fail(err, errlen, "hipIpcGetMemHandle: %s", errstr(r));
  segs[0].fd = -1;
  segs[0].base = (uint64_t)(uintptr_t)base;
  segs[0].size = len;
  *n = 1;
  return 0;
}

static int hip_ipc_import(uintptr_t ctx, int n, const rmaw_ipc_seg* segs, uint64_t* va, char* err, size_t errlen) {
  *va = 0;
  if (!hip_ipc_ready()) return rmaw_fail(err, errlen, "the runtime lacks the hipIpc calls");
  if (n != 1 || segs[0].fd >= 0) return rmaw_fail(err, errlen, "HIP opens one allocation's handle, not %d segments", n);
  hipIpcMemHandle h;
  memcpy(h.reserved, segs[0].handle, sizeof h.reserved);
  void* p = NULL;
  hipError_t r = hip.setDevice((int)ctx - 1);
  if (r == 0) r = hip.ipcOpenMemHandle(&p, h, IPC_LAZY_PEER_ACCESS);
  if (r != 0) return rmaw_fail(err, errlen, "hipIpcOpenMemHandle: %s", errstr(r));
  *va = (uint64_t)(uintptr_t)p;
  return 0;
}

/* Interprocess events (hipEventInterprocess): a mapped put+signal
 * records one after its queued copy, and the target's stream waits for it
 * (hipStreamWaitEvent) before the signal write. Their handles are 64
 * bytes, as hipIpcMemHandle_t. */
enum { EVENT_DISABLE_TIMING = 0x2, EVENT_INTERPROCESS = 0x4 };

static int hip_ipc_event_new(uintptr_t ctx, uintptr_t* ev, unsigned char* handle, char* err, size_t errlen) {
  if (!hip.ipcGetEventHandle || !hip.ipcOpenEventHandle || !hip.streamWaitEvent || !hip.eventCreateWithFlags)
    return rmaw_fail(err, errlen, "the runtime lacks hipIpcGetEventHandle, hipIpcOpenEventHandle or hipStreamWaitEvent");
  void* e = NULL;
  hipError_t r = hip.setDevice((int)ctx - 1);
  if (r == 0) r = hip.eventCreateWithFlags(&e, EVENT_DISABLE_TIMING | EVENT_INTERPROCESS);
  if (r != 0) return rmaw_fail(err, errlen, "hipEventCreateWithFlags (interprocess): %s", errstr(r));
  if ((r = hip.ipcGetEventHandle(handle, e)) != 0) {
    hip.eventDestroy(e);
    return rmaw_fail(err, errlen, "hipIpcGetEventHandle: %s", errstr(r));
  }
  *ev = (uintptr_t)e;
  return 0;
}

static int hip_ipc_event_open(uintptr_t ctx, const unsigned char* handle, uintptr_t* ev, char* err, size_t errlen) {
  if (!hip.ipcOpenEventHandle) return rmaw_fail(err, errlen, "the runtime lacks hipIpcOpenEventHandle");
  hipIpcMemHandle h;
  memcpy(h.reserved, handle, sizeof h.reserved);
  void* e = NULL;
  hipError_t r = hip.setDevice((int)ctx - 1);
  if (r == 0) r = hip.ipcOpenEventHandle(&e, h);
  if (r != 0) return rmaw_fail(err, errlen, "hipIpcOpenEventHandle: %s", errstr(r));
  *ev = (uintptr_t)e;
  return 0;
}

static int hip_stream_wait(uintptr_t ctx, uintptr_t ev, char* err, size_t errlen) {
  if (!hip.streamWaitEvent) return rmaw_fail(err, errlen, "the runtime lacks hipStreamWaitEvent");
  DEV_STREAM(k, "hipStreamWaitEvent");
  r = hip.streamWaitEvent(devs[k].stream, (void*)ev, 0);
  if (r != 0) return rmaw_fail(err, errlen, "hipStreamWaitEvent: %s", errstr(r));
  return 0;
}

static int hip_ipc_unmap(uintptr_t ctx, uint64_t va, int n, const uint64_t* sizes, char* err, size_t errlen) {
  (void)n, (void)sizes;
  if (!hip_ipc_ready()) return rmaw_fail(err, errlen, "the runtime lacks the hipIpc calls");
  hipError_t r = hip.setDevice((int)ctx - 1);
  if (r == 0) r = hip.ipcCloseMemHandle((void*)(uintptr_t)va);
  if (r != 0) return rmaw_fail(err, errlen, "hipIpcCloseMemHandle: %s", errstr(r));
  return 0;
}

static int hip_copy_async(uintptr_t ctx, int to_device, void* host, uint64_t dev, uint64_t n, char* err,
                          size_t errlen) {
  DEV_STREAM(k, "hipMemcpyAsync");
  void* d = (void*)(uintptr_t)dev;
  r = to_device ? hip.memcpyAsync(d, host, (size_t)n, KIND_H2D, devs[k].stream)
                : hip.memcpyAsync(host, d, (size_t)n, KIND_D2H, devs[k].stream);
  if (r != 0)
    return rmaw_fail(err, errlen, "hipMemcpyAsync (%s) of %llu bytes: %s", to_device ? "to device" : "from device",
                     (unsigned long long)n, errstr(r));
  return 0;
}

static int hip_copy_dtod_async(uintptr_t ctx, uint64_t dst, uint64_t src, uint64_t n, char* err, size_t errlen) {
  DEV_STREAM(k, "hipMemcpyAsync");
  r = hip.memcpyAsync((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, (size_t)n, KIND_D2D, devs[k].stream);
  if (r != 0)
    return rmaw_fail(err, errlen, "hipMemcpyAsync (device to device) of %llu bytes: %s", (unsigned long long)n, errstr(r));
  return 0;
}

static int hip_event_record(uintptr_t ctx, uintptr_t* ev, char* err, size_t errlen) {
  DEV_STREAM(k, "hipEventRecord");
  if (!*ev) {
    void* x = NULL;
    r = hip.eventCreateWithFlags(&x, 2); /* hipEventDisableTiming */
    if (r != 0) return rmaw_fail(err, errlen, "hipEventCreateWithFlags: %s", errstr(r));
    *ev = (uintptr_t)x;
  }
  r = hip.eventRecord((void*)*ev, devs[k].stream);
  if (r != 0) return rmaw_fail(err, errlen, "hipEventRecord: %s", errstr(r));
  return 0;
}

static int hip_event_query(uintptr_t ctx, uintptr_t ev) {
  if (hip.setDevice((int)ctx - 1) != 0) return -1;
  hipError_t r = hip.eventQuery((void*)ev);
  return r == 0 ? 1 : r == 600 ? 0 : -1; /* hipErrorNotReady */
}

static void hip_event_destroy(uintptr_t ctx, uintptr_t ev) {
  if (ev && hip.setDevice((int)ctx - 1) == 0) hip.eventDestroy((void*)ev);
}

static int hip_stream_sync(uintptr_t ctx, char* err, size_t errlen) {
  DEV_STREAM(k, "hipStreamSynchronize");
  r = hip.streamSynchronize(devs[k].stream);
  if (r != 0) return rmaw_fail(err, errlen, "hipStreamSynchronize: %s", errstr(r));
  return 0;
}

/* The HIP runtime's entries of the ops table package devrt calls through. */
const rmaw_devrt_ops rmaw_hip_ops = RMAW_DEVRT_OPS(hip);
