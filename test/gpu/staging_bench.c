/* staging_bench: how fast device memory moves through the plugin, against
 * the bounds measured in the same run, on one GPU machine (two ranks =
 * two processes on GPU 0).
 *
 *   1. Bounds: synchronous cuMemcpy of `bytes` device<->host, pinned
 *      (cuMemHostAlloc) and pageable (malloc), and pinned in chunks of
 *      NCCL_RMA_WASM_STAGE_CHUNK_KB as the plugin copies (async + wait on a
 *      non-blocking stream).
 *   2. For each transport, tcp (NCCL_RMA_WASM_INTRANODE=0) and intranode
 *      (=1): a put with signal of `bytes` from host to host memory (the
 *      wire bound of that transport) and from device to device memory,
 *      timed from the post until the target saw the signal (and told the
 *      sender over a socketpair); then the signal latency, host and device
 *      signal words, as half a ping-pong of empty put-with-signals.
 *
 * Prints "BOUND", "PUT", "SIGNAL" and "RATIO" lines and one "RESULT" line.
 * The device put passes when it reaches 0.8 x min(pinned D2H, the
 * transport's host put, pinned H2D). Under "intranode" device payloads
 * move through the plugin's shared staging ring (device -> shared pinned
 * slot -> device, the two copies of successive chunks overlapped; no
 * socket), so their bound is the intra-node host put (process_vm_writev);
 * with NCCL_RMA_WASM_INTRANODE_RING=0 they ride the TCP lanes instead.
 * BOUND signal_rmw is what one device signal update costs the plugin
 * without GDRCopy: an 8-byte device-to-host and host-to-device copy, each
 * waited for, in this process alone (the SIGNAL device figure adds the
 * two processes' contention for one GPU and the wire).
 *
 *   staging_bench [path/to/librccl-rma-wasm.so] [bytes] [iterations] [signal round trips]
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "gpu_rank.h"

static int cmpd(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}
static double median(double* v, int n) {
  qsort(v, n, sizeof *v, cmpd);
  return v[n / 2];
}

static void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                   const char* fmt, ...) {
  (void)flags, (void)file, (void)line;
  va_list ap;
  va_start(ap, fmt);
  char buf[1024];
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  /* WARN always; INFO only about device memory, staging and transports. */
  if (level <= 2 || (level == 3 && (strstr(buf, "CUDA") || strstr(buf, "pinned") || strstr(buf, "intra-node") ||
                                    strstr(buf, "GDR") || strstr(buf, "HIP") || strstr(buf, "signal words") ||
                                    strstr(buf, "agent") || strstr(buf, "stall") || strstr(buf, "pending"))))
    fprintf(stderr, "[%s] plugin: %s\n", who, buf);
}


/* Results travel to the parent through a pipe, in this order. */
enum { B_D2H_PIN, B_H2D_PIN, B_D2H_PAGE, B_H2D_PAGE, B_D2H_CHUNK, B_H2D_CHUNK, NBOUNDS };
enum { P_HOST, P_DEV, P_SIG_HOST_US, P_SIG_DEV_US, P_SELF_D2H_US, P_SELF_H2D_US, NPUT };

static size_t chunk_bytes(void) {
  const char* s = getenv("NCCL_RMA_WASM_STAGE_CHUNK_KB");
  size_t kb = s && *s ? strtoull(s, NULL, 0) : 1024;
  return (kb ? kb : 1024) << 10;
}

