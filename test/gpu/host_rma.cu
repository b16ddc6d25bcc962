// host_rma: NCCL's host RMA API over our plugin, for a machine with an
// NVIDIA GPU (test/gpu/nccl_gin_check.sh builds and runs it with mpirun, two
// ranks on one GPU posing as two hosts). For sizes from 8 B to 64 MiB each
// rank puts a pattern into the peer's window with ncclPutSignal, waits for
// the peer's put with ncclWaitSignal, and checks every byte; then a bare
// ncclSignal round; then bandwidth: ITERS puts and one wait per size, beside
// NCCL's own ncclSend/ncclRecv between the same processes; and small-op
// latency (8 B, 4 KiB, 64 KiB put+signal exchanges beside NCCL's send/recv
// exchanges; LAT_ITERS). Prints
// "HOSTRMA PASS" or "HOSTRMA FAIL <why>".
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define FAIL_TAG "HOSTRMA"
#include "nccl_check.h"

static uint8_t pat(int owner, size_t size, size_t i) {
  return (uint8_t)(owner * 71 + (size & 0xff) * 13 + i * 7 + (i >> 11));
}

int main(int argc, char** argv) {
  int nranks = startRank(&argc, &argv);
  if (nranks != 2) FAIL("run with 2 ranks, not %d", nranks);
  ncclComm_t comm = openComm(nranks);
  cudaStream_t s;
  CUDA(cudaStreamCreate(&s));

  const size_t maxSize = (size_t)64 << 20;
  void *src, *dst, *rbuf;
  NCCL(ncclMemAlloc(&src, maxSize));
  NCCL(ncclMemAlloc(&dst, maxSize));
  NCCL(ncclMemAlloc(&rbuf, maxSize));
  ncclWindow_t srcWin, dstWin;
  NCCL(ncclCommWindowRegister(comm, src, maxSize, &srcWin, NCCL_WIN_COLL_SYMMETRIC));
  NCCL(ncclCommWindowRegister(comm, dst, maxSize, &dstWin, NCCL_WIN_COLL_SYMMETRIC));
  int peer = 1 - rank_;
  std::vector<uint8_t> host(maxSize);
  long verified = 0;

  // Correctness: every size, every byte.
  for (size_t size = 8; size <= maxSize; size *= 8) {
    for (size_t i = 0; i < size; i++) host[i] = pat(rank_, size, i);
    CUDA(cudaMemcpy(src, host.data(), size, cudaMemcpyHostToDevice));
    CUDA(cudaMemset(dst, 0, size));
    CUDA(cudaDeviceSynchronize());
    MPI_Barrier(MPI_COMM_WORLD);
    NCCL(ncclPutSignal(src, size, ncclUint8, peer, dstWin, 0, 0, 0, 0, comm, s));
    ncclWaitSignalDesc_t w = {1, peer, 0, 0};
    NCCL(ncclWaitSignal(1, &w, comm, s));
    CUDA(cudaStreamSynchronize(s));
    CUDA(cudaMemcpy(host.data(), dst, size, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < size; i++)
      if (host[i] != pat(peer, size, i))
        FAIL("ncclPutSignal of %zu bytes: byte %zu is %u, want %u", size, i, host[i], pat(peer, size, i));
    verified += (long)size;
    MPI_Barrier(MPI_COMM_WORLD);  // nobody refills what the peer still reads
  }
  // A bare signal each way.
  NCCL(ncclSignal(peer, 0, 0, 0, comm, s));
  ncclWaitSignalDesc_t w1 = {1, peer, 0, 0};
  NCCL(ncclWaitSignal(1, &w1, comm, s));
  CUDA(cudaStreamSynchronize(s));
  printf("[rank %d] HOSTRMA verified %ld bytes of ncclPutSignal (8 B to 64 MiB) and an ncclSignal\n", rank_, verified);

  // Small-operation latency: both ranks put+signal to each other and wait
  // for the peer's signal, LAT_ITERS times per size, beside NCCL's own
  // send/recv exchange of the same size between the same processes
  // (ratio > 1: the plugin is faster).
  const int latIters = getenv("LAT_ITERS") ? atoi(getenv("LAT_ITERS")) : 500;
  const size_t latSizes[] = {8, 4096, 65536};
  for (size_t size : latSizes) {
    for (int warm = 0; warm < 2; warm++) {
      int iters = warm ? latIters : 20;
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int k = 0; k < iters; k++) {
        NCCL(ncclPutSignal(src, size, ncclUint8, peer, dstWin, 0, 0, 0, 0, comm, s));
        ncclWaitSignalDesc_t w = {1, peer, 0, 0};
        NCCL(ncclWaitSignal(1, &w, comm, s));
      }
      CUDA(cudaStreamSynchronize(s));
      double tput = MPI_Wtime() - t0;
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
      for (int k = 0; k < iters; k++) {
        NCCL(ncclGroupStart());
        NCCL(ncclSend(src, size, ncclUint8, peer, comm, s));
        NCCL(ncclRecv(rbuf, size, ncclUint8, peer, comm, s));
        NCCL(ncclGroupEnd());
      }
      CUDA(cudaStreamSynchronize(s));
      double tsr = MPI_Wtime() - t0;
      if (warm && rank_ == 0)
        printf("HOSTRMA latency size=%zu iters=%d putsignal_us=%.1f nccl-sendrecv_us=%.1f ratio=%.2f\n", size, iters,
               tput / iters * 1e6, tsr / iters * 1e6, tsr / tput);
    }
  }

  // Bandwidth: rank 0 puts ITERS times, rank 1 waits for ITERS signals;
  // then NCCL's own send/recv of the same sizes.
  for (size_t size = (size_t)1 << 20; size <= maxSize; size *= 4) {
    int iters = (int)(((size_t)512 << 20) / size);
    if (iters > 64) iters = 64;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    if (rank_ == 0) {
      for (int k = 0; k < iters; k++) NCCL(ncclPutSignal(src, size, ncclUint8, 1, dstWin, 0, 0, 0, 0, comm, s));
    } else {
      ncclWaitSignalDesc_t w = {iters, 0, 0, 0};
      NCCL(ncclWaitSignal(1, &w, comm, s));
    }
    CUDA(cudaStreamSynchronize(s));
    MPI_Barrier(MPI_COMM_WORLD);
    double tput = MPI_Wtime() - t0;
    t0 = MPI_Wtime();
    for (int k = 0; k < iters; k++) {
      NCCL(ncclGroupStart());
      if (rank_ == 0) NCCL(ncclSend(src, size, ncclUint8, 1, comm, s));
      else NCCL(ncclRecv(rbuf, size, ncclUint8, 0, comm, s));
      NCCL(ncclGroupEnd());
    }
    CUDA(cudaStreamSynchronize(s));
    MPI_Barrier(MPI_COMM_WORLD);
    double tsr = MPI_Wtime() - t0;
    if (rank_ == 0)
      printf("HOSTRMA size=%zu iters=%d putsignal=%.2f GB/s nccl-sendrecv=%.2f GB/s ratio=%.2f\n", size, iters,
             (double)size * iters / tput / 1e9, (double)size * iters / tsr / 1e9, tsr / tput);
  }

  NCCL(ncclMemFree(rbuf));
  closeComm(comm, srcWin, src, dstWin, dst);
  if (rank_ == 0) printf("HOSTRMA PASS\n");
  MPI_Finalize();
  return 0;
}
