/* A stand-in libcuda.so.1 for machines without a GPU: "device memory" is
 * host memory the fake remembers, copies are memcpy. It lets
 * test/gpu/staging_bench.sh --fake run build/staging_bench (and the
 * plugin's CUDA glue: pinned allocation, per-thread streams, pointer
 * attributes) end to end; its numbers mean nothing.
 *
 *   cc -shared -fPIC -o build/fakecuda/libcuda.so.1 test/gpu/fakecuda.c -lpthread
 *   cc -shared -fPIC -o build/fakecuda/libgdrapi.so test/gpu/fakegdr.c    (optional) */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAXA 256
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  uintptr_t base;
  size_t n;
  int vmm; /* made by cuMemMap: reachable from every context */
  int fdp1; /* a cuMem mapping's memfd + 1 (0: none), for IPC */
  void* ctx; /* the context current at cuMemAlloc (which alone reaches it) */
} allocs[MAXA];
static int ctxobj, ctx2obj;
/* The calling thread's current context: a second context (cuCtxCreate)
 * may only touch cuMem* mappings, as with the real driver, where other
 * allocations belong to the context that made them. */
static __thread void* current;

/* alloc_size is the size of the allocation holding p (0: none). */
__attribute__((unused)) static size_t alloc_size(uintptr_t p) {
  pthread_mutex_lock(&mu);
  size_t n = 0;
  for (int i = 0; i < MAXA; i++)
    if (allocs[i].base && p >= allocs[i].base && p < allocs[i].base + allocs[i].n) n = allocs[i].n;
  pthread_mutex_unlock(&mu);
  return n;
}

static int find(uintptr_t p) {
  pthread_mutex_lock(&mu);
  int ok = 0;
  for (int i = 0; i < MAXA; i++)
    if (allocs[i].base && p >= allocs[i].base && p < allocs[i].base + allocs[i].n) ok = 1;
  pthread_mutex_unlock(&mu);
  return ok;
}

int cuInit(unsigned f) { (void)f; return 0; }
int cuDeviceGetCount(int* n) { *n = 1; return 0; }
int cuDeviceGet(int* d, int o) { *d = o; return 0; }
int cuDevicePrimaryCtxRetain(void** c, int d) { (void)d; *c = &ctxobj; return 0; }
int cuCtxSetCurrent(void* c) {
  current = c;
  return 0;
}
int cuCtxCreate_v2(void** c, unsigned f, int d) {
  (void)f, (void)d;
  /* FAKECUDA_CTX_FAIL=1: refuse, as an MPS server out of client contexts. */
  if (getenv("FAKECUDA_CTX_FAIL")) return 2;
  *c = current = &ctx2obj;
  return 0;
}
static int vmm_at(uintptr_t p) {
  pthread_mutex_lock(&mu);
  int ok = 0;
  for (int i = 0; i < MAXA; i++)
    if (allocs[i].base && allocs[i].vmm && p >= allocs[i].base && p < allocs[i].base + allocs[i].n) ok = 1;
  pthread_mutex_unlock(&mu);
  return ok;
}
/* A handle of cuMemCreate or cuMemImportFromShareableHandle is a memfd
 * (HMARK | fd), so that another process can map the same pages (IPC);
 * cuMemRelease closes it, and a mapping keeps a descriptor of its own. */
#define HMARK (1ULL << 62)
static int vmm_fd(uintptr_t p) {
  int fd = -1;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAXA; i++)
    if (allocs[i].base && allocs[i].vmm && p >= allocs[i].base && p < allocs[i].base + allocs[i].n) fd = allocs[i].fdp1 - 1;
  pthread_mutex_unlock(&mu);
  return fd;
}
int cuMemRetainAllocationHandle(unsigned long long* h, void* p) {
  int fd = vmm_fd((uintptr_t)p);
  *h = fd >= 0 ? HMARK | (unsigned long long)dup(fd) : 1;
  return vmm_at((uintptr_t)p) ? 0 : 1;
}
/* second_ok checks a device address used with the second context current. */
/* own2 reports whether dev lies in a cuMemAlloc allocation the second
 * context made itself (the plugin's scratch words). */
static int own2(uintptr_t dev) {
  pthread_mutex_lock(&mu);
  int ok = 0;
  for (int i = 0; i < MAXA; i++)
    if (allocs[i].base && !allocs[i].vmm && allocs[i].ctx == &ctx2obj && dev >= allocs[i].base && dev < allocs[i].base + allocs[i].n) ok = 1;
  pthread_mutex_unlock(&mu);
  return ok;
}
static int second_ok(uintptr_t dev) {
  static int said;
  if (current != &ctx2obj || own2(dev)) return 1;
  if (vmm_at(dev)) {
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED)) fprintf(stderr, "fakecuda: the plugin's second context reaches a cuMem mapping\n");
    return 1;
  }
  fprintf(stderr, "fakecuda: device address %#lx used in the plugin's second context, which cannot reach it\n", (unsigned long)dev);
  return 0;
}
int cuGetErrorString(int r, const char** s) { (void)r; *s = "fake CUDA error"; return 0; }
/* Streams run their work in order. By default each operation runs when
 * it is queued; with FAKECUDA_ASYNC_US=n a worker thread per stream runs
 * it n microseconds later, so that work the plugin does outside a
 * stream's order (a signal written before its payload's copy ran) shows.
 * FAKECUDA_DTOD_US=m delays device-to-device copies m microseconds more, so
 * that a header sent before a peer's copy into our memory ran shows. */
