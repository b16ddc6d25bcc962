/* telemetry.c - per-peer operation and byte counters and latency histograms,
 * built from the host's completion records, exported as Prometheus text
 * through rmaw_metrics (the host writes NCCL_RMA_WASM_METRICS_FILE and
 * serves NCCL_RMA_WASM_METRICS_ADDR) and summarised in NCCL's log when the
 * context's instance is finalized. It plans nothing: the data path runs as
 * with the default backend, plus one guest call per completion batch.
 *
 * Peers 0..TELEMETRY_PEERS-1 are counted one by one; higher ranks share the
 * series peer="other". No configuration. README: guests/telemetry/README.md.
 */
#include "rmaw.h"

RMAW_ABI_V1()
RMAW_DEFINE_AREA(256)

#define TELEMETRY_PEERS 64
#define NBUCKETS 11 /* 1 us * 4^i, i = 0..10 (1 us .. 1.05 s), then +Inf */
#define NKINDS 4

struct peer_stats {
  uint64_t ops[NKINDS], bytes[NKINDS], errors, count, sum_ns;
  uint64_t hist[NBUCKETS + 1]; /* not cumulative; the last is +Inf */
};

static struct peer_stats peers[TELEMETRY_PEERS + 1]; /* the last: peer="other" */
static uint64_t all_hist[NBUCKETS + 1], all_ops, all_bytes, all_errors, unknown_kind;
static int32_t my_rank = -1, my_ctx = -1;

static const char *kind_names[NKINDS] = {"put", "putSignal", "get", "flush"};

RMAW_EXPORT(rmaw_init) int64_t rmaw_init(int64_t host_features) {
  return RMAW_FEATURE_COMPLETIONS & host_features;
}

RMAW_EXPORT(rmaw_ctx_open) int32_t rmaw_ctx_open(int32_t ctx, int64_t comm, int32_t nranks, int32_t rank, int32_t n) {
  (void)comm;
  (void)nranks;
  (void)n;
  my_rank = rank;
  my_ctx = ctx;
  return RMAW_OK;
}

static uint32_t bucket(uint64_t ns) {
  uint64_t le = 1000;
  for (uint32_t i = 0; i < NBUCKETS; i++, le *= 4)
    if (ns <= le) return i;
  return NBUCKETS;
}

RMAW_ON_COMPLETION(c) {
  struct peer_stats *p = &peers[c->peer < TELEMETRY_PEERS ? c->peer : TELEMETRY_PEERS];
  uint32_t b = bucket(c->latency_ns);
  if (c->kind >= 1 && c->kind <= NKINDS) {
    p->ops[c->kind - 1]++;
    p->bytes[c->kind - 1] += c->size;
  } else {
    unknown_kind++;
  }
  if (c->status) {
    p->errors++;
    all_errors++;
  }
  p->count++;
  p->sum_ns += c->latency_ns;
  p->hist[b]++;
  all_hist[b]++;
  all_ops++;
  all_bytes += c->size;
}

/* ---- text ---- */

static char out[192 << 10];
static uint32_t out_len;
static int out_full;

static void put_str(const char *s) {
  uint32_t n = rmaw_strlen(s);
  if (out_full || out_len + n > sizeof out) {
    out_full = 1;
    return;
  }
  for (uint32_t i = 0; i < n; i++) out[out_len++] = s[i];
}

static void put_u64(uint64_t v) {
  char buf[24];
  rmaw_utoa(v, buf);
  put_str(buf);
}

/* ns as seconds with 9 decimals. */
static void put_seconds(uint64_t ns) {
  char frac[10];
  uint64_t f = ns % 1000000000u;
  put_u64(ns / 1000000000u);
  for (int i = 8; i >= 0; i--) {
    frac[i] = (char)('0' + f % 10);
    f /= 10;
  }
  frac[9] = 0;
  put_str(".");
  put_str(frac);
}

static void put_peer(uint32_t i) {
  put_str("{peer=\"");
  if (i == TELEMETRY_PEERS) put_str("other");
  else put_u64(i);
  put_str("\"");
}

static void counter_family(const char *name, const char *help, int bytes) {
  put_str("# HELP ");
  put_str(name);
  put_str(help);
  put_str("# TYPE ");
  put_str(name);
  put_str(" counter\n");
  for (uint32_t i = 0; i <= TELEMETRY_PEERS; i++) {
    if (!peers[i].count) continue;
    for (uint32_t k = 0; k < NKINDS; k++) {
      put_str(name);
      put_peer(i);
      put_str(",kind=\"");
      put_str(kind_names[k]);
      put_str("\"} ");
      put_u64(bytes ? peers[i].bytes[k] : peers[i].ops[k]);
      put_str("\n");
    }
  }
}

