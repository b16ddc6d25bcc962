/*
 * rma_driver.c - drive an NCCL/RCCL RMA plugin the way RCCL loads it.
 *
 * The parent forks one process per rank (before anything is dlopen'ed) and
 * acts as the bootstrap hub over socketpairs: allgather of the 128-byte
 * listen handles, barriers, and per-rank reports. Each child dlopens the
 * plugin with RTLD_NOW|RTLD_LOCAL, dlsyms ncclRmaPlugin_v<V> and runs
 * init .. finalize (optionally several cycles), moving patterned data with
 * iput / iputSignal / iget from several threads and verifying every byte.
 *
 * Build: gcc -O2 -Wall -Wextra -Werror -pthread -Icapi samples/rma_driver.c -ldl
 * Usage: see samples/README.md or --help.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rma_plugin.h"

/* ------------------------------------------------------------------ */
/* options                                                             */

enum scenario { SC_BASIC, SC_BAD_INPUT, SC_KILL, SC_TEARDOWN };

static struct {
  const char* lib;
  int version;
  int ranks;
  size_t size;
  int iters;
  int threads;
  int cycles;
  enum scenario scenario;
  int kill_rank;
  int timeout_s;
  int verbose;
  int no_progress;
  int no_ptrace;
  int signal_storm;
} opt = {"build/librccl-rma-wasm.so", 15, 2, 1 << 20, 3, 2, 1, SC_BASIC, 1, 300, 0, 0, 0, 0};

