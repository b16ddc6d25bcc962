/* A stand-in libamdhip64.so for machines without an AMD GPU: two "devices"
 * whose memory is host memory the fake remembers, with the device each
 * allocation belongs to. It checks what the real runtime would punish
 * silently: a copy must run on a thread whose current device (hipSetDevice)
 * owns the device memory, on a stream created for that device. A copy that
 * breaks either rule fails with hipErrorInvalidDevice (101), so the plugin's
 * progress threads (which start with no device set) are held to it.
 *
 *   cc -shared -fPIC -o <dir>/libamdhip64.so test/gpu/fakehip.c -lpthread */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAXA 256
#define NDEV 2
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  uintptr_t base;
  size_t n;
  int dev;
} allocs[MAXA];
static __thread int current = -1; /* no device until hipSetDevice */

struct stream {
  int dev;
};

/* owner returns the device of p, or -1 when p is not device memory. */
static int owner(uintptr_t p) {
  int d = -1;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAXA; i++)
    if (allocs[i].base && p >= allocs[i].base && p < allocs[i].base + allocs[i].n) d = allocs[i].dev;
  pthread_mutex_unlock(&mu);
  return d;
}

int hipInit(unsigned f) { (void)f; return 0; }
int hipGetDeviceCount(int* n) { *n = NDEV; return 0; }
int hipRuntimeGetVersion(int* v) { *v = 60200000; return 0; } /* ROCm 6: device memory type 2 */
const char* hipGetErrorString(int r) { return r == 101 ? "fake HIP: wrong device for this copy" : "fake HIP error"; }
int hipSetDevice(int d) {
  if (getenv("FAKEHIP_IGNORE_SET")) return 0;
  if (d < 0 || d >= NDEV) return 101;
  current = d;
  return 0;
}
int hipPointerGetAttributes(void* out, const void* p) {
  int d = owner((uintptr_t)p);
  int* a = out; /* type, device: the first two fields in every ROCm release */
  a[0] = d >= 0 ? 2 : 0;
  a[1] = d;
  return d >= 0 ? 0 : 1;
}
int hipMalloc(void** p, size_t n) {
  if (current < 0) return 101;
  void* m = calloc(1, n ? n : 1);
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAXA; i++)
    if (!allocs[i].base) {
      allocs[i].base = (uintptr_t)m;
      allocs[i].n = n;
      allocs[i].dev = current;
      break;
    }
  pthread_mutex_unlock(&mu);
  *p = m;
  return 0;
}
int hipFree(void* p) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAXA; i++)
    if (allocs[i].base == (uintptr_t)p) allocs[i].base = 0;
  pthread_mutex_unlock(&mu);
  free(p);
  return 0;
}
int hipStreamCreateWithFlags(void** s, unsigned f) {
  (void)f;
  if (current < 0) return 101;
  struct stream* st = malloc(sizeof *st);
  st->dev = current;
  *s = st;
  return 0;
}
int hipStreamSynchronize(void* s) { (void)s; return 0; }
int hipHostMalloc(void** p, size_t n, unsigned f) { (void)f; *p = malloc(n); return *p ? 0 : 2; }
int hipHostFree(void* p) { free(p); return 0; }
/* Pinning memory the caller mapped (the plugin's staging ring). */
int hipHostRegister(void* p, size_t n, unsigned f) { (void)f; return p && n ? 0 : 1; }
int hipHostUnregister(void* p) { return p ? 0 : 1; }
/* kind: 1 host to device, 2 device to host. */
static int copy(void* dst, const void* src, size_t n, int kind, int dev) {
  uintptr_t d = (uintptr_t)(kind == 1 ? dst : src);
  if (owner(d) < 0 || owner(d + (n ? n - 1 : 0)) != owner(d)) return 1; /* not device memory */
  if (owner(d) != dev) return 101;
  if (kind == 3) { /* device to device: the destination on the same device */
    uintptr_t t = (uintptr_t)dst;
    if (owner(t) != dev || owner(t + (n ? n - 1 : 0)) != dev) return 1;
  }
  memcpy(dst, src, n);
  return 0;
}
int hipMemcpyAsync(void* dst, const void* src, size_t n, int kind, void* s) {
  struct stream* st = s;
  if (!st || st->dev != current) return 101;
  return copy(dst, src, n, kind, current);
}
int hipMemcpy(void* dst, const void* src, size_t n, int kind) { return copy(dst, src, n, kind, current); }

#ifndef FAKEHIP_NO_DMABUF
/* hipMemGetHandleForAddressRange: a DMA-BUF of a page-aligned range of one
 * device's memory, made current first, as the plugin's export must; the fd
 * is a memfd of the range's length (there is nothing to import it here). */
int hipMemGetHandleForAddressRange(void* handle, void* dptr, size_t n, int type, unsigned long long flags) {
  uintptr_t p = (uintptr_t)dptr, pg = (uintptr_t)sysconf(_SC_PAGESIZE);
  if (type != 1 || flags != 0 || n == 0 || p % pg || n % pg) return 1;
  int d = owner(p);
  if (d >= 0 && d != current) return 101;
  int fd = memfd_create("fakehip-dmabuf", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)n) != 0) return 2;
  *(int*)handle = fd;
  return 0;
}
#endif
