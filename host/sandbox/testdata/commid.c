/* commid.c - a test backend that checks the communicator id it is handed.
 * rmaw_ctx_open records comm_id; every planned operation then succeeds only
 * if it equals the config's comm=<decimal>, and fails with ncclRemoteError
 * (6) otherwise, so a host that loses the id fails the test's operations. */
#include "rmaw.h"

RMAW_ABI_V1()
RMAW_DEFINE_AREA(0)

static int64_t want = -1, seen = -2;

RMAW_EXPORT(rmaw_init) int64_t rmaw_init(int64_t host_features) {
  char cfg[64];
  int32_t len = rmaw_get_config(cfg, sizeof cfg);
  if (len < 0) return len;
  want = rmaw_config_int(cfg, (uint32_t)len, "comm", -1);
  return host_features & RMAW_FEATURE_PLAN_OP;
}

RMAW_EXPORT(rmaw_ctx_open) int32_t rmaw_ctx_open(int32_t ctx, int64_t comm_id, int32_t nranks, int32_t rank,
                                                 int32_t ncontexts) {
  (void)ctx, (void)nranks, (void)rank, (void)ncontexts;
  seen = comm_id;
  return RMAW_OK;
}

RMAW_EXPORT(rmaw_plan_op) int32_t rmaw_plan_op(int32_t ctx, int32_t kind, int32_t peer, int64_t size,
                                               int32_t opt_flags, int32_t signal_op) {
  (void)ctx, (void)kind, (void)peer, (void)size, (void)opt_flags, (void)signal_op;
  return seen == want ? 0 : 6;
}
