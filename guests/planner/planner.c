/* planner.c - a per-operation planning backend: lane by size, completion
 * counters, and fault injection driven by the configuration string. Used by
 * the benchmarks and sandbox tests.
 *
 * Configuration (NCCL_RMA_WASM_CONFIG or planner.conf), comma separated:
 *   lanes=N        lanes per peer (1..8, default 4)
 *   stripe=BYTES   ops at least this large go round-robin over all lanes
 *                  (default 64k); smaller ones stay on lane peer % lanes
 *   fail_every=N   fail every Nth op with ncclInvalidArgument (0 = never)
 *   trap_every=N   trap (unreachable) in every Nth plan_op (0 = never)
 *   oob_every=N    load from outside linear memory in every Nth plan_op
 *   hang=1         never return from rmaw_init;  hang=2: from rmaw_plan_op
 *   bad_lane=N     answer lane 1000 in every Nth plan_op (nonsense)
 *   completions=0  do not ask for completion batches
 */
#include "rmaw.h"

RMAW_ABI_V1()
RMAW_DEFINE_AREA(64)

static struct {
  int64_t lanes, stripe, fail_every, trap_every, oob_every, hang, bad_lane, completions;
  uint64_t ops, rr, done, done_bytes, done_errors, latency_ns;
} st;

static char cfg[512];
static volatile uint32_t spin;

static void log_kv(const char *what, uint64_t v) {
  char line[96];
  uint32_t n = 0;
  for (const char *p = what; *p && n < 60; p++) line[n++] = *p;
  n += rmaw_utoa(v, line + n);
  rmaw_log_raw(RMAW_LOG_INFO, line, n);
}

RMAW_EXPORT(rmaw_init) int64_t rmaw_init(int64_t host_features) {
  int32_t len = RMAW_CONFIG_KEYS(cfg, {"lanes", &st.lanes, 4}, {"stripe", &st.stripe, 64 << 10},
                                      {"fail_every", &st.fail_every, 0}, {"trap_every", &st.trap_every, 0},
                                      {"oob_every", &st.oob_every, 0}, {"hang", &st.hang, 0},
                                      {"bad_lane", &st.bad_lane, 0}, {"completions", &st.completions, 1});
  if (len < 0) return len;
  if (st.lanes < 1 || st.lanes > RMAW_MAX_LANES) {
    rmaw_log(RMAW_LOG_WARN, "planner: lanes must be 1..8");
    return RMAW_ERR_INVAL;
  }
  while (st.hang == 1) spin++;
  int64_t want = RMAW_FEATURE_PLAN_OP | (st.completions ? RMAW_FEATURE_COMPLETIONS : 0);
  return want & host_features;
}

RMAW_CONN_PLAN_LANES(st.lanes, st.stripe)

static int every(int64_t n, uint64_t i) { return n > 0 && i % (uint64_t)n == 0; }

RMAW_EXPORT(rmaw_plan_op) int32_t rmaw_plan_op(int32_t ctx, int32_t kind, int32_t peer, int64_t size,
                                               int32_t opt_flags, int32_t signal_op) {
  (void)ctx;
  (void)kind;
  (void)opt_flags;
  (void)signal_op;
  uint64_t i = ++st.ops;
  struct rmaw_plan *p = &rmaw_area_ptr()->plan;
  if (every(st.trap_every, i)) __builtin_trap();
  if (every(st.oob_every, i)) return (int32_t)*(volatile uint32_t *)(uintptr_t)0xfffffff0u;
  while (st.hang == 2) spin++;
  if (every(st.fail_every, i)) return RMAW_NCCL_INVALID_ARGUMENT;
  if (every(st.bad_lane, i)) {
    p->lane = 1000;
    return RMAW_OK;
  }
  if (size >= st.stripe) p->lane = (int32_t)(st.rr++ % (uint64_t)st.lanes);
  else p->lane = (int32_t)((uint32_t)peer % (uint64_t)st.lanes);
  return RMAW_OK;
}

RMAW_ON_COMPLETION(c) {
  st.done++;
  st.done_bytes += c->size;
  st.latency_ns += c->latency_ns;
  if (c->status) st.done_errors++;
}

RMAW_EXPORT(rmaw_ctx_close) int32_t rmaw_ctx_close(int32_t ctx) {
  (void)ctx;
  log_kv("planner: ops planned ", st.ops);
  log_kv("planner: completions ", st.done);
  log_kv("planner: completed bytes ", st.done_bytes);
  log_kv("planner: failed ops ", st.done_errors);
  return RMAW_OK;
}
