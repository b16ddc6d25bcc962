// nccl_check.h: the failure macros of the NCCL programs in test/gpu
// (host_rma.cu, gin_alltoall.cu; nccl_gin_check.sh builds them with nvcc).
// Define FAIL_TAG ("HOSTRMA", "GINA2A") before including it: a failure
// prints "[rank R] <FAIL_TAG> FAIL <why>" and aborts every rank. rank_ is
// set by the program after MPI_Init.
#ifndef RMAW_NCCL_CHECK_H
#define RMAW_NCCL_CHECK_H

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>

static int rank_ = -1;

#define FAIL(...)                                  \
  do {                                             \
    printf("[rank %d] " FAIL_TAG " FAIL ", rank_); \
    printf(__VA_ARGS__);                           \
    printf("\n");                                  \
    fflush(stdout);                                \
    MPI_Abort(MPI_COMM_WORLD, 1);                  \
  } while (0)
#define CUDA(x)                                                        \
  do {                                                                 \
    cudaError_t e_ = (x);                                              \
    if (e_ != cudaSuccess) FAIL("%s: %s", #x, cudaGetErrorString(e_)); \
  } while (0)
#define NCCL(x)                                                        \
  do {                                                                 \
    ncclResult_t r_ = (x);                                             \
    if (r_ != ncclSuccess) FAIL("%s: %s", #x, ncclGetErrorString(r_)); \
  } while (0)

#endif