static void bounds(size_t size, int iters, int out) {
  who = "bounds";
  cuda_open();
  CUdeviceptr d;
  CU(cu.memAlloc(&d, size));
  void* pin;
  CU(cu.memHostAlloc(&pin, size, 1));
  void* page = malloc(size);
  memset(page, 1, size);
  memset(pin, 1, size);
  void* stream;
  CU(cu.streamCreate(&stream, 1));
  size_t chunk = chunk_bytes();
  double r[NBOUNDS];
  double t[64];
  if (iters > 64) iters = 64;
  for (int k = 0; k < NBOUNDS; k++) {
    for (int i = -1; i < iters; i++) { /* i = -1: warm-up */
      double t0 = now();
      switch (k) {
        case B_D2H_PIN: CU(cu.dtoh(pin, d, size)); break;
        case B_H2D_PIN: CU(cu.htod(d, pin, size)); break;
        case B_D2H_PAGE: CU(cu.dtoh(page, d, size)); break;
        case B_H2D_PAGE: CU(cu.htod(d, page, size)); break;
        case B_D2H_CHUNK:
        case B_H2D_CHUNK:
          for (size_t o = 0; o < size; o += chunk) {
            size_t m = size - o < chunk ? size - o : chunk;
            size_t b = 2 * chunk <= size ? (o / chunk % 2) * chunk : 0;
            /* one staging buffer's worth of pinned memory, as the plugin */
            if (k == B_D2H_CHUNK) CU(cu.dtohAsync((char*)pin + b, d + o, m, stream));
            else CU(cu.htodAsync(d + o, (char*)pin + b, m, stream));
            CU(cu.streamSynchronize(stream));
          }
          break;
      }
      if (i >= 0) t[i] = now() - t0;
    }
    r[k] = size / median(t, iters) / 1e9;
  }
  static const char* names[NBOUNDS] = {"d2h_pinned", "h2d_pinned", "d2h_pageable", "h2d_pageable",
                                       "d2h_pinned_chunked", "h2d_pinned_chunked"};
  for (int k = 0; k < NBOUNDS; k++)
    printf("BOUND %-20s %7.2f GB/s  (%zu bytes%s, median of %d)\n", names[k], r[k], size,
           k >= B_D2H_CHUNK ? ", chunk = NCCL_RMA_WASM_STAGE_CHUNK_KB, async + wait" : "", iters);
  /* The plugin's device signal update without GDRCopy: read the word,
   * write it back, each copy waited for on a non-blocking stream. */
  {
    double ts[64];
    uint64_t* w = pin;
    for (int i = -1; i < 64; i++) {
      double t0 = now();
      CU(cu.dtohAsync(w, d, 8, stream));
      CU(cu.streamSynchronize(stream));
      (*w)++;
      CU(cu.htodAsync(d, w, 8, stream));
      CU(cu.streamSynchronize(stream));
      if (i >= 0) ts[i] = now() - t0;
    }
    printf("BOUND signal_rmw %10.1f us  (8-byte D2H + H2D, each waited for: a device signal without GDRCopy, one process)\n",
           median(ts, 64) * 1e6);
  }
  if (write(out, r, sizeof r) != (ssize_t)sizeof r) FAIL("pipe");
}

static void sync_peer(int fd) {
  char b = 1, c;
  xchg(fd, &b, &c, 1);
}


static uint64_t dev_word(CUdeviceptr p) {
  uint64_t v;
  CU(cu.dtoh(&v, p, 8));
  return v;
}

/* The kernel waiter (BENCH_KERNEL_WAIT=1, best under CUDA MPS so that the
 * two ranks' kernels run at once): the device signal word is watched the
 * way a GIN kernel watches it, by a one-thread kernel that spins on the
 * word and, once it reaches want, stores what it saw in a host-mapped
 * word the host spins on. Polling with synchronous copies (the default)
 * adds a copy of its own to each look and contends with the plugin's
 * write. The kernel gives up after 10 s (%globaltimer), storing the value
 * it last saw, so a lost signal fails the run instead of hanging it. */
static const char wait_ptx[] =
    ".version 6.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    ".visible .entry bench_wait(.param .u64 w, .param .u64 want, .param .u64 flag)\n"
    "{\n"
    "  .reg .pred %p<3>;\n"
    "  .reg .b64 %rd<8>;\n"
    "  ld.param.u64 %rd1, [w];\n"
    "  ld.param.u64 %rd2, [want];\n"
    "  ld.param.u64 %rd3, [flag];\n"
    "  mov.u64 %rd4, %globaltimer;\n"
    "  add.u64 %rd4, %rd4, 10000000000;\n"
    "L_loop:\n"
    "  ld.volatile.global.u64 %rd5, [%rd1];\n"
    "  setp.ge.u64 %p1, %rd5, %rd2;\n"
    "  @%p1 bra L_done;\n"
    "  mov.u64 %rd6, %globaltimer;\n"
    "  setp.lt.u64 %p2, %rd6, %rd4;\n"
    "  @%p2 bra L_loop;\n"
    "L_done:\n"
    "  st.volatile.global.u64 [%rd3], %rd5;\n"
    "  membar.sys;\n"
    "  ret;\n"
    "}\n";