struct op {
  struct op* next;
  int kind; /* 0 copy, 1 write64, 2 add64, 3 add32 (low word), 4 mark an interprocess event, 5 wait for one */
  void* dst;
  const void* src;
  size_t n;
  const void* host;
  int to_device;
  uint64_t v;
};
static void run_op(struct op* o);
/* op_delay_us: device-to-device copies run FAKECUDA_DTOD_US later still. */
static long op_delay_us(const struct op* o) {
  static long dtod_us = -1;
  if (o->kind != 0 || o->host) return 0;
  if (dtod_us < 0) dtod_us = getenv("FAKECUDA_DTOD_US") ? atol(getenv("FAKECUDA_DTOD_US")) : 0;
  return dtod_us;
}
#include "fakestream.h"
int cuStreamCreate(void** out, unsigned f) {
  (void)f;
  *out = fs_new("FAKECUDA_ASYNC_US", 0);
  return *out ? 0 : 2;
}
static int enqueue(void* stream, struct op o) { return fs_enqueue(stream, o); }
int cuStreamSynchronize(void* stream) {
  fs_sync(stream);
  return 0;
}
int cuPointerGetAttribute(void* out, int attr, unsigned long long p) {
  if (!find((uintptr_t)p)) return 1;
  if (attr == 2) *(unsigned*)out = 2;       /* memory type: device */
  else if (attr == 1) *(void**)out = &ctxobj; /* context */
  else if (attr == 9) *(int*)out = 0;       /* ordinal */
  else return 1;
  return 0;
}
int cuMemGetAddressRange_v2(unsigned long long* base, size_t* n, unsigned long long p) {
  int ok = 1;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAXA; i++)
    if (allocs[i].base && p >= allocs[i].base && p < allocs[i].base + allocs[i].n) {
      *base = allocs[i].base;
      *n = allocs[i].n;
      ok = 0;
    }
  pthread_mutex_unlock(&mu);
  return ok;
}
int cuPointerSetAttribute(const void* v, int attr, unsigned long long p) { (void)v, (void)attr, (void)p; return 0; }
int cuMemAlloc_v2(unsigned long long* p, size_t n) {
  /* Large blocks aligned to 64 KiB, like the driver's, so that the fake
   * GDRCopy (fakegdr.c) can map their pages. */
  void* m = n >= (1 << 16) ? aligned_alloc(1 << 16, (n + 0xffff) & ~(size_t)0xffff) : calloc(1, n);
  if (n >= (1 << 16)) memset(m, 0, n);
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAXA; i++)
    if (!allocs[i].base) {
      allocs[i].base = (uintptr_t)m;
      allocs[i].n = n;
      allocs[i].vmm = 0;
      allocs[i].fdp1 = 0;
      allocs[i].ctx = current;
      break;
    }
  pthread_mutex_unlock(&mu);
  *p = (uintptr_t)m;
  return 0;
}
int cuMemFree_v2(unsigned long long p) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAXA; i++)
    if (allocs[i].base == p) allocs[i].base = 0;
  pthread_mutex_unlock(&mu);
  free((void*)(uintptr_t)p);
  return 0;
}
/* Pinned host memory is remembered, as the device reaches it (UVA): stream
 * writes and waits and the agent may touch it. */
#define MAXH 256
struct hrange {
  uintptr_t p;
  size_t n;
  unsigned flags; /* cuMemHostAlloc's or cuMemHostRegister's */
};
static struct hrange hallocs[MAXH];
/* remember puts a range in the first free entry of t (max entries). */
static void remember(struct hrange* t, int max, void* p, size_t n, unsigned f) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < max; i++)
    if (!t[i].p) {
      t[i] = (struct hrange){(uintptr_t)p, n, f};
      break;
    }
  pthread_mutex_unlock(&mu);
}
int cuMemHostAlloc(void** p, size_t n, unsigned f) {
  *p = malloc(n);
  remember(hallocs, MAXH, *p, n, f);
  return 0;
}
int cuMemFreeHost(void* p) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAXH; i++)
    if (hallocs[i].p == (uintptr_t)p) hallocs[i].p = 0;
  pthread_mutex_unlock(&mu);
  free(p);
  return 0;
}
/* Pinning memory the caller mapped (the plugin's intra-node staging ring):
 * the range is remembered, so that copies of it can be watched.
 *
 * FAKECUDA_STAGE_FILE=path (a file of at least 64 bytes that every process
 * of a test maps) and FAKECUDA_STAGE_US=n: each async copy whose host side
 * lies in registered memory takes n microseconds, and counts in the file:
 * word 0 copies to the device running now (all processes), word 1 from
 * the device, word 2 such copies made, word 3 those that started while one
 * of the other direction ran (in this process or another): how much the
 * stages of the ring overlap. */
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#define MAXREG 64
static struct hrange regs[MAXREG];
/* hostmem reports whether [p, p+n) lies in pinned host memory. */
__attribute__((unused)) static int hostmem(uintptr_t p, size_t n) {
  pthread_mutex_lock(&mu);
  int ok = 0;
  for (int i = 0; i < MAXH; i++)
    if (hallocs[i].p && p >= hallocs[i].p && p + n <= hallocs[i].p + hallocs[i].n) ok = 1;
  for (int i = 0; i < MAXREG; i++)
    if (regs[i].p && p >= regs[i].p && p + n <= regs[i].p + regs[i].n) ok = 1;
  pthread_mutex_unlock(&mu);
  return ok;
}
static volatile long* stage;
static long stage_us = -1;

int cuMemHostRegister_v2(void* p, size_t n, unsigned f) {
  if (!p || !n) return 1;
  remember(regs, MAXREG, p, n, f);
  return 0;
}
int cuMemHostUnregister(void* p) {
  int found = 0;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAXREG; i++)
    if (regs[i].p == (uintptr_t)p) regs[i].p = 0, found = 1;
  pthread_mutex_unlock(&mu);
  return found ? 0 : 1;
}

/* watched returns the shared counters when host lies in registered memory
 * and FAKECUDA_STAGE_FILE is set, else NULL. */
