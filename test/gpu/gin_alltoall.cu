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
// the end (a run still going after GINA2A_WATCH_S s reports where it is). Prints "GINA2A bytes=.. iters=.. us_per_alltoall=.." and
// "GINA2A PASS", or "GINA2A FAIL <why>".
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <nccl_device.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <unistd.h>
#include <algorithm>
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

// Where each kernel is, for the watchdog: thread 0 stores it*8+stage in a
// host-mapped word (stage 1 started, 2 past the first barrier, 3 puts
// posted, 4 signal arrived, 5 flushed, 6 done) and the signal it waits for.
struct Progress {
  volatile unsigned long long where, base, want;
};

// Each stage's time too (%globaltimer, ns), in device memory, 8 words per
// iteration: the phases' medians tell where an alltoall's time goes (the
// launch gap, the first barrier, the puts' posting, the signal's wait, the
// flush, the last barrier), printed as one "GINA2A PHASES" line per rank.
enum { STAGES = 8 };

__device__ static inline void mark(Progress* p, int it, int stage, unsigned long long* times) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    times[(size_t)it * STAGES + stage] = t;
    p->where = (unsigned long long)it * 8 + stage;
    __threadfence_system();
  }
}

__global__ void alltoall(ncclWindow_t sendwin, ncclWindow_t recvwin, size_t bytes, int it, ncclDevComm dc,
                         Progress* prog, unsigned long long* times) {
  ncclGin gin{dc, 0};
  unsigned sig = blockIdx.x;
  mark(prog, it, 1, times);
  uint64_t base = gin.readSignal(sig);
  if (threadIdx.x == 0 && blockIdx.x == 0) prog->base = base, prog->want = base + dc.nRanks;
  ncclGinBarrierSession<ncclCoopCta> bar{ncclCoopCta(), gin, ncclTeamTagWorld(), blockIdx.x};
  // Nobody puts before everybody read its signal's starting value.
  bar.sync(ncclCoopCta(), cuda::memory_order_acquire, ncclGinFenceLevel::None);
  mark(prog, it, 2, times);
  size_t slot = (size_t)it * dc.nRanks * bytes;
  int tid = threadIdx.x + blockIdx.x * blockDim.x;
  int nthreads = blockDim.x * gridDim.x;
  for (int r = tid; r < dc.nRanks; r += nthreads)
    gin.put(ncclTeamWorld(dc), r, recvwin, slot + (size_t)dc.rank * bytes, sendwin, slot + (size_t)r * bytes, bytes,
            ncclGin_StrongSignalInc{sig});
  mark(prog, it, 3, times);
  // Every put to rank r comes from thread r, so it lands on signal r/THREADS.
  if (blockIdx.x == (dc.rank % nthreads) / blockDim.x) gin.waitSignal(ncclCoopCta(), sig, base + dc.nRanks);
  mark(prog, it, 4, times);
  gin.flush(ncclCoopCta());
  mark(prog, it, 5, times);
  bar.sync(ncclCoopCta(), cuda::memory_order_release, ncclGinFenceLevel::None);
  mark(prog, it, 6, times);
}

// The watchdog: a run still going after GINA2A_WATCH_S seconds (default
// 20) prints, every 5 s, where this rank's kernels are and which slots of
// the receive window hold their bytes (read on a stream of its own, which
// does not wait for the kernels), then goes on waiting: the script's
// timeout decides. A hang is then told apart: a put that never landed, a
// signal that never came, or a flush that never ended.
struct Watch {
  Progress* prog;
  const uint8_t* recv;
  size_t bytes;
  int nranks, iters;
  volatile int done;
};

static void* watch(void* arg) {
  Watch* w = (Watch*)arg;
  int first = getenv("GINA2A_WATCH_S") ? atoi(getenv("GINA2A_WATCH_S")) : 20;
  for (int t = 0; !w->done; t++) {
    sleep(1);
    if (t + 1 < first || (t + 1 - first) % 5 != 0 || w->done) continue;
    unsigned long long where = w->prog->where;
    printf("[rank %d] GINA2A WATCH %d s: kernel %llu at stage %llu (1 started 2 barrier 3 posted 4 signalled 5 flushed 6 done), waits for signal %llu from base %llu\n",
           rank_, t + 1, where / 8, where % 8, w->prog->want, w->prog->base);
    size_t total = (size_t)w->iters * w->nranks * w->bytes;
    std::vector<uint8_t> h(total);
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) continue;
    if (cudaMemcpyAsync(h.data(), w->recv, total, cudaMemcpyDeviceToHost, s) == cudaSuccess &&
        cudaStreamSynchronize(s) == cudaSuccess) {
      for (int from = 0; from < w->nranks; from++) {
        int landed = 0, firstMissing = -1;
        for (int it = 0; it < w->iters; it++) {
          bool ok = true;
          for (size_t i = 0; i < w->bytes && ok; i++)
            ok = h[((size_t)it * w->nranks + from) * w->bytes + i] == pat(from, rank_, it, i);
          if (ok) landed++;
          else if (firstMissing < 0) firstMissing = it;
        }
        printf("[rank %d] GINA2A WATCH from rank %d: %d of %d iterations landed, first missing %d\n", rank_, from,
               landed, w->iters, firstMissing);
      }
    }
    cudaStreamDestroy(s);
  }
  return NULL;
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

