/* cuda_check: two ranks (processes) on one GPU machine drive the plugin the
 * way RCCL's proxies do with device memory: buffers from cuMemAlloc are
 * registered as NCCL_PTR_CUDA, a put with a signal lands in the peer's
 * device memory (the signal word too), and a get reads the peer's device
 * memory. Every byte is checked by copying it back. Then a window of two
 * physical allocations in one VMM reservation, registered with
 * regMrSymDmaBuf, takes a put that straddles both (multiseg). Then, round after
 * round, one rank posts a put and signals from device memory and tears down
 * at once without testing them (destroyContext, deregMrSym, cuMemFree,
 * closeColl, finalize), as NCCL's GIN proxy does after a kernel's last
 * barrier: the other rank must see every byte and signal in its device
 * memory. Needs libcuda.so.1 and a GPU; prints "RESULT PASS" or
 * "RESULT FAIL <why>".
 *
 *   cuda_check [path/to/librccl-rma-wasm.so] [bytes] [teardown rounds]
 */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>

#include "gpu_rank.h"

static int rank;

static void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                   const char* fmt, ...) {
  (void)flags, (void)file, (void)line;
  if (level > 3) return; /* NCCL numbering: up to INFO */
  va_list ap;
  va_start(ap, fmt);
  char buf[1024];
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(stderr, "[rank %d] plugin %d: %s\n", rank, (int)level, buf);
}



static uint8_t pat(int owner, size_t i) { return (uint8_t)(owner * 37 + i * 11 + (i >> 9)); }


/* One teardown round on a fresh communicator: rank `sender` puts `size`
 * bytes of device memory (half plain, half with an ADD signal) and a bare
 * INC signal into the peer's device memory, then tears down at once. */
static void teardown_round(const ncclRma_v15_t* t, size_t size, int fd, int round) {
  int sender = round % 2;
  gpu_rank_t g;
  gpu_rank_connect(t, logger, rank, fd, false, &g);
  void *pctx = g.pctx, *coll = g.coll, *rma = g.rma;
  CUdeviceptr src, dst, sig;
  CU(cu.memAlloc(&src, size));
  CU(cu.memAlloc(&dst, size));
  CU(cu.memAlloc(&sig, 16));
  uint8_t* host = calloc(1, size);
  CU(htod_done(dst, host, size));
  CU(htod_done(sig, host, 16));
  for (size_t i = 0; i < size; i++) host[i] = pat(round + 3, i);
  CU(htod_done(src, host, size));
  void *msrc, *mdst, *msig;
  NC(t->regMrSym(coll, (void*)src, size, NCCL_PTR_CUDA, 0, &msrc));
  NC(t->regMrSym(coll, (void*)dst, size, NCCL_PTR_CUDA, 0, &mdst));
  /* Odd rounds register the signal words as NCCL's GIN proxy does (never
   * reset): the plugin writes them from a host shadow; even rounds take
   * the device atomic (or the read-modify-write). */
  int sigflags = NCCL_NET_MR_FLAG_FORCE_SO | (round % 2 ? NCCL_NET_MR_FLAG_SIGNAL_NEVER_RESET : 0);
  NC(t->regMrSym(coll, (void*)sig, 16, NCCL_PTR_CUDA, sigflags, &msig));
  char b = 1, c;
  xchg(fd, &b, &c, 1);
  size_t half = size / 2;
  if (rank == sender) {
    void *r0, *r1, *r2;
    NC(t->iput(rma, 0, 0, msrc, half, 0, mdst, 1 - rank, 0, &r0));
    NC(t->iputSignal(rma, 0, half, msrc, size - half, half, mdst, 1 - rank, 0, msig, (uint64_t)round + 1,
                     NCCL_NET_SIGNAL_OP_ADD, true, 0, &r1));
    NC(t->iputSignal(rma, 0, 0, NULL, 0, 0, NULL, 1 - rank, 8, msig, 0, NCCL_NET_SIGNAL_OP_INC, true, 0, &r2));
    if (!r0 || !r1 || !r2) FAIL("NULL request");
    NC(t->destroyContext(rma));
    NC(t->deregMrSym(coll, msrc));
    CU(cu.memFree(src)); /* as NCCL frees a window after deregistering it */
  } else {
    time_t t0 = time(NULL);
    uint64_t s[2] = {0, 0};
    while (s[0] != (uint64_t)round + 1 || s[1] != 1) {
      CU(cu.dtoh(s, sig, 16));
      if (time(NULL) - t0 > 30)
        FAIL("teardown round %d: device signals %llu %llu, want %d 1: operations accepted before the "
             "sender's teardown were lost", round, (unsigned long long)s[0], (unsigned long long)s[1],
             round + 1);
    }
    CU(cu.dtoh(host, dst, size));
    for (size_t i = 0; i < size; i++)
      if (host[i] != pat(round + 3, i))
        FAIL("teardown round %d: device byte %zu is %u, want %u", round, i, host[i], pat(round + 3, i));
    bool bad = false;
    NC(t->queryLastError(rma, &bad));
    if (bad) FAIL("teardown round %d: queryLastError reports an error after the peer's goodbye", round);
    NC(t->destroyContext(rma));
    NC(t->deregMrSym(coll, msrc));
  }
  NC(t->deregMrSym(coll, mdst));
  NC(t->deregMrSym(coll, msig));
  NC(t->closeColl(coll));
  NC(t->finalize(pctx));
  if (rank != sender) CU(cu.memFree(src)); /* the sender's went above */
  CU(cu.memFree(dst));
  CU(cu.memFree(sig));
  free(host);
}