static volatile long* watched(const void* host) {
  pthread_mutex_lock(&mu);
  if (stage_us < 0) {
    const char* f = getenv("FAKECUDA_STAGE_FILE");
    const char* us = getenv("FAKECUDA_STAGE_US");
    stage_us = us ? atol(us) : 0;
    int fd = f ? open(f, O_RDWR) : -1;
    if (fd >= 0) {
      void* m = mmap(NULL, 64, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (m != MAP_FAILED) stage = m;
      close(fd);
    }
  }
  int in = 0;
  for (int i = 0; i < MAXREG; i++)
    if (regs[i].p && (uintptr_t)host >= regs[i].p && (uintptr_t)host < regs[i].p + regs[i].n) in = 1;
  pthread_mutex_unlock(&mu);
  return in ? stage : NULL;
}

static void stage_copy(int to_device, void* dst, const void* src, size_t n, const void* host) {
  volatile long* w = watched(host);
  if (w) {
    __atomic_add_fetch(&w[to_device ? 0 : 1], 1, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&w[2], 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&w[to_device ? 1 : 0], __ATOMIC_SEQ_CST) > 0) __atomic_add_fetch(&w[3], 1, __ATOMIC_SEQ_CST);
    usleep(stage_us);
  }
  memcpy(dst, src, n);
  if (w) __atomic_sub_fetch(&w[to_device ? 0 : 1], 1, __ATOMIC_SEQ_CST);
}
int cuMemcpyHtoD_v2(unsigned long long d, const void* h, size_t n) { memcpy((void*)(uintptr_t)d, h, n); return 0; }
int cuMemcpyDtoH_v2(void* h, unsigned long long d, size_t n) { memcpy(h, (void*)(uintptr_t)d, n); return 0; }
static void run_op(struct op* o) {
  if (o->kind == 6) { /* cuStreamWaitValue64: until the word reaches v */
    while (__atomic_load_n((uint64_t*)o->dst, __ATOMIC_ACQUIRE) < o->v) usleep(20);
    return;
  }
  if (o->kind == 4) { /* the recording reached */
    ipcev_reach((long*)o->dst, (long)o->v);
    return;
  }
  if (o->kind == 5) { /* wait until another process's stream reached recording v */
    ipcev_wait((const long*)o->dst, (long)o->v);
    return;
  }
  if (o->kind == 0) stage_copy(o->to_device, o->dst, o->src, o->n, o->host);
  else if (o->kind == 1) __atomic_store_n((uint64_t*)o->dst, o->v, __ATOMIC_SEQ_CST);
  else if (o->kind == 3) __atomic_add_fetch((uint32_t*)o->dst, (uint32_t)o->v, __ATOMIC_SEQ_CST);
  else __atomic_add_fetch((uint64_t*)o->dst, o->v, __ATOMIC_SEQ_CST);
}
int cuMemcpyHtoDAsync_v2(unsigned long long d, const void* h, size_t n, void* s) {
  if (!second_ok(d)) return 1;
  return enqueue(s, (struct op){.kind = 0, .dst = (void*)(uintptr_t)d, .src = h, .n = n, .host = h, .to_device = 1});
}
int cuMemcpyDtoHAsync_v2(void* h, unsigned long long d, size_t n, void* s) {
  if (!second_ok(d)) return 1;
  return enqueue(s, (struct op){.kind = 0, .dst = h, .src = (void*)(uintptr_t)d, .n = n, .host = h});
}

#ifndef FAKECUDA_MINIMAL
/* Device to device: both ends fake device memory the context reaches. */
int cuMemcpyDtoDAsync_v2(unsigned long long d, unsigned long long s, size_t n, void* st) {
  if (!find((uintptr_t)d) || !find((uintptr_t)s) || !second_ok(d) || !second_ok(s)) return 1;
  static int said;
  if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED)) fprintf(stderr, "fakecuda: a device-to-device copy\n");
  return enqueue(st, (struct op){.kind = 0, .dst = (void*)(uintptr_t)d, .src = (void*)(uintptr_t)s, .n = n, .host = NULL});
}
#endif

#ifndef FAKECUDA_MINIMAL
/* Stream memory operations, events and the plugin's atomic-add kernel,
 * emulated on host memory (which fake device memory is). Built with
 * -DFAKECUDA_MINIMAL the library lacks them all, as an old driver would,
 * and the plugin must fall back to synchronous copies. FAKECUDA_NO_MEMOPS=1
 * makes the device deny 64-bit stream memory operations. */
int cuCtxGetDevice(int* d) { *d = 0; return 0; }
int cuDeviceGetAttribute(int* v, int attr, int dev) {
  (void)dev;
  if (attr == 122 || attr == 93) *v = getenv("FAKECUDA_NO_MEMOPS") ? 0 : 1;
  else if (attr == 148) *v = getenv("FAKECUDA_NO_REDUCE") ? 0 : 1; /* atomic reductions */
  else *v = 0;
  return 0;
}
int cuStreamWriteValue64_v2(void* s, unsigned long long addr, unsigned long long v, unsigned flags) {
  (void)flags;
  if (hostmem((uintptr_t)addr, 8) && addr % 8 == 0) return enqueue(s, (struct op){.kind = 1, .dst = (void*)(uintptr_t)addr, .v = v});
  if (!find((uintptr_t)addr) || addr % 8 || !second_ok(addr)) return 1;
  return enqueue(s, (struct op){.kind = 1, .dst = (void*)(uintptr_t)addr, .v = v});
}
int cuStreamWaitValue64_v2(void* s, unsigned long long addr, unsigned long long v, unsigned flags) {
  if (flags != 0 || addr % 8 || !hostmem((uintptr_t)addr, 8)) return 1; /* GEQ on host memory only */
  return enqueue(s, (struct op){.kind = 6, .dst = (void*)(uintptr_t)addr, .v = v});
}
/* cuStreamBatchMemOp_v2 with barriers (6) and atomic reductions (8): an
 * add whose data type is 18 (the value the plugin's probe tries first)
 * is a 64-bit add, or with FAKECUDA_REDUCE_32=1 a 32-bit add of the low
 * word (the probe must then refuse it); any other data type, operation or
 * flag is refused, as a driver refuses a value it does not know. */
