// gin_pingpong: GPU-initiated ping-pong through NCCL's device API (GIN), for
// a machine with an NVIDIA GPU: the one-way time of a small put+signal from
// one rank's kernel to the kernel of another that waits for it.
// test/gpu/nccl_gin_check.sh builds it against a source-built NCCL and runs
// it with mpirun as two ranks on one GPU posing as two hosts, so every put
// and signal goes through NCCL's GIN proxy and our plugin.
//
//   gin_pingpong BYTES ROUNDS
//
// One kernel per rank runs ROUNDS round trips: rank 0 puts BYTES with a
// signal increment to rank 1 and waits for the reply; rank 1 waits for the
// put, checks its first and last byte, and puts its reply the same way.
// Round i uses slot i of the windows, so a late or lost put cannot hide
// behind the next; every byte of every slot is checked at the end, and a
// signal seen before its bytes fails the run. A first kernel of WARMUP
// rounds (default 20) is not timed. Prints "GINPP bytes=.. rounds=..
// us_one_way=.." (the timed kernel's time over 2 x ROUNDS) and "GINPP PASS",
// or "GINPP FAIL <why>".
//
// With GINPP_TRACE=<prefix>, thread 0 also stamps each timed round's put
// and the moment its wait saw the peer's signal (%globaltimer), and the
// rank calibrates that clock against the host's realtime clock (a kernel
// and the host answering each other through pinned memory), writing both
// to <prefix>.rank<r>.kernel: with the plugin's own trace
// (NCCL_RMA_WASM_PROFILE_TRACE=<prefix>), test/gpu/hoptrace sets the
// plugin's points of each hop between the two kernels' stamps. With
// GINPP_SIGNAL=1 each round is a signal alone (a GIN barrier's hop), no
// payload: only the signals are checked.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <nccl_device.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <vector>

#define FAIL_TAG "GINPP"
#include "nccl_check.h"

enum { THREADS = 32 };

// The byte that rank `from` sends at position i of round r.
__host__ __device__ static inline uint8_t pat(int from, int r, size_t i) {
  return (uint8_t)(from * 101 + r * 13 + i * 7 + (i >> 8) + 1);
}

// pingpong runs rounds [first, first+n): thread 0 puts and checks (with
// volatile loads, after the signal's acquire), the CTA waits for the
// signal together. *early counts signals seen before their bytes.
__device__ static inline uint64_t gtime() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void pingpong(ncclWindow_t sendwin, ncclWindow_t recvwin, const volatile uint8_t* recv, size_t bytes, int first,
                         int n, ncclDevComm dc, unsigned* early, uint64_t* stamps, bool sigOnly) {
  ncclGin gin{dc, 0};
  const unsigned sig = 0;
  uint64_t base = gin.readSignal(sig);
  ncclGinBarrierSession<ncclCoopCta> bar{ncclCoopCta(), gin, ncclTeamTagWorld(), 0};
  // Nobody puts before both read their signal's starting value.
  bar.sync(ncclCoopCta(), cuda::memory_order_acquire, ncclGinFenceLevel::None);
  int peer = dc.rank ^ 1;
  for (int k = 0; k < n; k++) {
    size_t slot = (size_t)(first + k) * bytes;
    if (dc.rank == 1) {
      gin.waitSignal(ncclCoopCta(), sig, base + k + 1);
      if (stamps && threadIdx.x == 0) stamps[2 * k + 1] = gtime();
      if (!sigOnly && threadIdx.x == 0 &&
          (recv[slot] != pat(0, first + k, 0) || recv[slot + bytes - 1] != pat(0, first + k, bytes - 1)))
        atomicAdd(early, 1u);
    }
    if (stamps && threadIdx.x == 0) stamps[2 * k] = gtime();
    if (threadIdx.x == 0 && sigOnly) gin.signal(ncclTeamWorld(dc), peer, ncclGin_StrongSignalInc{sig});
    else if (threadIdx.x == 0)
      gin.put(ncclTeamWorld(dc), peer, recvwin, slot, sendwin, slot, bytes, ncclGin_StrongSignalInc{sig});
    if (dc.rank == 0) {
      gin.waitSignal(ncclCoopCta(), sig, base + k + 1);
      if (stamps && threadIdx.x == 0) stamps[2 * k + 1] = gtime();
      if (!sigOnly && threadIdx.x == 0 &&
          (recv[slot] != pat(1, first + k, 0) || recv[slot + bytes - 1] != pat(1, first + k, bytes - 1)))
        atomicAdd(early, 1u);
    }
  }
  gin.flush(ncclCoopCta());
  bar.sync(ncclCoopCta(), cuda::memory_order_release, ncclGinFenceLevel::None);
}

