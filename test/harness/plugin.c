/*
 * plugin.c - load the plugin as RCCL does and give it a logger.
 *
 * Every table version is seen through a v15-shaped table: v16 adds
 * getRmaProperties, v14 lacks the optFlags argument, so its data calls go
 * through small adapters.
 */
#include "harness.h"

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

int load_plugin(plugin_t* p, char* err, size_t errlen) {
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

/* ---- --summary: what the plugin says about itself ---- */

/* The plugin logs from any of its threads, so captures take a lock. */
static pthread_mutex_t g_sum_mu = PTHREAD_MUTEX_INITIALIZER;
static summary_t g_sum = {.connected = -1, .intra = -1, .lanes = -1};

/* copy_until copies s up to the first character of stop (or the end). */
static void copy_until(char* dst, size_t cap, const char* s, const char* stop) {
  size_t n = strcspn(s, stop);
  if (n >= cap) n = cap - 1;
  memcpy(dst, s, n);
  dst[n] = 0;
}

/* capture keeps the INFO lines that say which backend runs and how each
 * peer is reached; their text is the plugin's (host/plugin.go, host/comm.go,
 * host/sandbox, host/dataplane/intranode.go). */
static void capture(const char* m) {
  const char* p;
  pthread_mutex_lock(&g_sum_mu);
  if ((p = strstr(m, "NET/wasm: initialized for comm")) && (p = strstr(p, " with backend "))) {
    copy_until(g_sum.backend, sizeof g_sum.backend, p + strlen(" with backend "), " ");
  } else if ((p = strstr(m, "wasm: backend ")) && strstr(p, " loaded (features ")) {
    copy_until(g_sum.features, sizeof g_sum.features, strstr(p, "(features ") + strlen("(features "),
               ",)");
  } else if ((p = strstr(m, "NET/wasm: rank ")) && strstr(p, " connected to ")) {
    int n = -1, intra = -1, lanes = -1;
    char t[24] = "";
    sscanf(strstr(p, " connected to "),
           " connected to %d ranks in %23[^;]; %d on this host use the intra-node path; %d TCP", &n,
           t, &intra, &lanes);
    g_sum.connected = n;
    g_sum.intra = intra;
    g_sum.lanes = lanes;
    memcpy(g_sum.connect_time, t, sizeof t);
  } else if ((p = strstr(m, "intra-node path to rank ")) && strstr(p, "refused by the kernel")) {
    int r = -1;
    if (sscanf(p, "intra-node path to rank %d", &r) == 1 && r >= 0 && r < SUMMARY_MAX_RANKS)
      g_sum.refused[r] = 1;
  } else if ((p = strstr(m, "wasm guest ")) && (p = strstr(p, ": "))) {
    /* the backend's own lines: keep the last few */
    if (g_sum.nnotes == SUMMARY_NOTES) {
      memmove(g_sum.notes[0], g_sum.notes[1], sizeof g_sum.notes[0] * (SUMMARY_NOTES - 1));
      g_sum.nnotes--;
    }
    copy_until(g_sum.notes[g_sum.nnotes++], sizeof g_sum.notes[0], p + 2, "\n");
  }
  pthread_mutex_unlock(&g_sum_mu);
}

void summary_snapshot(summary_t* out) {
  pthread_mutex_lock(&g_sum_mu);
  *out = g_sum;
  pthread_mutex_unlock(&g_sum_mu);
}

/* ------------------------------------------------------------------ */
/* logger (NCCL numbering: VERSION 1, WARN 2, INFO 3, ABORT 4, TRACE 5) */

atomic_int g_warns;
atomic_int g_expecting_warn;

void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
            const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (level == RMA_NCCL_LOG_WARN) atomic_fetch_add(&g_warns, 1);
  if (opt.summary && level == RMA_NCCL_LOG_INFO) capture(buf);
  int quiet = level == RMA_NCCL_LOG_WARN && atomic_load(&g_expecting_warn) && !opt.verbose;
  if (!quiet && (level == RMA_NCCL_LOG_WARN || level == RMA_NCCL_LOG_VERSION ||
                 level == RMA_NCCL_LOG_ABORT || opt.verbose)) {
    static const char* lv[] = {"NONE", "VERSION", "WARN", "INFO", "ABORT", "TRACE"};
    fprintf(stderr, "[rank %d] plugin %s %s:%d (0x%lx) %s\n", g_rank,
            (level >= 0 && level <= 5) ? lv[level] : "?", file ? file : "?", line, flags, buf);
  }
}