struct fmemop {
  unsigned operation, flags, reductionOp, dataType;
  unsigned long long address, value, alias;
  unsigned long long pad;
};
int cuStreamBatchMemOp_v2(void* s, unsigned count, struct fmemop* ops, unsigned flags) {
  if (flags || count > 256) return 1;
  for (unsigned i = 0; i < count; i++) {
    struct fmemop* o = &ops[i];
    if (o->operation == 6) continue;
    if (o->operation != 8 || o->flags || o->reductionOp != 0 || o->dataType != 18) return 1;
    if (!find((uintptr_t)o->address) || o->address % 8 || !second_ok(o->address)) return 1;
  }
  static int said;
  for (unsigned i = 0; i < count; i++) {
    struct fmemop* o = &ops[i];
    if (o->operation != 8) continue;
    int kind = getenv("FAKECUDA_REDUCE_32") ? 3 : 2;
    /* The plugin's probe adds to a 32-byte scratch allocation (no test
     * program allocates that size); say when another word gets one. */
    if (alloc_size(o->address) != 32 && !__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
      fprintf(stderr, "fakecuda: a stream atomic add to a signal word\n");
    enqueue(s, (struct op){.kind = kind, .dst = (void*)(uintptr_t)o->address, .v = o->value});
  }
  return 0;
}
static int modobj, funcobj, waitmod, waitfunc, agentmod, agentfunc;


/* The plugin's device agent (host/devmem/cuda/agent.c), emulated by a
 * thread that runs its ring's commands in order, with the layout the
 * kernel reads. FAKECUDA_AGENT_US=n delays each command n microseconds,
 * so that work ordered wrongly against the stream shows. A command with
 * an address the GPU would fault on ends the process, as a real fault
 * would poison the context. The stream the kernel runs on answers
 * cuStreamQuery "not ready" while a thread runs or waits to. Kernels
 * launched on one stream run one after the other, as on a GPU: a launch
 * while one runs waits for it to end. The kernel parks as the real one
 * does: once idle for its idle parameter (ns, 0 never) it writes awake = 0
 * (header word 24), fences, looks at the next slot once more, and ends
 * unless a command came. */
struct agentargs {
  volatile uint64_t* ring;
  uint64_t mask, idle;
  int inl;     /* the flags parameter's bit 0: inline commands may come */
  int oneRead; /* bit 1: the slot is read whole and taken by its check word */
  void* stream;
};
static struct {
  void* s;
  int running, queued;
} agentStreams[64];
static pthread_mutex_t agentMu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t agentCv = PTHREAD_COND_INITIALIZER;
static int agent_running(void* s) {
  pthread_mutex_lock(&agentMu);
  int busy = 0;
  for (int i = 0; i < 64; i++)
    if (agentStreams[i].s == s) busy = 1;
  pthread_mutex_unlock(&agentMu);
  return busy;
}
static uint64_t mono_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}
static void agent_bad(const char* what, uint64_t a, uint64_t n) {
  fprintf(stderr, "fakecuda: the device agent was handed %s (%#llx, %llu bytes)\n", what, (unsigned long long)a, (unsigned long long)n);
  abort();
}
/* The peer inbox (agent.ptx, ISCAN; host/devmem/cuda/inbox.c): rows of
 * entries a peer's agent writes into our device memory, read from the
 * ring header when the kernel starts and looked at between commands. */
struct ibx {
  uint64_t rows, hrows, P, E, logE, next[32];
  volatile uint64_t* taken;
  const volatile uint64_t* table;
};
static void ib_load(volatile uint64_t* ring, struct ibx* b) {
  memset(b, 0, sizeof *b);
  b->rows = ring[25];
  b->hrows = ring[30];
  b->P = ring[26] > 16 ? 16 : ring[26];
  b->logE = ring[27] > 16 ? 16 : ring[27];
  b->E = 1ull << b->logE;
  b->taken = (volatile uint64_t*)(uintptr_t)ring[28];
  b->table = (const volatile uint64_t*)(uintptr_t)ring[29];
  if (!b->rows || !b->P || !b->taken || !b->table) {
    b->P = 0;
    return;
  }
  if (!hostmem((uintptr_t)b->taken, 32 * 8)) agent_bad("inbox counts it cannot reach", (uintptr_t)b->taken, 32 * 8);
  if (b->hrows && !hostmem(b->hrows, b->P * b->E * 8)) agent_bad("inbox host rows it cannot reach", b->hrows, b->P * b->E * 8);
  if (!find(b->rows) || !vmm_at(b->rows) || !find(b->rows + b->P * b->E * 8 - 1))
    agent_bad("inbox rows it cannot reach", b->rows, b->P * b->E * 8);
  static int saidHost;
  if (b->hrows && !__atomic_exchange_n(&saidHost, 1, __ATOMIC_RELAXED)) fprintf(stderr, "fakecuda: the device agent reads inbox rows in host memory\n");
  if (!find((uintptr_t)b->table) || !find((uintptr_t)b->table + 64 * 16 - 1)) agent_bad("an inbox table it cannot reach", (uintptr_t)b->table, 1024);
  for (uint64_t i = 0; i < b->P; i++) b->next[i] = b->taken[i], b->next[16 + i] = b->taken[16 + i];
}
/* ib_scan takes every entry there is (each us late, as commands are);
 * 1 when it took one. */
