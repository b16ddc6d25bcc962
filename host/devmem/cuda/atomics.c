/* Signal words on the context's stream: stream writes, and atomic adds
 * as a stream memory operation (verified at the context's first use) or
 * else a one-thread kernel (atomics.ptx). The device agent, where it runs,
 * takes both (agent.c). */
#include "cuda_internal.h"

/* The atomic add (atomics.ptx): one thread adds v to *p with atom.global.add.u64 (sm_50
 * PTX, which the driver compiles for any later GPU). membar.sys first
 * (harmless: the stream already orders the kernel after the copies queued
 * before it). */
char rmacu_add64_ptx[1024]; /* atomics.ptx, NUL-terminated (ptx.go) */

/* Stream atomics. CUDA 13.1 added an atomic reduction to the stream memory
 * operations: an add queued on the stream like a stream write, run without
 * a kernel (so no SM: a kernel holding every SM while it spins on the
 * signal cannot starve it) and without a host wait. cuda_internal.h declares
 * the driver's types from the documented layout, and the data-type enum's
 * values are not among the documented facts it was written from, so
 * rmacu_reduce_probe verifies one before the data path uses it: at the
 * context's first use (registration, through staging.Prewarm), each
 * candidate is tried on a scratch pair of words in the same batch shape
 * the data path queues (a system-scope barrier, then the add), and kept
 * only if two adds carried across bit 32 exactly as a 64-bit add does and
 * left the next word alone. A driver that refuses every candidate, or
 * computes anything else, leaves the other paths in place (INFO line).
 * Candidates: the unsigned and 64-bit scalar bits of CUatomicOperation-
 * Capability (2 | 16), as the operation enum reuses CUatomicOperation's
 * values, then the first two of a plain enumeration. */
static const uint32_t reduceCandidates[] = {18, 1, 2};
static char reduceNote[240] = "not probed (no CUDA context used yet)";

/* streamAtomic: probe and use stream atomics (NCCL_RMA_WASM_STREAM_ATOMIC). */
static int streamAtomic = 1;

void rmaw_cuda_stream_atomic(int on) { streamAtomic = on; }

static void reduce_fill(memop* ops, uint32_t ty, CUdeviceptr w, uint64_t v) {
  memset(ops, 0, 2 * sizeof *ops);
  ops[0].reduce.operation = MEMOP_BARRIER; /* flags 0: system scope */
  ops[1].reduce.operation = MEMOP_ATOMIC_REDUCTION;
  ops[1].reduce.reductionOp = REDUCTION_OP_ADD;
  ops[1].reduce.dataType = ty;
  ops[1].reduce.address = (uint64_t)w;
  ops[1].reduce.value = v;
}

/* rmacu_reduce_probe sets e->reduceTy (under rmacu_mu, ctx current). The scratch words
 * are never freed: cuMemFree can synchronize the device, and a kernel of
 * the application may be waiting for a signal. */
void rmacu_reduce_probe(ctxstream* e, int have_dev, CUdevice dev) {
  int v = 0;
  CUresult r = 0;
  if (!streamAtomic) {
    snprintf(reduceNote, sizeof reduceNote, "off (NCCL_RMA_WASM_STREAM_ATOMIC=0)");
    return;
  }
  if (!rmacu_cu.batchMemOp || !rmacu_cu.memAlloc) {
    snprintf(reduceNote, sizeof reduceNote, "the driver has no cuStreamBatchMemOp_v2");
    return;
  }
  if (!have_dev || (r = rmacu_cu.deviceGetAttribute(&v, ATTR_ATOMIC_REDUCTION, dev)) != 0 || !v) {
    snprintf(reduceNote, sizeof reduceNote, "the device reports no stream atomic reductions (attribute %d: %d, status %d)",
             ATTR_ATOMIC_REDUCTION, v, r);
    return;
  }
  CUdeviceptr w = 0;
  if ((r = rmacu_cu.memAlloc(&w, 32)) != 0) { /* one 32-byte sector; two words used */
    snprintf(reduceNote, sizeof reduceNote, "no scratch word to verify them on (cuMemAlloc: %s)", rmacu_errstr(r));
    return;
  }
  const uint64_t guard = 0x5a5a5a5a5a5a5a5aull, want = 0x300000003ull;
  int n = 0;
  for (size_t i = 0; i < sizeof reduceCandidates / sizeof reduceCandidates[0]; i++) {
    uint32_t ty = reduceCandidates[i];
    uint64_t init[2] = {0xffffffffull, guard}, got[2] = {0, 0};
    memop a[2], b[2];
    reduce_fill(a, ty, w, 1);
    reduce_fill(b, ty, w, 0x200000003ull);
    r = rmacu_cu.htod(w, init, sizeof init, e->stream);
    if (r == 0) r = rmacu_cu.batchMemOp(e->stream, 2, a, 0);
    if (r == 0) r = rmacu_cu.batchMemOp(e->stream, 2, b, 0);
    if (r == 0) r = rmacu_cu.dtoh(got, w, sizeof got, e->stream);
    CUresult rs = rmacu_cu.streamSynchronize(e->stream); /* nothing queued outlives init and got */
    if (r == 0) r = rs;
    if (r == 0 && got[0] == want && got[1] == guard) {
      e->reduceTy = ty;
      snprintf(reduceNote, sizeof reduceNote, "stream atomic adds (cuStreamBatchMemOp_v2, data type %u verified as 64-bit)", ty);
      return;
    }
    n += snprintf(reduceNote + n, n < (int)sizeof reduceNote ? sizeof reduceNote - n : 0, "%stype %u: %s",
                  i ? "; " : "no data type verified as a 64-bit add: ", ty,
                  r ? rmacu_errstr(r) : got[1] != guard ? "wrote past the word" : "not a 64-bit add");
  }
}