typedef struct {
  CUresult (*launch)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,
                     void**);
  void* fn;
  void* stream;
  volatile uint64_t* flag;
  CUdeviceptr flagd;
} kwait_t;

#define KWAIT_IDLE UINT64_MAX

/* kwait_open readies the kernel waiter when BENCH_KERNEL_WAIT=1 and the
 * driver loads its module (the fake driver does not: it says so and the
 * run keeps copy polling). */
static bool kwait_open(kwait_t* k) {
  if (!getenv("BENCH_KERNEL_WAIT") || !atoi(getenv("BENCH_KERNEL_WAIT"))) return false;
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  CUresult (*load)(void**, const void*) = h ? dlsym(h, "cuModuleLoadData") : NULL;
  CUresult (*get)(void**, void*, const char*) = h ? dlsym(h, "cuModuleGetFunction") : NULL;
  CUresult (*devptr)(CUdeviceptr*, void*, unsigned) = h ? dlsym(h, "cuMemHostGetDevicePointer_v2") : NULL;
  k->launch = h ? dlsym(h, "cuLaunchKernel") : NULL;
  void* mod = NULL;
  CUresult r = -1;
  if (load && get && devptr && k->launch && (r = load(&mod, wait_ptx)) == 0) r = get(&k->fn, mod, "bench_wait");
  if (r != 0) {
    printf("[%s] BENCH_KERNEL_WAIT: no kernel waiter (module load: CUDA error %d); device words polled by copies\n", who, r);
    return false;
  }
  void* p = NULL;
  CU(cu.memHostAlloc(&p, 8, 0x1 | 0x2)); /* PORTABLE | DEVICEMAP */
  CU(devptr(&k->flagd, p, 0));
  k->flag = p;
  *k->flag = KWAIT_IDLE;
  CU(cu.streamCreate(&k->stream, 1 /* non-blocking */));
  return true;
}

/* kwait_launch starts a kernel that waits until the word at w reaches want. */
static void kwait_launch(kwait_t* k, CUdeviceptr w, uint64_t want) {
  *k->flag = KWAIT_IDLE;
  __sync_synchronize();
  void* args[] = {&w, &want, &k->flagd};
  CU(k->launch(k->fn, 1, 1, 1, 1, 1, 1, 0, k->stream, args, NULL));
}

/* kwait_wait waits for the kernel of kwait_launch to see want. */
/* The waiter drives the plugin while it waits, as NCCL's proxy thread
 * does (its loop calls rmaProgress whatever the kernels wait for);
 * BENCH_PROGRESS=0 waits without calling the plugin, so the target's
 * service alone applies what arrives. */
static const ncclRma_v15_t* prog_t;
static void* prog_rma;
static void progress(void) {
  if (prog_t && prog_t->rmaProgress) prog_t->rmaProgress(prog_rma);
}

/* wait_done tests req until it completes, calling rmaProgress between
 * tests as NCCL's proxy does (every microsecond or so). */
static void wait_done(const ncclRma_v15_t* t, void* coll, void* req) {
  int done = 0;
  double t0 = now();
  while (!done) {
    progress();
    NC(t->test(coll, req, &done));
    if (now() - t0 > 60) FAIL("request did not complete in 60 s");
  }
}

static void kwait_wait(kwait_t* k, uint64_t want) {
  double t0 = now();
  uint64_t v;
  while ((v = *k->flag) == KWAIT_IDLE) {
    progress();
    if (now() - t0 > 60) FAIL("the waiting kernel did not finish in 60 s");
  }
  if (v < want) FAIL("device signal word stayed at %llu, want %llu (the waiting kernel gave up after 10 s)",
                     (unsigned long long)v, (unsigned long long)want);
  CU(cu.streamSynchronize(k->stream));
}