/* vmm_open of the CUDA driver only (gpu_rank.c). */
static bool cuda_vmm(void) { return !hip_mode() && vmm_open(); }

/* window_small: small put+signals from window to window (multiseg's
 * window), each followed by a plain 8-byte put and a signal alone. */
static void window_small(const ncclRma_v15_t* t, void* coll, void* rma, int fd, void* mwin, CUdeviceptr base, size_t win,
                         size_t seg, uint8_t* host) {
  /* Small put+signals from window to window, as GIN puts from its own
   * window: 8 B, 4 KiB and 64 KiB, each with an ADD to a word of the
   * second segment, whose bytes must be there once it is seen. One rank
   * puts while the other watches, then the other way, so that no copy of
   * the watcher's own can hold its signal back by luck. (With
   * NCCL_RMA_WASM_INTRANODE_IPC=1 each is one device copy into the mapped
   * window, its signal ordered after it by an event or a host wait.) */
  static const size_t small[] = {8, 4096, 65536};
  char b = 1, c;
  void* req;
  double t0;
  uint64_t v;
  for (size_t i = 0; i < 131072; i++) host[i] = pat(rank + 9, i);
  CU(htod_done(base, host, 131072)); /* our window's first 128 KiB: the source */
  xchg(fd, &b, &c, 1);
  for (int pass = 0; pass < 2; pass++) {
    for (int k = 0; k < 3; k++) {
      size_t doff = 3 * seg / 2 + (size_t)k * 65536;
      if (rank == pass) {
        NC(t->iputSignal(rma, 0, 0, mwin, small[k], doff, mwin, 1 - rank, win - 16, mwin, 1, NCCL_NET_SIGNAL_OP_ADD, true,
                         0, &req));
        wait_req(t, coll, req);
        /* Then a plain put of 8 B and a signal alone (INC), strong: once
         * the watcher sees it, both puts' bytes are there. */
        NC(t->iput(rma, 0, 0, mwin, 8, 3 * seg / 2 + 3 * 65536 + (size_t)k * 8, mwin, 1 - rank, 0, &req));
        wait_req(t, coll, req);
        NC(t->iputSignal(rma, 0, 0, NULL, 0, 0, NULL, 1 - rank, win - 24, mwin, 0, NCCL_NET_SIGNAL_OP_INC, true, 0, &req));
        wait_req(t, coll, req);
        continue;
      }
      t0 = now();
      for (v = 0; v < (uint64_t)k + 1;) {
        CU(cu.dtoh(&v, base + win - 16, 8));
        if (now() - t0 > 60) FAIL("multiseg: small signal %d is %llu", k, (unsigned long long)v);
      }
      CU(cu.dtoh(host + 65536, base + doff, small[k]));
      for (size_t i = 0; i < small[k]; i++)
        if (host[65536 + i] != pat(1 - rank + 9, i))
          FAIL("multiseg: byte %zu of the %zu-byte put+signal is %u once its signal was seen, want %u", i, small[k],
               host[65536 + i], pat(1 - rank + 9, i));
      for (v = 0; v < (uint64_t)k + 1;) {
        CU(cu.dtoh(&v, base + win - 24, 8));
        if (now() - t0 > 60) FAIL("multiseg: small signal alone %d is %llu", k, (unsigned long long)v);
      }
      CU(cu.dtoh(host + 65536, base + 3 * seg / 2 + 3 * 65536 + (size_t)k * 8, 8));
      for (size_t i = 0; i < 8; i++)
        if (host[65536 + i] != pat(1 - rank + 9, i))
          FAIL("multiseg: byte %zu of the 8-byte put before signal alone %d is %u, want %u", i, k, host[65536 + i], pat(1 - rank + 9, i));
    }
    xchg(fd, &b, &c, 1);
  }
  /* Plain 4 KiB puts, each followed at once (not waited for) by a signal
   * alone: the signal must not pass its put however it goes (with the
   * peer inbox's host rows, a signal alone with nothing queued before it
   * is written by the host; here the put's copy is still queued). */
  size_t qoff = 3 * seg / 2 + 3 * 65536 + 64 + 131072; /* after the 128 KiB put's bytes below */
  for (int pass = 0; pass < 2; pass++) {
    for (int k = 0; k < 4; k++) {
      if (rank == pass) {
        void* preq;
        NC(t->iput(rma, 0, (size_t)k * 4096, mwin, 4096, qoff + (size_t)k * 4096, mwin, 1 - rank, 0, &preq));
        NC(t->iputSignal(rma, 0, 0, NULL, 0, 0, NULL, 1 - rank, win - 40, mwin, 0, NCCL_NET_SIGNAL_OP_INC, true, 0, &req));
        wait_req(t, coll, preq);
        wait_req(t, coll, req);
      } else {
        t0 = now();
        for (v = 0; v < (uint64_t)k + 1;) {
          CU(cu.dtoh(&v, base + win - 40, 8));
          if (now() - t0 > 60) FAIL("multiseg: the signal after 4 KiB put %d is %llu", k, (unsigned long long)v);
        }
        CU(cu.dtoh(host + 131072, base + qoff + (size_t)k * 4096, 4096));
        for (size_t i = 0; i < 4096; i++)
          if (host[131072 + i] != pat(1 - rank + 9, (size_t)k * 4096 + i))
            FAIL("multiseg: byte %zu of 4 KiB put %d is %u once the signal posted right after it was seen, want %u", i, k,
                 host[131072 + i], pat(1 - rank + 9, (size_t)k * 4096 + i));
      }
      xchg(fd, &b, &c, 1);
    }
  }
  /* A put larger than the device agent copies, landed by the target, then
   * a signal alone: the signal must not pass the put (with
   * NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL the put ends the agent's adds). */
  size_t boff = 3 * seg / 2 + 3 * 65536 + 64;
  for (int pass = 0; pass < 2; pass++) {
    if (rank == pass) {
      void* preq;
      NC(t->iput(rma, 0, 0, mwin, 131072, boff, mwin, 1 - rank, 0, &preq));
      NC(t->iputSignal(rma, 0, 0, NULL, 0, 0, NULL, 1 - rank, win - 32, mwin, 0, NCCL_NET_SIGNAL_OP_INC, true, 0, &req));
      wait_req(t, coll, preq);
      wait_req(t, coll, req);
    } else {
      t0 = now();
      for (v = 0; v < 1;) {
        CU(cu.dtoh(&v, base + win - 32, 8));
        if (now() - t0 > 60) FAIL("multiseg: the signal after the 128 KiB put is %llu", (unsigned long long)v);
      }
      CU(cu.dtoh(host + 131072, base + boff, 131072));
      for (size_t i = 0; i < 131072; i++)
        if (host[131072 + i] != pat(1 - rank + 9, i))
          FAIL("multiseg: byte %zu of the 128 KiB put is %u once the signal after it was seen, want %u", i, host[131072 + i],
               pat(1 - rank + 9, i));
    }
    xchg(fd, &b, &c, 1);
  }
  /* Every signal once: 3 ADDs of 1 and 3 INCs from the peer, exactly. */
  uint64_t w[2];
  CU(cu.dtoh(w, base + win - 24, 16));
  if (w[0] != 3 || w[1] != 3)
    FAIL("multiseg: after 3 small put+signals and 3 signals alone the words are %llu and %llu, want 3 and 3",
         (unsigned long long)w[1], (unsigned long long)w[0]);
}

