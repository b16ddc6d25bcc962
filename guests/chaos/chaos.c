/* chaos.c - seeded, reproducible fault and latency injection, for testing
 * how an application handles failed operations and slow ones.
 * README: guests/chaos/README.md.
 *
 * Every decision comes from a splitmix64 stream seeded with
 * (seed, rank, context number), so the same program, seed and configuration
 * inject the same faults on the same operations of each context, run after
 * run (the guest has no clock and no other input).
 *
 * Configuration (NCCL_RMA_WASM_CONFIG or chaos.conf), comma separated:
 *   seed=N         the seed (default 1)
 *   fail_ppm=N     fail this many ops per million (default 0)
 *   fail_code=C    the ncclResult_t they fail with, 1..6 (default 2, ncclSystemError)
 *   delay_ppm=N    delay this many ops per million (default 0)
 *   delay_ns=N     by up to this long, uniformly (default 1000000, at most 10 ms)
 *   kinds=MASK     op kinds affected: 1 put, 2 putSignal, 4 get, 8 flush (default 7)
 *   peer=R         only ops to rank R (default -1: every peer)
 *   after=N        leave the first N ops of each context alone (default 0)
 *   reset_peer=R   emulate a reset of rank R: from op reset_at of a context,
 *   reset_at=N     fail reset_len consecutive ops to R with ncclRemoteError,
 *   reset_len=N    as if the peer had gone and come back (default: off)
 */
#include "rmaw.h"

RMAW_ABI_V1()
RMAW_DEFINE_AREA(64)

static struct {
  int64_t seed, fail_ppm, fail_code, delay_ppm, delay_ns, kinds, peer, after;
  int64_t reset_peer, reset_at, reset_len;
  int delay_ok;
  int32_t rank, ctx;
  uint64_t rng, ops, failed, delayed, delay_total_ns, reset_failed, reset_seen, skipped_delays;
  uint64_t completed, completed_err;
} st;

static char cfg[512];

static uint64_t next(void) { /* splitmix64 */
  uint64_t z = (st.rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

RMAW_EXPORT(rmaw_init) int64_t rmaw_init(int64_t host_features) {
  int32_t len = RMAW_CONFIG_KEYS(cfg, {"seed", &st.seed, 1}, {"fail_ppm", &st.fail_ppm, 0},
                                      {"fail_code", &st.fail_code, RMAW_NCCL_SYSTEM_ERROR},
                                      {"delay_ppm", &st.delay_ppm, 0}, {"delay_ns", &st.delay_ns, 1000000},
                                      {"kinds", &st.kinds, 7}, {"peer", &st.peer, -1}, {"after", &st.after, 0},
                                      {"reset_peer", &st.reset_peer, -1}, {"reset_at", &st.reset_at, 0},
                                      {"reset_len", &st.reset_len, 0});
  if (len < 0) return len;
  if (st.fail_ppm < 0 || st.fail_ppm > 1000000 || st.delay_ppm < 0 || st.delay_ppm > 1000000 ||
      st.fail_code < 1 || st.fail_code > 6 || st.delay_ns < 1 || st.delay_ns > (int64_t)RMAW_MAX_DELAY_NS ||
      st.kinds < 0 || st.kinds > 15 || st.after < 0 || st.reset_at < 0 || st.reset_len < 0) {
    rmaw_log(RMAW_LOG_WARN,
             "chaos: want fail_ppm and delay_ppm 0..1000000, fail_code 1..6, delay_ns 1..10000000, kinds 0..15, "
             "after, reset_at, reset_len >= 0");
    return RMAW_ERR_INVAL;
  }
  st.delay_ok = (host_features & RMAW_FEATURE_DELAY) != 0;
  int64_t want = RMAW_FEATURE_PLAN_OP | RMAW_FEATURE_COMPLETIONS;
  if (st.delay_ppm) want |= RMAW_FEATURE_DELAY;
  return want & host_features;
}

RMAW_EXPORT(rmaw_ctx_open) int32_t rmaw_ctx_open(int32_t ctx, int64_t comm, int32_t nranks, int32_t rank, int32_t n) {
  (void)comm;
  (void)nranks;
  (void)n;
  st.rank = rank;
  st.ctx = ctx;
  st.rng = (uint64_t)st.seed ^ ((uint64_t)(uint32_t)rank << 32) ^ ((uint64_t)(uint32_t)ctx * 0x9e3779b97f4a7c15ull);
  return RMAW_OK;
}

RMAW_EXPORT(rmaw_plan_op) int32_t rmaw_plan_op(int32_t ctx, int32_t kind, int32_t peer, int64_t size,
                                               int32_t opt_flags, int32_t signal_op) {
  (void)ctx;
  (void)size;
  (void)opt_flags;
  (void)signal_op;
  uint64_t i = st.ops++;
  /* Two draws per op, always, so one setting never shifts another's stream. */
  uint64_t r1 = next() % 1000000u, r2 = next();
  if (st.reset_len && peer == st.reset_peer) {
    uint64_t k = st.reset_seen++;
    if (k >= (uint64_t)st.reset_at && k < (uint64_t)(st.reset_at + st.reset_len)) {
      st.reset_failed++;
      return RMAW_NCCL_REMOTE_ERROR;
    }
  }
  if (i < (uint64_t)st.after) return RMAW_OK;
  if (kind < 1 || kind > 4 || !(st.kinds & (1 << (kind - 1)))) return RMAW_OK;
  if (st.peer >= 0 && peer != st.peer) return RMAW_OK;
  if (r1 < (uint64_t)st.fail_ppm) {
    st.failed++;
    return (int32_t)st.fail_code;
  }
  if (r1 < (uint64_t)(st.fail_ppm + st.delay_ppm)) { /* the next delay_ppm of the million */
    if (!st.delay_ok) {
      st.skipped_delays++;
      return RMAW_OK;
    }
    uint64_t d = 1 + r2 % (uint64_t)st.delay_ns;
    rmaw_area_ptr()->plan.delay_ns = d;
    st.delayed++;
    st.delay_total_ns += d;
  }
  return RMAW_OK;
}

RMAW_ON_COMPLETION(c) {
  st.completed++;
  if (c->status) st.completed_err++;
}

RMAW_EXPORT(rmaw_ctx_close) int32_t rmaw_ctx_close(int32_t ctx) {
  (void)ctx;
  char line[320];
  struct rmaw_buf b = {line, 0, sizeof line};
  rmaw_buf_fmt(&b, "chaos: seed %lld rank %d ctx %d: %llu ops, failed %llu (code %lld), reset window failed %llu",
               st.seed, st.rank, st.ctx, st.ops, st.failed, st.fail_code, st.reset_failed);
  rmaw_buf_fmt(&b, ", delayed %llu by %llu us in all", st.delayed, st.delay_total_ns / 1000);
  if (st.skipped_delays)
    rmaw_buf_fmt(&b, " (%llu delays skipped: the host does not offer FEATURE_DELAY)", st.skipped_delays);
  rmaw_buf_fmt(&b, "; completions %llu (%llu with an error)", st.completed, st.completed_err);
  rmaw_buf_log(RMAW_LOG_INFO, &b);
  return RMAW_OK;
}
