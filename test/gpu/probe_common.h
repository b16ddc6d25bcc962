// probe_common.h: what the GPU probes (agent_probe.cu, bus_probe.cu) share:
// CK, which ends the program with "<PROBE_TAG> FAIL file:line call: error"
// on a failed driver call, now_us, the host's monotonic clock in
// microseconds, and probe_context, the driver started and device 0's
// primary context made current. Define PROBE_TAG before including it.
#pragma once
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CK(x)                                                                      \
  do {                                                                             \
    CUresult r_ = (x);                                                             \
    if (r_ != CUDA_SUCCESS) {                                                      \
      const char* s_ = "?";                                                        \
      cuGetErrorString(r_, &s_);                                                   \
      fprintf(stderr, PROBE_TAG " FAIL %s:%d %s: %s\n", __FILE__, __LINE__, #x, s_); \
      exit(1);                                                                     \
    }                                                                              \
  } while (0)

static inline double now_us() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static inline void probe_context() {
  CK(cuInit(0));
  CUdevice d;
  CK(cuDeviceGet(&d, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, d));
  CK(cuCtxSetCurrent(ctx));
}