static double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// phases prints the medians of each kernel's phases (µs), the first ten
// kernels left out (warm-up): the gap from the previous kernel's end to
// this one's start, the first barrier, posting the puts, waiting for the
// signal, the flush, the last barrier, and the whole kernel.
static void phases(const unsigned long long* dev, int iters) {
  std::vector<unsigned long long> t((size_t)iters * STAGES);
  if (cudaMemcpy(t.data(), dev, t.size() * sizeof t[0], cudaMemcpyDeviceToHost) != cudaSuccess) return;
  const char* names[] = {"launch-gap", "barrier1", "post", "signal", "flush", "barrier2", "kernel"};
  std::vector<double> d[7];
  for (int it = 10; it < iters; it++) {
    const unsigned long long* x = &t[(size_t)it * STAGES];
    for (int k = 1; k < 6; k++) d[k].push_back((x[k + 1] - x[k]) / 1000.0);
    d[0].push_back((x[1] - t[(size_t)(it - 1) * STAGES + 6]) / 1000.0);
    d[6].push_back((x[6] - x[1]) / 1000.0);
  }
  printf("[rank %d] GINA2A PHASES median µs:", rank_);
  for (int k = 0; k < 7; k++) printf(" %s=%.1f", names[k], median(d[k]));
  printf("\n");
  // The mean from kernel 10's start to the last kernel's end: the steady
  // state, without the first kernels' one-time setup (windows mapped,
  // lanes opened), beside the slowest kernel of that span.
  if (iters > 11) {
    double span = (t[(size_t)(iters - 1) * STAGES + 6] - t[(size_t)10 * STAGES + 1]) / 1000.0, worst = 0;
    for (size_t i = 0; i < d[6].size(); i++) worst = d[6][i] > worst ? d[6][i] : worst;
    printf("[rank %d] GINA2A STEADY us_per_alltoall=%.1f (kernels 10 to %d) slowest_kernel_us=%.1f\n", rank_, span / (iters - 10), iters - 1, worst);
  }
}

int main(int argc, char** argv) {
  int nranks = startRank(&argc, &argv);
  size_t bytes = argc > 1 ? strtoull(argv[1], NULL, 0) : 4096;
  int iters = argc > 2 ? atoi(argv[2]) : 200;
  if (bytes == 0 || iters <= 0) FAIL("usage: gin_alltoall BYTES_PER_PEER ITERATIONS");
  ncclComm_t comm = openComm(nranks);
  requireGin(comm);

  size_t total = (size_t)iters * nranks * bytes;
  void *send, *recv;
  ncclWindow_t sendwin, recvwin;
  openWindows(comm, total, &send, &sendwin, &recv, &recvwin);
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
  Progress* prog;
  CUDA(cudaHostAlloc((void**)&prog, sizeof *prog, cudaHostAllocMapped));
  prog->where = prog->base = prog->want = 0;
  Progress* progDev;
  CUDA(cudaHostGetDevicePointer((void**)&progDev, prog, 0));
  unsigned long long* times;
  CUDA(cudaMalloc((void**)&times, (size_t)iters * STAGES * sizeof *times));
  CUDA(cudaMemset(times, 0, (size_t)iters * STAGES * sizeof *times));
  Watch w = {prog, (const uint8_t*)recv, bytes, nranks, iters, 0};
  pthread_t wt;
  pthread_create(&wt, NULL, watch, &w);
  MPI_Barrier(MPI_COMM_WORLD);
  CUDA(cudaEventRecord(e0, s));
  // GINA2A_SYNC_EACH=1 waits for each kernel before launching the next:
  // nothing is queued behind a running kernel (the diagnosis of SPEC.md
  // §4, "Copies queued behind the application's kernels").
  bool syncEach = getenv("GINA2A_SYNC_EACH") && atoi(getenv("GINA2A_SYNC_EACH"));
  for (int it = 0; it < iters; it++) {
    alltoall<<<CTAS, THREADS, 0, s>>>(sendwin, recvwin, bytes, it, dc, progDev, times);
    if (syncEach) CUDA(cudaStreamSynchronize(s));
  }
  CUDA(cudaEventRecord(e1, s));
  CUDA(cudaStreamSynchronize(s));
  w.done = 1;
  pthread_join(wt, NULL);
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
  phases(times, iters);
  CUDA(cudaFree(times));
  double us = ms * 1000.0 / iters, worst = 0;
  MPI_Allreduce(&us, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (rank_ == 0)
    printf("GINA2A bytes=%zu iters=%d ranks=%d us_per_alltoall=%.1f verified=%zu\n", bytes, iters, nranks, worst,
           total);

  CUDA(cudaFreeHost(prog));
  NCCL(ncclDevCommDestroy(comm, &dc));
  closeComm(comm, sendwin, send, recvwin, recv);
  CUDA(cudaStreamDestroy(s));
  if (rank_ == 0) printf("GINA2A PASS\n");
  MPI_Finalize();
  return 0;
}
