/* plan11.c - a Guest ABI v1.1 planner for tests and the benchmark: it
 * enables the v1.1 features its configuration asks for and sets the plan's
 * v1.1 fields from it. With an empty configuration it behaves like a v1
 * guest that plans nothing.
 *
 * Configuration (NCCL_RMA_WASM_CONFIG or plan11.conf), comma separated:
 *   lanes=N          lanes per peer (1..8, default: the host's)
 *   codec=ID         conn.codec: 0 none, 1 S2, 2 zstd (enables compression)
 *   level=L          its level
 *   op_codec=ID      plan.codec for ops of at least op_min bytes (per op)
 *   op_level=L       its level
 *   op_min=BYTES     (default 0)
 *   chunk=BYTES      plan.chunk_size of every op (enables FEATURE_CHUNK)
 *   delay=NS         plan.delay_ns of every op (enables FEATURE_DELAY)
 *   transport=T      conn.transport (3 enables FEATURE_TRANSPORTS)
 *   plan=1           plan every op even without the keys above
 *   batch=1          plan aggregated ops in batches (rmaw_plan_ops)
 *   batch_status=N   answer status N in every batch record (tests)
 */
#include "rmaw.h"

RMAW_ABI_V1()
RMAW_DEFINE_AREA(128) /* room for 64 batch records */

static struct {
  int64_t lanes, codec, level, op_codec, op_level, op_min, chunk, delay, transport, plan, batch, batch_status;
  uint64_t ops;
} st;
static char cfg[512];

RMAW_EXPORT(rmaw_init) int64_t rmaw_init(int64_t host_features) {
  int32_t len = RMAW_CONFIG_KEYS(cfg, {"lanes", &st.lanes, 0}, {"codec", &st.codec, -1}, {"level", &st.level, 0},
                                      {"op_codec", &st.op_codec, -1}, {"op_level", &st.op_level, 0},
                                      {"op_min", &st.op_min, 0}, {"chunk", &st.chunk, -1}, {"delay", &st.delay, -1},
                                      {"transport", &st.transport, -1}, {"plan", &st.plan, 0}, {"batch", &st.batch, 0},
                                      {"batch_status", &st.batch_status, 0});
  if (len < 0) return len;
  int64_t want = 0;
  if (st.codec >= 0 || st.op_codec >= 0) want |= RMAW_FEATURE_COMPRESSION;
  if (st.op_codec >= 0 || st.chunk >= 0 || st.delay >= 0 || st.plan) want |= RMAW_FEATURE_PLAN_OP;
  if (st.chunk >= 0) want |= RMAW_FEATURE_CHUNK;
  if (st.delay >= 0) want |= RMAW_FEATURE_DELAY;
  if (st.transport == RMAW_TRANSPORT_FABRIC) want |= RMAW_FEATURE_TRANSPORTS;
  if (st.batch) want |= RMAW_FEATURE_PLAN_BATCH | RMAW_FEATURE_PLAN_OP;
  return want & host_features; /* a v1 host offers bits 0..1 only */
}

RMAW_EXPORT(rmaw_conn_plan) int32_t rmaw_conn_plan(int32_t nranks, int32_t rank) {
  (void)nranks;
  (void)rank;
  struct rmaw_conn_plan *c = &rmaw_area_ptr()->conn;
  if (st.lanes > 0) c->lanes = (int32_t)st.lanes;
  if (st.codec >= 0) c->codec = RMAW_CODEC(st.codec, st.level);
  if (st.transport >= 0) c->transport = (int32_t)st.transport;
  return RMAW_OK;
}

static void plan(struct rmaw_plan *p, int64_t size) {
  st.ops++;
  if (st.op_codec >= 0 && size >= st.op_min) p->codec = RMAW_CODEC(st.op_codec, st.op_level);
  if (st.chunk >= 0) p->chunk_size = (uint64_t)st.chunk;
  if (st.delay >= 0) p->delay_ns = (uint64_t)st.delay;
}

RMAW_EXPORT(rmaw_plan_op) int32_t rmaw_plan_op(int32_t ctx, int32_t kind, int32_t peer, int64_t size,
                                               int32_t opt_flags, int32_t signal_op) {
  (void)ctx;
  (void)kind;
  (void)peer;
  (void)opt_flags;
  (void)signal_op;
  plan(&rmaw_area_ptr()->plan, size);
  return RMAW_OK;
}

RMAW_EXPORT(rmaw_plan_ops) int32_t rmaw_plan_ops(int32_t ctx, int32_t n) {
  (void)ctx;
  struct rmaw_plan_rec *r = rmaw_plan_recs();
  if (n < 0 || (uint32_t)n * sizeof *r > rmaw_area_ptr()->comp_cap * sizeof(struct rmaw_completion)) return RMAW_ERR_INVAL;
  for (int32_t i = 0; i < n; i++) {
    plan(&r[i].plan, (int64_t)r[i].size);
    r[i].status = (int32_t)st.batch_status;
  }
  return RMAW_OK;
}

RMAW_EXPORT(rmaw_ctx_close) int32_t rmaw_ctx_close(int32_t ctx) {
  char line[64] = "plan11: ops planned ";
  uint32_t k = rmaw_strlen(line);
  (void)ctx;
  k += rmaw_utoa(st.ops, line + k);
  rmaw_log_raw(RMAW_LOG_INFO, line, k);
  return RMAW_OK;
}
