/* Devices and pools: which device holds an address, and each device's
 * shared stream and pool of copy streams. */
#include "hip_internal.h"

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
  hipError_t r = rmahip_rt.pointerGetAttributes(&a, (const void*)(uintptr_t)p);
  *type = a.head.type;
  *dev = a.head.device;
  return r;
}

int rmahip_inspect(uint64_t ptr, uint64_t size, uintptr_t* ctx, char* err, size_t errlen) {
  int type = -1, dev = -1;
  hipError_t r = attrs(ptr, &type, &dev);
  if (r != 0 || type != rmahip_memtype_device || dev < 0)
    return rmaw_fail(err, errlen, "not HIP device memory (memory type %d, status %s)", type, r ? rmahip_errstr(r) : "ok");
  if (size > 1) {
    int t2 = -1, d2 = -1;
    if (attrs(ptr + size - 1, &t2, &d2) != 0 || t2 != rmahip_memtype_device || d2 != dev)
      return rmaw_fail(err, errlen, "the range ends outside HIP device memory of device %d", dev);
  }
  *ctx = (uintptr_t)dev + 1;
  return 0;
}

/* The device stream: one non-blocking stream per device that every
 * thread's stream-ordered work queues on (see the CUDA side's context
 * stream), published with a release store of rmahip_ndevs and found without a
 * lock. */
static pthread_mutex_t dmu = PTHREAD_MUTEX_INITIALIZER;
devstream rmahip_devs[MAX_DEV];
int rmahip_ndevs;

/* rmahip_dev_stream sets ctx's device on this thread and returns its shared
 * stream's slot, -1 with *r set on failure. */
int rmahip_dev_stream(uintptr_t ctx, hipError_t* r) {
  int dev = (int)ctx - 1;
  *r = rmahip_rt.setDevice(dev);
  if (*r != 0) return -1;
  int n = __atomic_load_n(&rmahip_ndevs, __ATOMIC_ACQUIRE);
  for (int i = 0; i < n; i++)
    if (rmahip_devs[i].dev == dev) return i;
  pthread_mutex_lock(&dmu);
  int k = -1;
  for (int i = 0; i < rmahip_ndevs; i++)
    if (rmahip_devs[i].dev == dev) k = i;
  if (k < 0 && rmahip_ndevs < MAX_DEV) {
    hipStream_t s = NULL;
    *r = rmahip_rt.streamCreateWithFlags(&s, STREAM_NON_BLOCKING);
    for (int i = 0; *r == 0 && i < NCOPY; i++) {
      *r = rmahip_rt.streamCreateWithFlags(&rmahip_devs[rmahip_ndevs].copy[i], STREAM_NON_BLOCKING);
      pthread_mutex_init(&rmahip_devs[rmahip_ndevs].cmu[i], NULL);
    }
    if (*r == 0) {
      k = rmahip_ndevs;
      rmahip_devs[k].dev = dev;
      rmahip_devs[k].stream = s;
      rmahip_devs[k].caps = (rmahip_rt.writeValue64 ? RMAW_CAP_WRITE64 : 0) |
                     (rmahip_rt.eventCreateWithFlags && rmahip_rt.eventRecord && rmahip_rt.eventQuery && rmahip_rt.eventDestroy ? RMAW_CAP_ASYNC : 0);
      __atomic_store_n(&rmahip_ndevs, rmahip_ndevs + 1, __ATOMIC_RELEASE);
    }
  }
  pthread_mutex_unlock(&dmu);
  return k;
}

int rmahip_caps(uintptr_t ctx) {
  hipError_t r;
  int k = rmahip_dev_stream(ctx, &r);
  return k < 0 ? 0 : rmahip_devs[k].caps;
}