static const char* scenario_name(enum scenario s) {
  return s == SC_BAD_INPUT ? "bad-input" : s == SC_KILL ? "kill" : s == SC_TEARDOWN ? "teardown" : "basic";
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char* result_name(int r) {
  static const char* names[] = {"ncclSuccess",       "ncclUnhandledCudaError", "ncclSystemError",
                                "ncclInternalError", "ncclInvalidArgument",    "ncclInvalidUsage",
                                "ncclRemoteError",   "ncclInProgress"};
  return (r >= 0 && r < 8) ? names[r] : "ncclResult(?)";
}

/* ------------------------------------------------------------------ */
/* bootstrap: children talk to the parent hub over a socketpair        */

enum { MSG_COLL = 1, MSG_REPORT = 2 };
enum { TAG_HANDLES = 1, TAG_BARRIER = 2, TAG_KILL = 3 };

typedef struct {
  int32_t type;
  int32_t tag;
  int64_t len;
} msg_hdr;

typedef struct {
  int32_t status; /* 0 ok, -1 a rank is gone */
  int32_t gone_rank;
  int64_t len;
} reply_hdr;

typedef struct {
  int32_t status; /* 0 pass */
  int32_t warns;
  int32_t cycles_done;
  int32_t pad;
  double seconds;       /* time in the data phases */
  uint64_t bytes;       /* bytes put + got by this rank */
  uint64_t ops;         /* data operations issued */
  char reason[512];
} report_t;

static int write_full(int fd, const void* p, size_t n) {
  const char* c = p;
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

static int read_full(int fd, void* p, size_t n) {
  char* c = p;
  while (n > 0) {
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    c += r;
    n -= (size_t)r;
  }
  return 0;
}

static int g_boot_fd = -1; /* child side */
static int g_rank = -1;

/* allgather of len bytes; out gets nranks*len bytes. Returns 0 or -1 (a
 * rank died or the hub is gone); never hangs while the hub lives. */
static int boot_allgather(int tag, const void* in, size_t len, void* out) {
  msg_hdr h = {MSG_COLL, tag, (int64_t)len};
  if (write_full(g_boot_fd, &h, sizeof h) || (len && write_full(g_boot_fd, in, len))) return -1;
  reply_hdr r;
  if (read_full(g_boot_fd, &r, sizeof r)) return -1;
  if (r.status != 0) {
    fprintf(stderr, "[rank %d] bootstrap: rank %d is gone\n", g_rank, r.gone_rank);
    return -1;
  }
  if ((size_t)r.len != len * (size_t)opt.ranks) return -1;
  if (r.len && read_full(g_boot_fd, out, (size_t)r.len)) return -1;
  return 0;
}

static int boot_barrier(int tag) { return boot_allgather(tag, NULL, 0, NULL); }

static void boot_report(const report_t* rep) {
  msg_hdr h = {MSG_REPORT, 0, (int64_t)sizeof *rep};
  if (write_full(g_boot_fd, &h, sizeof h) == 0) write_full(g_boot_fd, rep, sizeof *rep);
}

/* ------------------------------------------------------------------ */
/* the plugin, seen through a v15-shaped table                         */

typedef struct {
  ncclRma_v15_t t; /* v14 calls go through adapters below */
  ncclResult_t (*getRmaProperties)(void* collComm, ncclRmaProperties_v16_t* p); /* v16 only */
  void* dl;
} plugin_t;

static const ncclRma_v14_t* g_v14;

static ncclResult_t a14_iput(void* c, int ctx, uint64_t so, void* sm, size_t sz, uint64_t doff,
                             void* dm, uint32_t rank, uint32_t of, void** req) {
  (void)of;
  return g_v14->iput(c, ctx, so, sm, sz, doff, dm, rank, req);
}
static ncclResult_t a14_iputSignal(void* c, int ctx, uint64_t so, void* sm, size_t sz,
                                   uint64_t doff, void* dm, uint32_t rank, uint64_t sigOff,
                                   void* sigMh, uint64_t val, uint32_t op, bool strong,
                                   uint32_t of, void** req) {
  (void)of;
  return g_v14->iputSignal(c, ctx, so, sm, sz, doff, dm, rank, sigOff, sigMh, val, op, strong, req);
}
static ncclResult_t a14_iget(void* c, int ctx, uint64_t ro, void* rm, size_t sz, uint64_t lo,
                             void* lm, uint32_t rank, uint32_t of, void** req) {
  (void)of;
  return g_v14->iget(c, ctx, ro, rm, sz, lo, lm, rank, req);
}

static int load_plugin(plugin_t* p, char* err, size_t errlen) {
  memset(p, 0, sizeof *p);
  p->dl = dlopen(opt.lib, RTLD_NOW | RTLD_LOCAL);
  if (p->dl == NULL) {
    snprintf(err, errlen, "dlopen(%s): %s", opt.lib, dlerror());
    return -1;
  }
  char sym[64];
  snprintf(sym, sizeof sym, "ncclRmaPlugin_v%d", opt.version);
  void* s = dlsym(p->dl, sym);
  if (s == NULL) {
    snprintf(err, errlen, "dlsym(%s): %s", sym, dlerror());
    return -1;
  }
  if (opt.version == 15) {
    p->t = *(const ncclRma_v15_t*)s;
  } else if (opt.version == 16) {
    const ncclRma_v16_t* v = s;
    p->getRmaProperties = v->getRmaProperties;
    p->t = (ncclRma_v15_t){v->name, v->init, v->devices, v->getProperties, v->listen, v->connect,
                           v->createContext, v->regMrSym, v->regMrSymDmaBuf, v->deregMrSym,
                           v->destroyContext, v->closeColl, v->closeListen, v->iput,
                           v->iputSignal, v->iget, v->iflush, v->test, v->rmaProgress,
                           v->queryLastError, v->finalize};
  } else {
    const ncclRma_v14_t* v = s;
    g_v14 = v;
    p->t = (ncclRma_v15_t){v->name, v->init, v->devices, v->getProperties, v->listen, v->connect,
                           v->createContext, v->regMrSym, v->regMrSymDmaBuf, v->deregMrSym,
                           v->destroyContext, v->closeColl, v->closeListen, a14_iput,
                           a14_iputSignal, a14_iget, v->iflush, v->test, v->rmaProgress,
                           v->queryLastError, v->finalize};
  }
  void** slots = (void**)&p->t;
  for (size_t i = 1; i < sizeof p->t / sizeof(void*); i++) {
    if (slots[i] == NULL) {
      snprintf(err, errlen, "%s: slot %zu is NULL", sym, i);
      return -1;
    }
  }
  if (opt.version == 16 && p->getRmaProperties == NULL) {
    snprintf(err, errlen, "%s: getRmaProperties is NULL", sym);
    return -1;
  }
  if (p->t.name == NULL) {
    snprintf(err, errlen, "%s: name is NULL", sym);
    return -1;
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* logger (NCCL numbering: VERSION 1, WARN 2, INFO 3, ABORT 4, TRACE 5) */

static atomic_int g_warns;
static atomic_int g_expecting_warn; /* inside a bad-input check: count, don't print */

static void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                   const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (level == RMA_NCCL_LOG_WARN) atomic_fetch_add(&g_warns, 1);
  int quiet = level == RMA_NCCL_LOG_WARN && atomic_load(&g_expecting_warn) && !opt.verbose;
  if (!quiet && (level == RMA_NCCL_LOG_WARN || level == RMA_NCCL_LOG_VERSION ||
                 level == RMA_NCCL_LOG_ABORT || opt.verbose)) {
    static const char* lv[] = {"NONE", "VERSION", "WARN", "INFO", "ABORT", "TRACE"};
    fprintf(stderr, "[rank %d] plugin %s %s:%d (0x%lx) %s\n", g_rank,
            (level >= 0 && level <= 5) ? lv[level] : "?", file ? file : "?", line, flags, buf);
  }
}

/* ------------------------------------------------------------------ */
/* data patterns                                                       */

static uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

/* key of the bytes src sends to dst in (cycle, iter) from thread t */
static uint64_t put_key(int src, int dst, int cycle, int iter, int t) {
  return mix64(((uint64_t)src << 48) ^ ((uint64_t)dst << 32) ^ ((uint64_t)cycle << 24) ^
               ((uint64_t)iter << 8) ^ (uint64_t)t ^ 0x5055540000000000ULL);
}
static uint64_t get_key(int owner, int cycle, int iter) {
  return mix64(((uint64_t)owner << 48) ^ ((uint64_t)cycle << 24) ^ ((uint64_t)iter << 8) ^
               0x4745540000000000ULL);
}

/* byte at offset o of a region with key k */
static inline uint8_t pat(uint64_t k, size_t o) {
  uint64_t w = k ^ (((uint64_t)(o >> 3) + 1) * 0x9E3779B97F4A7C15ULL);
  return (uint8_t)(w >> ((o & 7) * 8));
}

static void fill(uint8_t* b, size_t off, size_t len, uint64_t k) {
  for (size_t i = 0; i < len; i++) b[i] = pat(k, off + i);
}

/* first mismatching index or -1 */
static long check(const uint8_t* b, size_t off, size_t len, uint64_t k) {
  for (size_t i = 0; i < len; i++)
    if (b[i] != pat(k, off + i)) return (long)i;
  return -1;
}

/* thread t's chunk of a region of opt.size bytes */
static void chunk(int t, size_t* off, size_t* len) {
  size_t a = opt.size * (size_t)t / (size_t)opt.threads;
  size_t b = opt.size * (size_t)(t + 1) / (size_t)opt.threads;
  *off = a;
  *len = b - a;
}

/* ------------------------------------------------------------------ */
/* one rank                                                            */

#define SIG_INC_ADD 0x10000ULL /* value of the per-sender ADD signal */
#define BOGUS_CTX ((void*)(uintptr_t)0xBAD0C0DEULL)
#define GARBAGE_HANDLE ((void*)(uintptr_t)0x7a7a7a7a12345ULL)

typedef struct {
  plugin_t pl;
  int cycle;
  void* ctx;
  void* ginCtx; /* NCCL inits the plugin a second time for the GIN proxy */
  void* listenComm;
  void* coll;
  void* rctx;
  uint8_t *src, *dst, *getsrc, *getdst;
  uint64_t* sig;
  void *srcMh, *dstMh, *getsrcMh, *getdstMh, *sigMh;
  char err[512];
  atomic_int failed;
  uint64_t bytes, ops;
  double seconds;
  int iter;
} rank_t;

static rank_t R;

static void failf(const char* fmt, ...) {
  int expected = 0;
  if (!atomic_compare_exchange_strong(&R.failed, &expected, 1)) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(R.err, sizeof R.err, fmt, ap);
  va_end(ap);
  fprintf(stderr, "[rank %d] FAIL: %s\n", g_rank, R.err);
}

#define CALL(expr)                                                                   \
  do {                                                                               \
    ncclResult_t rc_ = (expr);                                                       \
    if (rc_ != ncclSuccess) {                                                        \
      failf("cycle %d: %s returned %d (%s)", R.cycle, #expr, rc_, result_name(rc_)); \
      return -1;                                                                     \
    }                                                                                \
  } while (0)

/* poll test() until done; rmaProgress sometimes (never with --no-progress) */
static int wait_req(void* req, const char* what, int thread, double deadline) {
  if (req == NULL) return 0;
  long spins = 0;
  for (;;) {
    int done = 0;
    ncclResult_t rc = R.pl.t.test(R.coll, req, &done);
    if (rc != ncclSuccess) {
      failf("cycle %d iter %d thread %d: test(%s) returned %d (%s)", R.cycle, R.iter, thread, what,
            rc, result_name(rc));
      return -1;
    }
    if (done) return 0;
    ++spins;
    if (!opt.no_progress && thread == 0 && (spins & 255) == 0) {
      rc = R.pl.t.rmaProgress(R.rctx);
      if (rc != ncclSuccess) {
        failf("rmaProgress returned %d (%s)", rc, result_name(rc));
        return -1;
      }
    }
    if ((spins & 1023) == 0 && now_s() > deadline) {
      failf("cycle %d iter %d thread %d: %s not complete after %d s", R.cycle, R.iter, thread, what,
            opt.timeout_s);
      return -1;
    }
  }
}

typedef struct {
  int t;
  pthread_t th;
  long ops;
} worker_t;

static void* worker(void* arg) {
  worker_t* w = arg;
  int t = w->t, N = opt.ranks, me = g_rank;
  size_t coff, clen;
  chunk(t, &coff, &clen);
  size_t h1 = clen / 2, h2 = clen - h1;
  double deadline = now_s() + opt.timeout_s;
  void* reqs[8];
  const char* what[8];
  for (int k = 0; k < N && !atomic_load(&R.failed); k++) {
    int d = (me + 1 + t + k) % N; /* spread the threads over peers */
    size_t sbase = (size_t)d * opt.size, dbase = (size_t)me * opt.size;
    int n = 0;
    ncclResult_t rc;
#define ISSUE(name, expr)                                                                   \
  do {                                                                                      \
    void* rq_ = NULL;                                                                       \
    rc = (expr);                                                                            \
    if (rc != ncclSuccess) {                                                                \
      failf("cycle %d iter %d thread %d: %s to rank %d returned %d (%s)", R.cycle, R.iter, \
            t, name, d, rc, result_name(rc));                                               \
      goto out;                                                                             \
    }                                                                                       \
    if (rq_ == NULL) {                                                                      \
      failf("%s to rank %d returned success with a NULL request", name, d);                 \
      goto out;                                                                             \
    }                                                                                       \
    what[n] = name;                                                                         \
    reqs[n++] = rq_;                                                                        \
    w->ops++;                                                                               \
  } while (0)
    /* 1. plain put of the first half of the chunk */
    if (h1 > 0)
      ISSUE("iput", R.pl.t.iput(R.rctx, t, sbase + coff, R.srcMh, h1, dbase + coff, R.dstMh,
                                (uint32_t)d, NCCL_RMA_OPT_FLAGS_AGGREGATE_REQUESTS, &rq_));
    /* 2. put of the second half + INC of word `me` */
    ISSUE("iputSignal(INC)",
          R.pl.t.iputSignal(R.rctx, t, sbase + coff + h1, R.srcMh, h2, dbase + coff + h1, R.dstMh,
                            (uint32_t)d, (uint64_t)me * 8, R.sigMh, 0, NCCL_NET_SIGNAL_OP_INC, true,
                            NCCL_RMA_OPT_FLAGS_AGGREGATE_REQUESTS, &rq_));
    /* 3. signal-only ADD (size 0, NULL data handles) of word `me` */
    ISSUE("iputSignal(size 0, ADD)",
          R.pl.t.iputSignal(R.rctx, t, 0, NULL, 0, 0, NULL, (uint32_t)d, (uint64_t)me * 8, R.sigMh,
                            SIG_INC_ADD, NCCL_NET_SIGNAL_OP_ADD, true,
                            NCCL_RMA_OPT_FLAGS_AGGREGATE_REQUESTS, &rq_));
    /* 4. signal-only ADD of the shared word N with value me+1 */
    ISSUE("iputSignal(size 0, ADD shared)",
          R.pl.t.iputSignal(R.rctx, t, 0, NULL, 0, 0, NULL, (uint32_t)d, (uint64_t)N * 8, R.sigMh,
                            (uint64_t)me + 1, NCCL_NET_SIGNAL_OP_ADD, true, 0, &rq_));
    /* 5. get our chunk of d's get source */
    if (clen > 0)
      ISSUE("iget", R.pl.t.iget(R.rctx, t, coff, R.getsrcMh, clen, (size_t)d * opt.size + coff,
                                R.getdstMh, (uint32_t)d, 0, &rq_));
#undef ISSUE
    for (int i = 0; i < n; i++)
      if (wait_req(reqs[i], what[i], t, deadline)) goto out;
    /* 6. flush after the completed get (request may be NULL = done) */
    void* fr = NULL;
    rc = R.pl.t.iflush(R.rctx, t, R.sigMh, (uint32_t)d, &fr);
    if (rc != ncclSuccess) {
      failf("iflush to rank %d returned %d (%s)", d, rc, result_name(rc));
      goto out;
    }
    if (wait_req(fr, "iflush", t, deadline)) goto out;
  }
out:
  return NULL;
}

static int wait_signals(int iter) {
  int N = opt.ranks;
  uint64_t per = (uint64_t)(iter + 1) * (uint64_t)opt.threads;
  uint64_t want_shared = 0;
  for (int s = 0; s < N; s++) want_shared += per * (uint64_t)(s + 1);
  double deadline = now_s() + opt.timeout_s;
  for (;;) {
    int ok = 1;
    for (int s = 0; s <= N; s++) {
      uint64_t want = s < N ? per * (1 + SIG_INC_ADD) : want_shared;
      uint64_t got = __atomic_load_n(&R.sig[s], __ATOMIC_ACQUIRE);
      if (got > want) {
        failf("cycle %d iter %d: signal word %d = %llu exceeds the expected %llu", R.cycle, iter,
              s, (unsigned long long)got, (unsigned long long)want);
        return -1;
      }
      if (got != want) ok = 0;
    }
    if (ok) return 0;
    if (now_s() > deadline) {
      char b[256];
      int o = 0;
      for (int s = 0; s <= N && o < (int)sizeof b - 24; s++)
        o += snprintf(b + o, sizeof b - (size_t)o, " %llu",
                      (unsigned long long)__atomic_load_n(&R.sig[s], __ATOMIC_ACQUIRE));
      failf("cycle %d iter %d: signals did not arrive within %d s (words:%s; want %llu each, "
            "shared %llu)",
            R.cycle, iter, opt.timeout_s, b, (unsigned long long)(per * (1 + SIG_INC_ADD)),
            (unsigned long long)want_shared);
      return -1;
    }
    usleep(50);
  }
}

static int verify_iter(int iter) {
  int N = opt.ranks;
  for (int s = 0; s < N; s++) {
    for (int t = 0; t < opt.threads; t++) {
      size_t off, len;
      chunk(t, &off, &len);
      long bad = check(R.dst + (size_t)s * opt.size + off, off, len,
                       put_key(s, g_rank, R.cycle, iter, t));
      if (bad >= 0) {
        failf("cycle %d iter %d: byte %zu of the region put by rank %d (thread %d) is wrong",
              R.cycle, iter, off + (size_t)bad, s, t);
        return -1;
      }
      bad = check(R.getdst + (size_t)s * opt.size + off, off, len, get_key(s, R.cycle, iter));
      if (bad >= 0) {
        failf("cycle %d iter %d: byte %zu got from rank %d (thread %d) is wrong", R.cycle, iter,
              off + (size_t)bad, s, t);
        return -1;
      }
    }
  }
  return 0;
}

static int run_iter(int iter) {
  int N = opt.ranks;
  R.iter = iter;
  /* a. our source slots and get source for this iteration */
  for (int d = 0; d < N; d++)
    for (int t = 0; t < opt.threads; t++) {
      size_t off, len;
      chunk(t, &off, &len);
      fill(R.src + (size_t)d * opt.size + off, off, len, put_key(g_rank, d, R.cycle, iter, t));
    }
  fill(R.getsrc, 0, opt.size, get_key(g_rank, R.cycle, iter));
  /* b. everyone is ready */
  if (boot_barrier(TAG_BARRIER)) {
    failf("cycle %d iter %d: bootstrap barrier failed (a rank died?)", R.cycle, iter);
    return -1;
  }
  double t0 = now_s();
  worker_t ws[64];
  for (int t = 0; t < opt.threads; t++) {
    ws[t].t = t;
    ws[t].ops = 0;
    pthread_create(&ws[t].th, NULL, worker, &ws[t]);
  }
  for (int t = 0; t < opt.threads; t++) {
    pthread_join(ws[t].th, NULL);
    R.ops += (uint64_t)ws[t].ops;
  }
  if (atomic_load(&R.failed)) return -1;
  if (wait_signals(iter)) return -1;
  R.seconds += now_s() - t0;
  R.bytes += 2ULL * (uint64_t)N * opt.size;
  if (verify_iter(iter)) return -1;
  bool err = false;
  CALL(R.pl.t.queryLastError(R.rctx, &err));
  if (err) {
    failf("cycle %d iter %d: queryLastError reports an error", R.cycle, iter);
    return -1;
  }
  /* g. nobody refills what others still read */
  if (boot_barrier(iter == 0 && opt.scenario == SC_KILL ? TAG_KILL : TAG_BARRIER)) {
    failf("cycle %d iter %d: bootstrap barrier failed (a rank died?)", R.cycle, iter);
    return -1;
  }
  return 0;
}

static void* xalloc(size_t n) {
  size_t a = (n + 4095) & ~(size_t)4095;
  void* p = aligned_alloc(4096, a ? a : 4096);
  if (p) memset(p, 0, a ? a : 4096);
  return p;
}

/* ---- bad input ---- */

static int bad_count;

#define EXPECT_BAD(what, expr, only_invalid_arg)                                             \
  do {                                                                                       \
    atomic_store(&g_expecting_warn, 1);                                                      \
    int w0_ = atomic_load(&g_warns);                                                         \
    ncclResult_t rc_ = (expr);                                                               \
    int w1_ = atomic_load(&g_warns);                                                         \
    atomic_store(&g_expecting_warn, 0);                                                      \
    bad_count++;                                                                             \
    if (!(rc_ == ncclInvalidArgument || (!(only_invalid_arg) && rc_ == ncclInvalidUsage))) { \
      failf("bad-input %s: returned %d (%s), want ncclInvalidArgument%s", what, rc_,         \
            result_name(rc_), (only_invalid_arg) ? "" : " or ncclInvalidUsage");             \
      return -1;                                                                             \
    }                                                                                        \
    if (w1_ == w0_) {                                                                        \
      failf("bad-input %s: returned %s but logged no WARN line", what, result_name(rc_));    \
      return -1;                                                                             \
    }                                                                                        \
    if (opt.verbose) fprintf(stderr, "[rank %d] bad-input ok: %s -> %s\n", g_rank, what,     \
                             result_name(rc_));                                              \
  } while (0)

static int bad_before_init(void) {
  EXPECT_BAD("init(ctx=NULL)", R.pl.t.init(NULL, 42, logger), 1);
  EXPECT_BAD("devices(NULL)", R.pl.t.devices(NULL), 1);
  EXPECT_BAD("getProperties(0, NULL)", R.pl.t.getProperties(0, NULL), 1);
  return 0;
}

static int bad_after_setup(int ndev) {
  ncclNetProperties_v12_t p;
  void* x = (void*)1;
  void* req = NULL;
  int N = opt.ranks;
  char h[NCCL_NET_HANDLE_MAXSIZE];
  EXPECT_BAD("getProperties(dev=ndev)", R.pl.t.getProperties(ndev, &p), 0);
  EXPECT_BAD("getProperties(dev=-1)", R.pl.t.getProperties(-1, &p), 0);
  EXPECT_BAD("listen(handle=NULL)", R.pl.t.listen(R.ctx, 0, NULL, &x), 1);
  EXPECT_BAD("listen(listenComm=NULL)", R.pl.t.listen(R.ctx, 0, h, NULL), 1);
  void* hs[1] = {NULL};
  EXPECT_BAD("connect(collComm=NULL)", R.pl.t.connect(NULL, hs, 1, 0, R.listenComm, NULL), 1);
  EXPECT_BAD("connect(handles=NULL)", R.pl.t.connect(NULL, NULL, 1, 0, R.listenComm, &x), 1);
  EXPECT_BAD("connect(handles[0]=NULL)", R.pl.t.connect(NULL, hs, 1, 0, R.listenComm, &x), 1);
  ncclRmaConfig_v15_t cfg = {opt.threads, INT_MIN, 1};
  EXPECT_BAD("createContext(config=NULL)", R.pl.t.createContext(R.coll, NULL, &x), 1);
  EXPECT_BAD("createContext(rmaCtx=NULL)", R.pl.t.createContext(R.coll, &cfg, NULL), 1);
  EXPECT_BAD("regMrSym(mhandle=NULL)",
             R.pl.t.regMrSym(R.coll, R.src, opt.size, NCCL_PTR_HOST, 0, NULL), 1);
  if (R.pl.getRmaProperties)
    EXPECT_BAD("getRmaProperties(NULL)", R.pl.getRmaProperties(R.coll, NULL), 1);
  EXPECT_BAD("iput(request=NULL)",
             R.pl.t.iput(R.rctx, 0, 0, R.srcMh, 8, 0, R.dstMh, 0, 0, NULL), 1);
  EXPECT_BAD("iputSignal(request=NULL)",
             R.pl.t.iputSignal(R.rctx, 0, 0, NULL, 0, 0, NULL, 0, 0, R.sigMh, 1,
                               NCCL_NET_SIGNAL_OP_INC, true, 0, NULL), 1);
  EXPECT_BAD("iget(request=NULL)",
             R.pl.t.iget(R.rctx, 0, 0, R.getsrcMh, 8, 0, R.getdstMh, 0, 0, NULL), 1);
  EXPECT_BAD("iflush(request=NULL)", R.pl.t.iflush(R.rctx, 0, R.sigMh, 0, NULL), 1);
  int done;
  EXPECT_BAD("test(done=NULL)", R.pl.t.test(R.coll, GARBAGE_HANDLE, NULL), 1);
  EXPECT_BAD("queryLastError(hasError=NULL)", R.pl.t.queryLastError(R.rctx, NULL), 1);
  /* garbage handles */
  EXPECT_BAD("iput(garbage rmaCtx)",
             R.pl.t.iput(GARBAGE_HANDLE, 0, 0, R.srcMh, 8, 0, R.dstMh, 0, 0, &req), 0);
  EXPECT_BAD("iput(garbage srcMhandle)",
             R.pl.t.iput(R.rctx, 0, 0, GARBAGE_HANDLE, 8, 0, R.dstMh, 0, 0, &req), 0);
  EXPECT_BAD("iput(garbage dstMhandle)",
             R.pl.t.iput(R.rctx, 0, 0, R.srcMh, 8, 0, GARBAGE_HANDLE, 0, 0, &req), 0);
  EXPECT_BAD("iputSignal(garbage signalMhandle)",
             R.pl.t.iputSignal(R.rctx, 0, 0, NULL, 0, 0, NULL, 0, 0, GARBAGE_HANDLE, 1,
                               NCCL_NET_SIGNAL_OP_INC, true, 0, &req), 0);
  EXPECT_BAD("iget(garbage remoteMhandle)",
             R.pl.t.iget(R.rctx, 0, 0, GARBAGE_HANDLE, 8, 0, R.getdstMh, 0, 0, &req), 0);
  EXPECT_BAD("test(garbage request)", R.pl.t.test(R.coll, GARBAGE_HANDLE, &done), 0);
  EXPECT_BAD("test(garbage collComm)", R.pl.t.test(GARBAGE_HANDLE, GARBAGE_HANDLE, &done), 0);
  EXPECT_BAD("rmaProgress(garbage rmaCtx)", R.pl.t.rmaProgress(GARBAGE_HANDLE), 0);
  EXPECT_BAD("deregMrSym(garbage mhandle)", R.pl.t.deregMrSym(R.coll, GARBAGE_HANDLE), 0);
  EXPECT_BAD("closeListen(garbage)", R.pl.t.closeListen(GARBAGE_HANDLE), 0);
  /* bounds, ranks, contexts, ops */
  EXPECT_BAD("iput(srcOff+size beyond the registration)",
             R.pl.t.iput(R.rctx, 0, (uint64_t)opt.size * (uint64_t)N - 8, R.srcMh, 16, 0, R.dstMh,
                         0, 0, &req), 0);
  EXPECT_BAD("iget(localOff+size beyond the registration)",
             R.pl.t.iget(R.rctx, 0, 0, R.getsrcMh, 16, (uint64_t)opt.size * (uint64_t)N - 8,
                         R.getdstMh, 0, 0, &req), 0);
  EXPECT_BAD("iput(rank=nranks)",
             R.pl.t.iput(R.rctx, 0, 0, R.srcMh, 8, 0, R.dstMh, (uint32_t)N, 0, &req), 0);
  EXPECT_BAD("iput(context=nContexts)",
             R.pl.t.iput(R.rctx, opt.threads, 0, R.srcMh, 8, 0, R.dstMh, 0, 0, &req), 0);
  EXPECT_BAD("iput(context=-1)", R.pl.t.iput(R.rctx, -1, 0, R.srcMh, 8, 0, R.dstMh, 0, 0, &req),
             0);
  EXPECT_BAD("iputSignal(signalOp=7)",
             R.pl.t.iputSignal(R.rctx, 0, 0, NULL, 0, 0, NULL, 0, 0, R.sigMh, 1, 7, true, 0, &req),
             0);
  EXPECT_BAD("iputSignal(size>0 with NULL src handle)",
             R.pl.t.iputSignal(R.rctx, 0, 0, NULL, 8, 0, R.dstMh, 0, 0, R.sigMh, 1,
                               NCCL_NET_SIGNAL_OP_INC, true, 0, &req), 0);
  /* a freed handle: register (collectively) and deregister a scratch buffer */
  uint8_t* scratch = xalloc(4096);
  void* smh = NULL;
  CALL(R.pl.t.regMrSym(R.coll, scratch, 4096, NCCL_PTR_HOST, 0, &smh));
  CALL(R.pl.t.deregMrSym(R.coll, smh));
  EXPECT_BAD("iput(deregistered srcMhandle)",
             R.pl.t.iput(R.rctx, 0, 0, smh, 8, 0, R.dstMh, 0, 0, &req), 0);
  EXPECT_BAD("deregMrSym(twice)", R.pl.t.deregMrSym(R.coll, smh), 0);
  free(scratch);
  if (req != NULL) {
    failf("bad-input: a failed call wrote a non-NULL request");
    return -1;
  }
  return 0;
}

static int bad_after_teardown(void* oldRctx, void* oldColl) {
  void* req = NULL;
  int done;
  void* x;
  uint8_t b[64];
  EXPECT_BAD("iput after destroyContext",
             R.pl.t.iput(oldRctx, 0, 0, R.srcMh, 8, 0, R.dstMh, 0, 0, &req), 0);
  EXPECT_BAD("rmaProgress after destroyContext", R.pl.t.rmaProgress(oldRctx), 0);
  EXPECT_BAD("destroyContext twice", R.pl.t.destroyContext(oldRctx), 0);
  if (oldColl) {
    EXPECT_BAD("regMrSym after closeColl",
               R.pl.t.regMrSym(oldColl, b, sizeof b, NCCL_PTR_HOST, 0, &x), 0);
    EXPECT_BAD("test after closeColl", R.pl.t.test(oldColl, GARBAGE_HANDLE, &done), 0);
    ncclRmaConfig_v15_t cfg = {1, INT_MIN, 1};
    EXPECT_BAD("createContext after closeColl", R.pl.t.createContext(oldColl, &cfg, &x), 0);
    EXPECT_BAD("closeColl twice", R.pl.t.closeColl(oldColl), 0);
  }
  return 0;
}

/* ---- kill scenario: rank opt.kill_rank was SIGKILLed after round 0 ---- */

static int fault_phase(void) {
  int victim = opt.kill_rank;
  double t0 = now_s(), deadline = t0 + 10.0;
  long issued = 0;
  const char* how = NULL;
  int code = 0;
  while (now_s() < deadline && how == NULL) {
    void* req = NULL;
    ncclResult_t rc;
    if (issued & 1)
      rc = R.pl.t.iget(R.rctx, 0, 0, R.getsrcMh, opt.size, (size_t)victim * opt.size, R.getdstMh,
                       (uint32_t)victim, 0, &req);
    else
      rc = R.pl.t.iputSignal(R.rctx, 0, (size_t)victim * opt.size, R.srcMh, opt.size,
                             (size_t)g_rank * opt.size, R.dstMh, (uint32_t)victim,
                             (uint64_t)g_rank * 8, R.sigMh, 0, NCCL_NET_SIGNAL_OP_INC, true, 0,
                             &req);
    issued++;
    if (rc != ncclSuccess) {
      how = (issued & 1) ? "iputSignal returned an error" : "iget returned an error";
      code = rc;
      break;
    }
    double rdl = now_s() + 2.0;
    long spins = 0;
    for (;;) {
      int done = 0;
      rc = R.pl.t.test(R.coll, req, &done);
      if (rc != ncclSuccess) {
        how = "test returned an error";
        code = rc;
        break;
      }
      if (done) break;
      if ((++spins & 255) == 0) {
        bool e = false;
        if (R.pl.t.queryLastError(R.rctx, &e) == ncclSuccess && e) {
          how = "queryLastError reported an error";
          break;
        }
        if (now_s() > rdl || now_s() > deadline) break; /* abandon this request */
        usleep(100);
      }
    }
    if (how == NULL) {
      bool e = false;
      if (R.pl.t.queryLastError(R.rctx, &e) == ncclSuccess && e)
        how = "queryLastError reported an error";
    }
  }
  double dt = now_s() - t0;
  if (how == NULL) {
    failf("kill: no error reported within 10 s for traffic to the killed rank %d (%ld ops issued)",
          victim, issued);
    return -1;
  }
  printf("[rank %d] kill: detected the loss of rank %d after %.3f s: %s%s%s (%ld ops issued)\n",
         g_rank, victim, dt, how, code ? " " : "", code ? result_name(code) : "", issued);
  return 0;
}

/* ---- teardown scenario: accepted operations are delivered ---- */

/* In cycle c, rank c % N receives and every other rank sends to it: a
 * striped put, a put with an ADD signal, and a bare INC signal, then tears
 * down at once without ever calling test(): destroyContext, deregMrSym (after
 * which the source is overwritten, as a caller reusing its memory would),
 * closeColl, finalize. The receiver must see every byte and every signal.
 * Returns 1 when this rank already tore down. */
static int teardown_phase(void) {
  int N = opt.ranks, recv = R.cycle % N;
  size_t half = opt.size / 2;
  uint64_t key = put_key(g_rank, recv, R.cycle, 0, 0);
  if (g_rank != recv) fill(R.src, 0, opt.size, key);
  if (boot_barrier(TAG_BARRIER)) {
    failf("cycle %d: bootstrap barrier failed (a rank died?)", R.cycle);
    return -1;
  }
  if (g_rank != recv) {
    size_t dbase = (size_t)g_rank * opt.size;
    void* rq[3] = {NULL, NULL, NULL};
    CALL(R.pl.t.iput(R.rctx, 0, 0, R.srcMh, half, dbase, R.dstMh, (uint32_t)recv, 0, &rq[0]));
    CALL(R.pl.t.iputSignal(R.rctx, 0, half, R.srcMh, opt.size - half, dbase + half, R.dstMh,
                           (uint32_t)recv, (uint64_t)g_rank * 8, R.sigMh,
                           (uint64_t)R.cycle + 1, NCCL_NET_SIGNAL_OP_ADD, true, 0, &rq[1]));
    CALL(R.pl.t.iputSignal(R.rctx, 0, 0, NULL, 0, 0, NULL, (uint32_t)recv, (uint64_t)N * 8,
                           R.sigMh, 0, NCCL_NET_SIGNAL_OP_INC, true, 0, &rq[2]));
    if (!rq[0] || !rq[1] || !rq[2]) {
      failf("cycle %d: a data call returned success with a NULL request", R.cycle);
      return -1;
    }
    /* The NCCL order, at once: contexts, registrations, communicator. */
    CALL(R.pl.t.destroyContext(R.rctx));
    CALL(R.pl.t.deregMrSym(R.coll, R.srcMh));
    memset(R.src, 0xEE, (size_t)N * opt.size); /* the caller reuses its memory */
    CALL(R.pl.t.deregMrSym(R.coll, R.dstMh));
    CALL(R.pl.t.deregMrSym(R.coll, R.getsrcMh));
    CALL(R.pl.t.deregMrSym(R.coll, R.getdstMh));
    CALL(R.pl.t.deregMrSym(R.coll, R.sigMh));
    CALL(R.pl.t.closeColl(R.coll));
    CALL(R.pl.t.finalize(R.ginCtx));
    CALL(R.pl.t.finalize(R.ctx));
    return 1;
  }
  /* receiver: every sender's ADD, and one INC each on the shared word */
  double deadline = now_s() + opt.timeout_s;
  for (;;) {
    int ok = __atomic_load_n(&R.sig[N], __ATOMIC_ACQUIRE) == (uint64_t)(N - 1);
    for (int s = 0; s < N; s++)
      if (s != recv && __atomic_load_n(&R.sig[s], __ATOMIC_ACQUIRE) != (uint64_t)R.cycle + 1)
        ok = 0;
    if (ok) break;
    if (now_s() > deadline) {
      char b[256];
      int o = 0;
      for (int s = 0; s <= N && o < (int)sizeof b - 24; s++)
        o += snprintf(b + o, sizeof b - (size_t)o, " %llu",
                      (unsigned long long)__atomic_load_n(&R.sig[s], __ATOMIC_ACQUIRE));
      failf("cycle %d: signals of senders that tore down at once did not arrive within %d s "
            "(words:%s; want %d from each sender, %d shared): accepted operations were lost",
            R.cycle, opt.timeout_s, b, R.cycle + 1, N - 1);
      return -1;
    }
    usleep(50);
  }
  for (int s = 0; s < N; s++) {
    if (s == recv) continue;
    long bad = check(R.dst + (size_t)s * opt.size, 0, opt.size, put_key(s, recv, R.cycle, 0, 0));
    if (bad >= 0) {
      failf("cycle %d: byte %ld of the put from rank %d (which tore down at once) is wrong", R.cycle,
            bad, s);
      return -1;
    }
    __atomic_store_n(&R.sig[s], 0, __ATOMIC_RELEASE);
  }
  bool err = false;
  CALL(R.pl.t.queryLastError(R.rctx, &err));
  if (err) {
    failf("cycle %d: queryLastError reports an error after peers said goodbye", R.cycle);
    return -1;
  }
  R.bytes += (uint64_t)(N - 1) * opt.size;
  R.ops += 3ULL * (uint64_t)(N - 1);
  if (opt.verbose)
    printf("[rank %d] teardown cycle %d: %d senders delivered every byte and signal\n", g_rank,
           R.cycle, N - 1);
  return 0;
}

/* ---- one init .. finalize cycle ---- */

static int run_cycle(int cycle) {
  int N = opt.ranks;
  R.cycle = cycle;
  char lerr[400];
  if (load_plugin(&R.pl, lerr, sizeof lerr)) {
    failf("%s", lerr);
    return -1;
  }
  if (strcmp(R.pl.t.name, "wasm") != 0 && cycle == 0)
    printf("[rank %d] note: plugin name is \"%s\"\n", g_rank, R.pl.t.name);
  if (opt.scenario == SC_BAD_INPUT && bad_before_init()) return -1;

  CALL(R.pl.t.init(&R.ctx, 0x5eed0000ULL + (uint64_t)cycle, logger));
  if (R.ctx == NULL) {
    failf("init returned success with a NULL context");
    return -1;
  }
  /* The GIN proxy calls init again on the same communicator and must get an
   * independent context; it is finalized first at teardown, as in NCCL. */
  CALL(R.pl.t.init(&R.ginCtx, 0x5eed0000ULL + (uint64_t)cycle, logger));
  if (R.ginCtx == NULL || R.ginCtx == R.ctx) {
    failf("second init returned context %p (first %p): want a distinct non-NULL context", R.ginCtx,
          R.ctx);
    return -1;
  }
  int ndev = 0;
  CALL(R.pl.t.devices(&ndev));
  if (ndev < 1) {
    failf("devices() reported %d devices", ndev);
    return -1;
  }
  for (int d = 0; d < ndev; d++) {
    ncclNetProperties_v12_t p;
    memset(&p, 0xA5, sizeof p);
    CALL(R.pl.t.getProperties(d, &p));
    if (p.netDeviceType != NCCL_NET_DEVICE_GIN_PROXY || p.maxRecvs < 1 || p.name == NULL) {
      failf("getProperties(%d): netDeviceType=%d maxRecvs=%d name=%p (want 2, >=1, non-NULL)", d,
            (int)p.netDeviceType, p.maxRecvs, (void*)p.name);
      return -1;
    }
    if (g_rank == 0 && cycle == 0)
      printf("[rank 0] device %d: name=%s speed=%d Mbps ptrSupport=0x%x maxRecvs=%d "
             "netDeviceType=%d\n",
             d, p.name, p.speed, p.ptrSupport, p.maxRecvs, (int)p.netDeviceType);
  }
  char handle[NCCL_NET_HANDLE_MAXSIZE];
  memset(handle, 0, sizeof handle);
  CALL(R.pl.t.listen(R.ctx, 0, handle, &R.listenComm));
  char* all = calloc((size_t)N, NCCL_NET_HANDLE_MAXSIZE);
  void* hs[N];
  if (boot_allgather(TAG_HANDLES, handle, sizeof handle, all)) {
    failf("bootstrap allgather of the handles failed (a rank died?)");
    free(all);
    return -1;
  }
  for (int i = 0; i < N; i++) hs[i] = all + (size_t)i * NCCL_NET_HANDLE_MAXSIZE;
  /* connect must ignore ctx (NCCL passes another plugin's context) */
  ncclResult_t crc = R.pl.t.connect(BOGUS_CTX, hs, N, g_rank, R.listenComm, &R.coll);
  free(all);
  if (crc != ncclSuccess) {
    failf("connect returned %d (%s)", crc, result_name(crc));
    return -1;
  }
  CALL(R.pl.t.closeListen(R.listenComm));
  if (R.pl.getRmaProperties) {
    ncclRmaProperties_v16_t rp = {true};
    CALL(R.pl.getRmaProperties(R.coll, &rp));
    if (g_rank == 0 && cycle == 0)
      printf("[rank 0] getRmaProperties: flushesAllPutsOnAnySignal=%d\n",
             (int)rp.flushesAllPutsOnAnySignal);
  }
  ncclRmaConfig_v15_t cfg = {opt.threads, INT_MIN, 1};
  CALL(R.pl.t.createContext(R.coll, &cfg, &R.rctx));

  size_t region = (size_t)N * opt.size;
  R.src = xalloc(region);
  R.dst = xalloc(region);
  R.getsrc = xalloc(opt.size);
  R.getdst = xalloc(region);
  R.sig = xalloc((size_t)(N + 1) * 8);
  if (!R.src || !R.dst || !R.getsrc || !R.getdst || !R.sig) {
    failf("out of memory allocating %zu-byte buffers", region);
    return -1;
  }
  CALL(R.pl.t.regMrSym(R.coll, R.src, region, NCCL_PTR_HOST, 0, &R.srcMh));
  CALL(R.pl.t.regMrSym(R.coll, R.dst, region, NCCL_PTR_HOST, 0, &R.dstMh));
  CALL(R.pl.t.regMrSym(R.coll, R.sig, (size_t)(N + 1) * 8, NCCL_PTR_HOST,
                       NCCL_NET_MR_FLAG_FORCE_SO | NCCL_NET_MR_FLAG_SIGNAL_NEVER_RESET, &R.sigMh));
  CALL(R.pl.t.regMrSym(R.coll, R.getsrc, opt.size, NCCL_PTR_HOST, 0, &R.getsrcMh));
  CALL(R.pl.t.regMrSym(R.coll, R.getdst, region, NCCL_PTR_HOST, 0, &R.getdstMh));
  if (!R.srcMh || !R.dstMh || !R.sigMh || !R.getsrcMh || !R.getdstMh) {
    failf("regMrSym returned success with a NULL handle");
    return -1;
  }

  if (opt.scenario == SC_BAD_INPUT) {
    if (bad_after_setup(ndev)) return -1;
    if (boot_barrier(TAG_BARRIER)) {
      failf("bootstrap barrier failed");
      return -1;
    }
  }

  if (opt.scenario == SC_TEARDOWN) {
    int td = teardown_phase();
    if (td < 0) return -1;
    if (td == 1) goto unloaded;
  }
  int iters = opt.scenario == SC_TEARDOWN ? 0 : opt.iters;
  for (int i = 0; i < iters; i++) {
    if (run_iter(i)) return -1;
    if (opt.scenario == SC_KILL && i == 0) {
      if (g_rank == opt.kill_rank) {
        failf("still alive after the kill point");
        return -1;
      }
      if (fault_phase()) return -1;
      break;
    }
  }

  /* teardown: no synchronisation among ranks needed */
  int lenient = opt.scenario == SC_KILL;
  ncclResult_t trc[8];
  int k = 0;
  trc[k++] = R.pl.t.deregMrSym(R.coll, R.srcMh);
  trc[k++] = R.pl.t.deregMrSym(R.coll, R.dstMh);
  trc[k++] = R.pl.t.deregMrSym(R.coll, R.getsrcMh);
  trc[k++] = R.pl.t.deregMrSym(R.coll, R.getdstMh);
  trc[k++] = R.pl.t.destroyContext(R.rctx);
  trc[k++] = R.pl.t.deregMrSym(R.coll, R.sigMh); /* NCCL deregisters signals after */
  for (int i = 0; i < k; i++)
    if (trc[i] != ncclSuccess) {
      if (!lenient) {
        failf("teardown call %d returned %d (%s)", i, trc[i], result_name(trc[i]));
        return -1;
      }
      printf("[rank %d] kill: teardown call %d returned %s\n", g_rank, i, result_name(trc[i]));
    }
  void* oldRctx = R.rctx;
  if (opt.scenario == SC_BAD_INPUT && bad_after_teardown(oldRctx, NULL)) return -1;
  ncclResult_t rc = R.pl.t.closeColl(R.coll);
  if (rc != ncclSuccess && !lenient) {
    failf("closeColl returned %d (%s)", rc, result_name(rc));
    return -1;
  }
  if (opt.scenario == SC_BAD_INPUT && bad_after_teardown(oldRctx, R.coll)) return -1;
  rc = R.pl.t.finalize(R.ginCtx);
  if (rc != ncclSuccess && !lenient) {
    failf("finalize(GIN context) returned %d (%s)", rc, result_name(rc));
    return -1;
  }
  rc = R.pl.t.finalize(R.ctx);
  if (rc != ncclSuccess && !lenient) {
    failf("finalize returned %d (%s)", rc, result_name(rc));
    return -1;
  }
unloaded:
  free(R.src);
  free(R.dst);
  free(R.getsrc);
  free(R.getdst);
  free(R.sig);
  R.src = R.dst = R.getsrc = R.getdst = NULL;
  R.sig = NULL;
  /* the library carries NODELETE: dlclose must leave it usable */
  if (dlclose(R.pl.dl) != 0) {
    failf("dlclose: %s", dlerror());
    return -1;
  }
  return 0;
}

static void on_alarm(int sig) {
  (void)sig;
  static const char m[] = "rma_driver: rank watchdog expired, exiting\n";
  ssize_t w = write(2, m, sizeof m - 1);
  (void)w;
  _exit(3);
}

/* A signal storm: host processes (MPI, profilers, Python) deliver signals
 * while plugin threads are inside Go or wazero code. Go requires handlers to
 * use SA_ONSTACK; with it, nothing may crash or hang. */
static atomic_long g_storm_hits;
static atomic_int g_storm_stop;

static void on_usr1(int sig) {
  (void)sig;
  char pad[4096]; /* use some stack, as real handlers do */
  pad[0] = 1;
  __asm__ volatile("" : : "r"(pad) : "memory");
  atomic_fetch_add(&g_storm_hits, 1);
}

static void* storm(void* arg) {
  (void)arg;
  pid_t pid = getpid();
  while (!atomic_load(&g_storm_stop)) {
    kill(pid, SIGUSR1);
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
  return NULL;
}

__attribute__((noreturn)) static void rank_main(int rank, int fd) {
  g_rank = rank;
  g_boot_fd = fd;
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGALRM, on_alarm);
  pthread_t storm_th;
  if (opt.signal_storm) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_ONSTACK | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    pthread_create(&storm_th, NULL, storm, NULL);
  }
  alarm((unsigned)(opt.timeout_s * (opt.cycles + 1) + 60));
  int cycles = opt.scenario == SC_KILL ? 1 : opt.cycles;
  int c;
  for (c = 0; c < cycles; c++)
    if (run_cycle(c)) break;
  if (opt.signal_storm) {
    atomic_store(&g_storm_stop, 1);
    pthread_join(storm_th, NULL);
    printf("[rank %d] signal storm: %ld SIGUSR1 handled during the run\n", rank,
           atomic_load(&g_storm_hits));
  }
  report_t rep;
  memset(&rep, 0, sizeof rep);
  rep.status = atomic_load(&R.failed) ? 1 : 0;
  rep.warns = atomic_load(&g_warns);
  rep.cycles_done = c;
  rep.seconds = R.seconds;
  rep.bytes = R.bytes;
  rep.ops = R.ops;
  snprintf(rep.reason, sizeof rep.reason, "%s", R.err);
  double bps = R.seconds > 0 ? (double)R.bytes / R.seconds : 0;
  if (rep.status == 0)
    printf("[rank %d] PASS cycles=%d ops=%llu moved=%.1f MiB in %.3f s => %.1f MB/s (%.3f GB/s) "
           "warns=%d%s\n",
           rank, c, (unsigned long long)R.ops, (double)R.bytes / 1048576.0, R.seconds, bps / 1e6,
           bps / 1e9, rep.warns, opt.scenario == SC_BAD_INPUT ? " (bad-input checks passed)" : "");
  if (rep.status == 0 && opt.scenario == SC_BAD_INPUT)
    printf("[rank %d] bad-input: %d invalid calls rejected with a WARN each, valid traffic "
           "still verified\n",
           rank, bad_count);
  if (rep.status != 0)
    printf("[rank %d] FAIL after %d cycle(s): %s (warns=%d)\n", rank, c, R.err, rep.warns);
  boot_report(&rep);
  fflush(stdout);
  /* leave without running the library's destructors in a weird state */
  _exit(rep.status);
}

/* ------------------------------------------------------------------ */
/* the parent: fork ranks, run the hub, report                          */

typedef struct {
  pid_t pid;
  int fd;
  int alive;      /* fd still open */
  int killed;     /* by us (kill scenario) */
  int pending;    /* contributed to the current collective */
  int tag;
  char* data;
  size_t len;
  int has_report;
  report_t rep;
  int status;
  int reaped;
} child_t;

static child_t* C;

static void hub_reply(int r, int status, int gone, const char* data, size_t len) {
  reply_hdr h = {status, gone, (int64_t)len};
  if (write_full(C[r].fd, &h, sizeof h) || (len && write_full(C[r].fd, data, len))) {
    /* the child died; its EOF will show up in poll */
  }
}

static void usage(FILE* f) {
  fprintf(f,
          "usage: rma_driver [options]\n"
          "  --lib PATH        plugin library (default build/librccl-rma-wasm.so)\n"
          "  --version V       table version 14|15|16 (default 15)\n"
          "  --ranks N         ranks, one process each (default 2)\n"
          "  --size BYTES      bytes per peer region; suffix k/m/g allowed (default 1m)\n"
          "  --iters N         rounds (default 3)\n"
          "  --threads T       threads per rank = nContexts (default 2)\n"
          "  --cycles K        init..finalize cycles per process, dlclose between (default 1)\n"
          "  --scenario S      basic | bad-input | kill | teardown (default basic)\n"
          "  --kill-rank R     rank the parent SIGKILLs after round 0 (kill; default 1)\n"
          "  --timeout S       per-wait timeout in seconds (default 300)\n"
          "  --no-progress     never call rmaProgress (test() must progress alone)\n"
          "  --no-ptrace       ranks drop CAP_SYS_PTRACE and become non-dumpable, so the\n"
          "                    kernel refuses process_vm_writev between them (fallback test)\n"
          "  --signal-storm    a thread per rank sends SIGUSR1 to the process every 50 us\n"
          "                    (handler installed with SA_ONSTACK, as Go requires)\n"
          "  --verbose         print INFO/TRACE plugin log lines\n");
}

/* drop_ptrace makes this process a target that process_vm_writev refuses:
 * without CAP_SYS_PTRACE (even as root) a non-dumpable peer is off limits. */
static int drop_ptrace(void) {
  struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  if (syscall(SYS_capget, &hdr, data) != 0) return -1;
  data[CAP_SYS_PTRACE / 32].effective &= ~(1u << (CAP_SYS_PTRACE % 32));
  data[CAP_SYS_PTRACE / 32].permitted &= ~(1u << (CAP_SYS_PTRACE % 32));
  data[CAP_SYS_PTRACE / 32].inheritable &= ~(1u << (CAP_SYS_PTRACE % 32));
  if (syscall(SYS_capset, &hdr, data) != 0) return -1;
  return prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
}

static size_t parse_size(const char* s) {
  char* e;
  double v = strtod(s, &e);
  switch (*e) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1048576; break;
    case 'g': case 'G': v *= 1073741824.0; break;
    default: break;
  }
  return (size_t)v;
}

int main(int argc, char** argv) {
  static struct option lo[] = {{"lib", 1, 0, 'l'},       {"version", 1, 0, 'V'},
                               {"ranks", 1, 0, 'n'},     {"size", 1, 0, 's'},
                               {"iters", 1, 0, 'i'},     {"threads", 1, 0, 't'},
                               {"cycles", 1, 0, 'c'},    {"scenario", 1, 0, 'S'},
                               {"kill-rank", 1, 0, 'k'}, {"timeout", 1, 0, 'T'},
                               {"verbose", 0, 0, 'v'},   {"no-progress", 0, 0, 'P'},
                               {"no-ptrace", 0, 0, 'D'},  {"signal-storm", 0, 0, 'G'},
                               {"help", 0, 0, 'h'},      {0, 0, 0, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (ch) {
      case 'l': opt.lib = optarg; break;
      case 'V': opt.version = atoi(optarg); break;
      case 'n': opt.ranks = atoi(optarg); break;
      case 's': opt.size = parse_size(optarg); break;
      case 'i': opt.iters = atoi(optarg); break;
      case 't': opt.threads = atoi(optarg); break;
      case 'c': opt.cycles = atoi(optarg); break;
      case 'k': opt.kill_rank = atoi(optarg); break;
      case 'T': opt.timeout_s = atoi(optarg); break;
      case 'v': opt.verbose = 1; break;
      case 'P': opt.no_progress = 1; break;
      case 'D': opt.no_ptrace = 1; break;
      case 'G': opt.signal_storm = 1; break;
      case 'S':
        if (!strcmp(optarg, "basic")) opt.scenario = SC_BASIC;
        else if (!strcmp(optarg, "bad-input")) opt.scenario = SC_BAD_INPUT;
        else if (!strcmp(optarg, "kill")) opt.scenario = SC_KILL;
        else if (!strcmp(optarg, "teardown")) opt.scenario = SC_TEARDOWN;
        else { usage(stderr); printf("RESULT FAIL bad --scenario %s\n", optarg); return 2; }
        break;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); printf("RESULT FAIL bad command line\n"); return 2;
    }
  }
  if ((opt.version != 14 && opt.version != 15 && opt.version != 16) || opt.ranks < 1 ||
      opt.ranks > 256 || opt.iters < 1 || opt.threads < 1 || opt.threads > 64 ||
      opt.cycles < 1 || opt.timeout_s < 1 ||
      (opt.scenario == SC_TEARDOWN && opt.ranks < 2) ||
      (opt.scenario == SC_KILL && (opt.ranks < 2 || opt.kill_rank < 0 ||
                                   opt.kill_rank >= opt.ranks)) ||
      (opt.size < 16 && opt.scenario == SC_BAD_INPUT)) {
    usage(stderr);
    printf("RESULT FAIL invalid options (kill needs --ranks >= 2 and 0 <= --kill-rank < ranks; "
           "bad-input needs --size >= 16)\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGPIPE, SIG_IGN);
  int N = opt.ranks;
  printf("rma_driver: lib=%s version=v%d ranks=%d size=%zu iters=%d threads=%d cycles=%d "
         "scenario=%s%s\n",
         opt.lib, opt.version, N, opt.size, opt.iters, opt.threads, opt.cycles,
         scenario_name(opt.scenario), opt.no_progress ? " no-progress" : "");
  fflush(stdout);

  C = calloc((size_t)N, sizeof *C);
  int (*sp)[2] = calloc((size_t)N, sizeof *sp);
  for (int r = 0; r < N; r++)
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp[r])) {
      perror("socketpair");
      printf("RESULT FAIL socketpair\n");
      return 1;
    }
  for (int r = 0; r < N; r++) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      printf("RESULT FAIL fork\n");
      return 1;
    }
    if (pid == 0) {
      /* die with the parent (a killed test harness leaves no ranks behind) */
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() == 1) _exit(4);
      if (opt.no_ptrace && drop_ptrace() != 0) {
        fprintf(stderr, "rank %d: cannot drop CAP_SYS_PTRACE: %s\n", r, strerror(errno));
        _exit(5);
      }
      /* only our end survives, so a dead sibling shows up as EOF at the hub */
      for (int q = 0; q < N; q++) {
        close(sp[q][0]);
        if (q != r) close(sp[q][1]);
      }
      rank_main(r, sp[r][1]);
    }
    C[r].pid = pid;
    C[r].fd = sp[r][0];
    C[r].alive = 1;
  }
  for (int r = 0; r < N; r++) close(sp[r][1]);

  /* hub: a collective completes when every rank contributed; once a rank
   * is gone every pending or later collective fails. */
  int gone = -1;
  double start = now_s();
  double limit = (double)opt.timeout_s * (opt.cycles + 1) + 120;
  struct pollfd* pfd = calloc((size_t)N, sizeof *pfd);
  const char* hub_err = NULL;
  for (;;) {
    int open_fds = 0;
    for (int r = 0; r < N; r++) {
      pfd[r].fd = C[r].alive ? C[r].fd : -1;
      pfd[r].events = POLLIN;
      pfd[r].revents = 0;
      open_fds += C[r].alive;
    }
    if (open_fds == 0) break;
    if (now_s() - start > limit) {
      hub_err = "global timeout: killing all ranks";
      for (int r = 0; r < N; r++)
        if (C[r].alive) kill(C[r].pid, SIGKILL);
      break;
    }
    int n = poll(pfd, (nfds_t)N, 1000);
    if (n < 0 && errno != EINTR) break;
    for (int r = 0; r < N && n > 0; r++) {
      if (!pfd[r].revents) continue;
      msg_hdr h;
      if (read_full(C[r].fd, &h, sizeof h) || h.len < 0 || h.len > (1 << 20)) {
        /* EOF: the rank exited or died */
        close(C[r].fd);
        C[r].alive = 0;
        if (gone < 0) gone = r;
        /* fail everybody who is waiting in a collective */
        for (int q = 0; q < N; q++)
          if (C[q].alive && C[q].pending) {
            hub_reply(q, -1, r, NULL, 0);
            C[q].pending = 0;
          }
        continue;
      }
      char* data = h.len ? malloc((size_t)h.len) : NULL;
      if (h.len && read_full(C[r].fd, data, (size_t)h.len)) {
        free(data);
        close(C[r].fd);
        C[r].alive = 0;
        if (gone < 0) gone = r;
        continue;
      }
      if (h.type == MSG_REPORT) {
        if ((size_t)h.len == sizeof(report_t)) {
          memcpy(&C[r].rep, data, sizeof(report_t));
          C[r].has_report = 1;
        }
        free(data);
        continue;
      }
      /* a collective contribution */
      int any_gone = 0;
      for (int q = 0; q < N; q++)
        if (!C[q].alive) any_gone = 1;
      if (any_gone) {
        int g = gone >= 0 ? gone : 0;
        hub_reply(r, -1, g, NULL, 0);
        free(data);
        continue;
      }
      C[r].pending = 1;
      C[r].tag = h.tag;
      C[r].data = data;
      C[r].len = (size_t)h.len;
      int all = 1;
      for (int q = 0; q < N; q++)
        if (!C[q].pending) all = 0;
      if (!all) continue;
      size_t len = C[0].len;
      int tag = C[0].tag;
      for (int q = 0; q < N; q++)
        if (C[q].len != len || C[q].tag != tag) hub_err = "ranks disagree on a collective";
      char* out = len ? malloc(len * (size_t)N) : NULL;
      for (int q = 0; q < N; q++) {
        if (len) memcpy(out + (size_t)q * len, C[q].data, len);
        free(C[q].data);
        C[q].data = NULL;
        C[q].pending = 0;
      }
      if (tag == TAG_KILL && opt.scenario == SC_KILL) {
        int v = opt.kill_rank;
        printf("rma_driver: round 0 done; SIGKILL rank %d (pid %d)\n", v, (int)C[v].pid);
        kill(C[v].pid, SIGKILL);
        waitpid(C[v].pid, &C[v].status, 0);
        C[v].reaped = 1;
        C[v].killed = 1;
        close(C[v].fd);
        C[v].alive = 0;
      }
      for (int q = 0; q < N; q++)
        if (C[q].alive) hub_reply(q, 0, -1, out, len * (size_t)N);
      free(out);
    }
  }
  for (int r = 0; r < N; r++)
    if (!C[r].reaped) {
      waitpid(C[r].pid, &C[r].status, 0);
      C[r].reaped = 1;
    }

  /* summary: a rank that died without a report is the primary cause;
   * otherwise the first rank that reported a failure. */
  int pass = hub_err == NULL;
  char reason[600] = "";
  double bytes = 0, secs = 0;
  int warns = 0, reporting = 0;
  if (hub_err) snprintf(reason, sizeof reason, "%s", hub_err);
  for (int r = 0; r < N; r++) {
    int st = C[r].status;
    if (C[r].killed || C[r].has_report) continue;
    if (WIFSIGNALED(st))
      printf("rma_driver: rank %d: died with signal %d (%s)\n", r, WTERMSIG(st),
             strsignal(WTERMSIG(st)));
    else
      printf("rma_driver: rank %d: exited with status %d without a report\n", r,
             WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    if (pass) {
      if (WIFSIGNALED(st))
        snprintf(reason, sizeof reason, "rank %d died with signal %d (%s)", r, WTERMSIG(st),
                 strsignal(WTERMSIG(st)));
      else
        snprintf(reason, sizeof reason, "rank %d exited with status %d without a report", r,
                 WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
    pass = 0;
  }
  for (int r = 0; r < N; r++) {
    int st = C[r].status;
    if (C[r].killed) {
      printf("rma_driver: rank %d: killed on purpose\n", r);
      continue;
    }
    if (C[r].has_report && (C[r].rep.status != 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)) {
      if (pass) {
        if (C[r].rep.reason[0])
          snprintf(reason, sizeof reason, "rank %d: %s", r, C[r].rep.reason);
        else
          snprintf(reason, sizeof reason, "rank %d failed (status %d)", r,
                   WIFEXITED(st) ? WEXITSTATUS(st) : -1);
      }
      pass = 0;
    }
    if (C[r].has_report) {
      bytes += (double)C[r].rep.bytes;
      reporting++;
      if (C[r].rep.seconds > secs) secs = C[r].rep.seconds;
      warns += C[r].rep.warns;
      printf("rma_driver: rank %d: %s, %.1f MiB moved in %.3f s = %.1f MB/s, %llu ops, %d WARN "
             "lines\n",
             r, C[r].rep.status ? "FAIL" : "ok", (double)C[r].rep.bytes / 1048576.0,
             C[r].rep.seconds,
             C[r].rep.seconds > 0 ? (double)C[r].rep.bytes / C[r].rep.seconds / 1e6 : 0.0,
             (unsigned long long)C[r].rep.ops, C[r].rep.warns);
    }
  }
  if (opt.scenario == SC_KILL && pass && !C[opt.kill_rank].killed) {
    pass = 0;
    snprintf(reason, sizeof reason, "the kill point was never reached");
  }
  if (pass)
    printf("RESULT PASS ranks=%d version=%d scenario=%s size=%zu iters=%d threads=%d cycles=%d "
           "aggregate=%.2f MB/s per_rank=%.2f MB/s per_rank_Bps=%.0f warns=%d\n",
           N, opt.version, scenario_name(opt.scenario), opt.size, opt.iters, opt.threads,
           opt.cycles, secs > 0 ? bytes / secs / 1e6 : 0.0,
           secs > 0 && reporting ? bytes / secs / 1e6 / reporting : 0.0,
           secs > 0 && reporting ? bytes / secs / reporting : 0.0, warns);
  else
    printf("RESULT FAIL %s\n", reason[0] ? reason : "unknown");
  return pass ? 0 : 1;
}