/* multiseg: as aws-ofi-nccl's rma_multiseg_signal and NCCL's symmetric
 * windows do, each rank builds one window of two physical allocations
 * mapped back to back in one VMM reservation, registers it with
 * regMrSymDmaBuf (a DMA-BUF fd of the whole range, closed right after, as
 * the caller may), and the peer puts a payload that straddles the two
 * segments with an ADD signal whose word lies in the second segment. */
static void multiseg(const ncclRma_v15_t* t, void* coll, void* rma, int fd, int direct) {
  if (!cuda_vmm()) {
    printf("[rank %d] multiseg: SKIP (%s)\n", rank, hip_mode() ? "CUDA only" : "the driver lacks the VMM calls");
    return;
  }
  /* POSIX fds, as NCCL's ncclMemAlloc asks for: the plugin maps such
   * windows into the other ranks of the host. */
  memProp prop = {.type = 1, .requestedHandleTypes = 1, .locType = 1, .locId = 0, .gpuDirectRDMACapable = 1};
  size_t gran = 0;
  CU(vmm.granularity(&gran, &prop, 0));
  size_t seg = gran < (2 << 20) ? (size_t)2 << 20 : gran, win = 2 * seg;
  CUdeviceptr base;
  CUmemHandle h[2];
  CU(vmm.reserve(&base, win, seg, 0, 0));
  for (int i = 0; i < 2; i++) {
    CU(vmm.create(&h[i], seg, &prop, 0));
    CU(vmm.map(base + (size_t)i * seg, seg, 0, h[i], 0));
  }
  memAccess acc = {1, 0, 3};
  CU(vmm.setAccess(base, win, &acc, 1));
  uint8_t* host = calloc(1, win);
  CU(htod_done(base, host, win));
  int dfd = -1;
  const char* how = "regMrSymDmaBuf";
  if (!vmm.rangeHandle || vmm.rangeHandle(&dfd, base, win, 1 /* DMA_BUF_FD */, 0) != 0 || dfd < 0) {
    dfd = -1;
    how = "regMrSym (this driver exports no DMA-BUF for the range)";
  }
  void* mwin;
  if (dfd >= 0) {
    NC(t->regMrSymDmaBuf(coll, (void*)base, win, NCCL_PTR_CUDA, 0, dfd, 0, &mwin));
    close(dfd); /* the plugin must not need it any more */
  } else {
    NC(t->regMrSym(coll, (void*)base, win, NCCL_PTR_CUDA, 0, &mwin));
  }
  /* The source: a plain allocation holding the pattern. */
  size_t n = seg, off = seg / 2, sigoff = win - 8;
  CUdeviceptr src;
  CU(cu.memAlloc(&src, n));
  for (size_t i = 0; i < n; i++) host[i] = pat(rank + 5, i);
  CU(htod_done(src, host, n));
  void* msrc;
  NC(t->regMrSym(coll, (void*)src, n, NCCL_PTR_CUDA, 0, &msrc));
  char b = 1, c;
  xchg(fd, &b, &c, 1);
  /* With NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL the first put to a peer
   * that the agent cannot carry ends the path: the small ones go first. */
  if (direct) window_small(t, coll, rma, fd, mwin, base, win, seg, host);
  void* req;
  NC(t->iputSignal(rma, 0, 0, msrc, n, off, mwin, 1 - rank, sigoff, mwin, 5, NCCL_NET_SIGNAL_OP_ADD, true, 0, &req));
  wait_req(t, coll, req);
  double t0 = now();
  uint64_t v = 0;
  while (v != 5) {
    CU(cu.dtoh(&v, base + sigoff, 8));
    if (now() - t0 > 60) FAIL("multiseg: signal word in the second segment is %llu, want 5", (unsigned long long)v);
  }
  CU(cu.dtoh(host, base, win));
  for (size_t i = 0; i < n; i++)
    if (host[off + i] != pat(1 - rank + 5, i))
      FAIL("multiseg: window byte %zu (segment %zu) is %u, want %u", off + i, (off + i) / seg, host[off + i],
           pat(1 - rank + 5, i));
  for (size_t i = direct ? 131072 : 0; i < off; i++) /* (direct: our source first) */
    if (host[i]) FAIL("multiseg: byte %zu before the put's range was written", i);
  if (!direct) window_small(t, coll, rma, fd, mwin, base, win, seg, host);
  xchg(fd, &b, &c, 1);
  NC(t->deregMrSym(coll, msrc));
  NC(t->deregMrSym(coll, mwin));
  CU(cu.memFree(src));
  CU(vmm.unmap(base, win));
  for (int i = 0; i < 2; i++) CU(vmm.release(h[i]));
  CU(vmm.addressFree(base, win));
  free(host);
  printf("[rank %d] multiseg: %zu-byte put+signal across the 2 segments of a VMM window registered with %s, "
         "verified; 8 B to 64 KiB put+signals window to window, verified\n", rank, n, how);
}

