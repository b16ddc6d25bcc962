/* passthrough.c - the embedded default backend: the same policy as the
 * native backend (one device "wasm-tcp", default connection plan), decided
 * once; it never asks to be called per operation, so the data path pays
 * nothing for the sandbox. Rebuild with `make guests-embedded`. */
#include "rmaw.h"

RMAW_ABI_V1()
RMAW_DEFINE_AREA(0)

RMAW_EXPORT(rmaw_init) int64_t rmaw_init(int64_t host_features) {
  (void)host_features;
  return 0; /* no per-op planning, no completions */
}

RMAW_EXPORT(rmaw_devices) int32_t rmaw_devices(int32_t max) {
  struct rmaw_device *d = &rmaw_area_ptr()->devices[0];
  if (max < 1) return RMAW_ERR_INVAL;
  /* guestabi.DefaultDevice*; TestDefaultDeviceAgrees checks these. */
  rmaw_strlcpy(d->name, "wasm-tcp", sizeof d->name);
  d->speed_mbps = 40000;
  d->latency_us = 20.0f;
  return 1;
}

RMAW_EXPORT(rmaw_conn_plan) int32_t rmaw_conn_plan(int32_t nranks, int32_t rank) {
  (void)nranks;
  (void)rank;
  return RMAW_OK; /* keep the host's defaults */
}
