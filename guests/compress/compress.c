/* compress.c - chooses, per peer and per op size, whether a put's payload is
 * compressed on the wire and with which codec (S2 or zstd), from the speed
 * it observes for each. README: guests/compress/README.md.
 *
 * The guest never sees a payload byte or a compressed size: what it observes
 * is the host's completion latency of each put, which includes compressing,
 * sending the (smaller or not) frames and decompressing at the target. So it
 * measures, per peer and size class, the delivered bytes per microsecond of
 * each candidate codec over a short trial, keeps the fastest for a while,
 * then tries them again. Data that compresses well on a slow link makes a
 * codec win; random data, or a fast link, makes "none" win.
 *
 * Size classes: below `min` (default 4k) never compressed; `min`..`large`
 * (default 256k) try none and S2; `large` and above try none, S2 and zstd.
 *
 * Configuration (NCCL_RMA_WASM_CONFIG or compress.conf), comma separated:
 *   min=BYTES      smallest put that may be compressed (default 4k; the host
 *                  never compresses under 512 bytes)
 *   large=BYTES    puts at least this large also try zstd (default 256k)
 *   trial=N        puts per candidate in a trial (default 8)
 *   period=N       puts that use the winner before the next trial (default 512)
 *   s2_level=L     S2 level 0..2 (default 1)
 *   zstd_level=L   zstd level 0..4 (default 1)
 *   codec=C        force: 0 none, 1 S2, 2 zstd for every put of at least min
 *                  bytes (default -1: choose)
 */
#include "rmaw.h"

RMAW_ABI_V1()
RMAW_DEFINE_AREA(64)

#define MAX_PEERS 256
#define NCAND 3 /* 0 none, 1 S2, 2 zstd */
#define NCLASS 2 /* 0 medium, 1 large */
#define FIFO 64  /* planned puts awaiting their completion, per peer */

struct cls {
  uint8_t phase;      /* 0 trial, 1 exploit */
  uint8_t cand;       /* the candidate on trial, or the winner */
  uint32_t left;      /* puts left in this phase */
  uint64_t bytes[NCAND], ns[NCAND];
};

struct peer {
  struct cls c[NCLASS];
  uint8_t fifo[FIFO]; /* candidate | class << 4 of each planned put, in plan order */
  uint32_t head, len;
};

static struct {
  int64_t min, large, trial, period, s2_level, zstd_level, force;
  int ok; /* FEATURE_COMPRESSION negotiated */
  int32_t rank;
  uint64_t puts[NCAND], bytes[NCAND], won[NCAND], trials, switches, unmatched;
} st;

static struct peer peers[MAX_PEERS + 1];
static char cfg[512];
static const char *names[NCAND] = {"none", "s2", "zstd"};

static uint32_t word(int cand) {
  switch (cand) {
  case 1: return RMAW_CODEC(RMAW_CODEC_S2, (uint32_t)st.s2_level);
  case 2: return RMAW_CODEC(RMAW_CODEC_ZSTD, (uint32_t)st.zstd_level);
  }
  return RMAW_CODEC_NONE;
}

static int ncand(int cls) { return cls ? 3 : 2; }

static void start_trial(struct cls *c) {
  c->phase = 0;
  c->cand = 0;
  c->left = (uint32_t)st.trial;
  for (int i = 0; i < NCAND; i++) c->bytes[i] = c->ns[i] = 0;
}

RMAW_EXPORT(rmaw_init) int64_t rmaw_init(int64_t host_features) {
  int32_t len = RMAW_CONFIG_KEYS(cfg, {"min", &st.min, 4 << 10}, {"large", &st.large, 256 << 10},
                                      {"trial", &st.trial, 8}, {"period", &st.period, 512},
                                      {"s2_level", &st.s2_level, 1}, {"zstd_level", &st.zstd_level, 1},
                                      {"codec", &st.force, -1});
  if (len < 0) return len;
  if (st.min < 0 || st.large < st.min || st.trial < 1 || st.period < 1 || st.s2_level < 0 || st.s2_level > 2 ||
      st.zstd_level < 0 || st.zstd_level > 4 || st.force < -1 || st.force > 2) {
    rmaw_log(RMAW_LOG_WARN, "compress: want min <= large, trial >= 1, period >= 1, s2_level 0..2, zstd_level 0..4, codec -1..2");
    return RMAW_ERR_INVAL;
  }
  for (uint32_t p = 0; p <= MAX_PEERS; p++)
    for (int c = 0; c < NCLASS; c++) start_trial(&peers[p].c[c]);
  st.ok = (host_features & RMAW_FEATURE_COMPRESSION) != 0;
  if (!st.ok) rmaw_log(RMAW_LOG_WARN, "compress: the host does not offer FEATURE_COMPRESSION: nothing is compressed");
  return (RMAW_FEATURE_PLAN_OP | RMAW_FEATURE_COMPLETIONS | RMAW_FEATURE_COMPRESSION) & host_features;
}

