/*
 * scenarios.c - the checks beyond the basic rounds: bad input, a killed
 * peer, teardown right after posting, and a signal storm.
 */
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>

#include "harness.h"

/* ---- bad input ---- */

int bad_count;

/* Every case expects the exact code SPEC.md §3 prescribes: ncclInvalidArgument
 * for an argument that is wrong in itself (NULL, unknown or released
 * handles, out-of-range values); ncclInvalidUsage only for a valid handle
 * used in a state that forbids the call. */
#define EXPECT_BAD(what, expr, want)                                                        \
  do {                                                                                      \
    atomic_store(&g_expecting_warn, 1);                                                     \
    int w0_ = atomic_load(&g_warns);                                                        \
    ncclResult_t rc_ = (expr);                                                              \
    int w1_ = atomic_load(&g_warns);                                                        \
    atomic_store(&g_expecting_warn, 0);                                                     \
    bad_count++;                                                                            \
    if (rc_ != (want)) {                                                                    \
      failf("bad-input %s: returned %d (%s), want %s", what, rc_, result_name(rc_),         \
            result_name(want));                                                             \
      return -1;                                                                            \
    }                                                                                       \
    if (w1_ == w0_) {                                                                       \
      failf("bad-input %s: returned %s but logged no WARN line", what, result_name(rc_));   \
      return -1;                                                                            \
    }                                                                                       \
    if (opt.verbose) fprintf(stderr, "[rank %d] bad-input ok: %s -> %s\n", g_rank, what,    \
                             result_name(rc_));                                             \
  } while (0)

int bad_before_init(void) {
  EXPECT_BAD("init(ctx=NULL)", R.pl.t.init(NULL, 42, logger), ncclInvalidArgument);
  EXPECT_BAD("devices(NULL)", R.pl.t.devices(NULL), ncclInvalidArgument);
  EXPECT_BAD("getProperties(0, NULL)", R.pl.t.getProperties(0, NULL), ncclInvalidArgument);
  return 0;
}