/* Small device put+signals as GIN sends them: both ranks put 8 B to
 * 64 KiB payloads into each other's device memory, each with an ADD to a
 * signal word, never-reset (the shadow's stream writes) or plain (the
 * stream atomic where the driver has one); each waits for the signal of
 * every put and then checks its bytes at once. The plugin copies such
 * payloads asynchronously (NCCL_RMA_WASM_ASYNC_COPY_KB): a signal written
 * or added before its payload's copy ran (FAKECUDA_ASYNC_US delays every
 * stream's work) shows here as a wrong byte. */
static void small_ops(const ncclRma_v15_t* t, void* coll, void* rma, int fd, int never_reset) {
  static const size_t sizes[] = {8, 64, 4096, 65536};
  enum { ITERS = 12 };
  size_t total = 0;
  for (int k = 0; k < 4; k++) total += sizes[k] * ITERS;
  CUdeviceptr src, dst, sig;
  CU(cu.memAlloc(&src, total));
  CU(cu.memAlloc(&dst, total));
  CU(cu.memAlloc(&sig, 8));
  uint8_t* host = malloc(total);
  for (size_t i = 0; i < total; i++) host[i] = pat(rank + 11, i);
  CU(htod_done(src, host, total));
  memset(host, 0, total);
  CU(htod_done(dst, host, total));
  CU(htod_done(sig, host, 8));
  void *msrc, *mdst, *msig;
  NC(t->regMrSym(coll, (void*)src, total, NCCL_PTR_CUDA, 0, &msrc));
  NC(t->regMrSym(coll, (void*)dst, total, NCCL_PTR_CUDA, 0, &mdst));
  NC(t->regMrSym(coll, (void*)sig, 8, NCCL_PTR_CUDA,
                 NCCL_NET_MR_FLAG_FORCE_SO | (never_reset ? NCCL_NET_MR_FLAG_SIGNAL_NEVER_RESET : 0), &msig));
  char b = 1, c;
  xchg(fd, &b, &c, 1);
  size_t off = 0;
  uint64_t n = 0;
  for (int k = 0; k < 4; k++)
    for (int it = 0; it < ITERS; it++, n++) {
      size_t sz = sizes[k];
      void* req;
      NC(t->iputSignal(rma, 0, off, msrc, sz, off, mdst, 1 - rank, 0, msig, 1, NCCL_NET_SIGNAL_OP_ADD, true, 0, &req));
      if (!req) FAIL("NULL request");
      wait_req(t, coll, req);
      time_t t0 = time(NULL);
      uint64_t s = 0;
      while (s != n + 1) {
        CU(cu.dtoh(&s, sig, 8));
        if (s > n + 1 || time(NULL) - t0 > 30) FAIL("small put %llu of %zu bytes: signal %llu", (unsigned long long)n, sz, (unsigned long long)s);
      }
      CU(cu.dtoh(host, dst + off, sz));
      for (size_t i = 0; i < sz; i++)
        if (host[i] != pat(1 - rank + 11, off + i))
          FAIL("small put %llu of %zu bytes: byte %zu is %u once its signal is seen, want %u", (unsigned long long)n, sz, i,
               host[i], pat(1 - rank + 11, off + i));
      xchg(fd, &b, &c, 1); /* in step: the next signal only after both checked this one */
      off += sz;
    }
  xchg(fd, &b, &c, 1);
  NC(t->deregMrSym(coll, msrc));
  NC(t->deregMrSym(coll, mdst));
  NC(t->deregMrSym(coll, msig));
  CU(cu.memFree(src));
  CU(cu.memFree(dst));
  CU(cu.memFree(sig));
  free(host);
  printf("[rank %d] small device put+signals: %llu of 8 B to 64 KiB, %s signal, every byte there once its signal was seen\n",
         rank, (unsigned long long)n, never_reset ? "never-reset" : "plain");
}

