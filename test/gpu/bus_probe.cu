// bus_probe: how long a host write takes to be seen by a polling kernel and
// answered, by itself, so that the device agent's round trip (agent_probe)
// can be set against the bus. The host stores a number into a pinned word
// (release) and spins until a second pinned word echoes it; the kernel
// polls the first word and writes the second. Modes:
//
//   0 floor       thread 0: relaxed loads, a relaxed store
//   1 fenced      thread 0: acquire loads, fence.sc.sys, then the store (the
//                 agent's publish)
//   2 two-trip    thread 0: relaxed loads, then one more load of another
//                 pinned word before the store (the agent's second read of
//                 a slot)
//   3 warps       W warps poll at once, their starts staggered; the first to
//                 see a number echoes it
//   4 in flight   thread 0 keeps K loads in flight, issued a stagger apart
//
// Each mode runs with the host answering at once and with a random pause of
// 0-3 us before each store (so the store lands at a random point of the
// kernel's poll). Medians (p10, p90) of ITERS, in microseconds. Built and
// run by test/gpu/bus_probe.sh on a GPU machine (nvcc, -lcuda).
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <algorithm>
#include <vector>

#define PROBE_TAG "BUS"
#include "probe_common.h"

typedef unsigned long long u64;

__device__ __forceinline__ u64 ldr(const u64* p) {
  u64 v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ u64 lda(const u64* p) {
  u64 v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void str(u64* p, u64 v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ u64 gtime() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void until(u64 t) {
  while (gtime() < t) {
  }
}

// pong: a is the host's word, b the echo, c another pinned word (mode 2).
// The kernel ends once it saw a number of at least n.
extern "C" __global__ void pong(u64* a, u64* b, u64* c, int mode, u64 n, int warps, u64 stagger) {
  __shared__ u64 last;
  int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid == 0) last = 0;
  __syncthreads();
  if (mode <= 2 || mode == 4) {
    if (tid != 0) return;
    u64 want = 1;
    if (mode == 4) {
      // K loads in flight, stagger apart: each check waits only for the
      // oldest, and the next is issued right after it.
      const int K = 4;
      u64 v[K];
      for (int k = 0; k < K; k++) {
        v[k] = ldr(a);
        until(gtime() + stagger);
      }
      for (;;) {
        for (int k = 0; k < K; k++) {
          u64 x = v[k];
          v[k] = ldr(a);
          if (x >= want) {
            str(b, x);
            want = x + 1;
            if (x >= n) return;
          }
        }
      }
    }
    for (;;) {
      u64 x = mode == 1 ? lda(a) : ldr(a);
      if (x < want) continue;
      if (mode == 1) asm volatile("fence.sc.sys;" ::: "memory");
      if (mode == 2) x += ldr(c);  // c holds 0: a second trip before the answer
      str(b, x);
      want = x + 1;
      if (x >= n) return;
    }
  }
  // mode 3: lane 0 of each of the first `warps` warps polls.
  if (lane != 0 || warp >= warps) return;
  until(gtime() + (u64)warp * stagger);
  u64 want = 1;
  for (;;) {
    u64 x = ldr(a);
    if (x < want) continue;
    want = x + 1;
    if (atomicMax(&last, x) < x) str(b, x);
    if (x >= n) return;
  }
}

int main(int argc, char** argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 2000;
  probe_context();
  void* hp;
  CK(cuMemHostAlloc(&hp, 3 * 4096, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  volatile u64* a = (volatile u64*)hp;
  volatile u64* b = (volatile u64*)((char*)hp + 4096);
  volatile u64* c = (volatile u64*)((char*)hp + 8192);
  CUdeviceptr dp;
  CK(cuMemHostGetDevicePointer(&dp, hp, 0));
  CUstream st;
  CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  struct {
    const char* name;
    int mode, warps;
    u64 stagger;
  } runs[] = {
      {"floor", 0, 1, 0},           {"fenced", 1, 1, 0},          {"two-trip", 2, 1, 0},
      {"warps 2 /500ns", 3, 2, 500}, {"warps 4 /250ns", 3, 4, 250}, {"warps 4 /400ns", 3, 4, 400},
      {"in flight 4 /250ns", 4, 1, 250}, {"in flight 4 /400ns", 4, 1, 400},
  };
  srand(1);
  for (auto& r : runs) {
    for (int pause = 0; pause < 2; pause++) {
      *a = 0, *b = 0, *c = 0;
      u64 n = (u64)iters + 100;
      int mode = r.mode, warps = r.warps;
      u64 stagger = r.stagger;
      u64 da = dp, db = dp + 4096, dc = dp + 8192;
      pong<<<1, 128, 0, (cudaStream_t)st>>>((u64*)da, (u64*)db, (u64*)dc, mode, n, warps, stagger);
      std::vector<double> v;
      bool ok = true;
      for (u64 i = 1; i <= n && ok; i++) {
        if (pause) {
          double until = now_us() + (rand() % 3000) / 1000.0;
          while (now_us() < until) {
          }
        }
        double t0 = now_us();
        __atomic_store_n((u64*)a, i, __ATOMIC_RELEASE);
        while (__atomic_load_n((u64*)b, __ATOMIC_ACQUIRE) < i)
          if (now_us() - t0 > 2e6) {
            printf("BUS FAIL %s: no echo of %llu\n", r.name, i);
            ok = false;
            break;
          }
        if (i > 100) v.push_back(now_us() - t0);
      }
      if (!ok) return 1;
      CK(cuStreamSynchronize(st));
      std::sort(v.begin(), v.end());
      size_t k = v.size();
      printf("BUS %-20s %-8s p50 %6.2f us  p10 %6.2f  p90 %6.2f  (n=%zu)\n", r.name, pause ? "paused" : "at once",
             v[k / 2], v[k / 10], v[k * 9 / 10], k);
    }
  }
  printf("BUS done\n");
  return 0;
}