RMAW_CTX_OPEN_RANK(st.rank)

static int is_put(uint32_t kind) { return kind == RMAW_OP_PUT || kind == RMAW_OP_PUT_SIGNAL; }

RMAW_EXPORT(rmaw_plan_op) int32_t rmaw_plan_op(int32_t ctx, int32_t kind, int32_t peer, int64_t size,
                                               int32_t opt_flags, int32_t signal_op) {
  (void)ctx;
  (void)opt_flags;
  (void)signal_op;
  uint64_t sz = (uint64_t)size;
  struct rmaw_plan *plan = &rmaw_area_ptr()->plan;
  if (!st.ok || !is_put((uint32_t)kind) || sz < (uint64_t)st.min) return RMAW_OK; /* pre-filled: none */
  int cls = sz >= (uint64_t)st.large;
  struct peer *p = &peers[(uint32_t)peer < MAX_PEERS ? (uint32_t)peer : MAX_PEERS];
  struct cls *c = &p->c[cls];
  int cand;
  if (st.force >= 0) {
    cand = (int)st.force;
  } else {
    cand = c->cand;
    if (c->left == 0) { /* the phase is over */
      if (c->phase == 0 && c->cand + 1 < ncand(cls)) {
        c->cand++;
        c->left = (uint32_t)st.trial;
      } else if (c->phase == 0) { /* every candidate tried: keep the fastest */
        int best = 0;
        for (int i = 1; i < ncand(cls); i++) /* bytes/ns compared without division */
          if (c->bytes[i] * c->ns[best] > c->bytes[best] * c->ns[i] || c->ns[best] == 0) best = i;
        if (c->ns[best] == 0) best = 0; /* nothing completed yet: stay uncompressed */
        c->phase = 1;
        c->cand = (uint8_t)best;
        c->left = (uint32_t)st.period;
        st.trials++;
        st.won[best]++;
      } else {
        start_trial(c);
        st.switches++;
      }
      cand = c->cand;
    }
    c->left--;
  }
  plan->codec = word(cand);
  st.puts[cand]++;
  st.bytes[cand] += sz;
  if (p->len < FIFO) {
    p->fifo[(p->head + p->len) % FIFO] = (uint8_t)(cand | cls << 4);
    p->len++;
  }
  return RMAW_OK;
}

RMAW_ON_COMPLETION(r) {
  if (!is_put(r->kind) || r->size < (uint64_t)st.min) return;
  struct peer *p = &peers[r->peer < MAX_PEERS ? r->peer : MAX_PEERS];
  if (p->len == 0) { /* more completions than plans: a hostile or foreign record */
    st.unmatched++;
    return;
  }
  /* Puts to one peer complete close to plan order; a trial's puts all
   * use one codec, so a swap at a boundary blurs one sample at most. */
  uint8_t e = p->fifo[p->head];
  p->head = (p->head + 1) % FIFO;
  p->len--;
  struct cls *c = &p->c[e >> 4 & 1];
  int cand = e & 3;
  if (r->status || c->phase != 0) return; /* measure trials only */
  if (c->ns[cand] + r->latency_ns < c->ns[cand]) return; /* overflow */
  c->bytes[cand] += r->size;
  c->ns[cand] += r->latency_ns ? r->latency_ns : 1;
}

RMAW_EXPORT(rmaw_ctx_close) int32_t rmaw_ctx_close(int32_t ctx) {
  (void)ctx;
  char line[320];
  struct rmaw_buf b = {line, 0, sizeof line};
  rmaw_buf_fmt(&b, "compress: rank %d: puts", st.rank);
  for (int i = 0; i < NCAND; i++) rmaw_buf_fmt(&b, " %s %llu (%llu B)", names[i], st.puts[i], st.bytes[i]);
  rmaw_buf_fmt(&b, "; trials decided %llu", st.trials);
  if (st.force >= 0) {
    rmaw_buf_str(&b, " (codec forced)");
  } else {
    rmaw_buf_str(&b, ", won by");
    for (int i = 0; i < NCAND; i++) rmaw_buf_fmt(&b, " %s %llu", names[i], st.won[i]);
  }
  rmaw_buf_log(RMAW_LOG_INFO, &b);
  return RMAW_OK;
}
