/*
 * rank.c - one rank: init .. finalize cycles, the worker threads that move
 * patterned data, the signal waits and the byte-for-byte verification.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* setns */
#endif
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>

#include "harness.h"

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
uint64_t put_key(int src, int dst, int cycle, int iter, int t) {
  return mix64(((uint64_t)src << 48) ^ ((uint64_t)dst << 32) ^ ((uint64_t)cycle << 24) ^
               ((uint64_t)iter << 8) ^ (uint64_t)t ^ 0x5055540000000000ULL);
}
static uint64_t get_key(int owner, int cycle, int iter) {
  return mix64(((uint64_t)owner << 48) ^ ((uint64_t)cycle << 24) ^ ((uint64_t)iter << 8) ^
               0x4745540000000000ULL);
}

/* comm c's keys differ from every other comm's (0 for comm 0, which the
 * scenarios share) */
static uint64_t comm_salt(int c) { return c ? mix64(0x434f4d4d00000000ULL + (uint64_t)c) : 0; }

/* byte at offset o of a region with key k; --compressible: runs of 32
 * equal bytes drawn from 4 values, still a function of (k, o) */
static inline uint8_t pat(uint64_t k, size_t o) {
  if (opt.compressible) return (uint8_t)('a' + (mix64(k ^ (uint64_t)(o >> 5)) & 3));
  uint64_t w = k ^ (((uint64_t)(o >> 3) + 1) * 0x9E3779B97F4A7C15ULL);
  return (uint8_t)(w >> ((o & 7) * 8));
}

void fill(uint8_t* b, size_t off, size_t len, uint64_t k) {
  for (size_t i = 0; i < len; i++) b[i] = pat(k, off + i);
}

