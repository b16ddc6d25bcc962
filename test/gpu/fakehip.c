/* A stand-in libamdhip64.so for machines without an AMD GPU: two "devices"
 * whose memory is host memory the fake remembers, with the device each
 * allocation belongs to. It checks what the real runtime would punish
 * silently: a copy must run on a thread whose current device (hipSetDevice)
 * owns the device memory, on a stream created for that device. A copy that
 * breaks either rule fails with hipErrorInvalidDevice (101), so the plugin's
 * progress threads (which start with no device set) are held to it.
 * Device memory is a memfd mapping, so that another process can open it
 * through hipIpcOpenMemHandle (/proc/<pid>/fd/<fd>), as a peer's memory
 * reachable from any device (PEER).
 * Streams run their work in order: at once by default, or with
 * FAKEHIP_ASYNC_US=n on a worker thread per stream n microseconds after it
 * was queued (FAKEHIP_DTOD_US=m delays device-to-device copies m more), so
 * that work the plugin orders wrongly shows: a signal written before its
 * payload's copy ran, a peer's signal ahead of the copy into our memory.
 * Events, hipStreamWriteValue64 and interprocess events (a memfd arena
 * another process maps, as fakecuda's) run in stream order too.
 *
 *   cc -shared -fPIC -o <dir>/libamdhip64.so test/gpu/fakehip.c -lpthread */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <fcntl.h>
#include <stdio.h>

#define MAXA 256
#define NDEV 2
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
#define PEER (-2) /* another process's memory, opened by hipIpcOpenMemHandle */
static struct {
  uintptr_t base;
  size_t n;
  int dev;
  int fd; /* the memfd behind it, -1 for PEER mappings */
} allocs[MAXA];
static __thread int current = -1; /* no device until hipSetDevice */

/* A stream's work: 0 copy, 1 write64, 4 mark an interprocess event
 * reached, 5 wait until another process's stream reached one. */