/* wait_sig polls a signal word (host or device) until it reaches want;
 * pause_us between device polls keeps them from taking copy-engine turns
 * from the transfer being timed (0 for latency). */
static void wait_sig(volatile uint64_t* host, CUdeviceptr dev, uint64_t want, int pause_us) {
  double t0 = now();
  while ((host ? *host : dev_word(dev)) < want) {
    progress();
    if (now() - t0 > 60) FAIL("signal did not reach %llu in 60 s", (unsigned long long)want);
    if (!host && pause_us) usleep(pause_us);
  }
}

/* bench is what a ping-pong needs of a rank's set-up (ranks). */
typedef struct {
  const ncclRma_v15_t* t;
  void *coll, *rma;
  int fd, pings, rank;
  bool kern;
  kwait_t* kw;
  size_t pb;
  void *mdsrc, *mddst, *mhsrc, *mhdst, *mdsig, *mhsig;
  CUdeviceptr dsig;
  uint64_t* hsig;
} bench;

/* ping runs the signal ping-pong k (P_SIG_HOST_US or P_SIG_DEV_US) and
 * returns the one-way time in microseconds. */
static double ping(const bench* b, int k) {
  const ncclRma_v15_t* t = b->t;
  void *coll = b->coll, *rma = b->rma;
  int fd = b->fd, pings = b->pings, rank = b->rank;
  bool kern = b->kern;
  kwait_t* kwp = b->kw;
  size_t pb = b->pb;
  void *mdsrc = b->mdsrc, *mddst = b->mddst, *mhsrc = b->mhsrc, *mhdst = b->mhdst, *mdsig = b->mdsig, *mhsig = b->mhsig;
  CUdeviceptr dsig = b->dsig;
  uint64_t* hsig = b->hsig;
  void* sig = k == P_SIG_DEV_US ? mdsig : mhsig;
  bool kdev = kern && k == P_SIG_DEV_US;
  sync_peer(fd);
  double t0 = 0;
  if (kdev && rank == 1) kwait_launch(kwp, dsig + 8, 1);
  for (int i = 0; i < pings + 10; i++) {
    if (i == 10) t0 = now(); /* after warm-up */
    uint64_t want = (uint64_t)i + 1;
    if (kdev && rank == 0) kwait_launch(kwp, dsig + 8, want);
    if (rank == 1) {
      if (kdev) kwait_wait(kwp, want);
      else wait_sig(k == P_SIG_DEV_US ? NULL : (volatile uint64_t*)&hsig[1], dsig + 8, want, 0);
      if (kdev && i + 1 < pings + 10) kwait_launch(kwp, dsig + 8, want + 1);
    }
    void* req;
    void* psrc = pb ? (k == P_SIG_DEV_US ? mdsrc : mhsrc) : NULL;
    void* pdst = pb ? (k == P_SIG_DEV_US ? mddst : mhdst) : NULL;
    NC(t->iputSignal(rma, 0, 0, psrc, pb, 0, pdst, 1 - rank, 8, sig, 1, NCCL_NET_SIGNAL_OP_ADD, true, 0, &req));
    if (req) wait_done(t, coll, req);
    if (rank == 0) {
      if (kdev) kwait_wait(kwp, want);
      else wait_sig(k == P_SIG_DEV_US ? NULL : (volatile uint64_t*)&hsig[1], dsig + 8, want, 0);
    }
  }
  return (now() - t0) / pings / 2 * 1e6;
}