/* first mismatching index or -1 */
long check(const uint8_t* b, size_t off, size_t len, uint64_t k) {
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


rank_t R;

/* the communicators --comms adds (1..C-1); comm 0 is R.cm */
static comm_t g_extra[MAX_COMMS];
static comm_t* comm_at(int c) { return c ? &g_extra[c] : &R.cm; }

void failf(const char* fmt, ...) {
  int expected = 0;
  if (!atomic_compare_exchange_strong(&R.failed, &expected, 1)) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(R.err, sizeof R.err, fmt, ap);
  va_end(ap);
  fprintf(stderr, "[rank %d] FAIL: %s\n", g_rank, R.err);
}

/* poll test() until done; rmaProgress sometimes (never with --no-progress) */
static int wait_req(const comm_t* cm, void* req, const char* what, int thread, double deadline) {
  if (req == NULL) return 0;
  long spins = 0;
  for (;;) {
    int done = 0;
    ncclResult_t rc = R.pl.t.test(cm->coll, req, &done);
    if (rc != ncclSuccess) {
      failf("cycle %d iter %d thread %d: test(%s) returned %d (%s)", R.cycle, R.iter, thread, what,
            rc, result_name(rc));
      return -1;
    }
    if (done) return 0;
    ++spins;
    if (!opt.no_progress && thread == 0 && (spins & 255) == 0) {
      rc = R.pl.t.rmaProgress(cm->rctx);
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
  int t, c; /* context t of communicator c */
  const comm_t* cm;
  pthread_t th;
  long ops;
} worker_t;

static void* worker(void* arg) {
  worker_t* w = arg;
  int t = w->t, N = opt.ranks, me = g_rank;
  const comm_t* cm = w->cm;
  atomic_fetch_add(&R.running, 1);
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
      failf("cycle %d iter %d comm %d thread %d: %s to rank %d returned %d (%s)", R.cycle,  \
            R.iter, w->c, t, name, d, rc, result_name(rc));                                  \
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
      ISSUE("iput", R.pl.t.iput(cm->rctx, t, sbase + coff, cm->srcMh, h1, dbase + coff, cm->dstMh,
                                (uint32_t)d, NCCL_RMA_OPT_FLAGS_AGGREGATE_REQUESTS, &rq_));
    /* 2. put of the second half + INC of word `me` */
    ISSUE("iputSignal(INC)",
          R.pl.t.iputSignal(cm->rctx, t, sbase + coff + h1, cm->srcMh, h2, dbase + coff + h1, cm->dstMh,
                            (uint32_t)d, (uint64_t)me * 8, cm->sigMh, 0, NCCL_NET_SIGNAL_OP_INC, true,
                            NCCL_RMA_OPT_FLAGS_AGGREGATE_REQUESTS, &rq_));
    /* 3. signal-only ADD (size 0, NULL data handles) of word `me` */
    ISSUE("iputSignal(size 0, ADD)",
          R.pl.t.iputSignal(cm->rctx, t, 0, NULL, 0, 0, NULL, (uint32_t)d, (uint64_t)me * 8, cm->sigMh,
                            SIG_INC_ADD, NCCL_NET_SIGNAL_OP_ADD, true,
                            NCCL_RMA_OPT_FLAGS_AGGREGATE_REQUESTS, &rq_));
    /* 4. signal-only ADD of the shared word N with value me+1 */
    ISSUE("iputSignal(size 0, ADD shared)",
          R.pl.t.iputSignal(cm->rctx, t, 0, NULL, 0, 0, NULL, (uint32_t)d, (uint64_t)N * 8, cm->sigMh,
                            (uint64_t)me + 1, NCCL_NET_SIGNAL_OP_ADD, true, 0, &rq_));
    /* 5. get our chunk of d's get source */
    if (clen > 0)
      ISSUE("iget", R.pl.t.iget(cm->rctx, t, coff, cm->getsrcMh, clen, (size_t)d * opt.size + coff,
                                cm->getdstMh, (uint32_t)d, 0, &rq_));
#undef ISSUE
    for (int i = 0; i < n; i++)
      if (wait_req(cm, reqs[i], what[i], t, deadline)) goto out;
    /* 6. flush after the completed get (request may be NULL = done) */
    void* fr = NULL;
    rc = R.pl.t.iflush(cm->rctx, t, cm->sigMh, (uint32_t)d, &fr);
    if (rc != ncclSuccess) {
      failf("iflush to rank %d returned %d (%s)", d, rc, result_name(rc));
      goto out;
    }
    if (wait_req(cm, fr, "iflush", t, deadline)) goto out;
  }
out:
  atomic_fetch_sub(&R.running, 1);
  return NULL;
}

/* sig_words prints the first n signal words into b (for a failure line) */
void sig_words(const uint64_t* sig, int n, char* b, size_t cap) {
  size_t o = 0;
  b[0] = 0;
  for (int s = 0; s < n && o + 24 < cap; s++)
    o += (size_t)snprintf(b + o, cap - o, " %llu",
                          (unsigned long long)__atomic_load_n(&sig[s], __ATOMIC_ACQUIRE));
}

static int wait_signals(int iter) {
  int N = opt.ranks;
  uint64_t per = (uint64_t)(iter + 1) * (uint64_t)opt.threads;
  uint64_t want_shared = 0;
  for (int s = 0; s < N; s++) want_shared += per * (uint64_t)(s + 1);
  double deadline = now_s() + opt.timeout_s;
  for (int c = 0; c < opt.comms; c++) {
    uint64_t* sig = comm_at(c)->sig;
    for (;;) {
      int ok = 1;
      for (int s = 0; s <= N; s++) {
        uint64_t want = s < N ? per * (1 + SIG_INC_ADD) : want_shared;
        uint64_t got = __atomic_load_n(&sig[s], __ATOMIC_ACQUIRE);
        if (got > want) {
          failf("cycle %d iter %d comm %d: signal word %d = %llu exceeds the expected %llu", R.cycle,
                iter, c, s, (unsigned long long)got, (unsigned long long)want);
          return -1;
        }
        if (got != want) ok = 0;
      }
      if (ok) break;
      if (now_s() > deadline) {
        char b[256];
        sig_words(sig, N + 1, b, sizeof b);
        failf("cycle %d iter %d comm %d: signals did not arrive within %d s (words:%s; want %llu "
              "each, shared %llu)",
              R.cycle, iter, c, opt.timeout_s, b, (unsigned long long)(per * (1 + SIG_INC_ADD)),
              (unsigned long long)want_shared);
        return -1;
      }
      usleep(50);
    }
  }
  return 0;
}

static int verify_iter(int iter) {
  int N = opt.ranks;
  for (int c = 0; c < opt.comms; c++) {
    const comm_t* cm = comm_at(c);
    for (int s = 0; s < N; s++) {
      for (int t = 0; t < opt.threads; t++) {
        size_t off, len;
        chunk(t, &off, &len);
        long bad = check(cm->dst + (size_t)s * opt.size + off, off, len,
                         put_key(s, g_rank, R.cycle, iter, t) ^ comm_salt(c));
        if (bad >= 0) {
          failf("cycle %d iter %d comm %d: byte %zu of the region put by rank %d (thread %d) is wrong",
                R.cycle, iter, c, off + (size_t)bad, s, t);
          return -1;
        }
        bad = check(cm->getdst + (size_t)s * opt.size + off, off, len,
                    get_key(s, R.cycle, iter) ^ comm_salt(c));
        if (bad >= 0) {
          failf("cycle %d iter %d comm %d: byte %zu got from rank %d (thread %d) is wrong", R.cycle,
                iter, c, off + (size_t)bad, s, t);
          return -1;
        }
      }
    }
  }
  return 0;
}

static int run_iter(int iter) {
  int N = opt.ranks;
  R.iter = iter;
  /* a. our source slots and get source for this iteration */
  for (int c = 0; c < opt.comms; c++) {
    for (int d = 0; d < N; d++)
      for (int t = 0; t < opt.threads; t++) {
        size_t off, len;
        chunk(t, &off, &len);
        fill(comm_at(c)->src + (size_t)d * opt.size + off, off, len,
             put_key(g_rank, d, R.cycle, iter, t) ^ comm_salt(c));
      }
    fill(comm_at(c)->getsrc, 0, opt.size, get_key(g_rank, R.cycle, iter) ^ comm_salt(c));
  }
  /* b. everyone is ready */
  if (boot_barrier(TAG_BARRIER)) {
    failf("cycle %d iter %d: bootstrap barrier failed (a rank died?)", R.cycle, iter);
    return -1;
  }
  double t0 = now_s();
  static worker_t ws[64 * MAX_COMMS];
  int nw = opt.threads * opt.comms;
  for (int i = 0; i < nw; i++) {
    ws[i].t = i % opt.threads;
    ws[i].c = i / opt.threads;
    ws[i].cm = comm_at(ws[i].c);
    ws[i].ops = 0;
    pthread_create(&ws[i].th, NULL, worker, &ws[i]);
  }
  if (opt.scenario == SC_FAULT && opt.fault == F_LANE_RESET && iter >= 1 && g_rank == opt.kill_rank) {
    /* One more lane breaks in every round after the first, while the
     * round's operations are in flight: the plugin must move its work to
     * the other lanes and lose nothing. */
    usleep((useconds_t)opt.fault_delay_ms * 1000);
    int busy = atomic_load(&R.running);
    char what[128];
    int n = reset_one_lane(getpid(), what, sizeof what);
    printf("[rank %d] lane-reset: reset %d TCP connection(s) (%s) %.3f s into round %d, %d of %d threads "
           "still posting\n",
           g_rank, n, what, now_s() - t0, iter, busy, opt.threads);
    fflush(stdout);
  }
  for (int i = 0; i < nw; i++) {
    pthread_join(ws[i].th, NULL);
    R.ops += (uint64_t)ws[i].ops;
  }
  if (atomic_load(&R.failed)) return -1;
  if (wait_signals(iter)) return -1;
  R.round_s = now_s() - t0;
  R.seconds += R.round_s;
  R.bytes += 2ULL * (uint64_t)N * opt.size * (uint64_t)opt.comms;
  /* INC, ADD, shared ADD per thread */
  R.sigs += 3ULL * (uint64_t)N * (uint64_t)opt.threads * (uint64_t)opt.comms;
  if (verify_iter(iter)) return -1;
  for (int c = 0; c < opt.comms; c++) {
    bool err = false;
    CALL(R.pl.t.queryLastError(comm_at(c)->rctx, &err));
    if (err) {
      failf("cycle %d iter %d comm %d: queryLastError reports an error", R.cycle, iter, c);
      return -1;
    }
  }
  /* g. nobody refills what others still read */
  if (boot_barrier(iter == 0 && (opt.scenario == SC_KILL || opt.scenario == SC_FAULT) ? TAG_KILL
                                                                                     : TAG_BARRIER)) {
    failf("cycle %d iter %d: bootstrap barrier failed (a rank died?)", R.cycle, iter);
    return -1;
  }
  return 0;
}

void* xalloc(size_t n) {
  size_t a = (n + 4095) & ~(size_t)4095;
  void* p = aligned_alloc(4096, a ? a : 4096);
  if (p) memset(p, 0, a ? a : 4096);
  return p;
}

/* ---- one init .. finalize cycle ---- */

/* With --nofile a setup call may fail for want of descriptors, but only
 * cleanly: ncclSystemError (or ncclRemoteError from connect, when a peer
 * gave up) with a WARN line. SETUP returns -2 from run_cycle then. */
static int g_setup_failed;

#define SETUP(expr)                                                                          \
  do {                                                                                       \
    int w0_ = atomic_load(&g_warns);                                                         \
    ncclResult_t rc_ = (expr);                                                               \
    if (rc_ != ncclSuccess) {                                                                \
      if (opt.nofile > 0 && (rc_ == ncclSystemError || rc_ == ncclRemoteError) &&            \
          atomic_load(&g_warns) > w0_) {                                                     \
        printf("[rank %d] nofile %d: %s returned %s with a WARN\n", g_rank, opt.nofile, #expr, \
               result_name(rc_));                                                            \
        g_setup_failed = 1;                                                                  \
        return -2;                                                                           \
      }                                                                                      \
      failf("cycle %d: %s returned %d (%s)", R.cycle, #expr, rc_, result_name(rc_));         \
      return -1;                                                                             \
    }                                                                                        \
  } while (0)

/* register_bufs allocates communicator k's buffers and registers them
 * (the signal words with FORCE_SO | SIGNAL_NEVER_RESET, as NCCL does). */
static int register_bufs(comm_t* cm, int k) {
  int N = opt.ranks;
  size_t region = (size_t)N * opt.size;
  cm->src = xalloc(region);
  cm->dst = xalloc(region);
  cm->getsrc = xalloc(opt.size);
  cm->getdst = xalloc(region);
  cm->sig = xalloc((size_t)(N + 1) * 8);
  if (!cm->src || !cm->dst || !cm->getsrc || !cm->getdst || !cm->sig) {
    failf("comm %d: out of memory allocating %zu-byte buffers", k, region);
    return -1;
  }
  SETUP(R.pl.t.regMrSym(cm->coll, cm->src, region, NCCL_PTR_HOST, 0, &cm->srcMh));
  SETUP(R.pl.t.regMrSym(cm->coll, cm->dst, region, NCCL_PTR_HOST, 0, &cm->dstMh));
  SETUP(R.pl.t.regMrSym(cm->coll, cm->sig, (size_t)(N + 1) * 8, NCCL_PTR_HOST,
                       NCCL_NET_MR_FLAG_FORCE_SO | NCCL_NET_MR_FLAG_SIGNAL_NEVER_RESET, &cm->sigMh));
  SETUP(R.pl.t.regMrSym(cm->coll, cm->getsrc, opt.size, NCCL_PTR_HOST, 0, &cm->getsrcMh));
  SETUP(R.pl.t.regMrSym(cm->coll, cm->getdst, region, NCCL_PTR_HOST, 0, &cm->getdstMh));
  if (!cm->srcMh || !cm->dstMh || !cm->sigMh || !cm->getsrcMh || !cm->getdstMh) {
    failf("comm %d: regMrSym returned success with a NULL handle", k);
    return -1;
  }
  return 0;
}

/* setup_comm sets up communicator k (k >= 1) beside the rank's own, as
 * NCCL does for every further communicator: listen on the same plugin
 * context, exchange handles, connect, its own contexts and registrations. */
static int setup_comm(comm_t* cm, int k) {
  int N = opt.ranks;
  char handle[NCCL_NET_HANDLE_MAXSIZE];
  memset(handle, 0, sizeof handle);
  void* lc = NULL;
  SETUP(R.pl.t.listen(R.ctx, opt.device, handle, &lc));
  char* all = calloc((size_t)N, NCCL_NET_HANDLE_MAXSIZE);
  void* hs[N];
  if (!all || boot_allgather(TAG_HANDLES, handle, sizeof handle, all)) {
    failf("comm %d: bootstrap allgather of the handles failed (a rank died?)", k);
    free(all);
    R.pl.t.closeListen(lc);
    return -1;
  }
  for (int i = 0; i < N; i++) hs[i] = all + (size_t)i * NCCL_NET_HANDLE_MAXSIZE;
  ncclResult_t crc = R.pl.t.connect(BOGUS_CTX, hs, N, g_rank, lc, &cm->coll);
  free(all);
  R.pl.t.closeListen(lc);
  if (crc != ncclSuccess) {
    failf("comm %d: connect returned %d (%s)", k, crc, result_name(crc));
    return -1;
  }
  ncclRmaConfig_v15_t cfg = {opt.threads, INT_MIN, 1};
  SETUP(R.pl.t.createContext(cm->coll, &cfg, &cm->rctx));
  return register_bufs(cm, k);
}

/* close_comms tears down communicators 1.. (what of them was set up);
 * strict: every call must succeed. */
static int close_comms(int strict) {
  int bad = 0;
  for (int k = 1; k < MAX_COMMS; k++) {
    comm_t* cm = &g_extra[k];
    if (cm->coll) {
      void* mh[] = {cm->srcMh, cm->dstMh, cm->getsrcMh, cm->getdstMh};
      for (int i = 0; i < 4; i++)
        if (mh[i] && R.pl.t.deregMrSym(cm->coll, mh[i]) != ncclSuccess) bad = 1;
      if (cm->rctx && R.pl.t.destroyContext(cm->rctx) != ncclSuccess) bad = 1;
      if (cm->sigMh && R.pl.t.deregMrSym(cm->coll, cm->sigMh) != ncclSuccess) bad = 1;
      if (R.pl.t.closeColl(cm->coll) != ncclSuccess) bad = 1;
    }
    free(cm->src);
    free(cm->dst);
    free(cm->getsrc);
    free(cm->getdst);
    free(cm->sig);
    memset(cm, 0, sizeof *cm);
  }
  if (bad && strict) {
    failf("cycle %d: tearing down the extra communicators failed", R.cycle);
    return -1;
  }
  return 0;
}

static int run_cycle(int cycle) {
  int N = opt.ranks;
  R.cycle = cycle;
  R.ctx = R.ginCtx = R.listenComm = R.cm.coll = NULL;
  char lerr[400];
  if (load_plugin(&R.pl, lerr, sizeof lerr)) {
    failf("%s", lerr);
    return -1;
  }
  if (strcmp(R.pl.t.name, "wasm") != 0 && cycle == 0)
    printf("[rank %d] note: plugin name is \"%s\"\n", g_rank, R.pl.t.name);
  if (opt.scenario == SC_BAD_INPUT && bad_before_init()) return -1;

  SETUP(R.pl.t.init(&R.ctx, 0x5eed0000ULL + (uint64_t)cycle, logger));
  if (R.ctx == NULL) {
    failf("init returned success with a NULL context");
    return -1;
  }
  /* The GIN proxy calls init again on the same communicator and must get an
   * independent context; it is finalized first at teardown, as in NCCL. */
  SETUP(R.pl.t.init(&R.ginCtx, 0x5eed0000ULL + (uint64_t)cycle, logger));
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
      printf("[rank 0] device %d: name=%s pciPath=%s speed=%d Mbps ptrSupport=0x%x maxRecvs=%d "
             "netDeviceType=%d\n",
             d, p.name, p.pciPath ? p.pciPath : "(null)", p.speed, p.ptrSupport, p.maxRecvs,
             (int)p.netDeviceType);
  }
  if (opt.device < 0 || opt.device >= ndev) {
    failf("--device %d: the plugin reports %d device(s)", opt.device, ndev);
    return -1;
  }
  char handle[NCCL_NET_HANDLE_MAXSIZE];
  memset(handle, 0, sizeof handle);
  SETUP(R.pl.t.listen(R.ctx, opt.device, handle, &R.listenComm));
  char* all = calloc((size_t)N, NCCL_NET_HANDLE_MAXSIZE);
  void* hs[N];
  if (boot_allgather(TAG_HANDLES, handle, sizeof handle, all)) {
    if (opt.nofile > 0) { /* a peer gave up cleanly (its own line says how) */
      printf("[rank %d] nofile %d: a peer gave up before connect\n", g_rank, opt.nofile);
      g_setup_failed = 1;
      free(all);
      return -2;
    }
    failf("bootstrap allgather of the handles failed (a rank died?)");
    free(all);
    return -1;
  }
  for (int i = 0; i < N; i++) hs[i] = all + (size_t)i * NCCL_NET_HANDLE_MAXSIZE;
  /* connect must ignore ctx (NCCL passes another plugin's context) */
  ncclResult_t crc = R.pl.t.connect(BOGUS_CTX, hs, N, g_rank, R.listenComm, &R.cm.coll);
  free(all);
  if (crc != ncclSuccess) {
    if (opt.nofile > 0 && (crc == ncclSystemError || crc == ncclRemoteError) && atomic_load(&g_warns) > 0) {
      printf("[rank %d] nofile %d: connect returned %s with a WARN\n", g_rank, opt.nofile,
             result_name(crc));
      g_setup_failed = 1;
      return -2;
    }
    failf("connect returned %d (%s)", crc, result_name(crc));
    return -1;
  }
  CALL(R.pl.t.closeListen(R.listenComm));
  R.listenComm = NULL;
  if (R.pl.getRmaProperties) {
    ncclRmaProperties_v16_t rp = {true};
    CALL(R.pl.getRmaProperties(R.cm.coll, &rp));
    if (g_rank == 0 && cycle == 0)
      printf("[rank 0] getRmaProperties: flushesAllPutsOnAnySignal=%d\n",
             (int)rp.flushesAllPutsOnAnySignal);
  }
  ncclRmaConfig_v15_t cfg = {opt.threads, INT_MIN, 1};
  SETUP(R.pl.t.createContext(R.cm.coll, &cfg, &R.cm.rctx));

  int rrc = register_bufs(&R.cm, 0);
  if (rrc) return rrc;
  for (int k = 1; k < opt.comms; k++) {
    int rc = setup_comm(&g_extra[k], k);
    if (rc) return rc;
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
  if (opt.scenario == SC_PINGPONG && pingpong_phase()) return -1;
  int iters = opt.scenario == SC_TEARDOWN || opt.scenario == SC_PINGPONG ? 0 : opt.iters;
  for (int i = 0; i < iters; i++) {
    if (run_iter(i)) return -1;
    if (opt.scenario == SC_FAULT && (opt.fault == F_STOP_CONT || opt.fault == F_LANE_RESET) && i >= 1)
      printf("[rank %d] %s: round %d took %.3f s, every byte and signal verified (ended at %.6f)\n",
             g_rank, fault_name(opt.fault), i, R.round_s, now_s());
    if (opt.scenario == SC_FAULT && opt.fault != F_STOP_CONT && opt.fault != F_LANE_RESET && i == 0) {
      if (g_rank == opt.kill_rank && opt.fault != F_RESET && opt.fault != F_STOP) {
        /* the victim keeps its own operations in flight until it is killed */
        fault_storm();
        failf("still alive after the fault point");
        return -1;
      }
      if (fault_storm()) return -1;
      break;
    }
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
  int lenient = opt.scenario == SC_KILL || (opt.scenario == SC_FAULT && opt.fault != F_STOP_CONT &&
                                             opt.fault != F_LANE_RESET);
  if (close_comms(!lenient)) return -1;
  ncclResult_t trc[8];
  int k = 0;
  trc[k++] = R.pl.t.deregMrSym(R.cm.coll, R.cm.srcMh);
  trc[k++] = R.pl.t.deregMrSym(R.cm.coll, R.cm.dstMh);
  trc[k++] = R.pl.t.deregMrSym(R.cm.coll, R.cm.getsrcMh);
  trc[k++] = R.pl.t.deregMrSym(R.cm.coll, R.cm.getdstMh);
  trc[k++] = R.pl.t.destroyContext(R.cm.rctx);
  trc[k++] = R.pl.t.deregMrSym(R.cm.coll, R.cm.sigMh); /* NCCL deregisters signals after */
  for (int i = 0; i < k; i++)
    if (trc[i] != ncclSuccess) {
      if (!lenient) {
        failf("teardown call %d returned %d (%s)", i, trc[i], result_name(trc[i]));
        return -1;
      }
      printf("[rank %d] kill: teardown call %d returned %s\n", g_rank, i, result_name(trc[i]));
    }
  void* oldRctx = R.cm.rctx;
  if (opt.scenario == SC_BAD_INPUT && bad_after_teardown(oldRctx, NULL)) return -1;
  ncclResult_t rc = R.pl.t.closeColl(R.cm.coll);
  if (rc != ncclSuccess && !lenient) {
    failf("closeColl returned %d (%s)", rc, result_name(rc));
    return -1;
  }
  if (opt.scenario == SC_BAD_INPUT && bad_after_teardown(oldRctx, R.cm.coll)) return -1;
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
  free(R.cm.src);
  free(R.cm.dst);
  free(R.cm.getsrc);
  free(R.cm.getdst);
  free(R.cm.sig);
  R.cm.src = R.cm.dst = R.cm.getsrc = R.cm.getdst = NULL;
  R.cm.sig = NULL;
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

__attribute__((noreturn)) void rank_main(int rank, int fd) {
  boot_attach(rank, fd);
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGALRM, on_alarm);
  if (opt.signal_storm) storm_start();
  alarm((unsigned)(opt.timeout_s * (opt.cycles + 1) + 60));
  if (opt.netns) {
    char path[256];
    snprintf(path, sizeof path, "/var/run/netns/%s%d", opt.netns, rank);
    int nfd = open(path, O_RDONLY | O_CLOEXEC);
    if (nfd < 0 || setns(nfd, CLONE_NEWNET) != 0)
      failf("cannot join network namespace %s: %s", path, strerror(errno));
    if (nfd >= 0) close(nfd);
  }
  if (opt.scenario == SC_PINGPONG) {
    /* TCP forced: no single-copy path between the two processes, no
     * libfabric (host/config reads these through libc getenv at init and
     * connect); --intranode keeps the intra-node path */
    if (!opt.intranode) setenv("NCCL_RMA_WASM_INTRANODE", "0", 1);
    setenv("NCCL_RMA_WASM_TRANSPORT", "tcp", 1);
  }
  if (opt.nofile > 0) {
    struct rlimit rl = {(rlim_t)opt.nofile, (rlim_t)opt.nofile};
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) failf("setrlimit(RLIMIT_NOFILE, %d): %s", opt.nofile, strerror(errno));
  }
  int cycles = opt.scenario == SC_KILL || opt.scenario == SC_FAULT ? 1 : opt.cycles;
  int c;
  long fd1 = -1, rss1 = -1, th1 = -1;
  for (c = 0; c < cycles && !atomic_load(&R.failed); c++) {
    int rc = run_cycle(c);
    if (rc == -2) {
      /* a clean setup failure: release what was made, which must not crash either */
      close_comms(0);
      if (R.listenComm) R.pl.t.closeListen(R.listenComm);
      if (R.cm.coll) R.pl.t.closeColl(R.cm.coll);
      if (R.ginCtx) R.pl.t.finalize(R.ginCtx);
      if (R.ctx) R.pl.t.finalize(R.ctx);
      break;
    }
    if (rc) break;
    if (c == 0) count_resources(&fd1, &rss1, &th1);
  }
  if (cycles > 1 && c == cycles) {
    long fdn, rssn, thn;
    count_resources(&fdn, &rssn, &thn);
    printf("[rank %d] resources: after cycle 1 fds=%ld rss=%ld KiB threads=%ld; after cycle %d "
           "fds=%ld rss=%ld KiB threads=%ld\n",
           rank, fd1, rss1, th1, c, fdn, rssn, thn);
  }
  if (opt.signal_storm) {
    long hits = storm_stop();
    printf("[rank %d] signal storm: %ld SIGUSR1 handled during the run\n", rank, hits);
  }
  report_t rep;
  memset(&rep, 0, sizeof rep);
  rep.status = atomic_load(&R.failed) ? 1 : 0;
  rep.warns = atomic_load(&g_warns);
  rep.cycles_done = c;
  rep.seconds = R.seconds;
  rep.bytes = R.bytes;
  rep.ops = R.ops;
  rep.sigs = R.sigs;
  rep.setup_failed = g_setup_failed;
  if (opt.summary) summary_snapshot(&rep.sum);
  snprintf(rep.reason, sizeof rep.reason, "%s", R.err);
  snprintf(rep.pp_line, sizeof rep.pp_line, "%s", R.pp_line);
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