int bad_after_setup(int ndev) {
  ncclNetProperties_v12_t p;
  void* x = (void*)1;
  void* req = NULL;
  int N = opt.ranks;
  char h[NCCL_NET_HANDLE_MAXSIZE];
  EXPECT_BAD("getProperties(dev=ndev)", R.pl.t.getProperties(ndev, &p), ncclInvalidArgument);
  EXPECT_BAD("getProperties(dev=-1)", R.pl.t.getProperties(-1, &p), ncclInvalidArgument);
  EXPECT_BAD("listen(handle=NULL)", R.pl.t.listen(R.ctx, 0, NULL, &x), ncclInvalidArgument);
  EXPECT_BAD("listen(listenComm=NULL)", R.pl.t.listen(R.ctx, 0, h, NULL), ncclInvalidArgument);
  void* hs[1] = {NULL};
  EXPECT_BAD("connect(collComm=NULL)", R.pl.t.connect(NULL, hs, 1, 0, R.listenComm, NULL), ncclInvalidArgument);
  EXPECT_BAD("connect(handles=NULL)", R.pl.t.connect(NULL, NULL, 1, 0, R.listenComm, &x), ncclInvalidArgument);
  EXPECT_BAD("connect(handles[0]=NULL)", R.pl.t.connect(NULL, hs, 1, 0, R.listenComm, &x), ncclInvalidArgument);
  ncclRmaConfig_v15_t cfg = {opt.threads, INT_MIN, 1};
  EXPECT_BAD("createContext(config=NULL)", R.pl.t.createContext(R.cm.coll, NULL, &x), ncclInvalidArgument);
  EXPECT_BAD("createContext(rmaCtx=NULL)", R.pl.t.createContext(R.cm.coll, &cfg, NULL), ncclInvalidArgument);
  EXPECT_BAD("regMrSym(mhandle=NULL)",
             R.pl.t.regMrSym(R.cm.coll, R.cm.src, opt.size, NCCL_PTR_HOST, 0, NULL), ncclInvalidArgument);
  if (R.pl.getRmaProperties)
    EXPECT_BAD("getRmaProperties(NULL)", R.pl.getRmaProperties(R.cm.coll, NULL), ncclInvalidArgument);
  EXPECT_BAD("iput(request=NULL)",
             R.pl.t.iput(R.cm.rctx, 0, 0, R.cm.srcMh, 8, 0, R.cm.dstMh, 0, 0, NULL), ncclInvalidArgument);
  EXPECT_BAD("iputSignal(request=NULL)",
             R.pl.t.iputSignal(R.cm.rctx, 0, 0, NULL, 0, 0, NULL, 0, 0, R.cm.sigMh, 1,
                               NCCL_NET_SIGNAL_OP_INC, true, 0, NULL), ncclInvalidArgument);
  EXPECT_BAD("iget(request=NULL)",
             R.pl.t.iget(R.cm.rctx, 0, 0, R.cm.getsrcMh, 8, 0, R.cm.getdstMh, 0, 0, NULL), ncclInvalidArgument);
  EXPECT_BAD("iflush(request=NULL)", R.pl.t.iflush(R.cm.rctx, 0, R.cm.sigMh, 0, NULL), ncclInvalidArgument);
  int done;
  EXPECT_BAD("test(done=NULL)", R.pl.t.test(R.cm.coll, GARBAGE_HANDLE, NULL), ncclInvalidArgument);
  EXPECT_BAD("queryLastError(hasError=NULL)", R.pl.t.queryLastError(R.cm.rctx, NULL), ncclInvalidArgument);
  /* garbage handles */
  EXPECT_BAD("iput(garbage rmaCtx)",
             R.pl.t.iput(GARBAGE_HANDLE, 0, 0, R.cm.srcMh, 8, 0, R.cm.dstMh, 0, 0, &req), ncclInvalidArgument);
  EXPECT_BAD("iput(garbage srcMhandle)",
             R.pl.t.iput(R.cm.rctx, 0, 0, GARBAGE_HANDLE, 8, 0, R.cm.dstMh, 0, 0, &req), ncclInvalidArgument);
  EXPECT_BAD("iput(garbage dstMhandle)",
             R.pl.t.iput(R.cm.rctx, 0, 0, R.cm.srcMh, 8, 0, GARBAGE_HANDLE, 0, 0, &req), ncclInvalidArgument);
  EXPECT_BAD("iputSignal(garbage signalMhandle)",
             R.pl.t.iputSignal(R.cm.rctx, 0, 0, NULL, 0, 0, NULL, 0, 0, GARBAGE_HANDLE, 1,
                               NCCL_NET_SIGNAL_OP_INC, true, 0, &req), ncclInvalidArgument);
  EXPECT_BAD("iget(garbage remoteMhandle)",
             R.pl.t.iget(R.cm.rctx, 0, 0, GARBAGE_HANDLE, 8, 0, R.cm.getdstMh, 0, 0, &req), ncclInvalidArgument);
  EXPECT_BAD("test(garbage request)", R.pl.t.test(R.cm.coll, GARBAGE_HANDLE, &done), ncclInvalidArgument);
  EXPECT_BAD("test(garbage collComm)", R.pl.t.test(GARBAGE_HANDLE, GARBAGE_HANDLE, &done), ncclInvalidArgument);
  EXPECT_BAD("rmaProgress(garbage rmaCtx)", R.pl.t.rmaProgress(GARBAGE_HANDLE), ncclInvalidArgument);
  EXPECT_BAD("deregMrSym(garbage mhandle)", R.pl.t.deregMrSym(R.cm.coll, GARBAGE_HANDLE), ncclInvalidArgument);
  EXPECT_BAD("closeListen(garbage)", R.pl.t.closeListen(GARBAGE_HANDLE), ncclInvalidArgument);
  /* bounds, ranks, contexts, ops */
  EXPECT_BAD("iput(srcOff+size beyond the registration)",
             R.pl.t.iput(R.cm.rctx, 0, (uint64_t)opt.size * (uint64_t)N - 8, R.cm.srcMh, 16, 0, R.cm.dstMh,
                         0, 0, &req), ncclInvalidArgument);
  EXPECT_BAD("iget(localOff+size beyond the registration)",
             R.pl.t.iget(R.cm.rctx, 0, 0, R.cm.getsrcMh, 16, (uint64_t)opt.size * (uint64_t)N - 8,
                         R.cm.getdstMh, 0, 0, &req), ncclInvalidArgument);
  EXPECT_BAD("iput(rank=nranks)",
             R.pl.t.iput(R.cm.rctx, 0, 0, R.cm.srcMh, 8, 0, R.cm.dstMh, (uint32_t)N, 0, &req), ncclInvalidArgument);
  EXPECT_BAD("iput(context=nContexts)",
             R.pl.t.iput(R.cm.rctx, opt.threads, 0, R.cm.srcMh, 8, 0, R.cm.dstMh, 0, 0, &req), ncclInvalidArgument);
  EXPECT_BAD("iput(context=-1)", R.pl.t.iput(R.cm.rctx, -1, 0, R.cm.srcMh, 8, 0, R.cm.dstMh, 0, 0, &req), ncclInvalidArgument);
  EXPECT_BAD("iputSignal(signalOp=7)",
             R.pl.t.iputSignal(R.cm.rctx, 0, 0, NULL, 0, 0, NULL, 0, 0, R.cm.sigMh, 1, 7, true, 0, &req), ncclInvalidArgument);
  EXPECT_BAD("iputSignal(size>0 with NULL src handle)",
             R.pl.t.iputSignal(R.cm.rctx, 0, 0, NULL, 8, 0, R.cm.dstMh, 0, 0, R.cm.sigMh, 1,
                               NCCL_NET_SIGNAL_OP_INC, true, 0, &req), ncclInvalidArgument);
  /* a freed handle: register (collectively) and deregister a scratch buffer */
  uint8_t* scratch = xalloc(4096);
  void* smh = NULL;
  CALL(R.pl.t.regMrSym(R.cm.coll, scratch, 4096, NCCL_PTR_HOST, 0, &smh));
  CALL(R.pl.t.deregMrSym(R.cm.coll, smh));
  EXPECT_BAD("iput(deregistered srcMhandle)",
             R.pl.t.iput(R.cm.rctx, 0, 0, smh, 8, 0, R.cm.dstMh, 0, 0, &req), ncclInvalidArgument);
  EXPECT_BAD("deregMrSym(twice)", R.pl.t.deregMrSym(R.cm.coll, smh), ncclInvalidArgument);
  free(scratch);
  if (req != NULL) {
    failf("bad-input: a failed call wrote a non-NULL request");
    return -1;
  }
  return 0;
}

