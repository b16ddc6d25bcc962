/* careless.c - a backend with the mistakes the conformance kit exists to
 * catch, each switched on by the configuration string (tests only):
 *   kinds=1     trap on an op kind it does not know
 *   ctxs=1      keep per-context state in a 16-entry table indexed by ctx
 *   chatty=1    log on every plan_op
 *   batch=1     trap on a completion batch larger than 8
 *   status=1    fail rmaw_ctx_close with a status
 *   metrics=1   answer rmaw_metrics with a label of the host's (rank)
 */
#include "rmaw.h"

RMAW_ABI_V1()
RMAW_DEFINE_AREA(64)

static int64_t kinds, ctxs, chatty, batch, status, metrics;
static uint32_t per_ctx[16];

RMAW_EXPORT(rmaw_init) int64_t rmaw_init(int64_t host_features) {
  static char cfg[128];
  int32_t len = rmaw_get_config(cfg, sizeof cfg);
  if (len > (int32_t)sizeof cfg) len = sizeof cfg;
  kinds = rmaw_config_int(cfg, (uint32_t)len, "kinds", 0);
  ctxs = rmaw_config_int(cfg, (uint32_t)len, "ctxs", 0);
  chatty = rmaw_config_int(cfg, (uint32_t)len, "chatty", 0);
  batch = rmaw_config_int(cfg, (uint32_t)len, "batch", 0);
  status = rmaw_config_int(cfg, (uint32_t)len, "status", 0);
  metrics = rmaw_config_int(cfg, (uint32_t)len, "metrics", 0);
  return (RMAW_FEATURE_PLAN_OP | RMAW_FEATURE_COMPLETIONS) & host_features;
}

RMAW_EXPORT(rmaw_ctx_open) int32_t rmaw_ctx_open(int32_t ctx, int64_t comm, int32_t nranks, int32_t rank, int32_t n) {
  (void)comm; (void)nranks; (void)rank; (void)n;
  if (ctxs && (uint32_t)ctx >= 16) __builtin_trap();
  per_ctx[(uint32_t)ctx % 16] = 0;
  return RMAW_OK;
}

RMAW_EXPORT(rmaw_plan_op) int32_t rmaw_plan_op(int32_t ctx, int32_t kind, int32_t peer, int64_t size,
                                               int32_t opt_flags, int32_t signal_op) {
  (void)ctx; (void)peer; (void)size; (void)opt_flags; (void)signal_op;
  if (kinds && (kind < 1 || kind > 4)) __builtin_trap();
  if (chatty) rmaw_log(RMAW_LOG_INFO, "careless: planning an op");
  return RMAW_OK;
}

RMAW_EXPORT(rmaw_completions) int32_t rmaw_completions(int32_t ctx, int32_t n) {
  (void)ctx;
  if (batch && n > 8) __builtin_trap();
  return RMAW_OK;
}

RMAW_EXPORT(rmaw_ctx_close) int32_t rmaw_ctx_close(int32_t ctx) {
  (void)ctx;
  return status ? RMAW_ERR_INTERNAL : RMAW_OK;
}

static const char good[] = "# TYPE careless_ops_total counter\ncareless_ops_total 1\n";
static const char bad[] = "careless_ops_total{rank=\"0\"} 1\n";

RMAW_EXPORT(rmaw_metrics) int64_t rmaw_metrics(void) {
  const char *t = metrics ? bad : good;
  uint32_t n = metrics ? sizeof bad - 1 : sizeof good - 1;
  return ((int64_t)(uint32_t)(uintptr_t)t << 32) | n;
}
