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
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <nccl_device.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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
__global__ void pingpong(ncclWindow_t sendwin, ncclWindow_t recvwin, const volatile uint8_t* recv, size_t bytes, int first,
                         int n, ncclDevComm dc, unsigned* early) {
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
      if (threadIdx.x == 0 && (recv[slot] != pat(0, first + k, 0) || recv[slot + bytes - 1] != pat(0, first + k, bytes - 1)))
        atomicAdd(early, 1u);
    }
    if (threadIdx.x == 0)
      gin.put(ncclTeamWorld(dc), peer, recvwin, slot, sendwin, slot, bytes, ncclGin_StrongSignalInc{sig});
    if (dc.rank == 0) {
      gin.waitSignal(ncclCoopCta(), sig, base + k + 1);
      if (threadIdx.x == 0 && (recv[slot] != pat(1, first + k, 0) || recv[slot + bytes - 1] != pat(1, first + k, bytes - 1)))
        atomicAdd(early, 1u);
    }
  }
  gin.flush(ncclCoopCta());
  bar.sync(ncclCoopCta(), cuda::memory_order_release, ncclGinFenceLevel::None);
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
  if (warm > 0) pingpong<<<1, THREADS, 0, s>>>(sendwin, recvwin, (const volatile uint8_t*)recv, bytes, 0, warm, dc, early);
  CUDA(cudaEventRecord(e0, s));
  pingpong<<<1, THREADS, 0, s>>>(sendwin, recvwin, (const volatile uint8_t*)recv, bytes, warm, rounds, dc, early);
  CUDA(cudaEventRecord(e1, s));
  CUDA(cudaStreamSynchronize(s));
  CUDA(cudaGetLastError());
  float ms = 0;
  CUDA(cudaEventElapsedTime(&ms, e0, e1));

  unsigned seenEarly = 0;
  CUDA(cudaMemcpy(&seenEarly, early, sizeof seenEarly, cudaMemcpyDeviceToHost));
  if (seenEarly) FAIL("%u signals were seen before their bytes", seenEarly);
  std::vector<uint8_t> host(total);
  CUDA(cudaMemcpy(host.data(), recv, total, cudaMemcpyDeviceToHost));
  int peer = rank_ ^ 1;
  for (int r = 0; r < all; r++)
    for (size_t i = 0; i < bytes; i++)
      if (host[(size_t)r * bytes + i] != pat(peer, r, i))
        FAIL("round %d: byte %zu is %u, want %u", r, i, host[(size_t)r * bytes + i], pat(peer, r, i));
  double us = ms * 1000.0 / (2.0 * rounds), worst = 0;
  MPI_Allreduce(&us, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (rank_ == 0) printf("GINPP bytes=%zu rounds=%d us_one_way=%.2f verified=%zu\n", bytes, rounds, worst, 2 * total);

  CUDA(cudaFree(early));
  NCCL(ncclDevCommDestroy(comm, &dc));
  closeComm(comm, sendwin, send, recvwin, recv);
  CUDA(cudaStreamDestroy(s));
  if (rank_ == 0) printf("GINPP PASS\n");
  MPI_Finalize();
  return 0;
}