int bad_after_teardown(void* oldRctx, void* oldColl) {
  void* req = NULL;
  int done;
  void* x;
  uint8_t b[64];
  EXPECT_BAD("iput after destroyContext",
             R.pl.t.iput(oldRctx, 0, 0, R.cm.srcMh, 8, 0, R.cm.dstMh, 0, 0, &req), ncclInvalidArgument);
  EXPECT_BAD("rmaProgress after destroyContext", R.pl.t.rmaProgress(oldRctx), ncclInvalidArgument);
  EXPECT_BAD("destroyContext twice", R.pl.t.destroyContext(oldRctx), ncclInvalidArgument);
  if (oldColl) {
    EXPECT_BAD("regMrSym after closeColl",
               R.pl.t.regMrSym(oldColl, b, sizeof b, NCCL_PTR_HOST, 0, &x), ncclInvalidArgument);
    EXPECT_BAD("test after closeColl", R.pl.t.test(oldColl, GARBAGE_HANDLE, &done), ncclInvalidArgument);
    ncclRmaConfig_v15_t cfg = {1, INT_MIN, 1};
    EXPECT_BAD("createContext after closeColl", R.pl.t.createContext(oldColl, &cfg, &x), ncclInvalidArgument);
    EXPECT_BAD("closeColl twice", R.pl.t.closeColl(oldColl), ncclInvalidArgument);
  }
  return 0;
}

