/* shaper.c - token-bucket rate limits per peer and per traffic class,
 * applied by pacing (plan.delay_ns, FEATURE_DELAY). README: guests/shaper/README.md.
 *
 * Traffic classes are the op kinds: "put" (put and putSignal payloads) and
 * "get". Each op passes the bucket of its peer (every class) and the bucket
 * of its (peer, class); it is delayed by what the fuller of the two needs.
 *
 * The guest has no clock (SPEC.md §8.4, by decision), so a bucket cannot
 * refill with time. It refills with completions instead: a bucket's level is
 * the bytes planned through it minus the bytes the host reported complete,
 * i.e. the bytes in flight. An op that finds the level above the burst is
 * delayed by (level + size - burst) / rate, the time the excess takes to
 * drain at the rate, at most 10 ms (the ABI's cap; such ops are counted as
 * "capped"). Completions arrive in batches (up to 64, or at rmaProgress), so
 * the level errs high: the shaper is conservative, never lax.
 *
 * Configuration (NCCL_RMA_WASM_CONFIG or shaper.conf), comma separated:
 *   rate=BYTES/s       every class to one peer (default 0 = unlimited)
 *   put_rate=BYTES/s   puts to one peer (default 0 = unlimited)
 *   get_rate=BYTES/s   gets from one peer (default 0 = unlimited)
 *   burst=BYTES        bytes in flight per bucket before pacing (default 1m)
 *   (k/m/g suffixes are powers of 1024: rate=100m is 100 MiB/s)
 */
#include "rmaw.h"

RMAW_ABI_V1()
RMAW_DEFINE_AREA(64)

#define MAX_PEERS 512
#define NCLASSES 2 /* 0 put, 1 get */

struct bucket {
  uint64_t planned, done;
};

static struct {
  int64_t rate, class_rate[NCLASSES], burst;
  int delay_ok;
  int32_t rank;
  uint64_t ops, delayed, capped, delay_total_ns, bytes[NCLASSES], max_delay_ns;
} st;

static struct bucket peer_b[MAX_PEERS + 1], class_b[MAX_PEERS + 1][NCLASSES];
static char cfg[512];
static const char *class_names[NCLASSES] = {"put", "get"};

RMAW_EXPORT(rmaw_init) int64_t rmaw_init(int64_t host_features) {
  int32_t len = RMAW_CONFIG_KEYS(cfg, {"rate", &st.rate, 0}, {"put_rate", &st.class_rate[0], 0},
                                      {"get_rate", &st.class_rate[1], 0}, {"burst", &st.burst, 1 << 20});
  if (len < 0) return len;
  if (st.rate < 0 || st.class_rate[0] < 0 || st.class_rate[1] < 0 || st.burst < 0) {
    rmaw_log(RMAW_LOG_WARN, "shaper: rates and burst must be >= 0");
    return RMAW_ERR_INVAL;
  }
  st.delay_ok = (host_features & RMAW_FEATURE_DELAY) != 0;
  if (!st.delay_ok) rmaw_log(RMAW_LOG_WARN, "shaper: the host does not offer FEATURE_DELAY: nothing is shaped");
  return (RMAW_FEATURE_PLAN_OP | RMAW_FEATURE_COMPLETIONS | RMAW_FEATURE_DELAY) & host_features;
}

RMAW_CTX_OPEN_RANK(st.rank)

static int class_of(int32_t kind) {
  switch (kind) {
  case RMAW_OP_PUT:
  case RMAW_OP_PUT_SIGNAL:
    return 0;
  case RMAW_OP_GET:
    return 1;
  }
  return -1;
}

/* The delay an op of size bytes needs through bucket b at rate r. */
static uint64_t need(const struct bucket *b, uint64_t size, int64_t r) {
  if (r <= 0) return 0;
  uint64_t level = b->planned - b->done + size;
  if (level <= (uint64_t)st.burst) return 0;
  uint64_t excess = level - (uint64_t)st.burst;
  /* excess * 1e9 / r without overflow for any excess below 2^64 / 1e9 */
  if (excess > (~(uint64_t)0) / 1000000000u) return ~(uint64_t)0;
  return excess * 1000000000u / (uint64_t)r;
}

RMAW_EXPORT(rmaw_plan_op) int32_t rmaw_plan_op(int32_t ctx, int32_t kind, int32_t peer, int64_t size,
                                               int32_t opt_flags, int32_t signal_op) {
  (void)ctx;
  (void)opt_flags;
  (void)signal_op;
  int c = class_of(kind);
  uint64_t sz = (uint64_t)size;
  uint32_t p = (uint32_t)peer < MAX_PEERS ? (uint32_t)peer : MAX_PEERS;
  st.ops++;
  if (c < 0 || sz == 0) return RMAW_OK;
  uint64_t d = need(&peer_b[p], sz, st.rate), d2 = need(&class_b[p][c], sz, st.class_rate[c]);
  if (d2 > d) d = d2;
  peer_b[p].planned += sz;
  class_b[p][c].planned += sz;
  st.bytes[c] += sz;
  if (d && st.delay_ok) {
    if (d > RMAW_MAX_DELAY_NS) {
      d = RMAW_MAX_DELAY_NS;
      st.capped++;
    }
    rmaw_area_ptr()->plan.delay_ns = d;
    st.delayed++;
    st.delay_total_ns += d;
    if (d > st.max_delay_ns) st.max_delay_ns = d;
  }
  return RMAW_OK;
}

RMAW_ON_COMPLETION(rec) {
  int c = class_of((int32_t)rec->kind);
  if (c < 0 || rec->size == 0) return;
  uint32_t p = rec->peer < MAX_PEERS ? rec->peer : MAX_PEERS;
  /* Never drain below what was planned (a hostile or duplicate record). */
  struct bucket *bs[2] = {&peer_b[p], &class_b[p][c]};
  for (int j = 0; j < 2; j++) {
    uint64_t room = bs[j]->planned - bs[j]->done;
    bs[j]->done += rec->size < room ? rec->size : room;
  }
}

RMAW_EXPORT(rmaw_ctx_close) int32_t rmaw_ctx_close(int32_t ctx) {
  (void)ctx;
  char line[320];
  struct rmaw_buf b = {line, 0, sizeof line};
  rmaw_buf_fmt(&b, "shaper: rank %d: %llu ops (", st.rank, st.ops);
  for (int c = 0; c < NCLASSES; c++)
    rmaw_buf_fmt(&b, "%s %llu bytes%s", class_names[c], st.bytes[c], c + 1 < NCLASSES ? ", " : "), delayed ");
  rmaw_buf_fmt(&b, "%llu by %llu us in all (longest %llu us, %llu at the 10 ms cap)", st.delayed,
               st.delay_total_ns / 1000, st.max_delay_ns / 1000, st.capped);
  rmaw_buf_fmt(&b, "; limits rate %lld put_rate %lld get_rate %lld B/s, burst %lld", st.rate, st.class_rate[0],
               st.class_rate[1], st.burst);
  rmaw_buf_log(RMAW_LOG_INFO, &b);
  return RMAW_OK;
}
