// agent_probe: the device agent's round trip by itself, beside the driver's
// own ways to the same effect, on one GPU in one process. It speaks the
// agent's ring protocol (host/devmem/cuda/agent.c: a 256-byte header, then
// 128-byte slots; a slot's seq written last with release; done at byte 0)
// to each PTX file named, one kernel at a time, and times from the host:
//
//   nop           a command that does nothing (pickup and publish)
//   copy d2h      64 B from device memory to pinned host memory
//   copy h2d      64 B from pinned host memory to device memory
//   add           an atomic add to a device word
//   copy+add      a fused landing: 64 B from pinned host memory, then an add
//   inline+write  64 B carried in the slot, then a signal write
//   inline+add    8 B carried in the slot, then an add
//   mark+add      an add that first waits for a host word (a peer's mark,
//                 here already there: the wait's own cost, AG_AFTER_MARK)
//   late mark     a mark written 10 us after the agent was asked to wait
//                 for it, timed from the mark to the add done, against the
//                 host seeing the mark and then asking for the add
//   h2d 4K, h2d 64K, d2h 64K   larger copies (64 KiB: the agent's largest
//                 by default), to see how its threads' loads of pinned host
//                 memory add up
//
// and, as the baselines, a 64 B cuMemcpyDtoHAsync + event polled with
// cuEventQuery, a 64 KiB cuMemcpyHtoDAsync + event, and a
// cuStreamWriteValue64 to a host word polled by the host. Each kernel runs
// started four ways (flags 0-3: inline bytes read or not, a slot read in
// one request or two). Medians (p10, p90) of ITERS each, in microseconds. Built and run by
// test/gpu/agent_probe.sh on the GPU machine (nvcc, -lcuda).
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <vector>

#define PROBE_TAG "PROBE"
#include "probe_common.h"

static const int SLOTS = 1024, HDR = 256, SLOT = 128;

static void report(const char* variant, const char* what, std::vector<double>& v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  printf("PROBE %-28s %-10s p50 %7.2f us  p10 %7.2f  p90 %7.2f  (n=%zu)\n", variant, what, v[n / 2], v[n / 10],
         v[n * 9 / 10], n);
}

struct ring {
  volatile uint64_t* mem;
  CUdeviceptr dev;
  uint64_t seq;
};

static volatile uint64_t* slot(ring& r, uint64_t s) { return r.mem + (HDR + (s & (SLOTS - 1)) * SLOT) / 8; }

// checkWords: how many of a slot's words its check word covers (16 when
// the kernel reads inline bytes, else 8); set per kernel run below.
static int checkWords = 8;

// check is the slot's check word (host/devmem/cuda/agent.c, ag_check): the
// one-read kernel (flags bit 1) takes a slot only when it matches.
static uint64_t check(volatile uint64_t* sl, uint64_t s) {
  uint64_t h = 0;
  for (int j = 0; j < checkWords; j++) {
    uint64_t x = (j == 0 ? s : j == 1 ? 0 : sl[j]) ^ (uint64_t)j * 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    h ^= x ^ (x >> 31);
  }
  return h;
}

// put writes command s and returns it.
static uint64_t put(ring& r, uint64_t kind, uint64_t n, uint64_t src, uint64_t dst, uint64_t val, uint64_t sig = 0,
                    const void* inl = nullptr) {
  uint64_t s = ++r.seq;
  volatile uint64_t* sl = slot(r, s);
  sl[2] = kind;
  sl[3] = n;
  sl[4] = src;
  sl[5] = dst;
  sl[6] = val;
  sl[7] = sig;
  if (inl) memcpy((void*)(sl + 8), inl, n);
  sl[1] = check(sl, s);
  __atomic_store_n(&sl[0], s, __ATOMIC_RELEASE);
  return s;
}