/* ---- kill scenario: rank opt.kill_rank was SIGKILLed after round 0 ---- */

int fault_phase(void) {
  int victim = opt.kill_rank;
  double t0 = now_s(), deadline = t0 + 10.0;
  long issued = 0;
  const char* how = NULL;
  int code = 0;
  while (now_s() < deadline && how == NULL) {
    void* req = NULL;
    ncclResult_t rc;
    if (issued & 1)
      rc = R.pl.t.iget(R.cm.rctx, 0, 0, R.cm.getsrcMh, opt.size, (size_t)victim * opt.size, R.cm.getdstMh,
                       (uint32_t)victim, 0, &req);
    else
      rc = R.pl.t.iputSignal(R.cm.rctx, 0, (size_t)victim * opt.size, R.cm.srcMh, opt.size,
                             (size_t)g_rank * opt.size, R.cm.dstMh, (uint32_t)victim,
                             (uint64_t)g_rank * 8, R.cm.sigMh, 0, NCCL_NET_SIGNAL_OP_INC, true, 0,
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
      rc = R.pl.t.test(R.cm.coll, req, &done);
      if (rc != ncclSuccess) {
        how = "test returned an error";
        code = rc;
        break;
      }
      if (done) break;
      if ((++spins & 255) == 0) {
        bool e = false;
        if (R.pl.t.queryLastError(R.cm.rctx, &e) == ncclSuccess && e) {
          how = "queryLastError reported an error";
          break;
        }
        if (now_s() > rdl || now_s() > deadline) break; /* abandon this request */
        usleep(100);
      }
    }
    if (how == NULL) {
      bool e = false;
      if (R.pl.t.queryLastError(R.cm.rctx, &e) == ncclSuccess && e)
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
int teardown_phase(void) {
  int N = opt.ranks, recv = R.cycle % N;
  size_t half = opt.size / 2;
  uint64_t key = put_key(g_rank, recv, R.cycle, 0, 0);
  if (g_rank != recv) fill(R.cm.src, 0, opt.size, key);
  if (boot_barrier(TAG_BARRIER)) {
    failf("cycle %d: bootstrap barrier failed (a rank died?)", R.cycle);
    return -1;
  }
  if (g_rank != recv) {
    size_t dbase = (size_t)g_rank * opt.size;
    void* rq[3] = {NULL, NULL, NULL};
    CALL(R.pl.t.iput(R.cm.rctx, 0, 0, R.cm.srcMh, half, dbase, R.cm.dstMh, (uint32_t)recv, 0, &rq[0]));
    CALL(R.pl.t.iputSignal(R.cm.rctx, 0, half, R.cm.srcMh, opt.size - half, dbase + half, R.cm.dstMh,
                           (uint32_t)recv, (uint64_t)g_rank * 8, R.cm.sigMh,
                           (uint64_t)R.cycle + 1, NCCL_NET_SIGNAL_OP_ADD, true, 0, &rq[1]));
    CALL(R.pl.t.iputSignal(R.cm.rctx, 0, 0, NULL, 0, 0, NULL, (uint32_t)recv, (uint64_t)N * 8,
                           R.cm.sigMh, 0, NCCL_NET_SIGNAL_OP_INC, true, 0, &rq[2]));
    if (!rq[0] || !rq[1] || !rq[2]) {
      failf("cycle %d: a data call returned success with a NULL request", R.cycle);
      return -1;
    }
    /* The NCCL order, at once: contexts, registrations, communicator. */
    CALL(R.pl.t.destroyContext(R.cm.rctx));
    CALL(R.pl.t.deregMrSym(R.cm.coll, R.cm.srcMh));
    memset(R.cm.src, 0xEE, (size_t)N * opt.size); /* the caller reuses its memory */
    CALL(R.pl.t.deregMrSym(R.cm.coll, R.cm.dstMh));
    CALL(R.pl.t.deregMrSym(R.cm.coll, R.cm.getsrcMh));
    CALL(R.pl.t.deregMrSym(R.cm.coll, R.cm.getdstMh));
    CALL(R.pl.t.deregMrSym(R.cm.coll, R.cm.sigMh));
    CALL(R.pl.t.closeColl(R.cm.coll));
    CALL(R.pl.t.finalize(R.ginCtx));
    CALL(R.pl.t.finalize(R.ctx));
    return 1;
  }
  /* receiver: every sender's ADD, and one INC each on the shared word */
  double deadline = now_s() + opt.timeout_s;
  for (;;) {
    int ok = __atomic_load_n(&R.cm.sig[N], __ATOMIC_ACQUIRE) == (uint64_t)(N - 1);
    for (int s = 0; s < N; s++)
      if (s != recv && __atomic_load_n(&R.cm.sig[s], __ATOMIC_ACQUIRE) != (uint64_t)R.cycle + 1)
        ok = 0;
    if (ok) break;
    if (now_s() > deadline) {
      char b[256];
      sig_words(R.cm.sig, N + 1, b, sizeof b);
      failf("cycle %d: signals of senders that tore down at once did not arrive within %d s "
            "(words:%s; want %d from each sender, %d shared): accepted operations were lost",
            R.cycle, opt.timeout_s, b, R.cycle + 1, N - 1);
      return -1;
    }
    usleep(50);
  }
  for (int s = 0; s < N; s++) {
    if (s == recv) continue;
    long bad = check(R.cm.dst + (size_t)s * opt.size, 0, opt.size, put_key(s, recv, R.cycle, 0, 0));
    if (bad >= 0) {
      failf("cycle %d: byte %ld of the put from rank %d (which tore down at once) is wrong", R.cycle,
            bad, s);
      return -1;
    }
    __atomic_store_n(&R.cm.sig[s], 0, __ATOMIC_RELEASE);
  }
  bool err = false;
  CALL(R.pl.t.queryLastError(R.cm.rctx, &err));
  if (err) {
    failf("cycle %d: queryLastError reports an error after peers said goodbye", R.cycle);
    return -1;
  }
  R.bytes += (uint64_t)(N - 1) * opt.size;
  R.ops += 3ULL * (uint64_t)(N - 1);
  R.sigs += 2ULL * (uint64_t)(N - 1); /* each sender's ADD and INC */
  if (opt.verbose)
    printf("[rank %d] teardown cycle %d: %d senders delivered every byte and signal\n", g_rank,
           R.cycle, N - 1);
  return 0;
}

/* ---- signal storm ---- */

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

static pthread_t g_storm_th;

void storm_start(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_usr1;
  sa.sa_flags = SA_ONSTACK | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, NULL);
  pthread_create(&g_storm_th, NULL, storm, NULL);
}

long storm_stop(void) {
  atomic_store(&g_storm_stop, 1);
  pthread_join(g_storm_th, NULL);
  return atomic_load(&g_storm_hits);
}

/* ---- fault scenario: the rank side ---- */

/* fault_storm runs after round 0 of --scenario fault (all modes but
 * stop-cont): every rank keeps operations of the mode's kind in flight, the
 * survivors to the victim (--kill-rank), the victim to the next rank, while
 * the parent strikes the victim. Every rank still talking to a struck peer
 * must see an operation fail with ncclRemoteError (from the call or from
 * test()) and queryLastError report it, every request it posted must
 * complete, all within --timeout seconds: no hang, no crash, no other code. */
int fault_storm(void) {
  int N = opt.ranks, v = opt.kill_rank;
  int target = g_rank == v ? (v + 1) % N : v;
  int Q = opt.fault == F_KILL_SIGNAL ? 64 : 4;
  void* req[64] = {0};
  double t0 = now_s(), bound = t0 + opt.timeout_s, t_remote = 0, t_qle = 0;
  long issued = 0, ok = 0, failed = 0, spins = 0;
  const char* how = NULL;
  bool qle = false;
  for (;;) {
    int inflight = 0;
    for (int i = 0; i < Q; i++) {
      ncclResult_t rc;
      if (req[i] == NULL && !(how && qle)) {
        void* rq = NULL;
        const char* what;
        if (opt.fault == F_KILL_GET) {
          what = "iget";
          rc = R.pl.t.iget(R.cm.rctx, 0, 0, R.cm.getsrcMh, opt.size, (size_t)target * opt.size,
                           R.cm.getdstMh, (uint32_t)target, 0, &rq);
        } else if (opt.fault == F_KILL_SIGNAL) {
          what = "iputSignal(size 0)";
          rc = R.pl.t.iputSignal(R.cm.rctx, 0, 0, NULL, 0, 0, NULL, (uint32_t)target,
                                 (uint64_t)g_rank * 8, R.cm.sigMh, 0, NCCL_NET_SIGNAL_OP_INC, true, 0,
                                 &rq);
        } else {
          what = "iput";
          rc = R.pl.t.iput(R.cm.rctx, 0, (size_t)target * opt.size, R.cm.srcMh, opt.size,
                           (size_t)g_rank * opt.size, R.cm.dstMh, (uint32_t)target, 0, &rq);
        }
        issued++;
        if (rc != ncclSuccess) {
          if (rc != ncclRemoteError) {
            failf("fault %s: %s to rank %d returned %s, want ncclRemoteError", fault_name(opt.fault),
                  what, target, result_name(rc));
            return -1;
          }
          failed++;
          if (!how) {
            how = "the call returned ncclRemoteError";
            t_remote = now_s();
          }
        } else if (rq == NULL) {
          failf("fault: %s returned success with a NULL request", what);
          return -1;
        } else {
          req[i] = rq;
        }
      }
      if (req[i] == NULL) continue;
      int done = 0;
      rc = R.pl.t.test(R.cm.coll, req[i], &done);
      if (rc != ncclSuccess) {
        /* A survivor's put may also be refused by the struck rank itself:
         * having lost its own peer it tears down and releases the
         * registration while a stream the fault did not reach still carries
         * puts into it; the target's code (ncclInvalidArgument) then fails
         * the request, which is as clean an end as a lost connection. */
        bool refused = rc == ncclInvalidArgument && g_rank != v && opt.fault == F_RESET;
        if (rc != ncclRemoteError && !refused) {
          failf("fault %s: test() returned %s, want ncclRemoteError", fault_name(opt.fault),
                result_name(rc));
          return -1;
        }
        req[i] = NULL;
        failed++;
        if (!how) {
          how = refused ? "test() returned the struck rank's refusal (ncclInvalidArgument)" : "test() returned ncclRemoteError";
          t_remote = now_s();
        }
      } else if (done) {
        req[i] = NULL;
        ok++;
      } else {
        inflight++;
      }
    }
    if ((++spins & 63) == 0) {
      if (!opt.no_progress) R.pl.t.rmaProgress(R.cm.rctx);
      if (!qle && R.pl.t.queryLastError(R.cm.rctx, &qle) == ncclSuccess && qle) t_qle = now_s();
      if (how && qle && inflight == 0) break;
      if (now_s() > bound) {
        failf("fault %s: after %d s: %s, queryLastError %s, %d requests still pending (%ld issued, "
              "%ld ok, %ld failed)",
              fault_name(opt.fault), opt.timeout_s, how ? how : "no operation failed",
              qle ? "true" : "false", inflight, issued, ok, failed);
        return -1;
      }
      usleep(20);
    }
  }
  printf("[rank %d] fault %s: lost rank %d: %s after %.3f s, queryLastError true after %.3f s; "
         "%ld ops issued, %ld ok, %ld failed with ncclRemoteError, none pending (failed at %.6f)\n",
         g_rank, fault_name(opt.fault), target, how, t_remote - t0, t_qle - t0, issued, ok, failed,
         t_remote);
  return 0;
}

/* ---- fault scenario: the parent side ---- */

static enum { FS_IDLE, FS_ARMED, FS_STRIKE, FS_STOPPED, FS_STOPPED_FOR_GOOD, FS_DONE } g_fs;
static double g_fs_at, g_fs_t0;

static void reap_victim(child_t* C, int v) {
  kill(C[v].pid, SIGKILL);
  reap_child(&C[v]);
  C[v].killed = 1;
  if (C[v].alive) close(C[v].fd);
  C[v].alive = 0;
}

void fault_after_collective(child_t* C, int N, int tag) {
  (void)N;
  int v = opt.kill_rank;
  if (g_fs == FS_IDLE && tag == TAG_KILL) {
    g_fs_t0 = now_s();
    switch (opt.fault) {
      case F_STOP_CONT: g_fs = FS_ARMED; break; /* at the start of the next round */
      case F_LANE_RESET: g_fs = FS_DONE; break; /* the victim strikes itself, mid-round */
      case F_STOP:
        kill(C[v].pid, SIGSTOP);
        printf("rma_driver: fault phase begins; SIGSTOP rank %d (pid %d) for good (at %.6f)\n", v,
               (int)C[v].pid, g_fs_t0);
        g_fs = FS_STOPPED_FOR_GOOD;
        break;
      default:
        g_fs_at = g_fs_t0 + opt.fault_delay_ms / 1000.0;
        g_fs = FS_STRIKE;
    }
  } else if (g_fs == FS_ARMED) {
    kill(C[v].pid, SIGSTOP);
    g_fs_t0 = now_s();
    g_fs_at = g_fs_t0 + opt.stop_ms / 1000.0;
    printf("rma_driver: round 1 begins; SIGSTOP rank %d (pid %d) for %d ms\n", v, (int)C[v].pid,
           opt.stop_ms);
    g_fs = FS_STOPPED;
  }
}

void fault_tick(child_t* C, int N) {
  int v = opt.kill_rank;
  double t = now_s();
  if (g_fs == FS_STRIKE && t >= g_fs_at) {
    if (opt.fault == F_RESET) {
      int n = reset_sockets(C[v].pid);
      printf("rma_driver: %.3f s into the fault phase: reset %d TCP connections of rank %d\n",
             t - g_fs_t0, n, v);
    } else {
      reap_victim(C, v);
      printf("rma_driver: %.3f s into the fault phase (%s): SIGKILL rank %d (at %.6f)\n", t - g_fs_t0,
             fault_name(opt.fault), v, t);
    }
    g_fs = FS_DONE;
  } else if (g_fs == FS_STOPPED && t >= g_fs_at) {
    kill(C[v].pid, SIGCONT);
    printf("rma_driver: SIGCONT rank %d after %.3f s (at %.6f)\n", v, t - g_fs_t0, t);
    g_fs = FS_DONE;
  } else if (g_fs == FS_STOPPED_FOR_GOOD) {
    for (int r = 0; r < N; r++)
      if (r != v && C[r].alive) return;
    reap_victim(C, v); /* every survivor is done */
    g_fs = FS_DONE;
  }
}

/* socket_inodes lists the socket inodes among process pid's open files
 * (at most cap); -1 when its fd directory cannot be read. */
static int socket_inodes(pid_t pid, unsigned long* inos, int cap) {
  char path[96], link[96];
  int n = 0;
  snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
  DIR* d = opendir(path);
  if (d == NULL) return -1;
  struct dirent* e;
  while ((e = readdir(d)) != NULL && n < cap) {
    char p[400];
    snprintf(p, sizeof p, "%s/%s", path, e->d_name);
    ssize_t k = readlink(p, link, sizeof link - 1);
    if (k <= 0) continue;
    link[k] = 0;
    unsigned long ino;
    if (sscanf(link, "socket:[%lu]", &ino) == 1) inos[n++] = ino;
  }
  closedir(d);
  return n;
}

/* established lists the established TCP connections (IPv4 and IPv6) of
 * process pid by local and remote port (at most cap): the lines of
 * /proc/pid/net/tcp{,6} whose socket inode is one of its open files.
 * Returns how many, or -1 when its fd directory cannot be read. */
static int established(pid_t pid, unsigned* lp, unsigned* rp, int cap) {
  unsigned long inos[1024];
  int nc = 0;
  char path[96];
  int nino = socket_inodes(pid, inos, 1024);
  if (nino < 0) return -1;
  for (int v6 = 0; v6 < 2; v6++) {
    snprintf(path, sizeof path, "/proc/%d/net/tcp%s", (int)pid, v6 ? "6" : "");
    FILE* f = fopen(path, "r");
    if (f == NULL) continue;
    char line[512];
    if (fgets(line, sizeof line, f) == NULL) { fclose(f); continue; }
    while (fgets(line, sizeof line, f) && nc < cap) {
      unsigned lport, rport, st;
      unsigned long ino;
      if (sscanf(line, " %*d: %*[0-9A-Fa-f]:%x %*[0-9A-Fa-f]:%x %x %*x:%*x %*x:%*x %*x %*u %*u %lu",
                 &lport, &rport, &st, &ino) != 4 || st != 1 /* ESTABLISHED */)
        continue;
      for (int i = 0; i < nino; i++)
        if (inos[i] == ino) {
          lp[nc] = lport, rp[nc] = rport, nc++;
          break;
        }
    }
    fclose(f);
  }
  return nc;
}

/* reset_sockets aborts every established TCP connection of process pid
 * with ss -K run in its network namespace (nsenter; SOCK_DESTROY: the
 * kernel sends the far end a RST). Returns how many were reset. */
int reset_sockets(pid_t pid) {
  unsigned lp[1024], rp[1024];
  int nc = established(pid, lp, rp, 1024), n = 0;
  if (nc <= 0) return 0;
  /* One ss call for all of them: a call per connection would let the rank
   * notice the first reset and close the rest in order before they are hit. */
  static char cmd[65536];
  int o = snprintf(cmd, sizeof cmd, "nsenter -t %d -n ss -K -t -n '", (int)pid);
  for (; n < nc && o < (int)sizeof cmd - 128; n++)
    o += snprintf(cmd + o, sizeof cmd - (size_t)o, "%s( sport = :%u and dport = :%u )", n ? " or " : "", lp[n],
                  rp[n]);
  snprintf(cmd + o, sizeof cmd - (size_t)o, "' >/dev/null 2>&1");
  return system(cmd) == 0 ? n : 0;
}

/* reset_one_lane aborts one outgoing TCP lane of process pid to another
 * process with ss -K; what names it. Accepted connections share the
 * local port their listener had (several of them), lanes to ourselves end
 * at one of those ports: an outgoing lane to a peer is an established
 * connection whose local port is its own and whose remote port is none of
 * ours. Returns 1, or 0 when none was found. */
int reset_one_lane(pid_t pid, char* what, size_t cap) {
  unsigned lp[1024], rp[1024];
  snprintf(what, cap, "none");
  int nc = established(pid, lp, rp, 1024);
  for (int i = 0; i < nc; i++) {
    int shared = 0, ours = 0;
    for (int j = 0; j < nc; j++) {
      shared += j != i && lp[j] == lp[i];
      ours += lp[j] == rp[i];
    }
    if (shared || ours) continue;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "nsenter -t %d -n ss -K -t -n '( sport = :%u and dport = :%u )' >/dev/null 2>&1",
             (int)pid, lp[i], rp[i]);
    snprintf(what, cap, "local port %u to port %u", lp[i], rp[i]);
    return system(cmd) == 0 ? 1 : 0;
  }
  return 0;
}

/* count_resources reads this process's open descriptors, resident set and
 * threads from /proc. */
void count_resources(long* fds, long* rss_kib, long* threads) {
  *fds = *rss_kib = *threads = -1;
  DIR* d = opendir("/proc/self/fd");
  if (d) {
    long n = 0;
    while (readdir(d) != NULL) n++;
    closedir(d);
    *fds = n - 3; /* ".", ".." and the directory's own descriptor */
  }
  FILE* f = fopen("/proc/self/statm", "r");
  if (f) {
    long size, res;
    if (fscanf(f, "%ld %ld", &size, &res) == 2) *rss_kib = res * (sysconf(_SC_PAGESIZE) / 1024);
    fclose(f);
  }
  f = fopen("/proc/self/status", "r");
  if (f) {
    char line[256];
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "Threads: %ld", threads) == 1) break;
    fclose(f);
  }
}
