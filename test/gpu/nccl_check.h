// nccl_check.h: what the NCCL programs in test/gpu (host_rma.cu,
// gin_alltoall.cu; nccl_gin_check.sh builds them with nvcc) share: the
// failure macros, the start of a rank (MPI, its GPU, the communicator) and
// the teardown of its two windows and communicator. Define FAIL_TAG
// ("HOSTRMA", "GINA2A") before including it: a failure prints
// "[rank R] <FAIL_TAG> FAIL <why>" and aborts every rank.
#ifndef RMAW_NCCL_CHECK_H
#define RMAW_NCCL_CHECK_H

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>

static int rank_ = -1;  // set by startRank

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


// startRank starts MPI, sets rank_ and line-buffers stdout; it returns the
// number of ranks.
static int startRank(int* argc, char*** argv) {
  MPI_Init(argc, argv);
  int nranks;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  setvbuf(stdout, NULL, _IOLBF, 0);
  return nranks;
}

// openComm selects this rank's GPU (rank_ modulo the devices, so ranks may
// share one) and returns a communicator over all nranks ranks.
static ncclComm_t openComm(int nranks) {
  int ndev = 1;
  CUDA(cudaGetDeviceCount(&ndev));
  CUDA(cudaSetDevice(rank_ % ndev));
  ncclUniqueId id;
  if (rank_ == 0) NCCL(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  NCCL(ncclCommInitRank(&comm, nranks, id, rank_));
  return comm;
}

#ifdef NCCL_COMM_PROPERTIES_INITIALIZER
// requireGin fails the run unless comm offers NCCL's device API with GIN
// (for programs that include nccl_device.h first).
static void requireGin(ncclComm_t comm) {
  ncclCommProperties_t props = NCCL_COMM_PROPERTIES_INITIALIZER;
  NCCL(ncclCommQueryProperties(comm, &props));
  if (!props.deviceApiSupport || props.ginType == NCCL_GIN_TYPE_NONE)
    FAIL("no device API or no GIN on this communicator (ginType %d)", (int)props.ginType);
}
#endif

// openWindows allocates (ncclMemAlloc) and registers two symmetric windows
// of n bytes each; closeComm undoes it.
static void openWindows(ncclComm_t comm, size_t n, void** b0, ncclWindow_t* w0, void** b1, ncclWindow_t* w1) {
  NCCL(ncclMemAlloc(b0, n));
  NCCL(ncclMemAlloc(b1, n));
  NCCL(ncclCommWindowRegister(comm, *b0, n, w0, NCCL_WIN_COLL_SYMMETRIC));
  NCCL(ncclCommWindowRegister(comm, *b1, n, w1, NCCL_WIN_COLL_SYMMETRIC));
}

// closeComm deregisters the windows w0 and w1, frees their memory b0 and b1
// (from ncclMemAlloc), and finalizes and destroys comm.
static void closeComm(ncclComm_t comm, ncclWindow_t w0, void* b0, ncclWindow_t w1, void* b1) {
  NCCL(ncclCommWindowDeregister(comm, w0));
  NCCL(ncclCommWindowDeregister(comm, w1));
  NCCL(ncclMemFree(b0));
  NCCL(ncclMemFree(b1));
  NCCL(ncclCommFinalize(comm));
  NCCL(ncclCommDestroy(comm));
}

#endif