// clockpong: n exchanges with the host through pinned memory h: the kernel
// stamps g0 and publishes it with the exchange's number, the host answers
// with its realtime, the kernel stamps g1 once it sees the answer. The host
// time lies between g0 and g1 on the device's clock (plus the offset).
__global__ void clockpong(volatile uint64_t* h, uint64_t* out, int n) {
  for (int i = 0; i < n; i++) {
    uint64_t g0 = gtime();
    h[0] = g0;
    __threadfence_system();
    h[1] = i + 1;
    while (h[2] != (uint64_t)(i + 1)) {
    }
    uint64_t g1 = gtime();
    out[2 * i] = g0, out[2 * i + 1] = g1;
  }
}

static uint64_t realtimeNs() {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

// calibrate returns the offset o with realtime = globaltimer + o, from the
// narrowest tenth of 2,000 exchanges (the median of their midpoints), and
// the width of those exchanges (the bound on its error) in *width.
static int64_t calibrate(cudaStream_t s, int64_t* width) {
  const int n = 2000;
  uint64_t* h;
  CUDA(cudaHostAlloc((void**)&h, 4096, cudaHostAllocMapped | cudaHostAllocPortable));
  memset(h, 0, 4096);
  uint64_t* hd;
  CUDA(cudaHostGetDevicePointer((void**)&hd, h, 0));
  uint64_t* out;
  CUDA(cudaMalloc((void**)&out, 2 * n * sizeof(uint64_t)));
  clockpong<<<1, 1, 0, s>>>(hd, out, n);
  std::vector<uint64_t> host(n);
  for (int i = 0; i < n; i++) {
    while (__atomic_load_n(&h[1], __ATOMIC_ACQUIRE) != (uint64_t)(i + 1)) {
    }
    host[i] = realtimeNs();
    __atomic_store_n(&h[2], (uint64_t)(i + 1), __ATOMIC_RELEASE);
  }
  CUDA(cudaStreamSynchronize(s));
  std::vector<uint64_t> g(2 * n);
  CUDA(cudaMemcpy(g.data(), out, g.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  CUDA(cudaFree(out));
  CUDA(cudaFreeHost(h));
  std::vector<std::pair<int64_t, int64_t>> ex;  // (width, offset)
  for (int i = 0; i < n; i++)
    ex.push_back({(int64_t)(g[2 * i + 1] - g[2 * i]), (int64_t)host[i] - (int64_t)(g[2 * i] + (g[2 * i + 1] - g[2 * i]) / 2)});
  std::sort(ex.begin(), ex.end());
  std::vector<int64_t> off;
  for (int i = 0; i < n / 10; i++) off.push_back(ex[i].second);
  std::sort(off.begin(), off.end());
  *width = ex[n / 20].first;
  return off[off.size() / 2];
}

__global__ void fill(uint8_t* p, int from, size_t bytes, int rounds) {
  size_t total = (size_t)rounds * bytes;
  for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < total; k += (size_t)gridDim.x * blockDim.x)
    p[k] = pat(from, (int)(k / bytes), k % bytes);
}

int main(int argc, char** argv) {
  int nranks = startRank(&argc, &argv);
  size_t bytes = argc > 1 ? strtoull(argv[1], NULL, 0) : 8;
  int rounds = argc > 2 ? atoi(argv[2]) : 1000;
  int warm = getenv("WARMUP") ? atoi(getenv("WARMUP")) : 20;
  if (bytes == 0 || rounds <= 0 || warm < 0) FAIL("usage: gin_pingpong BYTES ROUNDS");
  if (nranks != 2) FAIL("needs 2 ranks, got %d", nranks);
  ncclComm_t comm = openComm(nranks);
  requireGin(comm);

  int all = warm + rounds;
  size_t total = (size_t)all * bytes;
  void *send, *recv;
  ncclWindow_t sendwin, recvwin;
  openWindows(comm, total, &send, &sendwin, &recv, &recvwin);
  cudaStream_t s;
  CUDA(cudaStreamCreate(&s));
  fill<<<64, 256, 0, s>>>((uint8_t*)send, rank_, bytes, all);
  CUDA(cudaMemsetAsync(recv, 0, total, s));
  unsigned* early;
  CUDA(cudaMalloc((void**)&early, sizeof *early));
  CUDA(cudaMemsetAsync(early, 0, sizeof *early, s));
  CUDA(cudaStreamSynchronize(s));

  ncclDevComm dc;
  ncclDevCommRequirements reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
  reqs.worldGinBarrierCount = 1;
  reqs.ginSignalCount = 1;
  reqs.ginConnectionType = NCCL_GIN_CONNECTION_FULL;
  NCCL(ncclDevCommCreate(comm, &reqs, &dc));

  cudaEvent_t e0, e1;
  CUDA(cudaEventCreate(&e0));
  CUDA(cudaEventCreate(&e1));
  MPI_Barrier(MPI_COMM_WORLD);
  const bool sigOnly = getenv("GINPP_SIGNAL") && atoi(getenv("GINPP_SIGNAL")) != 0;
  if (warm > 0)
    pingpong<<<1, THREADS, 0, s>>>(sendwin, recvwin, (const volatile uint8_t*)recv, bytes, 0, warm, dc, early, nullptr, sigOnly);
  const char* trace = getenv("GINPP_TRACE");
  uint64_t* stamps = nullptr;
  if (trace && *trace) {
    CUDA(cudaMalloc((void**)&stamps, 2 * (size_t)rounds * sizeof(uint64_t)));
    CUDA(cudaMemsetAsync(stamps, 0, 2 * (size_t)rounds * sizeof(uint64_t), s));
  }
  CUDA(cudaEventRecord(e0, s));
  pingpong<<<1, THREADS, 0, s>>>(sendwin, recvwin, (const volatile uint8_t*)recv, bytes, warm, rounds, dc, early, stamps, sigOnly);
  CUDA(cudaEventRecord(e1, s));
  CUDA(cudaStreamSynchronize(s));
  CUDA(cudaGetLastError());
  float ms = 0;
  CUDA(cudaEventElapsedTime(&ms, e0, e1));

  if (stamps) {
    int64_t width = 0, off = calibrate(s, &width);
    std::vector<uint64_t> st(2 * (size_t)rounds);
    CUDA(cudaMemcpy(st.data(), stamps, st.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
    CUDA(cudaFree(stamps));
    char path[4096];
    snprintf(path, sizeof path, "%s.rank%d.kernel", trace, rank_);
    FILE* f = fopen(path, "w");
    if (!f) FAIL("cannot write %s", path);
    fprintf(f, "# gin_pingpong rank %d bytes %zu rounds %d: realtime = globaltimer + %lld ns (exchange width %lld ns)\n", rank_,
            bytes, rounds, (long long)off, (long long)width);
    fprintf(f, "offset %lld %lld\n", (long long)off, (long long)width);
    for (int k = 0; k < rounds; k++)
      fprintf(f, "round %d %llu %llu\n", k, (unsigned long long)(st[2 * k] + off), (unsigned long long)(st[2 * k + 1] + off));
    fclose(f);
    printf("GINPP TRACE rank %d: %s (clock offset %lld ns, exchange width %lld ns)\n", rank_, path, (long long)off, (long long)width);
  }
  unsigned seenEarly = 0;
  CUDA(cudaMemcpy(&seenEarly, early, sizeof seenEarly, cudaMemcpyDeviceToHost));
  if (seenEarly) FAIL("%u signals were seen before their bytes", seenEarly);
  std::vector<uint8_t> host(total);
  CUDA(cudaMemcpy(host.data(), recv, total, cudaMemcpyDeviceToHost));
  int peer = rank_ ^ 1;
  for (int r = 0; r < all && !sigOnly; r++)
    for (size_t i = 0; i < bytes; i++)
      if (host[(size_t)r * bytes + i] != pat(peer, r, i))
        FAIL("round %d: byte %zu is %u, want %u", r, i, host[(size_t)r * bytes + i], pat(peer, r, i));
  double us = ms * 1000.0 / (2.0 * rounds), worst = 0;
  MPI_Allreduce(&us, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (rank_ == 0)
    printf("GINPP bytes=%zu rounds=%d us_one_way=%.2f verified=%zu%s\n", bytes, rounds, worst, sigOnly ? 0 : 2 * total,
           sigOnly ? " signals_alone=1" : "");

  CUDA(cudaFree(early));
  NCCL(ncclDevCommDestroy(comm, &dc));
  closeComm(comm, sendwin, send, recvwin, recv);
  CUDA(cudaStreamDestroy(s));
  if (rank_ == 0) printf("GINPP PASS\n");
  MPI_Finalize();
  return 0;
}