static void ranks(const char* lib, size_t size, int iters, int pings, int rank, int fd, int out) {
  static char name[32];
  snprintf(name, sizeof name, "rank %d", rank);
  who = name;
  /* Under Yama ptrace_scope=1 sibling processes may not process_vm_writev
   * each other: allow it, so that "intranode" measures that path. */
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  cuda_open();
  const ncclRma_v15_t* t = open_plugin(lib);
  gpu_rank_t g;
  gpu_rank_connect(t, logger, rank, fd, true, &g);
  void *coll = g.coll, *rma = g.rma;
  if (!getenv("BENCH_PROGRESS") || atoi(getenv("BENCH_PROGRESS"))) prog_t = t, prog_rma = rma;

  CUdeviceptr dsrc, ddst, dsig;
  /* BENCH_VMM=1: the buffers are cuMem mappings, as NCCL's ncclMemAlloc
   * windows are, so the plugin copies them in its own context (and, with
   * NCCL_RMA_WASM_DEVICE_AGENT=1, through its device agent). */
  bool vmm_bufs = getenv("BENCH_VMM") && atoi(getenv("BENCH_VMM"));
  if (vmm_bufs && !vmm_open()) FAIL("BENCH_VMM: the driver lacks the VMM calls");
  if (vmm_bufs) {
    CU(vmm_alloc(size, &dsrc));
    CU(vmm_alloc(size, &ddst));
    CU(vmm_alloc(2 << 20, &dsig));
    if (rank == 0) printf("BUFFERS cuMem mappings (BENCH_VMM=1)\n");
  } else {
    CU(cu.memAlloc(&dsrc, size));
    CU(cu.memAlloc(&ddst, size));
    /* 2 MiB: cuMemAlloc aligns it to its size, so the signal words' 64
     * KiB GPU page lies inside it and GDRCopy (when present) can map it. */
    CU(cu.memAlloc(&dsig, 2 << 20));
  }
  uint64_t zero[2] = {0, 0};
  CU(htod_done(dsig, zero, 16));
  char* hsrc = malloc(size);
  char* hdst = malloc(size);
  uint64_t* hsig = calloc(2, 8);
  memset(hsrc, rank + 1, size);
  memset(hdst, 0, size);
  CU(htod_done(dsrc, hsrc, size));
  void *mdsrc, *mddst, *mdsig, *mhsrc, *mhdst, *mhsig;
  NC(t->regMrSym(coll, (void*)dsrc, size, NCCL_PTR_CUDA, 0, &mdsrc));
  NC(t->regMrSym(coll, (void*)ddst, size, NCCL_PTR_CUDA, 0, &mddst));
  /* BENCH_SIG_NEVER_RESET=1 registers the device signal words as NCCL's
   * GIN proxy does: the plugin writes them from a host shadow. */
  int dsigflags = NCCL_NET_MR_FLAG_FORCE_SO;
  if (getenv("BENCH_SIG_NEVER_RESET") && atoi(getenv("BENCH_SIG_NEVER_RESET"))) dsigflags |= NCCL_NET_MR_FLAG_SIGNAL_NEVER_RESET;
  NC(t->regMrSym(coll, (void*)dsig, 16, NCCL_PTR_CUDA, dsigflags, &mdsig));
  NC(t->regMrSym(coll, hsrc, size, NCCL_PTR_HOST, 0, &mhsrc));
  NC(t->regMrSym(coll, hdst, size, NCCL_PTR_HOST, 0, &mhdst));
  NC(t->regMrSym(coll, hsig, 16, NCCL_PTR_HOST, NCCL_NET_MR_FLAG_FORCE_SO, &mhsig));
  sync_peer(fd);

  /* Signal latency: ping-pong of empty put-with-signals on word 1. With
   * the kernel waiter, each side's kernel is launched before the signal
   * it waits for can arrive (rank 0's before its own put). */
  kwait_t kw;
  bool kern = kwait_open(&kw);
  /* BENCH_PING_BYTES=n: each ping carries an n-byte payload (device to
   * device for the device word, host to host for the host word), as a
   * GIN put with signal does: the small-operation latency. */
  size_t pb = getenv("BENCH_PING_BYTES") ? strtoull(getenv("BENCH_PING_BYTES"), NULL, 0) : 0;
  if (pb > size) pb = size;
  /* BENCH_PING_FIRST=1: the device ping-pong first, before any put the
   * device agent cannot carry (NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL
   * ends its own signal adds to a peer at the first such put). */
  bool ping_first = getenv("BENCH_PING_FIRST") && atoi(getenv("BENCH_PING_FIRST"));
  double res[NPUT];
  if (ping_first) {
    bench b0 = {t, coll, rma, fd, pings, rank, kern, &kw, pb, mdsrc, mddst, mhsrc, mhdst, mdsig, mhsig, dsig, hsig};
    res[P_SIG_DEV_US] = ping(&b0, P_SIG_DEV_US);
  }
  double tm[64];
  if (iters > 62) iters = 62;
  /* Puts: rank 0 to rank 1, signal word 0; two warm-up rounds (connections,
   * pinned staging allocation). */
  for (int k = P_HOST; k <= P_DEV; k++) {
    void *src = k == P_DEV ? mdsrc : mhsrc, *dst = k == P_DEV ? mddst : mhdst, *sig = k == P_DEV ? mdsig : mhsig;
    for (int i = 0; i < iters + 2; i++) {
      sync_peer(fd);
      if (rank == 0) {
        double t0 = now();
        void* req;
        NC(t->iputSignal(rma, 0, 0, src, size, 0, dst, 1, 0, sig, 1, NCCL_NET_SIGNAL_OP_ADD, true, 0, &req));
        wait_done(t, coll, req);
        char c;
        if (read(fd, &c, 1) != 1) FAIL("peer died");
        if (i >= 2) tm[i - 2] = now() - t0;
      } else {
        /* Each loop has its own signal word, counting from 0. */
        wait_sig(k == P_DEV ? NULL : (volatile uint64_t*)&hsig[0], dsig, (uint64_t)i + 1, 20);
        char c = 1;
        if (write(fd, &c, 1) != 1) FAIL("peer died");
      }
    }
    if (rank == 0) res[k] = size / median(tm, iters) / 1e9;
  }
  /* Verify the last device put byte for byte. */
  if (rank == 1) {
    CU(cu.dtoh(hdst, ddst, size));
    for (size_t i = 0; i < size; i++)
      if (hdst[i] != 1) FAIL("device byte %zu is %d after the device put, want 1", i, hdst[i]);
  }
  bench bb = {t, coll, rma, fd, pings, rank, kern, &kw, pb, mdsrc, mddst, mhsrc, mhdst, mdsig, mhsig, dsig, hsig};
  for (int k = P_SIG_HOST_US; k <= P_SIG_DEV_US; k++)
    if (!(ping_first && k == P_SIG_DEV_US)) res[k] = ping(&bb, k);
  /* A rank's 8-byte put to itself, device to host and host to device:
   * one device copy and its completion seen by test(), no wire (the
   * device agent's round trip when it runs, else a copy engine's). The
   * median of 1000, rank 0 alone. */
  if (rank == 0) {
    static double st[1000];
    for (int k = P_SELF_D2H_US; k <= P_SELF_H2D_US; k++) {
      void *src = k == P_SELF_D2H_US ? mdsrc : mhsrc, *dst = k == P_SELF_D2H_US ? mhdst : mddst;
      for (int i = 0; i < 1010; i++) {
        double t0 = now();
        void* req;
        NC(t->iput(rma, 0, 64, src, 8, 64, dst, 0, 0, &req));
        wait_done(t, coll, req);
        if (i >= 10) st[i - 10] = now() - t0;
      }
      res[k] = median(st, 1000) * 1e6;
    }
    if (hdst[64] != 1) FAIL("the self put from device wrote %d, want 1", hdst[64]);
  }
  if (kern && rank == 0) printf("SIGNAL device words watched by a waiting kernel (BENCH_KERNEL_WAIT=1)\n");
  if (pb && rank == 0) printf("SIGNAL each ping carries a %zu-byte payload (BENCH_PING_BYTES)\n", pb);
  bool bad = false;
  NC(t->queryLastError(rma, &bad));
  if (bad) FAIL("queryLastError reports an error");
  sync_peer(fd);
  gpu_rank_close(t, &g, (void* const[]){mdsrc, mddst, mdsig, mhsrc, mhdst, mhsig}, 6);
  if (rank == 0 && write(out, res, sizeof res) != (ssize_t)sizeof res) FAIL("pipe");
}