struct op {
  struct op* next;
  int kind, dtod;
  void* dst;
  const void* src;
  size_t n;
  uint64_t v;
};
static void run_op(struct op* o);
/* op_delay_us: device-to-device copies run FAKEHIP_DTOD_US later still. */
static long op_delay_us(const struct op* o) {
  static long dtod_us = -1;
  if (!o->dtod) return 0;
  if (dtod_us < 0) dtod_us = getenv("FAKEHIP_DTOD_US") ? atol(getenv("FAKEHIP_DTOD_US")) : 0;
  return dtod_us;
}
#include "fakestream.h"

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
static void remember(void* m, size_t n, int dev, int fd) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAXA; i++)
    if (!allocs[i].base) {
      allocs[i].base = (uintptr_t)m;
      allocs[i].n = n;
      allocs[i].dev = dev;
      allocs[i].fd = fd;
      break;
    }
  pthread_mutex_unlock(&mu);
}
/* forget drops p's entry and returns it (n 0: none). */
static void forget(uintptr_t p, size_t* n, int* fd) {
  *n = 0;
  *fd = -1;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAXA; i++)
    if (allocs[i].base == p) {
      *n = allocs[i].n;
      *fd = allocs[i].fd;
      allocs[i].base = 0;
    }
  pthread_mutex_unlock(&mu);
}
int hipMalloc(void** p, size_t n) {
  if (current < 0) return 101;
  size_t len = n ? n : 1;
  int fd = memfd_create("fakehip-mem", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)len) != 0) return 2;
  void* m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    close(fd);
    return 2;
  }
  remember(m, n, current, fd);
  *p = m;
  return 0;
}
int hipFree(void* p) {
  size_t n;
  int fd;
  forget((uintptr_t)p, &n, &fd);
  if (fd < 0) return 1;
  munmap(p, n ? n : 1);
  close(fd);
  return 0;
}
int hipMemGetAddressRange(void** base, size_t* n, void* p) {
  int ok = 1;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAXA; i++)
    if (allocs[i].base && (uintptr_t)p >= allocs[i].base && (uintptr_t)p < allocs[i].base + allocs[i].n) {
      *base = (void*)allocs[i].base;
      *n = allocs[i].n;
      ok = 0;
    }
  pthread_mutex_unlock(&mu);
  return ok;
}
/* The fake's hipIpcMemHandle_t: who holds the memfd, and its size. */
typedef struct {
  unsigned magic;
  int pid, fd;
  unsigned long long n;
  unsigned char pad[64 - 24];
} ipcHandle;
typedef struct {
  unsigned char b[64];
} hipIpcMemHandle_t;
_Static_assert(sizeof(ipcHandle) == 64, "hipIpcMemHandle_t is 64 bytes");
int hipIpcGetMemHandle(hipIpcMemHandle_t* h, void* p) {
  int ok = 1;
  ipcHandle x = {.magic = 0x70696b66, .pid = getpid()};
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAXA; i++)
    if (allocs[i].base == (uintptr_t)p && allocs[i].fd >= 0) {
      x.fd = allocs[i].fd;
      x.n = allocs[i].n;
      ok = 0;
    }
  pthread_mutex_unlock(&mu);
  if (ok) return 1; /* not the start of a hipMalloc allocation */
  memcpy(h, &x, sizeof x);
  return 0;
}
int hipIpcOpenMemHandle(void** p, hipIpcMemHandle_t h, unsigned flags) {
  (void)flags;
  ipcHandle x;
  memcpy(&x, &h, sizeof x);
  if (x.magic != 0x70696b66 || x.pid == getpid()) return 1;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", x.pid, x.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return 2;
  void* m = mmap(NULL, x.n ? x.n : 1, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return 2;
  remember(m, x.n, PEER, -1);
  *p = m;
  return 0;
}
int hipIpcCloseMemHandle(void* p) {
  size_t n;
  int fd;
  forget((uintptr_t)p, &n, &fd);
  if (!n) return 1;
  munmap(p, n);
  return 0;
}
static void run_op(struct op* o) {
  switch (o->kind) {
  case 0:
    memcpy(o->dst, o->src, o->n);
    break;
  case 1:
    __atomic_store_n((uint64_t*)o->dst, o->v, __ATOMIC_SEQ_CST);
    break;
  case 4:
    ipcev_reach((long*)o->dst, (long)o->v);
    break;
  case 5:
    ipcev_wait((const long*)o->dst, (long)o->v);
    break;
  }
}
int hipStreamCreateWithFlags(void** s, unsigned f) {
  (void)f;
  if (current < 0) return 101;
  *s = fs_new("FAKEHIP_ASYNC_US", current);
  return *s ? 0 : 2;
}
int hipStreamSynchronize(void* s) {
  fs_sync(s);
  return 0;
}
int hipHostMalloc(void** p, size_t n, unsigned f) { (void)f; *p = malloc(n); return *p ? 0 : 2; }
int hipHostFree(void* p) { free(p); return 0; }
/* Pinning memory the caller mapped (the plugin's staging ring). */
int hipHostRegister(void* p, size_t n, unsigned f) { (void)f; return p && n ? 0 : 1; }
int hipHostUnregister(void* p) { return p ? 0 : 1; }
/* kind: 1 host to device, 2 device to host. */
/* reach: device memory at [p, p+n) that device dev may copy: its own, or
 * a peer's opened with hipIpcOpenMemHandle. 0 yes, 1 not device memory,
 * 101 another device's. */
static int reach(uintptr_t p, size_t n, int dev) {
  int o = owner(p);
  if (o == -1 || owner(p + (n ? n - 1 : 0)) != o) return 1;
  return o == dev || o == PEER ? 0 : 101;
}
static int copyable(void* dst, const void* src, size_t n, int kind, int dev) {
  int r = reach((uintptr_t)(kind == 1 ? dst : src), n, dev);
  if (r == 0 && kind == 3) r = reach((uintptr_t)dst, n, dev) ? 1 : 0; /* device to device: both reachable */
  return r;
}
int hipMemcpyAsync(void* dst, const void* src, size_t n, int kind, void* s) {
  struct fstream* st = s;
  if (!st || st->dev != current) return 101;
  int r = copyable(dst, src, n, kind, current);
  if (r != 0) return r;
  if (kind == 3) {
    static int said;
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED)) fprintf(stderr, "fakehip: a device-to-device copy\n");
  }
  return fs_enqueue(st, (struct op){.kind = 0, .dtod = kind == 3, .dst = dst, .src = src, .n = n});
}
int hipMemcpy(void* dst, const void* src, size_t n, int kind) {
  int r = copyable(dst, src, n, kind, current);
  if (r == 0) memcpy(dst, src, n);
  return r;
}
int hipStreamWriteValue64(void* s, void* ptr, uint64_t v, unsigned flags) {
  struct fstream* st = s;
  (void)flags;
  if (!st || st->dev != current) return 101;
  if ((uintptr_t)ptr % 8 || reach((uintptr_t)ptr, 8, current) != 0) return 1;
  static int said;
  if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED)) fprintf(stderr, "fakehip: a stream write of a signal word\n");
  return fs_enqueue(st, (struct op){.kind = 1, .dst = ptr, .v = v});
}

#define IPCEV_MAGIC 0x76656b68
int hipEventCreateWithFlags(void** e, unsigned f) {
  if (current < 0) return 101;
  struct fevent* ev = calloc(1, sizeof *ev);
  if (!ev) return 2;
  if (f & 4 && !(ev->x = ipcev_new("fakehip-ipcev"))) { /* hipEventInterprocess */
    free(ev);
    return 2;
  }
  *e = ev;
  return 0;
}
int hipEventRecord(void* e, void* stream) {
  struct fstream* s = stream;
  if (!s || s->dev != current) return 101;
  return fs_record(e, s, "fakehip");
}
int hipEventQuery(void* e) { return fs_passed(e) ? 0 : 600; /* hipErrorNotReady */ }
int hipEventDestroy(void* e) {
  free(e);
  return 0;
}
int hipIpcGetEventHandle(void* h, void* e) {
  struct fevent* ev = e;
  if (!ev->x) return 1; /* not made with hipEventInterprocess */
  ipcev_get(ev->x, IPCEV_MAGIC, h);
  return 0;
}
int hipIpcOpenEventHandle(void** e, ipcev_handle_t h) {
  long* x = ipcev_open(&h, IPCEV_MAGIC);
  if (!x) return 1;
  struct fevent* ev = calloc(1, sizeof *ev);
  ev->x = x;
  *e = ev;
  return 0;
}
int hipStreamWaitEvent(void* stream, void* e, unsigned f) {
  (void)f;
  struct fstream* s = stream;
  if (!s || s->dev != current) return 101;
  return fs_wait(s, e, "fakehip");
}

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