static int ib_scan(struct ibx* b, long us) {
  const uint64_t low62 = (1ull << 62) - 1;
  int took = 0;
  for (uint64_t j = 0; j < 32; j++)
    for (uint64_t i = j & 15; i < b->P && (j < 16 || b->hrows);) {
      uint64_t pos = b->next[j] & low62;
      uint64_t w = __atomic_load_n((uint64_t*)(uintptr_t)((j < 16 ? b->rows : b->hrows) + (i * b->E + (pos & (b->E - 1))) * 8), __ATOMIC_ACQUIRE);
      if (w >> 56 != (pos >> b->logE) % 255 + 1) break;
      if (us > 0) usleep(us);
      uint64_t idx = w >> 50 & 63, off = (w >> 28 & 0x3fffff) * 8, val = w & 0xfffffff;
      uint64_t base = b->table[idx * 2], size = b->table[idx * 2 + 1];
      if (base && off + 8 <= size) {
        if (!find(base + off) || !vmm_at(base + off)) agent_bad("a table entry naming memory it cannot reach", base, size);
        __atomic_add_fetch((uint64_t*)(uintptr_t)(base + off), val, __ATOMIC_SEQ_CST);
        static int saidInbox;
        if (!__atomic_exchange_n(&saidInbox, 1, __ATOMIC_RELAXED)) fprintf(stderr, "fakecuda: the device agent added a peer's inbox entry\n");
      } else {
        b->next[j] |= 1ull << 62;
        static int saidRefused;
        if (!__atomic_exchange_n(&saidRefused, 1, __ATOMIC_RELAXED)) fprintf(stderr, "fakecuda: the device agent refused an inbox entry\n");
      }
      b->next[j]++;
      __atomic_store_n(&b->taken[j], b->next[j], __ATOMIC_RELEASE);
      took = 1;
    }
  return took;
}