/* rmaw_cuda_stream_atomic_note copies what rmacu_reduce_probe found last. */
void rmaw_cuda_stream_atomic_note(char* out, size_t n) {
  pthread_mutex_lock(&rmacu_mu);
  snprintf(out, n, "%s", reduceNote);
  pthread_mutex_unlock(&rmacu_mu);
}

int rmacu_write64(uintptr_t ctx, uint64_t dev, uint64_t v, char* err, size_t errlen) {
  CTX_STREAM(e, "cuStreamWriteValue64");
  if (rmacu_ag_live(e)) {
    if (dev & 7) return rmaw_fail(err, errlen, "signal word %#llx not 8-byte aligned", (unsigned long long)dev);
    return rmacu_ag_submit(e, AG_WRITE, 8, 0, dev, v, err, errlen);
  }
  /* Flags 0: the write is ordered after the stream's earlier work and
   * preceded by a memory barrier. */
  r = rmacu_cu.writeValue64(e->stream, (CUdeviceptr)dev, (unsigned long long)v, 0);
  if (r != 0) return rmaw_fail(err, errlen, "cuStreamWriteValue64: %s", rmacu_errstr(r));
  return 0;
}

int rmacu_add64(uintptr_t ctx, uint64_t dev, uint64_t v, char* err, size_t errlen) {
  CTX_STREAM(e, "atomic add");
  if (rmacu_ag_live(e)) {
    if (dev & 7) return rmaw_fail(err, errlen, "signal word %#llx not 8-byte aligned", (unsigned long long)dev);
    return rmacu_ag_submit(e, AG_ADD, 8, 0, dev, v, err, errlen);
  }
  if (e->reduceTy) {
    memop ops[2];
    reduce_fill(ops, e->reduceTy, (CUdeviceptr)dev, v);
    r = rmacu_cu.batchMemOp(e->stream, 2, ops, 0);
    if (r != 0) return rmaw_fail(err, errlen, "cuStreamBatchMemOp_v2 (atomic add): %s", rmacu_errstr(r));
    return 0;
  }
  if (!__atomic_load_n(&e->add, __ATOMIC_ACQUIRE)) {
    /* Only NCCL_RMA_WASM_DEVICE_ATOMIC=1 gets here: the one place a module
     * is loaded, and the reason that switch is documented as needing no
     * kernel to spin on the signal meanwhile. */
    pthread_mutex_lock(&rmacu_mu);
    void* mod = NULL;
    void* f = e->add;
    if (!f && rmacu_cu.moduleLoadData(&mod, rmacu_add64_ptx) == 0) rmacu_cu.moduleGetFunction(&f, mod, "rmaw_add64");
    if (f) __atomic_store_n(&e->add, f, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&rmacu_mu);
    if (!f) return rmaw_fail(err, errlen, "no atomic-add kernel for this context (cuModuleLoadData of its PTX failed)");
  }
  unsigned long long p = dev, x = v;
  void* args[] = {&p, &x}; /* copied by the launch */
  r = rmacu_cu.launchKernel(e->add, 1, 1, 1, 1, 1, 1, 0, e->stream, args, NULL);
  if (r != 0) return rmaw_fail(err, errlen, "cuLaunchKernel (atomic add): %s", rmacu_errstr(r));
  return 0;
}
