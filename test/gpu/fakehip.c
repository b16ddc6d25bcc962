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
struct stream {
  int dev;
  pthread_mutex_t m;
  pthread_cond_t c;
  struct op *head, *tail;
  long issued, done;
};
static long async_us = -1, dtod_us = -1;

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
  case 4: { /* the recording reached: reached = max(reached, v) */
    long* d = (long*)o->dst;
    long cur = __atomic_load_n(d, __ATOMIC_ACQUIRE);
    while (cur < (long)o->v && !__atomic_compare_exchange_n(d, &cur, (long)o->v, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
    break;
  }
  case 5:
    while (__atomic_load_n((long*)o->dst, __ATOMIC_ACQUIRE) < (long)o->v) usleep(5);
    break;
  }
}
static void* stream_worker(void* arg) {
  struct stream* s = arg;
  pthread_mutex_lock(&s->m);
  for (;;) {
    while (!s->head) pthread_cond_wait(&s->c, &s->m);
    struct op* o = s->head;
    pthread_mutex_unlock(&s->m);
    usleep(async_us);
    if (o->dtod && dtod_us > 0) usleep(dtod_us);
    run_op(o);
    pthread_mutex_lock(&s->m);
    s->head = o->next;
    if (!s->head) s->tail = NULL;
    free(o);
    s->done++;
    pthread_cond_broadcast(&s->c);
  }
  return NULL;
}
/* enqueue runs o now (no delay) or hands it to the stream's worker. */
static int enqueue(struct stream* s, struct op o) {
  struct op* p = malloc(sizeof *p);
  if (!p) return 2;
  *p = o;
  p->next = NULL;
  pthread_mutex_lock(&s->m);
  s->issued++;
  if (async_us <= 0) {
    run_op(p);
    free(p);
    s->done++;
  } else {
    if (s->tail) s->tail->next = p;
    else s->head = p;
    s->tail = p;
    pthread_cond_broadcast(&s->c);
  }
  pthread_mutex_unlock(&s->m);
  return 0;
}
int hipStreamCreateWithFlags(void** s, unsigned f) {
  (void)f;
  if (current < 0) return 101;
  struct stream* st = calloc(1, sizeof *st);
  st->dev = current;
  pthread_mutex_init(&st->m, NULL);
  pthread_cond_init(&st->c, NULL);
  pthread_mutex_lock(&mu);
  if (async_us < 0) {
    async_us = getenv("FAKEHIP_ASYNC_US") ? atol(getenv("FAKEHIP_ASYNC_US")) : 0;
    dtod_us = getenv("FAKEHIP_DTOD_US") ? atol(getenv("FAKEHIP_DTOD_US")) : 0;
  }
  pthread_mutex_unlock(&mu);
  if (async_us > 0) {
    pthread_t t;
    pthread_create(&t, NULL, stream_worker, st);
    pthread_detach(t);
  }
  *s = st;
  return 0;
}
int hipStreamSynchronize(void* p) {
  struct stream* s = p;
  pthread_mutex_lock(&s->m);
  while (s->done < s->issued) pthread_cond_wait(&s->c, &s->m);
  pthread_mutex_unlock(&s->m);
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
  struct stream* st = s;
  if (!st || st->dev != current) return 101;
  int r = copyable(dst, src, n, kind, current);
  if (r != 0) return r;
  if (kind == 3) {
    static int said;
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED)) fprintf(stderr, "fakehip: a device-to-device copy\n");
  }
  return enqueue(st, (struct op){.kind = 0, .dtod = kind == 3, .dst = dst, .src = src, .n = n});
}
int hipMemcpy(void* dst, const void* src, size_t n, int kind) {
  int r = copyable(dst, src, n, kind, current);
  if (r == 0) memcpy(dst, src, n);
  return r;
}
int hipStreamWriteValue64(void* s, void* ptr, uint64_t v, unsigned flags) {
  struct stream* st = s;
  (void)flags;
  if (!st || st->dev != current) return 101;
  if ((uintptr_t)ptr % 8 || reach((uintptr_t)ptr, 8, current) != 0) return 1;
  static int said;
  if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED)) fprintf(stderr, "fakehip: a stream write of a signal word\n");
  return enqueue(st, (struct op){.kind = 1, .dst = ptr, .v = v});
}

/* Events. A plain one remembers its stream and how much was queued on it;
 * an interprocess one lives in a memfd arena that hipIpcOpenEventHandle
 * maps from the creating process (/proc/<pid>/fd/<fd>): a recording bumps
 * the recorded count and queues a mark that sets reached; a stream waiting
 * for it queues a wait until reached catches up with the count read when
 * the wait was queued. */