RMAW_EXPORT(rmaw_metrics) int64_t rmaw_metrics(void) {
  out_len = 0;
  out_full = 0;
  counter_family("rmaw_ops_total", " Operations completed, by peer and kind.\n", 0);
  counter_family("rmaw_bytes_total", " Payload bytes of completed operations, by peer and kind.\n", 1);
  put_str("# HELP rmaw_op_errors_total Operations that completed with an error, by peer.\n");
  put_str("# TYPE rmaw_op_errors_total counter\n");
  for (uint32_t i = 0; i <= TELEMETRY_PEERS; i++) {
    if (!peers[i].count) continue;
    put_str("rmaw_op_errors_total");
    put_peer(i);
    put_str("} ");
    put_u64(peers[i].errors);
    put_str("\n");
  }
  put_str("# HELP rmaw_op_latency_seconds Time from issue to completion (the host's clock), by peer.\n");
  put_str("# TYPE rmaw_op_latency_seconds histogram\n");
  for (uint32_t i = 0; i <= TELEMETRY_PEERS; i++) {
    struct peer_stats *p = &peers[i];
    if (!p->count) continue;
    uint64_t cum = 0, le = 1000;
    for (uint32_t b = 0; b <= NBUCKETS; b++, le *= 4) {
      cum += p->hist[b];
      put_str("rmaw_op_latency_seconds_bucket");
      put_peer(i);
      put_str(",le=\"");
      if (b == NBUCKETS) put_str("+Inf");
      else put_seconds(le);
      put_str("\"} ");
      put_u64(cum);
      put_str("\n");
    }
    put_str("rmaw_op_latency_seconds_sum");
    put_peer(i);
    put_str("} ");
    put_seconds(p->sum_ns);
    put_str("\nrmaw_op_latency_seconds_count");
    put_peer(i);
    put_str("} ");
    put_u64(p->count);
    put_str("\n");
  }
  /* out_full: a line may be cut; drop back to the last complete line. */
  if (out_full)
    while (out_len > 0 && out[out_len - 1] != '\n') out_len--;
  return ((int64_t)(uint32_t)(uintptr_t)out << 32) | out_len;
}

/* The bucket bound (in us) below which a fraction q/100 of ops completed. */
static uint64_t percentile_us(uint32_t q) {
  uint64_t want = (all_ops * q + 99) / 100, cum = 0, le = 1;
  for (uint32_t b = 0; b < NBUCKETS; b++, le *= 4) {
    cum += all_hist[b];
    if (cum >= want) return le;
  }
  return 0; /* above the last bound */
}

RMAW_EXPORT(rmaw_finalize) int32_t rmaw_finalize(void) {
  if (!all_ops) return RMAW_OK; /* the control instance, or an idle context */
  out_len = 0;
  out_full = 0;
  uint32_t npeers = 0;
  for (uint32_t i = 0; i <= TELEMETRY_PEERS; i++) npeers += peers[i].count != 0;
  put_str("telemetry: rank ");
  put_u64((uint64_t)(uint32_t)my_rank);
  put_str(" ctx ");
  put_u64((uint64_t)(uint32_t)my_ctx);
  put_str(": ");
  put_u64(all_ops);
  put_str(" ops (");
  for (uint32_t k = 0; k < NKINDS; k++) {
    uint64_t n = 0;
    for (uint32_t i = 0; i <= TELEMETRY_PEERS; i++) n += peers[i].ops[k];
    put_str(kind_names[k]);
    put_str(" ");
    put_u64(n);
    put_str(k + 1 < NKINDS ? ", " : "), ");
  }
  put_u64(all_bytes);
  put_str(" bytes, ");
  put_u64(all_errors);
  put_str(" errors, ");
  put_u64(npeers);
  put_str(" peers, latency p50 <= ");
  put_u64(percentile_us(50));
  put_str(" us, p99 <= ");
  uint64_t p99 = percentile_us(99);
  if (p99) put_u64(p99);
  else put_str("(over 1 s)");
  put_str(" us");
  rmaw_log_raw(RMAW_LOG_INFO, out, out_len);
  return RMAW_OK;
}