static void* agent_main(void* arg) {
  struct agentargs* x = arg;
  static long us = -1;
  static int saidCopy, saidSig;
  if (us < 0) us = getenv("FAKECUDA_AGENT_US") ? atol(getenv("FAKECUDA_AGENT_US")) : 0;
  /* FAKECUDA_INBOX_US=n: inbox entries n us late instead (0: at once, so
   * that a peer's entry that ran ahead of its copy shows). */
  static long ius = -2;
  if (ius == -2) ius = getenv("FAKECUDA_INBOX_US") ? atol(getenv("FAKECUDA_INBOX_US")) : us;
  int me = -1;
  pthread_mutex_lock(&agentMu);
  for (int i = 0; i < 64 && me < 0; i++)
    if (agentStreams[i].s == x->stream) me = i;
  while (agentStreams[me].running) pthread_cond_wait(&agentCv, &agentMu);
  agentStreams[me].running = 1;
  agentStreams[me].queued--;
  pthread_mutex_unlock(&agentMu);
  /* FAKECUDA_AGENT_LATE_MS: the first launch after the kernel parked
   * (started stays 1: the host clears it only for a launch it waits for)
   * that finds a command other than EXIT waiting starts this late, as a
   * block waits for an SM another grid holds. */
  static int lateDone;
  const char* late = getenv("FAKECUDA_AGENT_LATE_MS");
  if (late && __atomic_load_n(&x->ring[16], __ATOMIC_ACQUIRE) == 1) {
    uint64_t next = __atomic_load_n(&x->ring[0], __ATOMIC_ACQUIRE) + 1;
    volatile uint64_t* sl = x->ring + (256 + (next & x->mask) * 128) / 8;
    if (__atomic_load_n(&sl[0], __ATOMIC_ACQUIRE) == next && sl[2] != 5 && !__atomic_exchange_n(&lateDone, 1, __ATOMIC_RELAXED)) {
      usleep((useconds_t)atol(late) * 1000);
      fprintf(stderr, "fakecuda: the device agent's kernel started %s ms late\n", late);
    }
  }
  __atomic_store_n(&x->ring[24], 1, __ATOMIC_RELEASE);
  __atomic_store_n(&x->ring[16], 1, __ATOMIC_RELEASE);
  struct ibx ib;
  ib_load(x->ring, &ib);
  for (uint64_t seq = __atomic_load_n(&x->ring[0], __ATOMIC_ACQUIRE) + 1;; seq++) {
    volatile uint64_t* sl = x->ring + (256 + (seq & x->mask) * 128) / 8;
    int parked = 0;
    uint64_t since = mono_ns();
    if (ib.P) ib_scan(&ib, ius);
    for (int spins = 0; __atomic_load_n(&sl[0], __ATOMIC_ACQUIRE) != seq; spins++) {
      if (ib.P && ib_scan(&ib, ius)) {
        since = mono_ns();
        spins = 0;
        continue;
      }
      if (x->idle && mono_ns() - since >= x->idle) {
        __atomic_store_n(&x->ring[24], 0, __ATOMIC_SEQ_CST);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        if (__atomic_load_n(&sl[0], __ATOMIC_ACQUIRE) != seq) {
          static int saidPark;
          if (!__atomic_exchange_n(&saidPark, 1, __ATOMIC_RELAXED)) fprintf(stderr, "fakecuda: the device agent parked\n");
          parked = 1;
          break;
        }
        __atomic_store_n(&x->ring[24], 1, __ATOMIC_SEQ_CST);
        break;
      }
      if (spins > 200) usleep(50);
      else sched_yield();
    }
    if (parked) break;
    /* The one-read kernel's check (agent.ptx, CHECK): a slot whose check
     * word does not match what the host wrote would be read three times
     * and then taken the slow way, so a host that forgot to write it or
     * wrote it wrong would only be slower on a GPU; here it ends the
     * process, so that the tests see it. */
    if (x->oneRead) {
      uint64_t h = 0, c = 0;
      for (int j = 0; j < (x->inl ? 16 : 8); j++, c += 0x9e3779b97f4a7c15ull) {
        uint64_t w = (j == 0 ? seq : j == 1 ? 0 : sl[j]) ^ c;
        w = (w ^ (w >> 30)) * 0xbf58476d1ce4e5b9ull;
        w = (w ^ (w >> 27)) * 0x94d049bb133111ebull;
        h ^= w ^ (w >> 31);
      }
      if (h != sl[1]) agent_bad("a slot whose check word does not match its words", seq, sl[1]);
      static int saidOneRead;
      if (!__atomic_exchange_n(&saidOneRead, 1, __ATOMIC_RELAXED)) fprintf(stderr, "fakecuda: the device agent read a slot whole, its check word matched\n");
    }
    uint64_t kind = sl[2], n = sl[3], src = sl[4], dst = sl[5], val = sl[6], sig = sl[7];
    /* A write or add after a mark (kind | 16, AG_AFTER_MARK): first wait
     * until the pinned host word src reached n, at most
     * FAKECUDA_MARK_WAIT_MS (the kernel's 30 s) or until the pinned host
     * word sig (when not 0: the release word) is not 0, then skip the
     * signal and count it at header word 19, as the kernel does. */
    int afterMark = (kind & 16) != 0, skipped = 0;
    kind &= 15;
    if (afterMark) {
      if (kind != 2 && kind != 3) agent_bad("a wait for a mark before a command that is no signal", kind, 0);
      if (src % 8 || !hostmem(src, 8)) agent_bad("a mark it cannot reach", src, 8);
      if (sig && (sig % 8 || !hostmem(sig, 8))) agent_bad("a release word it cannot reach", sig, 8);
      const char* ms = getenv("FAKECUDA_MARK_WAIT_MS");
      uint64_t limit = (ms ? strtoull(ms, NULL, 10) : 30000) * 1000000ull, t0 = mono_ns();
      while (__atomic_load_n((uint64_t*)(uintptr_t)src, __ATOMIC_ACQUIRE) < n) {
        if (mono_ns() - t0 >= limit || (sig && __atomic_load_n((uint64_t*)(uintptr_t)sig, __ATOMIC_ACQUIRE) != 0)) {
          skipped = 1;
          __atomic_add_fetch(&x->ring[19], 1, __ATOMIC_SEQ_CST);
          break;
        }
        usleep(20);
      }
      static int saidMarkWait;
      if (!__atomic_exchange_n(&saidMarkWait, 1, __ATOMIC_RELAXED))
        fprintf(stderr, "fakecuda: the device agent waited for a peer's mark before a signal\n");
    }
    unsigned char inl[64];
    if (kind == 9 || kind == 10) {
      if (!x->inl) agent_bad("an inline command, started without reading inline bytes", dst, n);
      if (!n || n > sizeof inl) agent_bad("an inline payload it cannot carry", dst, n);
      memcpy(inl, (const void*)(sl + 8), n); /* read with the slot, as the kernel does */
    }
    if (us > 0) usleep(us);
    switch (kind) {
      case 9:
      case 10:
        if (!find(dst) || !vmm_at(dst) || !find(dst + n - 1)) agent_bad("an inline payload for memory it cannot reach", dst, n);
        memcpy((void*)(uintptr_t)dst, inl, n);
        static int saidInline;
        if (!__atomic_exchange_n(&saidInline, 1, __ATOMIC_RELAXED))
          fprintf(stderr, "fakecuda: the device agent landed an inline payload and its signal in one command\n");
        break;
      case 1:
      case 7:
      case 8: {
        int up = hostmem(src, n) && find(dst) && vmm_at(dst) && alloc_size(dst) && find(dst + n - 1);
        int down = hostmem(dst, n) && find(src) && vmm_at(src) && find(src + n - 1);
        /* Device to device: both ends cuMem mappings (a peer's window
         * mapped here, the copy context's own memory). */
        int across = find(src) && vmm_at(src) && find(src + n - 1) && find(dst) && vmm_at(dst) && find(dst + n - 1);
        if (!n || (!up && !down && !across)) agent_bad("a copy it cannot reach", up ? dst : src, n);
        static int saidAcross;
        if (across && !__atomic_exchange_n(&saidAcross, 1, __ATOMIC_RELAXED))
          fprintf(stderr, "fakecuda: the device agent copied device to device\n");
        memcpy((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, n);
        if (!__atomic_exchange_n(&saidCopy, 1, __ATOMIC_RELAXED)) fprintf(stderr, "fakecuda: the device agent copied a payload\n");
        static int saidFused;
        if (kind != 1 && !__atomic_exchange_n(&saidFused, 1, __ATOMIC_RELAXED))
          fprintf(stderr, "fakecuda: the device agent landed a payload and its signal in one command\n");
        break;
      }
      case 2:
      case 3:
        /* A write may go to pinned host memory too (a peer's host inbox
         * rows); an add only to device memory. */
        if (dst % 8 || ((!find(dst) || !vmm_at(dst)) && (kind == 3 || !hostmem(dst, 8))))
          agent_bad("a signal word it cannot reach", dst, 8);
        if (skipped) break;
        if (kind == 2) __atomic_store_n((uint64_t*)(uintptr_t)dst, val, __ATOMIC_SEQ_CST);
        else __atomic_add_fetch((uint64_t*)(uintptr_t)dst, val, __ATOMIC_SEQ_CST);
        if (!__atomic_exchange_n(&saidSig, 1, __ATOMIC_RELAXED)) fprintf(stderr, "fakecuda: the device agent applied a signal\n");
        break;
      case 4:
        if (dst % 8 || !hostmem(dst, 8)) agent_bad("an epoch word it cannot reach", dst, 8);
        while (__atomic_load_n((uint64_t*)(uintptr_t)dst, __ATOMIC_ACQUIRE) < val) usleep(20);
        break;
      case 0: /* nothing: a launch's reason (the peer inbox's kick) */
      case 5:
        break;
      default:
        agent_bad("an unknown command", kind, 0);
    }
    if (kind >= 7) {
      /* A fused command's signal, after its payload: a device word, or
       * (a copy's mark, kind 7) a word of pinned host memory. */
      int marked = kind == 7 && sig % 8 == 0 && hostmem(sig, 8);
      if (!marked && (sig % 8 || !find(sig) || !vmm_at(sig))) agent_bad("a signal word it cannot reach", sig, 8);
      static int saidMark;
      if (marked && !__atomic_exchange_n(&saidMark, 1, __ATOMIC_RELAXED))
        fprintf(stderr, "fakecuda: the device agent marked a copy in host memory\n");
      if (kind == 7 || kind == 9) __atomic_store_n((uint64_t*)(uintptr_t)sig, val, __ATOMIC_SEQ_CST);
      else __atomic_add_fetch((uint64_t*)(uintptr_t)sig, val, __ATOMIC_SEQ_CST);
    }
    __atomic_store_n(&x->ring[0], seq, __ATOMIC_RELEASE);
    if (kind == 5) break;
  }
  pthread_mutex_lock(&agentMu);
  agentStreams[me].running = 0;
  if (!agentStreams[me].queued) agentStreams[me].s = NULL;
  pthread_cond_broadcast(&agentCv);
  pthread_mutex_unlock(&agentMu);
  free(x);
  return NULL;
}
int cuStreamQuery(void* s) { return agent_running(s) ? 600 : 0; }
int cuModuleLoadData(void** m, const void* image) {
  /* FAKECUDA_NO_MODULES=1: loading a module may synchronize a real
   * context (CUDA lazy loading), which deadlocks against an application
   * kernel spinning on a signal; paths that must never load one run with
   * this set, and a load ends the process. */
  if (getenv("FAKECUDA_NO_MODULES")) {
    fprintf(stderr, "fakecuda: cuModuleLoadData called with FAKECUDA_NO_MODULES set\n");
    abort();
  }
  /* staging_bench's waiting kernel (BENCH_KERNEL_WAIT=1) is the other
   * module the fake knows. */
  if (strstr(image, ".entry rmaw_agent") && strstr(image, "nanosleep")) {
    *m = &agentmod;
    return 0;
  }
  if (strstr(image, ".entry bench_wait") && strstr(image, "%globaltimer")) {
    *m = &waitmod;
    return 0;
  }
  if (!strstr(image, "atom.global.add.u64") || !strstr(image, ".entry rmaw_add64")) return 218; /* invalid PTX */
  *m = &modobj;
  return 0;
}
int cuModuleGetFunction(void** f, void* m, const char* name) {
  if (m == &agentmod && strcmp(name, "rmaw_agent") == 0) {
    *f = &agentfunc;
    return 0;
  }
  if (m == &waitmod && strcmp(name, "bench_wait") == 0) {
    *f = &waitfunc;
    return 0;
  }
  if (m != &modobj || strcmp(name, "rmaw_add64") != 0) return 500;
  *f = &funcobj;
  return 0;
}
/* Mapped host memory: the fake's device addresses are host addresses. As
 * the driver does, it answers only for pinned memory allocated or
 * registered with DEVICEMAP (2). */
int cuMemHostGetDevicePointer_v2(unsigned long long* d, void* p, unsigned f) {
  if (f) return 1;
  int ok = 0;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAXH; i++)
    if (hallocs[i].p && (uintptr_t)p >= hallocs[i].p && (uintptr_t)p < hallocs[i].p + hallocs[i].n && hallocs[i].flags & 2) ok = 1;
  for (int i = 0; i < MAXREG; i++)
    if (regs[i].p && (uintptr_t)p >= regs[i].p && (uintptr_t)p < regs[i].p + regs[i].n && regs[i].flags & 2) ok = 1;
  pthread_mutex_unlock(&mu);
  if (!ok) return 1; /* CUDA_ERROR_INVALID_VALUE */
  *d = (uintptr_t)p;
  return 0;
}
/* bench_wait runs on a thread of its own, as a kernel runs beside the
 * host: it spins until the word reaches want or 10 s passed, then stores
 * what it saw in the flag. */
