// gin_alltoall: GPU-initiated alltoall through NCCL's device API (GIN), for a
// machine with an NVIDIA GPU. test/gpu/nccl_gin_check.sh builds it against a
// source-built NCCL and runs it with mpirun as two ranks on one GPU posing as
// two hosts, so every put and signal goes through NCCL's GIN proxy and our
// plugin.
//
//   gin_alltoall BYTES_PER_PEER ITERATIONS
//
// ITERATIONS kernels are launched back to back on one stream with no host
// synchronisation between them, the way an application loops; each kernel
// reads its signal, meets the peers at a GIN barrier, puts BYTES_PER_PEER to
// every rank with a signal increment, waits for every rank's put and flushes.
// Iteration i writes its own slot of the receive window, so one late or lost
// put cannot be hidden by the next; every byte of every slot is checked at
// the end. Prints "GINA2A bytes=.. iters=.. us_per_alltoall=.." and
// "GINA2A PASS", or "GINA2A FAIL <why>".
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <nccl_device.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#define FAIL_TAG "GINA2A"
#include "nccl_check.h"

// One CTA: the two-rank runs need one put per rank, and a single barrier
// and signal keep the kernel's own cost small beside the network's.
enum { CTAS = 1, THREADS = 128 };

// The byte that rank `from` sends rank `to` at position i of iteration it.
__host__ __device__ static inline uint8_t pat(int from, int to, int it, size_t i) {
  return (uint8_t)(from * 131 + to * 29 + it * 7 + i * 3 + (i >> 9));
}

__global__ void alltoall(ncclWindow_t sendwin, ncclWindow_t recvwin, size_t bytes, int it, ncclDevComm dc) {
  ncclGin gin{dc, 0};
  unsigned sig = blockIdx.x;
  uint64_t base = gin.readSignal(sig);
  ncclGinBarrierSession<ncclCoopCta> bar{ncclCoopCta(), gin, ncclTeamTagWorld(), blockIdx.x};
  // Nobody puts before everybody read its signal's starting value.
  bar.sync(ncclCoopCta(), cuda::memory_order_acquire, ncclGinFenceLevel::None);
  size_t slot = (size_t)it * dc.nRanks * bytes;
  int tid = threadIdx.x + blockIdx.x * blockDim.x;
  int nthreads = blockDim.x * gridDim.x;
  for (int r = tid; r < dc.nRanks; r += nthreads)
    gin.put(ncclTeamWorld(dc), r, recvwin, slot + (size_t)dc.rank * bytes, sendwin, slot + (size_t)r * bytes, bytes,
            ncclGin_StrongSignalInc{sig});
  // Every put to rank r comes from thread r, so it lands on signal r/THREADS.
  if (blockIdx.x == (dc.rank % nthreads) / blockDim.x) gin.waitSignal(ncclCoopCta(), sig, base + dc.nRanks);
  gin.flush(ncclCoopCta());
  bar.sync(ncclCoopCta(), cuda::memory_order_release, ncclGinFenceLevel::None);
}

__global__ void fill(uint8_t* p, int from, int nranks, size_t bytes, int iters) {
  size_t total = (size_t)iters * nranks * bytes;
  for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < total; k += (size_t)gridDim.x * blockDim.x) {
    size_t i = k % bytes;
    int to = (int)((k / bytes) % nranks);
    int it = (int)(k / bytes / nranks);
    p[k] = pat(from, to, it, i);
  }
}

int main(int argc, char** argv) {
  int nranks = startRank(&argc, &argv);
  size_t bytes = argc > 1 ? strtoull(argv[1], NULL, 0) : 4096;
  int iters = argc > 2 ? atoi(argv[2]) : 200;
  if (bytes == 0 || iters <= 0) FAIL("usage: gin_alltoall BYTES_PER_PEER ITERATIONS");
  ncclComm_t comm = openComm(nranks);
  ncclCommProperties_t props = NCCL_COMM_PROPERTIES_INITIALIZER;
  NCCL(ncclCommQueryProperties(comm, &props));
  if (!props.deviceApiSupport || props.ginType == NCCL_GIN_TYPE_NONE)
    FAIL("no device API or no GIN on this communicator (ginType %d)", (int)props.ginType);

  size_t total = (size_t)iters * nranks * bytes;
  void *send, *recv;
  NCCL(ncclMemAlloc(&send, total));
  NCCL(ncclMemAlloc(&recv, total));
  ncclWindow_t sendwin, recvwin;
  NCCL(ncclCommWindowRegister(comm, send, total, &sendwin, NCCL_WIN_COLL_SYMMETRIC));
  NCCL(ncclCommWindowRegister(comm, recv, total, &recvwin, NCCL_WIN_COLL_SYMMETRIC));
  cudaStream_t s;
  CUDA(cudaStreamCreate(&s));
  fill<<<256, 256, 0, s>>>((uint8_t*)send, rank_, nranks, bytes, iters);
  CUDA(cudaMemsetAsync(recv, 0, total, s));
  CUDA(cudaStreamSynchronize(s));

  ncclDevComm dc;
  ncclDevCommRequirements reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
  reqs.worldGinBarrierCount = CTAS;
  reqs.ginSignalCount = CTAS;
  reqs.ginConnectionType = NCCL_GIN_CONNECTION_FULL;
  NCCL(ncclDevCommCreate(comm, &reqs, &dc));

  cudaEvent_t e0, e1;
  CUDA(cudaEventCreate(&e0));
  CUDA(cudaEventCreate(&e1));
  MPI_Barrier(MPI_COMM_WORLD);
  CUDA(cudaEventRecord(e0, s));
  for (int it = 0; it < iters; it++) alltoall<<<CTAS, THREADS, 0, s>>>(sendwin, recvwin, bytes, it, dc);
  CUDA(cudaEventRecord(e1, s));
  CUDA(cudaStreamSynchronize(s));
  CUDA(cudaGetLastError());
  float ms = 0;
  CUDA(cudaEventElapsedTime(&ms, e0, e1));

  std::vector<uint8_t> host(total);
  CUDA(cudaMemcpy(host.data(), recv, total, cudaMemcpyDeviceToHost));
  for (int it = 0; it < iters; it++)
    for (int from = 0; from < nranks; from++)
      for (size_t i = 0; i < bytes; i++) {
        uint8_t got = host[((size_t)it * nranks + from) * bytes + i], want = pat(from, rank_, it, i);
        if (got != want)
          FAIL("iteration %d: byte %zu from rank %d is %u, want %u", it, i, from, got, want);
      }
  double us = ms * 1000.0 / iters, worst = 0;
  MPI_Allreduce(&us, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (rank_ == 0)
    printf("GINA2A bytes=%zu iters=%d ranks=%d us_per_alltoall=%.1f verified=%zu\n", bytes, iters, nranks, worst,
           total);

  NCCL(ncclDevCommDestroy(comm, &dc));
  closeComm(comm, sendwin, send, recvwin, recv);
  CUDA(cudaStreamDestroy(s));
  if (rank_ == 0) printf("GINA2A PASS\n");
  MPI_Finalize();
  return 0;
}