/* What a host sees must not run ahead of a device payload still being
 * copied: (1) a signal word in host memory, seen once the put's payload
 * is in the peer's device memory; (2) a flush as NCCL's RMA proxy makes
 * one, a loopback put of 8 bytes into a FORCE_SO device buffer, which
 * completes only
 * after the puts the peer's completed puts delivered landed. Each checks
 * the device bytes at once, with FAKECUDA_ASYNC_US holding every stream's
 * work back. */
static void host_view(const ncclRma_v15_t* t, void* coll, void* rma, int fd) {
  enum { N = 8, SZ = 4096 };
  CUdeviceptr src, dst, flush;
  CU(cu.memAlloc(&src, N * SZ));
  CU(cu.memAlloc(&dst, 2 * N * SZ));
  CU(cu.memAlloc(&flush, 16));
  uint8_t* host = malloc(2 * N * SZ);
  for (size_t i = 0; i < N * SZ; i++) host[i] = pat(rank + 21, i);
  CU(htod_done(src, host, N * SZ));
  memset(host, 0, 2 * N * SZ);
  CU(htod_done(dst, host, 2 * N * SZ));
  CU(htod_done(flush, host, 16));
  volatile uint64_t* hsig = calloc(1, 8);
  void *msrc, *mdst, *mflush, *mhsig;
  NC(t->regMrSym(coll, (void*)src, N * SZ, NCCL_PTR_CUDA, 0, &msrc));
  NC(t->regMrSym(coll, (void*)dst, 2 * N * SZ, NCCL_PTR_CUDA, 0, &mdst));
  NC(t->regMrSym(coll, (void*)flush, 16, NCCL_PTR_CUDA, NCCL_NET_MR_FLAG_FORCE_SO, &mflush));
  NC(t->regMrSym(coll, (void*)hsig, 8, NCCL_PTR_HOST, NCCL_NET_MR_FLAG_FORCE_SO, &mhsig));
  char b = 1, c;
  xchg(fd, &b, &c, 1);
  for (int k = 0; k < N; k++) {
    size_t off = (size_t)k * SZ;
    void* req;
    NC(t->iputSignal(rma, 0, off, msrc, SZ, off, mdst, 1 - rank, 0, mhsig, 1, NCCL_NET_SIGNAL_OP_ADD, true, 0, &req));
    wait_req(t, coll, req);
    time_t t0 = time(NULL);
    while (*hsig != (uint64_t)k + 1)
      if (time(NULL) - t0 > 30) FAIL("host signal %llu, want %d", (unsigned long long)*hsig, k + 1);
    CU(cu.dtoh(host, dst + off, SZ));
    for (size_t i = 0; i < SZ; i++)
      if (host[i] != pat(1 - rank + 21, off + i))
        FAIL("put %d: device byte %zu is %u once the host signal is seen, want %u", k, i, host[i], pat(1 - rank + 21, off + i));
    xchg(fd, &b, &c, 1);
  }
  /* Plain puts into the second half, 512 bytes each (64 queued copies
   * for the fake's streams to hold back), all posted, then completed,
   * then the peer is told. */
  void* preq[N * SZ / 512];
  for (int k = 0; k < N * SZ / 512; k++)
    NC(t->iput(rma, 0, (size_t)k * 512, msrc, 512, N * SZ + (size_t)k * 512, mdst, 1 - rank, 0, &preq[k]));
  for (int k = 0; k < N * SZ / 512; k++) wait_req(t, coll, preq[k]);
  xchg(fd, &b, &c, 1);
  /* The flush put's source is host memory here, so that no copy of ours
   * from the device (queued behind the peer's on the same stream) waits
   * for them in its stead: only the FORCE_SO target makes it wait. */
  void* req;
  NC(t->iput(rma, 0, 0, mhsig, 8, 8, mflush, rank, 0, &req));
  wait_req(t, coll, req);
  CU(cu.dtoh(host, dst + N * SZ, N * SZ));
  for (size_t i = 0; i < (size_t)N * SZ; i++)
    if (host[i] != pat(1 - rank + 21, i))
      FAIL("device byte %zu of the peer's completed puts is %u after the loopback flush, want %u", i, host[i], pat(1 - rank + 21, i));
  xchg(fd, &b, &c, 1);
  NC(t->deregMrSym(coll, msrc));
  NC(t->deregMrSym(coll, mdst));
  NC(t->deregMrSym(coll, mflush));
  NC(t->deregMrSym(coll, mhsig));
  CU(cu.memFree(src));
  CU(cu.memFree(dst));
  CU(cu.memFree(flush));
  free((void*)hsig);
  free(host);
  printf("[rank %d] host view: device payloads there once a host signal is seen, and after a loopback flush put\n", rank);
}