static bool reap(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(int argc, char** argv) {
  const char* lib = argc > 1 ? argv[1] : "build/librccl-rma-wasm.so";
  size_t size = argc > 2 ? strtoull(argv[2], NULL, 0) : (size_t)64 << 20;
  int iters = argc > 3 ? atoi(argv[3]) : 10;
  int pings = argc > 4 ? atoi(argv[4]) : 2000;
  if (iters < 1) iters = 1;
  setvbuf(stdout, NULL, _IOLBF, 0);
  /* CUDA does not survive fork: the parent never touches it. Each child
   * gets its own pipe, whose write end the parent closes, so that a child
   * that dies ends the parent's read. */
  int pp[2];
  if (pipe(pp)) return 1;
  pid_t pid = fork();
  if (pid == 0) {
    close(pp[0]);
    bounds(size, iters, pp[1]);
    _exit(0);
  }
  close(pp[1]);
  double b[NBOUNDS];
  ssize_t got = read(pp[0], b, sizeof b);
  if (!reap(pid) || got != (ssize_t)sizeof b) FAIL("the bounds child failed");
  static const char* modes[2] = {"tcp", "intranode"};
  double r[2][NPUT];
  for (int m = 0; m < 2; m++) {
    setenv("NCCL_RMA_WASM_INTRANODE", m ? "1" : "0", 1);
    int sp[2];
    close(pp[0]);
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp) || pipe(pp)) return 1;
    pid_t kids[2];
    for (int rank = 0; rank < 2; rank++) {
      kids[rank] = fork();
      if (kids[rank] == 0) {
        close(pp[0]);
        close(sp[1 - rank]);
        ranks(lib, size, iters, pings, rank, sp[rank], pp[1]);
        _exit(0);
      }
    }
    close(sp[0]);
    close(sp[1]);
    close(pp[1]);
    got = read(pp[0], r[m], sizeof r[m]);
    bool ok0 = reap(kids[0]), ok1 = reap(kids[1]);
    if (!ok0 || !ok1 || got != (ssize_t)sizeof r[m]) FAIL("mode %s: a rank failed", modes[m]);
    printf("PUT    %-9s host->host   %7.2f GB/s  (%zu bytes, put+signal until the target sees it, median of %d)\n",
           modes[m], r[m][P_HOST], size, iters);
    printf("PUT    %-9s device->dev  %7.2f GB/s\n", modes[m], r[m][P_DEV]);
    printf("SIGNAL %-9s host word %7.1f us   device word %7.1f us  (one way, half a ping-pong)\n", modes[m],
           r[m][P_SIG_HOST_US], r[m][P_SIG_DEV_US]);
    printf("SELF   %-9s 8 B device->host %6.1f us   host->device %6.1f us  (a put to itself until test() sees it, median)\n",
           modes[m], r[m][P_SELF_D2H_US], r[m][P_SELF_H2D_US]);
  }
  bool pass = true;
  for (int m = 0; m < 2; m++) {
    /* Each transport's own host put is its wire (see the top comment). */
    double wire = r[m][P_HOST];
    double bound = b[B_D2H_PIN] < b[B_H2D_PIN] ? b[B_D2H_PIN] : b[B_H2D_PIN];
    if (wire < bound) bound = wire;
    double ratio = r[m][P_DEV] / bound;
    printf("RATIO  %-9s device put %.2f GB/s / bound %.2f GB/s (min of d2h %.2f, %s wire %.2f, h2d %.2f) = %.2f "
           "(target >= 0.80)%s\n",
           modes[m], r[m][P_DEV], bound, b[B_D2H_PIN], modes[m], wire, b[B_H2D_PIN], ratio, ratio >= 0.8 ? "" : "  BELOW");
    if (ratio < 0.8) pass = false;
  }
  printf("RESULT %s staging_bench size=%zu chunk=%zu KiB lanes=%s\n", pass ? "PASS" : "BELOW-TARGET", size,
         chunk_bytes() >> 10, getenv("NCCL_RMA_WASM_LANES") ? getenv("NCCL_RMA_WASM_LANES") : "default");
  return pass ? 0 : 1;
}