struct fevent {
  struct stream* s;
  long seq;
  long* x; /* interprocess: {recorded, reached} */
};
#define NIPCEV 4096
static long* arena;
static int arenafd = -1, arenanext;
int hipEventCreateWithFlags(void** e, unsigned f) {
  if (current < 0) return 101;
  struct fevent* ev = calloc(1, sizeof *ev);
  if (!ev) return 2;
  if (f & 4) { /* hipEventInterprocess */
    pthread_mutex_lock(&mu);
    if (!arena) {
      arenafd = memfd_create("fakehip-ipcev", MFD_CLOEXEC);
      if (arenafd >= 0 && ftruncate(arenafd, NIPCEV * 2 * sizeof(long)) == 0)
        arena = mmap(NULL, NIPCEV * 2 * sizeof(long), PROT_READ | PROT_WRITE, MAP_SHARED, arenafd, 0);
      if (arena == MAP_FAILED) arena = NULL;
    }
    int i = arena && arenanext < NIPCEV ? arenanext++ : -1;
    pthread_mutex_unlock(&mu);
    if (i < 0) {
      free(ev);
      return 2;
    }
    ev->x = arena + 2 * i;
  }
  *e = ev;
  return 0;
}
int hipEventRecord(void* e, void* stream) {
  struct fevent* ev = e;
  struct stream* s = stream;
  if (!s || s->dev != current) return 101;
  if (ev->x) {
    static int said;
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED)) fprintf(stderr, "fakehip: an interprocess event recorded\n");
    long v = __atomic_add_fetch(&ev->x[0], 1, __ATOMIC_ACQ_REL);
    return enqueue(s, (struct op){.kind = 4, .dst = &ev->x[1], .v = (uint64_t)v});
  }
  pthread_mutex_lock(&s->m);
  ev->s = s;
  ev->seq = s->issued;
  pthread_mutex_unlock(&s->m);
  return 0;
}
int hipEventQuery(void* e) {
  struct fevent* ev = e;
  if (ev->x) return __atomic_load_n(&ev->x[1], __ATOMIC_ACQUIRE) >= __atomic_load_n(&ev->x[0], __ATOMIC_ACQUIRE) ? 0 : 600;
  if (!ev->s) return 0;
  pthread_mutex_lock(&ev->s->m);
  int done = ev->s->done >= ev->seq;
  pthread_mutex_unlock(&ev->s->m);
  return done ? 0 : 600; /* hipErrorNotReady */
}
int hipEventDestroy(void* e) {
  free(e);
  return 0;
}
typedef struct {
  unsigned magic;
  int pid, fd, index;
  unsigned char pad[48];
} ipcEvHandle;
_Static_assert(sizeof(ipcEvHandle) == 64, "hipIpcEventHandle_t is 64 bytes");
int hipIpcGetEventHandle(void* h, void* e) {
  struct fevent* ev = e;
  if (!ev->x) return 1; /* not made with hipEventInterprocess */
  ipcEvHandle x = {.magic = 0x76656b68, .pid = getpid(), .fd = arenafd, .index = (int)((ev->x - arena) / 2)};
  memcpy(h, &x, sizeof x);
  return 0;
}
int hipIpcOpenEventHandle(void** e, ipcEvHandle h) {
  if (h.magic != 0x76656b68 || h.pid == getpid() || h.index < 0 || h.index >= NIPCEV) return 1;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", h.pid, h.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return 2;
  long* m = mmap(NULL, NIPCEV * 2 * sizeof(long), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return 2;
  struct fevent* ev = calloc(1, sizeof *ev);
  ev->x = m + 2 * h.index; /* the mapping stays for the process's life */
  *e = ev;
  return 0;
}
int hipStreamWaitEvent(void* stream, void* e, unsigned f) {
  (void)f;
  struct fevent* ev = e;
  struct stream* s = stream;
  if (!s || s->dev != current) return 101;
  if (!ev->x) return 1; /* the plugin waits only for interprocess events */
  long v = __atomic_load_n(&ev->x[0], __ATOMIC_ACQUIRE);
  static int said;
  if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED)) fprintf(stderr, "fakehip: a stream waits for another process's event\n");
  return enqueue(s, (struct op){.kind = 5, .dst = &ev->x[1], .v = (uint64_t)v});
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