static int run(const char* lib, size_t size, int rounds, int fd) {
  static char name[16];
  snprintf(name, sizeof name, "rank %d", rank);
  who = name;
  int dev = device_open(rank);

  const ncclRma_v15_t* t = open_plugin(lib);
  gpu_rank_t g;
  gpu_rank_connect(t, logger, rank, fd, true, &g);
  void *coll = g.coll, *rma = g.rma;

  CUdeviceptr src, dst, sig, get;
  CU(cu.memAlloc(&src, size));
  CU(cu.memAlloc(&dst, 2 * size));
  CU(cu.memAlloc(&sig, 16));
  CU(cu.memAlloc(&get, size));
  uint8_t* host = malloc(2 * size);
  for (size_t i = 0; i < size; i++) host[i] = pat(rank, i);
  CU(htod_done(src, host, size));
  memset(host, 0, 2 * size);
  CU(htod_done(dst, host, 2 * size));
  CU(htod_done(sig, host, 16));
  CU(htod_done(get, host, size));
  void *msrc, *mdst, *msig, *mget;
  NC(t->regMrSym(coll, (void*)src, size, NCCL_PTR_CUDA, 0, &msrc));
  NC(t->regMrSym(coll, (void*)dst, 2 * size, NCCL_PTR_CUDA, 0, &mdst));
  NC(t->regMrSym(coll, (void*)sig, 16, NCCL_PTR_CUDA, NCCL_NET_MR_FLAG_FORCE_SO, &msig));
  NC(t->regMrSym(coll, (void*)get, size, NCCL_PTR_CUDA, 0, &mget));

  /* NCCL_RMA_WASM_INTRANODE_DIRECT_SIGNAL: the window's small operations
   * first, before any put the device agent cannot carry. */
  int direct = getenv("CUDA_CHECK_DIRECT") != NULL;
  if (direct) multiseg(t, coll, rma, fd, 1);
  /* Put into the peer's device memory with a device signal, and to ourselves. */
  for (int peer = 0; peer < 2; peer++) {
    void* req;
    NC(t->iputSignal(rma, 0, 0, msrc, size, (uint64_t)rank * size, mdst, peer, (uint64_t)rank * 8, msig, 7,
                     NCCL_NET_SIGNAL_OP_ADD, true, 0, &req));
    if (!req) FAIL("NULL request");
    wait_req(t, coll, req);
  }
  time_t t0 = time(NULL);
  uint64_t s[2] = {0, 0};
  while (s[0] != 7 || s[1] != 7) {
    CU(cu.dtoh(s, sig, 16));
    if (time(NULL) - t0 > 60) FAIL("device signals %llu %llu, want 7 7", (unsigned long long)s[0], (unsigned long long)s[1]);
  }
  CU(cu.dtoh(host, dst, 2 * size));
  for (int from = 0; from < 2; from++)
    for (size_t i = 0; i < size; i++)
      if (host[(size_t)from * size + i] != pat(from, i))
        FAIL("device byte %zu from rank %d is %u, want %u", i, from, host[(size_t)from * size + i], pat(from, i));

  /* Get the peer's device source into our device memory. */
  void* req;
  NC(t->iget(rma, 0, 0, msrc, size, 0, mget, 1 - rank, 0, &req));
  wait_req(t, coll, req);
  void* freq;
  NC(t->iflush(rma, 0, msig, 1 - rank, &freq));
  if (freq) wait_req(t, coll, freq);
  CU(cu.dtoh(host, get, size));
  for (size_t i = 0; i < size; i++)
    if (host[i] != pat(1 - rank, i)) FAIL("get byte %zu is %u, want %u", i, host[i], pat(1 - rank, i));
  bool bad = false;
  NC(t->queryLastError(rma, &bad));
  if (bad) FAIL("queryLastError reports an error");

  if (!direct) multiseg(t, coll, rma, fd, 0);
  small_ops(t, coll, rma, fd, 1);
  small_ops(t, coll, rma, fd, 0);
  host_view(t, coll, rma, fd);
  char b = 1, c;
  xchg(fd, &b, &c, 1); /* both done before anyone tears down */
  /* CUDA_CHECK_CHURN=n: n more communicators, one after another, while this
   * one keeps the plugin initialized, each with multiseg's window (its
   * small put+signals first). With the peer inbox each of them must go
   * through it: a row of the peer's inbox belongs to our process, not to
   * one communicator, so communicators that come and go never run out of
   * rows. */
  const char* churn = getenv("CUDA_CHECK_CHURN");
  int nchurn = churn ? atoi(churn) : 0;
  for (int i = 0; i < nchurn; i++) {
    gpu_rank_t g2;
    gpu_rank_connect(t, logger, rank, fd, true, &g2);
    multiseg(t, g2.coll, g2.rma, fd, 1);
    gpu_rank_close(t, &g2, NULL, 0);
  }
  if (nchurn > 0) printf("[rank %d] churn: %d more communicators one after another, every byte and signal verified\n", rank, nchurn);
  gpu_rank_close(t, &g, (void* const[]){msrc, mdst, msig, mget}, 4);
  printf("[rank %d] device memory (%s device %d): %zu-byte put+signal and get verified byte by byte\n", rank,
         hip_mode() ? "HIP" : "CUDA", dev, size);
  for (int r = 0; r < rounds; r++) teardown_round(t, r % 2 ? size : 4096, fd, r);
  if (rounds > 0)
    printf("[rank %d] teardown: %d rounds, the sender tearing down at once, every byte and signal arrived\n",
           rank, rounds);
  return 0;
}

int main(int argc, char** argv) {
  const char* lib = argc > 1 ? argv[1] : "build/librccl-rma-wasm.so";
  size_t size = argc > 2 ? strtoull(argv[2], NULL, 0) : (size_t)3 << 20;
  int rounds = argc > 3 ? atoi(argv[3]) : 20;
  setvbuf(stdout, NULL, _IOLBF, 0);
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp)) return 1;
  pid_t pid = fork();
  if (pid == 0) {
    rank = 1;
    close(sp[0]);
    _exit(run(lib, size, rounds, sp[1]));
  }
  rank = 0;
  close(sp[1]);
  int rc = run(lib, size, rounds, sp[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  if (rc == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0) {
    printf("RESULT PASS cuda_check size=%zu\n", size);
    return 0;
  }
  printf("RESULT FAIL a rank failed (status %d)\n", st);
  return 1;
}