static bool wait_done(ring& r, uint64_t s) {
  double t0 = now_us();
  while (__atomic_load_n(&r.mem[0], __ATOMIC_ACQUIRE) < s)
    if (now_us() - t0 > 2e6) return false;
  return true;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: agent_probe ITERS PTX...\n");
    return 2;
  }
  int iters = atoi(argv[1]);
  probe_context();
  // Every module is loaded before any agent runs: a load waits for a
  // resident kernel.
  int nv = argc - 2;
  std::vector<CUfunction> fns(nv);
  for (int i = 0; i < nv; i++) {
    FILE* f = fopen(argv[2 + i], "rb");
    if (!f) {
      fprintf(stderr, "PROBE FAIL open %s\n", argv[2 + i]);
      return 1;
    }
    std::vector<char> ptx(1 << 16);
    size_t k = fread(ptx.data(), 1, ptx.size() - 1, f);
    fclose(f);
    ptx[k] = 0;
    CUmodule m;
    CK(cuModuleLoadData(&m, ptx.data()));
    CK(cuModuleGetFunction(&fns[i], m, "rmaw_agent"));
  }
  void* hp;
  CK(cuMemHostAlloc(&hp, HDR + SLOTS * SLOT, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  ring r;
  r.mem = (volatile uint64_t*)hp;
  CK(cuMemHostGetDevicePointer(&r.dev, hp, 0));
  void* hbuf;
  CK(cuMemHostAlloc(&hbuf, 4096, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  CUdeviceptr hbufDev;
  CK(cuMemHostGetDevicePointer(&hbufDev, hbuf, 0));
  CUdeviceptr dbuf;
  CK(cuMemAlloc(&dbuf, 4096));
  CK(cuMemsetD8(dbuf, 7, 4096));
  // Larger copies (4 KiB, 64 KiB: the agent's largest by default), to see
  // how its threads' loads of pinned host memory add up.
  void* hbig;
  CK(cuMemHostAlloc(&hbig, 65536, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  memset(hbig, 5, 65536);
  CUdeviceptr hbigDev, dbig;
  CK(cuMemHostGetDevicePointer(&hbigDev, hbig, 0));
  CK(cuMemAlloc(&dbig, 65536));
  CUstream st;
  CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));

  // Baselines first, while no agent holds an SM.
  {
    CUevent ev;
    CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    std::vector<double> v;
    // A driver copy and its event, polled: 64 B to the host, 64 KiB to the device.
    for (int big = 0; big < 2; big++) {
      for (int i = 0; i < iters; i++) {
        double t0 = now_us();
        if (big)
          CK(cuMemcpyHtoDAsync(dbig, hbig, 65536, st));
        else
          CK(cuMemcpyDtoHAsync(hbuf, dbuf, 64, st));
        CK(cuEventRecord(ev, st));
        while (cuEventQuery(ev) == CUDA_ERROR_NOT_READY) {
        }
        v.push_back(now_us() - t0);
      }
      report("driver", big ? "h2d 64K" : "copy d2h", v);
      v.clear();
    }
    volatile uint64_t* w = (volatile uint64_t*)hbuf + 64;
    for (int i = 0; i < iters; i++) {
      double t0 = now_us();
      CK(cuStreamWriteValue64(st, hbufDev + 512, (cuuint64_t)(i + 1), 0));
      while (*w != (uint64_t)(i + 1)) {
      }
      v.push_back(now_us() - t0);
    }
    report("driver", "write", v);
  }

  // Each kernel five times: started without inline commands (flags 0, as
  // the default agent runs) and with them (flags 1, fused landings on),
  // each with the two-trip read of a slot and the one-read (flags 2 and
  // 3, NCCL_RMA_WASM_DEVICE_AGENT_ONE_READ).
  // And a fifth (f4): the two-trip read with three more warps polling,
  // staggered (NCCL_RMA_WASM_DEVICE_AGENT_STAGGER).
  for (int kf = 0; kf < 5 * nv; kf++) {
    int k = kf / 5;
    unsigned long long flags = kf % 5;
    checkWords = flags & 1 ? 16 : 8;
    memset(hp, 0, HDR + SLOTS * SLOT);
    r.seq = 0;
    CK(cuMemsetD8(dbuf + 2048, 0, 56));  // the add's word, the fused commands' signals, the marked adds', per variant
    ((volatile uint64_t*)hbuf)[256] = 1;  // the mark the marked add waits for, already there
    unsigned long long ring = r.dev, mask = SLOTS - 1, idle = 0;
    void* args[] = {&ring, &mask, &idle, &flags};
    r.mem[24] = 1;
    CK(cuLaunchKernel(fns[k], 1, 1, 1, 128, 1, 1, 0, st, args, NULL));
    char name[256];
    snprintf(name, sizeof name, "%s f%llu", strrchr(argv[2 + k], '/') ? strrchr(argv[2 + k], '/') + 1 : argv[2 + k], flags);
    // Warm up, and check that the copies copy.
    for (int i = 0; i < 100; i++) put(r, 0, 0, 0, 0, 0);
    if (!wait_done(r, r.seq)) {
      printf("PROBE FAIL %s: the agent never answered\n", name);
      return 1;
    }
    unsigned char pay[64];
    struct {
      const char* what;
      uint64_t kind, n, src, dst, val, sig;
      bool inl, count;
    } cs[] = {
        {"nop", 0, 0, 0, 0, 0, 0, false, false},
        {"copy d2h", 1, 64, (uint64_t)dbuf, (uint64_t)hbufDev, 0, 0, false, false},
        {"copy h2d", 1, 64, (uint64_t)hbufDev + 1024, (uint64_t)dbuf + 1024, 0, 0, false, false},
        {"add", 3, 0, 0, (uint64_t)dbuf + 2048, 1, 0, false, false},
        {"copy+add", 8, 64, (uint64_t)hbufDev + 1024, (uint64_t)dbuf + 1024, 1, (uint64_t)dbuf + 2056, false, false},
        {"h2d 4K", 1, 4096, (uint64_t)hbigDev, (uint64_t)dbig, 0, 0, false, false},
        {"h2d 64K", 1, 65536, (uint64_t)hbigDev, (uint64_t)dbig, 0, 0, false, false},
        {"d2h 64K", 1, 65536, (uint64_t)dbig, (uint64_t)hbigDev, 0, 0, false, false},
        {"inline+write", 9, 64, 0, (uint64_t)dbuf + 3072, 0, (uint64_t)dbuf + 2064, true, true},
        {"inline+add", 10, 8, 0, (uint64_t)dbuf + 3200, 1, (uint64_t)dbuf + 2072, true, false},
        {"mark+add", 3 | 16, 1, (uint64_t)hbufDev + 2048, (uint64_t)dbuf + 2080, 1, 0, false, false},
    };
    for (auto& c : cs) {
      if (c.inl && !(flags & 1)) continue;  // a kernel started without them reads no inline bytes
      std::vector<double> v;
      for (int i = 0; i < iters; i++) {
        for (int k = 0; k < 64; k++) pay[k] = (unsigned char)(i * 7 + k);
        double t0 = now_us();
        uint64_t s = put(r, c.kind, c.n, c.src, c.dst, c.count ? (uint64_t)(i + 1) : c.val, c.sig, c.inl ? pay : nullptr);
        if (!wait_done(r, s)) {
          printf("PROBE FAIL %s %s: no answer\n", name, c.what);
          return 1;
        }
        v.push_back(now_us() - t0);
      }
      report(name, c.what, v);
    }
    // A peer's mark that comes late, from the mark to the signal's add
    // done: the host seeing the mark and then asking the agent to add
    // (today's way), against the agent, asked 10 us before, waiting for
    // the mark itself (NCCL_RMA_WASM_INTRANODE_MARK_WAIT_DEVICE).
    volatile uint64_t* late = (volatile uint64_t*)hbuf + 260;
    for (int dev = 0; dev < 2; dev++) {
      std::vector<double> v;
      *late = 0;
      for (int i = 0; i < iters; i++) {
        uint64_t s = 0;
        if (dev) {
          s = put(r, 3 | 16, (uint64_t)(i + 1), (uint64_t)hbufDev + 2080, (uint64_t)dbuf + 2088, 1);
          for (double t = now_us(); now_us() - t < 10;) {
          }
        }
        double t0 = now_us();
        __atomic_store_n((uint64_t*)late, (uint64_t)(i + 1), __ATOMIC_RELEASE);
        if (!dev) s = put(r, 3, 0, 0, (uint64_t)dbuf + 2096, 1);
        if (!wait_done(r, s)) {
          printf("PROBE FAIL %s late mark: no answer\n", name);
          return 1;
        }
        v.push_back(now_us() - t0);
      }
      report(name, dev ? "late mark, agent waits" : "late mark, host adds", v);
    }
    // The copies arrived: the device bytes (7) in the host buffer.
    if (((volatile unsigned char*)hbuf)[63] != 7) printf("PROBE FAIL %s: copy d2h did not land\n", name);
    put(r, 5, 0, 0, 0, 0);  // stop
    CK(cuStreamSynchronize(st));
    uint64_t word = 0;
    CK(cuMemcpyDtoH(&word, dbuf + 2048, 8));
    printf("PROBE %s: device word after %d adds: %s\n", name, iters,
           word == (uint64_t)iters ? "right" : "WRONG");
    // The fused commands' signals, and the last inline payloads.
    uint64_t sigs[3];
    CK(cuMemcpyDtoH(sigs, dbuf + 2056, 24));
    unsigned char got[72];
    CK(cuMemcpyDtoH(got, dbuf + 3072, 64));
    CK(cuMemcpyDtoH(got + 64, dbuf + 3200, 8));
    bool bytes = true;
    for (int k = 0; k < 64; k++) bytes = bytes && got[k] == (unsigned char)((iters - 1) * 7 + k);
    for (int k = 0; k < 8; k++) bytes = bytes && got[64 + k] == (unsigned char)((iters - 1) * 7 + k);
    uint64_t marked[3] = {0, 0, 0};
    CK(cuMemcpyDtoH(marked, dbuf + 2080, 24));
    printf("PROBE %s: marked adds %llu, late-marked adds %llu and host adds %llu of %d (skipped %llu): %s\n", name,
           (unsigned long long)marked[0], (unsigned long long)marked[1], (unsigned long long)marked[2], iters,
           (unsigned long long)r.mem[19],
           marked[0] == (uint64_t)iters && marked[1] == (uint64_t)iters && marked[2] == (uint64_t)iters && r.mem[19] == 0
               ? "right"
               : "WRONG");
    if (flags & 2)
      printf("PROBE %s: slots read again the two-trip way after a torn read: %llu\n", name, (unsigned long long)r.mem[17]);
    if (!(flags & 1)) {  // no inline commands ran: only copy+add's signal counts
      printf("PROBE %s: fused signals (copy+add %llu of %d): %s\n", name, (unsigned long long)sigs[0], iters,
             sigs[0] == (uint64_t)iters ? "right" : "WRONG");
      continue;
    }
    printf("PROBE %s: fused signals (copy+add %llu, inline+write %llu, inline+add %llu of %d) and inline bytes: %s\n",
           name, (unsigned long long)sigs[0], (unsigned long long)sigs[1], (unsigned long long)sigs[2], iters,
           sigs[0] == (uint64_t)iters && sigs[1] == (uint64_t)iters && sigs[2] == (uint64_t)iters && bytes ? "right"
                                                                                                        : "WRONG");
  }
  // The peer inbox (agent.ptx, ISCAN): agent B, its ring header naming an
  // inbox of device words and a table of the signal words it may add to,
  // takes an entry that agent A wrote after a copy (a COPY_WRITE whose
  // signal word is B's inbox slot) and adds the entry's value to the
  // table's word, publishing how far it read in pinned host memory. Beside
  // it, the way a put+signal goes today: A's copy, then its mark in host
  // memory, seen by the host, which then has B add. And B's no-op with its
  // inbox polled, against the no-op above without one. Shipped kernel only.
  {
    const int P = 2, LOGE = 6, E = 1 << LOGE;
    void* hpB;
    CK(cuMemHostAlloc(&hpB, HDR + SLOTS * SLOT, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    ring rb;
    rb.mem = (volatile uint64_t*)hpB;
    CK(cuMemHostGetDevicePointer(&rb.dev, hpB, 0));
    void* hc;
    CK(cuMemHostAlloc(&hc, 4096, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    volatile uint64_t* cons = (volatile uint64_t*)hc;
    CUdeviceptr consDev, inbox, table, sigw, pay;
    CK(cuMemHostGetDevicePointer(&consDev, hc, 0));
    CK(cuMemAlloc(&inbox, 16 * E * 8));
    CK(cuMemAlloc(&table, 64 * 16));
    CK(cuMemAlloc(&sigw, 64));
    CK(cuMemAlloc(&pay, 4096));
    uint64_t tab[128] = {0};
    tab[5 * 2] = sigw, tab[5 * 2 + 1] = 16;  // entry 5: two words; entry 9 stays empty
    CK(cuMemcpyHtoD(table, tab, sizeof tab));
    CUstream st2;
    CK(cuStreamCreate(&st2, CU_STREAM_NON_BLOCKING));
    const uint64_t low62 = (1ull << 62) - 1;
    auto entry = [&](uint64_t pos, uint64_t idx, uint64_t off, uint64_t val) {
      return ((pos / E) % 255 + 1) << 56 | idx << 50 | (off / 8) << 28 | val;
    };
    for (unsigned long long flags = 0; flags < 4; flags += 2) {
      checkWords = 8;
      memset(hp, 0, HDR + SLOTS * SLOT);
      memset(hpB, 0, HDR + SLOTS * SLOT);
      memset(hc, 0, 4096);
      r.seq = rb.seq = 0;
      CK(cuMemsetD8(inbox, 0, 16 * E * 8));
      CK(cuMemsetD8(sigw, 0, 64));
      rb.mem[25] = inbox, rb.mem[26] = P, rb.mem[27] = LOGE, rb.mem[28] = consDev, rb.mem[29] = table;
      unsigned long long ringA = r.dev, ringB = rb.dev, mask = SLOTS - 1, idle = 0;
      void* argsA[] = {&ringA, &mask, &idle, &flags};
      void* argsB[] = {&ringB, &mask, &idle, &flags};
      r.mem[24] = rb.mem[24] = 1;
      CK(cuLaunchKernel(fns[0], 1, 1, 1, 128, 1, 1, 0, st, argsA, NULL));
      CK(cuLaunchKernel(fns[0], 1, 1, 1, 128, 1, 1, 0, st2, argsB, NULL));
      char name[64];
      snprintf(name, sizeof name, "inbox f%llu", flags);
      for (int i = 0; i < 100; i++) put(r, 0, 0, 0, 0, 0), put(rb, 0, 0, 0, 0, 0);
      if (!wait_done(r, r.seq) || !wait_done(rb, rb.seq)) {
        printf("PROBE FAIL %s: an agent never answered\n", name);
        return 1;
      }
      std::vector<double> v;
      uint64_t pos = 0;
      bool ok = true;
      // A copies 64 B and writes the entry into B's inbox (peer 1); B adds 1.
      for (int i = 0; i < iters && ok; i++, pos++) {
        double t0 = now_us();
        put(r, 7, 64, (uint64_t)dbuf, (uint64_t)pay, entry(pos, 5, 0, 1), (uint64_t)inbox + (1 * E + pos % E) * 8);
        while ((__atomic_load_n(&cons[1], __ATOMIC_ACQUIRE) & low62) < pos + 1)
          if (now_us() - t0 > 2e6) {
            printf("PROBE FAIL %s: entry %llu never taken\n", name, (unsigned long long)pos);
            ok = false;
            break;
          }
        v.push_back(now_us() - t0);
      }
      if (!ok) return 1;
      report(name, "copy+entry", v);
      v.clear();
      // Today's way: A's copy and its mark in host memory; the host sees the
      // mark and has B add.
      volatile uint64_t* mark = (volatile uint64_t*)hbuf + 192;
      for (int i = 0; i < iters; i++) {
        double t0 = now_us();
        put(r, 7, 64, (uint64_t)dbuf, (uint64_t)pay, (uint64_t)(i + 1), (uint64_t)hbufDev + 1536);
        while (*mark < (uint64_t)(i + 1))
          if (now_us() - t0 > 2e6) {
            printf("PROBE FAIL %s: no mark\n", name);
            return 1;
          }
        uint64_t s = put(rb, 3, 0, 0, (uint64_t)sigw + 8, 1);
        if (!wait_done(rb, s)) {
          printf("PROBE FAIL %s: B never added\n", name);
          return 1;
        }
        v.push_back(now_us() - t0);
      }
      report(name, "mark+add", v);
      v.clear();
      // B asked first to wait for A's mark itself, then A's copy and mark
      // (NCCL_RMA_WASM_INTRANODE_MARK_WAIT_DEVICE), from A's command to B's
      // add done: the mark in pinned host memory (as the mark page), then
      // in device memory (what a device mirror of the marks would give).
      for (int where = 0; where < 2; where++) {
        uint64_t mk = where ? (uint64_t)sigw + 32 : (uint64_t)hbufDev + 1544;
        uint64_t s0 = put(rb, 2, 0, 0, mk, 0);  // the mark word from 0, by B's agent
        if (!wait_done(rb, s0)) return 1;
        for (int i = 0; i < iters; i++) {
          uint64_t s = put(rb, 3 | 16, (uint64_t)(i + 1), mk, (uint64_t)sigw + 16 + 8 * where, 1);
          for (double t = now_us(); now_us() - t < 5;) {
          }
          double t0 = now_us();
          put(r, 7, 64, (uint64_t)dbuf, (uint64_t)pay, (uint64_t)(i + 1), mk);
          if (!wait_done(rb, s)) {
            printf("PROBE FAIL %s: B never added after the mark\n", name);
            return 1;
          }
          v.push_back(now_us() - t0);
        }
        report(name, where ? "mark (device)+B waits" : "mark (host)+B waits", v);
        v.clear();
      }
      for (int i = 0; i < iters; i++) {
        double t0 = now_us();
        uint64_t s = put(rb, 0, 0, 0, 0, 0);
        if (!wait_done(rb, s)) return 1;
        v.push_back(now_us() - t0);
      }
      report(name, "B nop", v);
      // An entry naming an empty table entry, then one past its word: both
      // read, neither added, the peer's word flagged.
      put(r, 2, 0, 0, (uint64_t)inbox + (1 * E + pos % E) * 8, entry(pos, 9, 0, 1)), pos++;
      put(r, 2, 0, 0, (uint64_t)inbox + (1 * E + pos % E) * 8, entry(pos, 5, 16, 1)), pos++;
      double t0 = now_us();
      while ((__atomic_load_n(&cons[1], __ATOMIC_ACQUIRE) & low62) < pos && now_us() - t0 < 2e6) {
      }
      uint64_t c1 = cons[1];
      put(r, 5, 0, 0, 0, 0);
      put(rb, 5, 0, 0, 0, 0);
      CK(cuStreamSynchronize(st));
      CK(cuStreamSynchronize(st2));
      uint64_t w[4];
      CK(cuMemcpyDtoH(w, sigw, 32));
      printf("PROBE %s: inbox adds %llu of %d, host-applied adds %llu of %d, adds after host and device marks %llu, %llu, bad entries read %s and flagged %s: %s\n",
             name, (unsigned long long)w[0], iters, (unsigned long long)w[1], iters, (unsigned long long)w[2],
             (unsigned long long)w[3], (c1 & low62) == pos ? "yes" : "NO", c1 >> 62 & 1 ? "yes" : "NO",
             w[0] == (uint64_t)iters && w[1] == (uint64_t)iters && w[2] == (uint64_t)iters && w[3] == (uint64_t)iters &&
                     (c1 & low62) == pos && (c1 >> 62 & 1)
                 ? "right"
                 : "WRONG");
    }
  }
  printf("PROBE done\n");
  return 0;
}