struct waitargs {
  volatile uint64_t *w, *flag;
  uint64_t want;
};
static void* bench_wait(void* a) {
  struct waitargs* x = a;
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  uint64_t v;
  while ((v = __atomic_load_n(x->w, __ATOMIC_ACQUIRE)) < x->want) {
    clock_gettime(CLOCK_MONOTONIC, &t);
    if (t.tv_sec - t0.tv_sec > 10) break;
    sched_yield();
  }
  __atomic_store_n(x->flag, v, __ATOMIC_RELEASE);
  free(x);
  return NULL;
}
int cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shm,
                   void* s, void** params, void** extra) {
  (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shm, (void)extra;
  if (f == &agentfunc) {
    if (bx != 128 || gx != 1) return 1;
    struct agentargs* x = malloc(sizeof *x);
    x->ring = (volatile uint64_t*)(uintptr_t)*(uint64_t*)params[0];
    x->mask = *(uint64_t*)params[1];
    x->idle = *(uint64_t*)params[2];
    x->inl = *(uint64_t*)params[3] & 1;
    x->oneRead = (*(uint64_t*)params[3] & 2) != 0;
    static int saidStagger;
    if ((*(uint64_t*)params[3] & 4) && !__atomic_exchange_n(&saidStagger, 1, __ATOMIC_RELAXED))
      fprintf(stderr, "fakecuda: the device agent's kernel started with staggered pollers\n");
    x->stream = s;
    if (!hostmem((uintptr_t)x->ring, 256 + (x->mask + 1) * 64)) return 700;
    int slot = -1;
    pthread_mutex_lock(&agentMu);
    for (int i = 0; i < 64 && slot < 0; i++)
      if (agentStreams[i].s == s) slot = i;
    for (int i = 0; i < 64 && slot < 0; i++)
      if (!agentStreams[i].s) slot = i, agentStreams[i].s = s;
    if (slot >= 0) agentStreams[slot].queued++;
    pthread_mutex_unlock(&agentMu);
    if (slot < 0) return 2;
    pthread_t th;
    if (pthread_create(&th, NULL, agent_main, x) != 0) return 2;
    pthread_detach(th);
    return 0;
  }
  if (f == &waitfunc) {
    uint64_t w = *(uint64_t*)params[0];
    if (!find((uintptr_t)w) || w % 8) return 700;
    struct waitargs* x = malloc(sizeof *x);
    x->w = (volatile uint64_t*)(uintptr_t)w;
    x->want = *(uint64_t*)params[1];
    x->flag = (volatile uint64_t*)(uintptr_t)*(uint64_t*)params[2];
    pthread_t th;
    if (pthread_create(&th, NULL, bench_wait, x) != 0) return 2;
    pthread_detach(th);
    return 0;
  }
  if (f != &funcobj) return 400;
  uint64_t p = *(uint64_t*)params[0], v = *(uint64_t*)params[1];
  if (!find((uintptr_t)p) || p % 8) return 700; /* launch failed */
  return enqueue(s, (struct op){.kind = 2, .dst = (void*)(uintptr_t)p, .v = v});
}
/* Interprocess events: fakeipcev.h. */
#define IPCEV_MAGIC 0x76656b66
int cuEventCreate(void** e, unsigned f) {
  struct fevent* ev = calloc(1, sizeof(struct fevent));
  if (f & 4 && !(ev->x = ipcev_new("fakecuda-ipcev"))) {
    free(ev);
    return 2;
  }
  *e = ev;
  return 0;
}
int cuIpcGetEventHandle(void* h, void* e) {
  struct fevent* ev = e;
  if (!ev->x) return 1; /* not made with CU_EVENT_INTERPROCESS */
  ipcev_get(ev->x, IPCEV_MAGIC, h);
  return 0;
}
int cuIpcOpenEventHandle(void** e, ipcev_handle_t h) {
  long* x = ipcev_open(&h, IPCEV_MAGIC);
  if (!x) return 1;
  struct fevent* ev = calloc(1, sizeof(struct fevent));
  ev->x = x;
  *e = ev;
  return 0;
}
int cuEventRecord(void* e, void* stream) { return fs_record(e, stream, "fakecuda"); }
int cuEventQuery(void* e) { return fs_passed(e) ? 0 : 600; }
int cuStreamWaitEvent(void* stream, void* e, unsigned f) {
  (void)f;
  return fs_wait(stream, e, "fakecuda");
}
int cuEventDestroy_v2(void* e) { free(e); return 0; }
#endif

/* Virtual memory management, enough for a multi-segment window: a
 * reservation is host memory; each cuMemMap makes one "allocation" of it
 * known (so the plugin sees several allocations back to back, as with the
 * real driver); the DMA-BUF of a range is a memfd the caller closes. */
#include <sys/mman.h>
#include <unistd.h>
int cuMemGetAllocationGranularity(size_t* g, const void* prop, int opt) { (void)prop, (void)opt; *g = 2 << 20; return 0; }
int cuMemAddressReserve(unsigned long long* p, size_t n, size_t align, unsigned long long addr, unsigned long long f) {
  (void)addr, (void)f;
  void* m = aligned_alloc(align ? align : (2 << 20), n);
  if (!m) return 2;
  memset(m, 0, n);
  *p = (uintptr_t)m;
  return 0;
}
/* An allocation made without POSIX fds among its requested handle types
 * (CUmemAllocationProp's second int) cannot be exported, as on a real
 * driver: its memfd is named so. */
int cuMemCreate(unsigned long long* h, size_t n, const void* prop, unsigned long long f) {
  (void)f;
  int types = ((const int*)prop)[1];
  int fd = memfd_create(types & 1 ? "fake-vmm" : "fake-vmm-private", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)n) != 0) return 2;
  *h = HMARK | (unsigned long long)fd;
  return 0;
}
int cuMemExportToShareableHandle(void* out, unsigned long long h, int type, unsigned long long f) {
  (void)f;
  if (type != 1 || !(h & HMARK)) return 1; /* POSIX fds of cuMemCreate'd memory only */
  char link[64], name[128];
  snprintf(link, sizeof link, "/proc/self/fd/%d", (int)(h & ~HMARK));
  ssize_t k = readlink(link, name, sizeof name - 1);
  if (k > 0 && (name[k] = 0, strstr(name, "fake-vmm-private"))) return 1; /* refused: not shareable */
  int fd = dup((int)(h & ~HMARK));
  if (fd < 0) return 2;
  *(int*)out = fd;
  return 0;
}
int cuMemImportFromShareableHandle(unsigned long long* h, void* os, int type) {
  if (type != 1) return 1;
  int fd = dup((int)(intptr_t)os);
  if (fd < 0) return 1;
  *h = HMARK | (unsigned long long)fd;
  return 0;
}
int cuMemMap(unsigned long long p, size_t n, size_t off, unsigned long long h, unsigned long long f) {
  (void)f;
  int fdp1 = 0;
  if (h & HMARK) {
    int fd = (int)(h & ~HMARK);
    if (mmap((void*)(uintptr_t)p, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, (off_t)off) == MAP_FAILED) return 2;
    fdp1 = dup(fd) + 1;
  }
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAXA; i++)
    if (!allocs[i].base) {
      allocs[i].base = (uintptr_t)p;
      allocs[i].n = n;
      allocs[i].vmm = 1;
      allocs[i].fdp1 = fdp1;
      break;
    }
  pthread_mutex_unlock(&mu);
  return 0;
}
int cuMemSetAccess(unsigned long long p, size_t n, const void* d, size_t c) { (void)p, (void)n, (void)d, (void)c; return 0; }
int cuMemUnmap(unsigned long long p, size_t n) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAXA; i++)
    if (allocs[i].base >= p && allocs[i].base < p + n) {
      if (allocs[i].fdp1) {
        /* Back to private pages, which cuMemAddressFree's free() expects. */
        mmap((void*)allocs[i].base, allocs[i].n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        close(allocs[i].fdp1 - 1);
      }
      allocs[i].base = 0;
      allocs[i].fdp1 = 0;
    }
  pthread_mutex_unlock(&mu);
  return 0;
}
int cuMemRelease(unsigned long long h) {
  if (h & HMARK) close((int)(h & ~HMARK));
  return 0;
}
int cuMemAddressFree(unsigned long long p, size_t n) { (void)n; free((void*)(uintptr_t)p); return 0; }
int cuMemGetHandleForAddressRange(void* h, unsigned long long p, size_t n, int type, unsigned long long f) {
  (void)p, (void)n, (void)f;
  if (type != 1) return 1;
  int fd = memfd_create("fake-dmabuf", 0);
  if (fd < 0) return 2;
  *(int*)h = fd;
  return 0;
}
