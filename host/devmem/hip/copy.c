/* Copies: the synchronous ones on a copy stream of the device's pool,
 * the stream-ordered ones and signal writes on its shared stream, and the
 * pinned host memory they stage through. */
#include "hip_internal.h"

/* Device k's pool (rmahip_devs[k]): copy_take locks a copy stream and
 * returns its index, copy_give unlocks it. */
static int copy_take(int k) { return rmaw_pool_take(rmahip_devs[k].cmu, &rmahip_devs[k].next, NCOPY); }

static void copy_give(int k, int i) { pthread_mutex_unlock(&rmahip_devs[k].cmu[i]); }

static hipStream_t copy_stream(int k, int i) { return rmahip_devs[k].copy[i]; }

/* Synchronous copies run on one of the device's copy streams, made with
 * its shared stream (rmahip_dev_stream) and never on the data path: see
 * the CUDA side's copy.c for why (a stream created while a kernel runs can
 * wait for it). */
/* pool_copy makes one hipMemcpyAsync of kind (what names it) on a copy
 * stream of ctx's device and waits for it. */
static int pool_copy(uintptr_t ctx, void* dst, const void* src, uint64_t n, int kind, const char* what, char* err,
                     size_t errlen) {
  hipError_t r;
  int k = rmahip_dev_stream(ctx, &r);
  if (k < 0) return rmaw_fail(err, errlen, "copy: no streams for device %d: %s", (int)ctx - 1, rmahip_errstr(r));
  int i = copy_take(k);
  hipStream_t s = copy_stream(k, i);
  r = rmahip_rt.memcpyAsync(dst, src, (size_t)n, kind, s);
  if (r == 0) r = rmahip_rt.streamSynchronize(s);
  copy_give(k, i);
  if (r != 0) return rmaw_fail(err, errlen, "hipMemcpyAsync (%s) of %llu bytes: %s", what, (unsigned long long)n, rmahip_errstr(r));
  return 0;
}

int rmahip_copy(uintptr_t ctx, int to_device, void* host, uint64_t dev, uint64_t n, char* err, size_t errlen) {
  void* d = (void*)(uintptr_t)dev;
  if (to_device) return pool_copy(ctx, d, host, n, KIND_H2D, "to device", err, errlen);
  return pool_copy(ctx, host, d, n, KIND_D2H, "from device", err, errlen);
}

/* A device-to-device copy on one device, waited for, on a copy stream. */
int rmahip_copy_dtod(uintptr_t ctx, uint64_t dst, uint64_t src, uint64_t n, char* err, size_t errlen) {
  return pool_copy(ctx, (void*)(uintptr_t)dst, (const void*)(uintptr_t)src, n, KIND_D2D, "device to device", err, errlen);
}

int rmahip_host_alloc(uintptr_t ctx, uint64_t n, void** p, char* err, size_t errlen) {
  hipError_t r = rmahip_rt.setDevice((int)ctx - 1);
  if (r == 0) r = rmahip_rt.hostMalloc(p, (size_t)n, HOST_MALLOC_PORTABLE);
  if (r != 0) return rmaw_fail(err, errlen, "hipHostMalloc of %llu bytes: %s", (unsigned long long)n, rmahip_errstr(r));
  return 0;
}

void rmahip_host_free(void* p) { rmahip_rt.hostFree(p); }

/* Pins memory we mapped ourselves (the intra-node staging ring). */
int rmahip_host_register(uintptr_t ctx, void* p, uint64_t n, char* err, size_t errlen) {
  if (!rmahip_rt.hostRegister) return rmaw_fail(err, errlen, "the runtime has no hipHostRegister");
  hipError_t r = rmahip_rt.setDevice((int)ctx - 1);
  if (r == 0) r = rmahip_rt.hostRegister(p, (size_t)n, HOST_MALLOC_PORTABLE); /* hipHostRegisterPortable = 1 */
  if (r != 0) return rmaw_fail(err, errlen, "hipHostRegister of %llu bytes: %s", (unsigned long long)n, rmahip_errstr(r));
  return 0;
}

void rmahip_host_unregister(uintptr_t ctx, void* p) {
  if (rmahip_rt.hostUnregister && rmahip_rt.setDevice((int)ctx - 1) == 0) rmahip_rt.hostUnregister(p);
}

int rmahip_write64(uintptr_t ctx, uint64_t dev, uint64_t v, char* err, size_t errlen) {
  DEV_STREAM(k, "hipStreamWriteValue64");
  r = rmahip_rt.writeValue64(rmahip_devs[k].stream, (void*)(uintptr_t)dev, v, 0);
  if (r != 0) return rmaw_fail(err, errlen, "hipStreamWriteValue64: %s", rmahip_errstr(r));
  return 0;
}

int rmahip_copy_async(uintptr_t ctx, int to_device, void* host, uint64_t dev, uint64_t n, char* err,
                      size_t errlen) {
  DEV_STREAM(k, "hipMemcpyAsync");
  void* d = (void*)(uintptr_t)dev;
  r = to_device ? rmahip_rt.memcpyAsync(d, host, (size_t)n, KIND_H2D, rmahip_devs[k].stream)
                : rmahip_rt.memcpyAsync(host, d, (size_t)n, KIND_D2H, rmahip_devs[k].stream);
  if (r != 0)
    return rmaw_fail(err, errlen, "hipMemcpyAsync (%s) of %llu bytes: %s", to_device ? "to device" : "from device",
                     (unsigned long long)n, rmahip_errstr(r));
  return 0;
}

int rmahip_copy_dtod_async(uintptr_t ctx, uint64_t dst, uint64_t src, uint64_t n, char* err, size_t errlen) {
  DEV_STREAM(k, "hipMemcpyAsync");
  r = rmahip_rt.memcpyAsync((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, (size_t)n, KIND_D2D, rmahip_devs[k].stream);
  if (r != 0)
    return rmaw_fail(err, errlen, "hipMemcpyAsync (device to device) of %llu bytes: %s", (unsigned long long)n, rmahip_errstr(r));
  return 0;
}
