/* agent.h: the device agent, included once by cuda.c (it uses cuda.c's
 * driver table and context streams).
 *
 * Under MPS a small device hop costs what the GPU takes to pick up work
 * submitted through the driver: a copy-engine copy, a stream write or an
 * event, each 10-20 us. The agent replaces those submissions for the
 * plugin's own copy contexts: one block of AG_THREADS threads, launched
 * once per context on a stream of its own, polls a ring of commands in
 * pinned host memory and runs them in order (copies between host and
 * device memory, signal writes and adds), writing the number of the last
 * one done back to host memory. The host submits by writing a slot, and
 * learns completion by reading a word: no driver call on the data path.
 *
 * Ordering with the context's stream (large copies, device-to-device
 * copies, interprocess events stay there): work queued on the stream after
 * agent work first waits, on the stream, for the agent's done word
 * (cuStreamWaitValue64); agent work after stream work first waits, in the
 * agent, for an epoch word the stream writes (cuStreamWriteValue64). So
 * the context keeps one order, as if it had one stream.
 *
 * The kernel never ends while the agent runs, so a call that can wait for
 * the context's kernels (pinned allocation and registration, unmapping)
 * first stops it (an EXIT command) and starts it again after (ag_pause,
 * ag_resume). It runs only in the plugin's own contexts, never the
 * application's: the application's device synchronisations never wait
 * for it. Events of an agent context are tickets, (sequence << 1) | 1,
 * passed once the done word reached the sequence; interprocess events
 * stay real events. */

/* The ring: a header, then AG_SLOTS slots of 64 bytes. Header words (byte
 * offsets): done at 0 (agent writes), epoch at 64 (the stream writes),
 * started at 128 (agent writes 1 when it runs). A slot: seq at 0 (written
 * last, with release), then kind, n, src, dst, val at 16..56. */
#define AG_SLOTS 1024
#define AG_HDR 256
#define AG_SLOT 64
#define AG_THREADS 128
enum { AG_COPY = 1, AG_WRITE = 2, AG_ADD = 3, AG_WAIT = 4, AG_EXIT = 5 };

/* The kernel, sm_70 PTX (acquire loads, nanosleep), which the driver
 * compiles for the GPU at hand. Thread 0 polls the next slot (backing
 * off with nanosleep once idle for a while) and shares its fields through
 * shared memory; every thread copies its share of a COPY (16-byte
 * accesses, four in flight per thread, when both ends are 16-byte aligned,
 * else bytes); each fences its writes at system scope before the barrier;
 * thread 0 then writes or adds the signal, or waits for the epoch, fences
 * again and publishes done. Loads are relaxed at system scope: the sources
 * were written by the CPU or by another process's kernel. */
static const char agent_ptx[] =
    ".version 7.0\n"
    ".target sm_70\n"
    ".address_size 64\n"
    ".visible .entry rmaw_agent(.param .u64 ring, .param .u64 mask, .param .u64 seq0)\n"
    "{\n"
    "  .reg .pred %p<16>;\n"
    "  .reg .b32 %r<32>;\n"
    "  .reg .b64 %rd<48>;\n"
    "  .shared .align 16 .b64 sh[6];\n"
    "  ld.param.u64 %rd1, [ring];\n"
    "  ld.param.u64 %rd2, [mask];\n"
    "  ld.param.u64 %rd3, [seq0];\n"
    "  mov.u32 %r1, %tid.x;\n"
    "  setp.eq.u32 %p1, %r1, 0;\n"
    "  cvt.u64.u32 %rd40, %r1;\n"
    "  @!%p1 bra SHARE;\n"
    "  mov.u64 %rd4, 1;\n"
    "  st.relaxed.sys.u64 [%rd1+128], %rd4;\n"
    "LOOP:\n"
    "  @!%p1 bra SHARE;\n"
    "  and.b64 %rd5, %rd3, %rd2;\n"
    "  shl.b64 %rd5, %rd5, 6;\n"
    "  add.u64 %rd5, %rd5, %rd1;\n"
    "  add.u64 %rd5, %rd5, 256;\n"
    "  mov.u32 %r2, 0;\n"
    "POLL:\n"
    "  ld.acquire.sys.u64 %rd6, [%rd5];\n"
    "  setp.eq.u64 %p2, %rd6, %rd3;\n"
    "  @%p2 bra GOT;\n"
    "  add.u32 %r2, %r2, 1;\n"
    "  min.u32 %r2, %r2, 262144;\n"
    "  setp.lt.u32 %p3, %r2, 4096;\n"
    "  @%p3 bra POLL;\n"
    "  setp.lt.u32 %p3, %r2, 262144;\n"
    "  selp.u32 %r3, 500, 20000, %p3;\n"
    "  nanosleep.u32 %r3;\n"
    "  bra POLL;\n"
    "GOT:\n"
    "  ld.relaxed.sys.v2.u64 {%rd7, %rd8}, [%rd5+16];\n"
    "  ld.relaxed.sys.v2.u64 {%rd9, %rd10}, [%rd5+32];\n"
    "  ld.relaxed.sys.u64 %rd11, [%rd5+48];\n"
    "  st.shared.v2.u64 [sh], {%rd7, %rd8};\n"
    "  st.shared.v2.u64 [sh+16], {%rd9, %rd10};\n"
    "  st.shared.u64 [sh+32], %rd11;\n"
    "SHARE:\n"
    "  barrier.sync 0;\n"
    "  ld.shared.v2.u64 {%rd7, %rd8}, [sh];\n"
    "  ld.shared.v2.u64 {%rd9, %rd10}, [sh+16];\n"
    "  ld.shared.u64 %rd11, [sh+32];\n"
    "  setp.ne.u64 %p4, %rd7, 1;\n"
    "  @%p4 bra CDONE;\n"
    /* COPY: n16 = n rounded down to 16 when src and dst are 16-aligned. */
    "  or.b64 %rd12, %rd9, %rd10;\n"
    "  and.b64 %rd12, %rd12, 15;\n"
    "  setp.eq.u64 %p5, %rd12, 0;\n"
    "  and.b64 %rd13, %rd8, -16;\n"
    "  selp.u64 %rd13, %rd13, 0, %p5;\n"
    "  shl.b64 %rd14, %rd40, 4;\n"
    "VLOOP:\n"
    "  setp.ge.u64 %p6, %rd14, %rd13;\n"
    "  @%p6 bra VDONE;\n"
    "  add.u64 %rd15, %rd14, 2048;\n"
    "  add.u64 %rd16, %rd14, 4096;\n"
    "  add.u64 %rd17, %rd14, 6144;\n"
    "  setp.lt.u64 %p7, %rd15, %rd13;\n"
    "  setp.lt.u64 %p8, %rd16, %rd13;\n"
    "  setp.lt.u64 %p9, %rd17, %rd13;\n"
    "  add.u64 %rd20, %rd9, %rd14;\n"
    "  add.u64 %rd21, %rd9, %rd15;\n"
    "  add.u64 %rd22, %rd9, %rd16;\n"
    "  add.u64 %rd23, %rd9, %rd17;\n"
    "  ld.relaxed.sys.v4.u32 {%r4, %r5, %r6, %r7}, [%rd20];\n"
    "  @%p7 ld.relaxed.sys.v4.u32 {%r8, %r9, %r10, %r11}, [%rd21];\n"
    "  @%p8 ld.relaxed.sys.v4.u32 {%r12, %r13, %r14, %r15}, [%rd22];\n"
    "  @%p9 ld.relaxed.sys.v4.u32 {%r16, %r17, %r18, %r19}, [%rd23];\n"
    "  add.u64 %rd24, %rd10, %rd14;\n"
    "  add.u64 %rd25, %rd10, %rd15;\n"
    "  add.u64 %rd26, %rd10, %rd16;\n"
    "  add.u64 %rd27, %rd10, %rd17;\n"
    "  st.v4.u32 [%rd24], {%r4, %r5, %r6, %r7};\n"
    "  @%p7 st.v4.u32 [%rd25], {%r8, %r9, %r10, %r11};\n"
    "  @%p8 st.v4.u32 [%rd26], {%r12, %r13, %r14, %r15};\n"
    "  @%p9 st.v4.u32 [%rd27], {%r16, %r17, %r18, %r19};\n"
    "  add.u64 %rd14, %rd14, 8192;\n"
    "  bra VLOOP;\n"
    "VDONE:\n"
    "  add.u64 %rd14, %rd13, %rd40;\n"
    "BLOOP:\n"
    "  setp.ge.u64 %p6, %rd14, %rd8;\n"
    "  @%p6 bra CFENCE;\n"
    "  add.u64 %rd20, %rd9, %rd14;\n"
    "  ld.relaxed.sys.u8 %r4, [%rd20];\n"
    "  add.u64 %rd24, %rd10, %rd14;\n"
    "  st.u8 [%rd24], %r4;\n"
    "  add.u64 %rd14, %rd14, 128;\n"
    "  bra BLOOP;\n"
    "CFENCE:\n"
    "  fence.acq_rel.sys;\n"
    "CDONE:\n"
    "  barrier.sync 0;\n"
    "  @!%p1 bra NEXT;\n"
    "  fence.sc.sys;\n"
    "  setp.eq.u64 %p10, %rd7, 2;\n"
    "  @%p10 st.relaxed.sys.u64 [%rd10], %rd11;\n"
    "  setp.eq.u64 %p11, %rd7, 3;\n"
    "  @%p11 atom.relaxed.sys.add.u64 %rd30, [%rd10], %rd11;\n"
    "  setp.ne.u64 %p12, %rd7, 4;\n"
    "  @%p12 bra PUBLISH;\n"
    "WPOLL:\n"
    "  ld.acquire.sys.u64 %rd31, [%rd10];\n"
    "  setp.ge.u64 %p13, %rd31, %rd11;\n"
    "  @%p13 bra PUBLISH;\n"
    "  nanosleep.u32 200;\n"
    "  bra WPOLL;\n"
    "PUBLISH:\n"
    "  fence.sc.sys;\n"
    "  st.relaxed.sys.u64 [%rd1], %rd3;\n"
    "NEXT:\n"
    "  barrier.sync 0;\n"
    "  setp.eq.u64 %p14, %rd7, 5;\n"
    "  @%p14 bra FINISH;\n"
    "  add.u64 %rd3, %rd3, 1;\n"
    "  bra LOOP;\n"
    "FINISH:\n"
    "  ret;\n"
    "}\n";

/* agentMode: 0 off, 1 on, 2 auto (on when MPS looks active);
 * agentMax: the largest copy the agent takes (bytes). */
static int agentMode = 0; /* declared before the host-memory calls */
static uint64_t agentMax = 64 << 10;
static char agentNote[240] = "not started (no copy context used yet)";
/* nmu guards agentNote alone: notes are set under mu or an agent's lock. */
static pthread_mutex_t nmu = PTHREAD_MUTEX_INITIALIZER;

__attribute__((format(printf, 1, 2))) static void ag_note(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&nmu);
  vsnprintf(agentNote, sizeof agentNote, fmt, ap);
  pthread_mutex_unlock(&nmu);
  va_end(ap);
}

void rmaw_cuda_agent(int mode, uint64_t max) {
  agentMode = mode;
  agentMax = max;
}

struct agent {
  CUcontext ctx;          /* the copy context it runs in */
  volatile uint64_t* mem; /* pinned: header, then slots */
  CUdeviceptr dev;        /* mem's device address */
  CUstream stream;        /* the kernel's own */
  void* fn;
  pthread_mutex_t mu; /* submissions, pause */
  uint64_t seq;       /* the last command submitted (under mu) */
  uint64_t epoch;     /* the last epoch the stream was asked to write (under mu) */
  uint64_t waited;    /* the last command the stream was made to wait for (under mu) */
  int streamLast;     /* the stream got work after the agent's last command (under mu) */
  int live;           /* running and taking work (atomic) */
  unsigned polls;     /* not-passed ticket queries, to look at the kernel now and then */
};

/* Host memory the agent may read or write: what cuda_host_alloc returned
 * and what cuda_host_register pinned, where the device reaches it at the
 * same address. Entries are appended (published with a release store of
 * nhr) and cleared, never moved. */
#define MAX_HR 256
static struct {
  uint64_t p, n;
} hr[MAX_HR];
static int nhr;

static void hr_add(void* p, uint64_t n) {
  if (!cu.memHostGetDevicePointer) return;
  CUdeviceptr d = 0;
  if (cu.memHostGetDevicePointer(&d, p, 0) != 0 || d != (CUdeviceptr)(uintptr_t)p) return;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < nhr; i++)
    if (__atomic_load_n(&hr[i].n, __ATOMIC_ACQUIRE) == 0) {
      __atomic_store_n(&hr[i].p, (uint64_t)(uintptr_t)p, __ATOMIC_RELAXED);
      __atomic_store_n(&hr[i].n, n, __ATOMIC_RELEASE);
      pthread_mutex_unlock(&mu);
      return;
    }
  if (nhr < MAX_HR) {
    hr[nhr].p = (uint64_t)(uintptr_t)p;
    hr[nhr].n = n;
    __atomic_store_n(&nhr, nhr + 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&mu);
}

static void hr_drop(void* p) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < nhr; i++)
    if (hr[i].p == (uint64_t)(uintptr_t)p) __atomic_store_n(&hr[i].n, 0, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&mu);
}

/* hr_ok reports whether [p, p+n) lies in one range the agent may touch. */
static int hr_ok(const void* p, uint64_t n) {
  uint64_t a = (uint64_t)(uintptr_t)p;
  int k = __atomic_load_n(&nhr, __ATOMIC_ACQUIRE);
  for (int i = 0; i < k; i++) {
    uint64_t len = __atomic_load_n(&hr[i].n, __ATOMIC_ACQUIRE);
    uint64_t base = __atomic_load_n(&hr[i].p, __ATOMIC_RELAXED);
    if (len && a >= base && a + n <= base + len && a + n >= a) return 1;
  }
  return 0;
}

static volatile uint64_t* ag_slot(struct agent* a, uint64_t s) {
  return a->mem + (AG_HDR + (s & (AG_SLOTS - 1)) * AG_SLOT) / 8;
}
static uint64_t ag_done(struct agent* a) { return __atomic_load_n(&a->mem[0], __ATOMIC_ACQUIRE); }

/* ag_put writes command s (under a->mu): it waits, for at most two
 * seconds, for the slot's previous command to be done. */
static int ag_put(struct agent* a, uint64_t kind, uint64_t n, uint64_t src, uint64_t dst, uint64_t val, char* err,
                  size_t errlen) {
  uint64_t s = a->seq + 1;
  if (s > AG_SLOTS && ag_done(a) < s - AG_SLOTS) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (ag_done(a) < s - AG_SLOTS) {
      clock_gettime(CLOCK_MONOTONIC, &t);
      if ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) > 2000000000L)
        return rmaw_fail(err, errlen, "the device agent did no work for 2 s (%llu commands behind)",
                         (unsigned long long)(s - ag_done(a)));
      sched_yield();
    }
  }
  volatile uint64_t* sl = ag_slot(a, s);
  sl[2] = kind;
  sl[3] = n;
  sl[4] = src;
  sl[5] = dst;
  sl[6] = val;
  __atomic_store_n(&sl[0], s, __ATOMIC_RELEASE);
  a->seq = s;
  return 0;
}

/* ag_follow makes the agent's next command wait for the stream's work
 * queued so far (under a->mu). */
static int ag_follow(ctxstream* e, char* err, size_t errlen) {
  struct agent* a = e->ag;
  if (!a->streamLast) return 0;
  CUresult r = cu.writeValue64(e->stream, a->dev + 64, (unsigned long long)(a->epoch + 1), 0);
  if (r != 0) return rmaw_fail(err, errlen, "cuStreamWriteValue64 (agent epoch): %s", errstr(r));
  a->epoch++;
  a->streamLast = 0;
  return ag_put(a, AG_WAIT, 0, 0, a->dev + 64, a->epoch, err, errlen);
}

/* ag_lead makes the stream's next work wait for the agent's commands
 * submitted so far (under a->mu). */
static int ag_lead(ctxstream* e, char* err, size_t errlen) {
  struct agent* a = e->ag;
  if (a->waited >= a->seq) return 0;
  CUresult r = cu.waitValue64(e->stream, a->dev, (unsigned long long)a->seq, 0 /* GEQ */);
  if (r != 0) return rmaw_fail(err, errlen, "cuStreamWaitValue64 (agent done): %s", errstr(r));
  a->waited = a->seq;
  return 0;
}

/* ag_live returns e's agent when it runs and takes work, else NULL. */
static struct agent* ag_live(ctxstream* e) {
  struct agent* a = __atomic_load_n(&e->ag, __ATOMIC_ACQUIRE);
  return a && __atomic_load_n(&a->live, __ATOMIC_ACQUIRE) ? a : NULL;
}

/* ag_submit queues one command after the context's earlier work. */
static int ag_submit(ctxstream* e, uint64_t kind, uint64_t n, uint64_t src, uint64_t dst, uint64_t val, char* err,
                     size_t errlen) {
  struct agent* a = e->ag;
  pthread_mutex_lock(&a->mu);
  int rc = -1;
  if (!a->live) rc = rmaw_fail(err, errlen, "the device agent stopped");
  else if (ag_follow(e, err, errlen) == 0) rc = ag_put(a, kind, n, src, dst, val, err, errlen);
  pthread_mutex_unlock(&a->mu);
  return rc;
}

/* ag_launch starts the kernel at command seq+1 and waits up to 500 ms
 * for it to run (under a->mu, the context current); 0 when it runs. */
static int ag_launch(struct agent* a, char* note, size_t notelen) {
  unsigned long long ring = a->dev, mask = AG_SLOTS - 1, seq0 = a->seq + 1;
  void* args[] = {&ring, &mask, &seq0};
  CUresult r = cu.ctxSetCurrent(a->ctx); /* the function is its context's */
  if (r != 0) {
    snprintf(note, notelen, "cuCtxSetCurrent: %s", errstr(r));
    return -1;
  }
  __atomic_store_n(&a->mem[16], 0, __ATOMIC_RELEASE);
  __atomic_store_n(&a->mem[0], a->seq, __ATOMIC_RELEASE);
  r = cu.launchKernel(a->fn, 1, 1, 1, AG_THREADS, 1, 1, 0, a->stream, args, NULL);
  if (r != 0) {
    snprintf(note, notelen, "cuLaunchKernel: %s", errstr(r));
    return -1;
  }
  for (int i = 0; i < 10000; i++) {
    if (__atomic_load_n(&a->mem[16], __ATOMIC_ACQUIRE) == 1) return 0;
    usleep(50);
  }
  snprintf(note, notelen, "its kernel did not start within 500 ms (no free SM?)");
  return -1;
}

/* ag_stop ends the kernel (under a->mu): an EXIT command, waited for. */
static void ag_stop(struct agent* a) {
  char err[160];
  /* A kernel that never started finds the EXIT if it ever does. */
  int started = __atomic_load_n(&a->mem[16], __ATOMIC_ACQUIRE) == 1;
  if (ag_put(a, AG_EXIT, 0, 0, 0, 0, err, sizeof err) == 0 && started) {
    for (int i = 0; i < 20000 && ag_done(a) < a->seq; i++) usleep(50);
  }
  if (ag_done(a) >= a->seq && cu.ctxSetCurrent(a->ctx) == 0) {
    cu.streamSynchronize(a->stream);
    __atomic_store_n(&a->mem[16], 0, __ATOMIC_RELEASE); /* ended: a second stop waits for nothing */
  }
}

/* ag_queues keeps the agent's stream off the hardware queues of the
 * context's other streams. A context has CUDA_DEVICE_MAX_CONNECTIONS of
 * them (8 by default), given to its streams in turn as they are made;
 * work queued behind a kernel that never ends, on a stream that shares its
 * queue, could wait for it forever. The context's stream was made first
 * and the copy streams next, so the agent's, made last, lands on queue
 * (1 + NCOPY) mod C: the shared stream there refuses the agent, and copy
 * streams there are left unused (copy_take). The turn order is the
 * driver's documented aliasing; the agent stays off (0) by default until
 * measured on a GPU. */
static int ag_queues(ctxstream* e) {
  const char* v = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  int c = v && atoi(v) > 0 ? atoi(v) : 8;
  int q = (1 + NCOPY) % c;
  unsigned skip = 0;
  if (q == 0) {
    ag_note("off: with CUDA_DEVICE_MAX_CONNECTIONS=%d its kernel would share the hardware queue of the context's stream", c);
    return -1;
  }
  for (int i = 0; i < NCOPY; i++)
    if ((1 + i) % c == q) skip |= 1u << i;
  if (skip == (1u << NCOPY) - 1) {
    ag_note("off: with CUDA_DEVICE_MAX_CONNECTIONS=%d every copy stream would share its kernel's hardware queue", c);
    return -1;
  }
  __atomic_store_n(&e->skip, skip, __ATOMIC_RELEASE);
  return 0;
}

/* ag_start makes and launches e's agent (under mu, e's context current;
 * e is one of the plugin's own contexts). A failure leaves the stream
 * paths, with the reason in agentNote. */
static void ag_start(ctxstream* e) {
  if (!agentMode || e->ag) return;
  if (agentMode == 2) {
    const char* dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
    char path[512];
    snprintf(path, sizeof path, "%s/control", dir && *dir ? dir : "/tmp/nvidia-mps");
    if (access(path, F_OK) != 0) {
      ag_note("off: MPS is not running (no %.150s; NCCL_RMA_WASM_DEVICE_AGENT=1 forces it)", path);
      return;
    }
  }
  if (!cu.launchKernel || !cu.moduleLoadData || !cu.waitValue64 || !cu.memHostGetDevicePointer || !(e->caps & RMAW_CAP_WRITE64)) {
    ag_note("off: the driver lacks stream memory operations or kernel launches");
    return;
  }
  if (ag_queues(e) != 0) return;
  struct agent* a = calloc(1, sizeof *a);
  void* mod = NULL;
  void* p = NULL;
  CUresult r;
  const char* what = NULL;
  if (!a) what = "no memory";
  else if ((r = cu.moduleLoadData(&mod, agent_ptx)) != 0) what = "cuModuleLoadData";
  else if ((r = cu.moduleGetFunction(&a->fn, mod, "rmaw_agent")) != 0) what = "cuModuleGetFunction";
  else if ((r = cu.memHostAlloc(&p, AG_HDR + AG_SLOTS * AG_SLOT, 3 /* PORTABLE | DEVICEMAP */)) != 0) what = "cuMemHostAlloc";
  else if ((r = cu.memHostGetDevicePointer(&a->dev, p, 0)) != 0) what = "cuMemHostGetDevicePointer";
  else if ((r = cu.streamCreate(&a->stream, STREAM_NON_BLOCKING)) != 0) what = "cuStreamCreate";
  if (what) {
    ag_note("off: %s: %s", what, a ? errstr(r) : "calloc");
    if (p) cu.memFreeHost(p);
    free(a);
    return;
  }
  memset(p, 0, AG_HDR + AG_SLOTS * AG_SLOT);
  a->mem = p;
  a->ctx = e->ctx;
  pthread_mutex_init(&a->mu, NULL);
  char note[160];
  if (ag_launch(a, note, sizeof note) != 0) {
    ag_note("off: %s", note);
    /* A kernel that starts later polls an empty ring until finalize
     * stops it; the memory stays. */
    __atomic_store_n(&e->ag, a, __ATOMIC_RELEASE);
    return;
  }
  a->live = 1;
  a->streamLast = 1; /* whatever the stream holds comes first */
  __atomic_store_n(&e->ag, a, __ATOMIC_RELEASE);
  ag_note("running (one block of %d threads per copy context; copies up to %llu bytes)",
           AG_THREADS, (unsigned long long)agentMax);
}

/* ag_find returns the agent of ctx without making ctx current. */
static struct agent* ag_find(uintptr_t ctx) {
  int n = __atomic_load_n(&nctxs, __ATOMIC_ACQUIRE);
  for (int i = 0; i < n; i++)
    if (ctxs[i].ctx == (CUcontext)ctx) return __atomic_load_n(&ctxs[i].ag, __ATOMIC_ACQUIRE);
  return NULL;
}

/* ag_pause stops ctx's agent around a call that may wait for the
 * context's kernels; it returns the agent to hand ag_resume, locked, or
 * NULL (none running). */
static struct agent* ag_pause(uintptr_t ctx) {
  struct agent* a = ag_find(ctx);
  if (!a) return NULL;
  pthread_mutex_lock(&a->mu);
  if (!a->live) {
    pthread_mutex_unlock(&a->mu);
    return NULL;
  }
  ag_stop(a);
  return a;
}

static void ag_resume(struct agent* a) {
  if (!a) return;
  char note[160];
  if (ag_launch(a, note, sizeof note) != 0) {
    __atomic_store_n(&a->live, 0, __ATOMIC_RELEASE);
    ag_note("stopped: restarting it after a pinned allocation: %s", note);
  }
  pthread_mutex_unlock(&a->mu);
}

/* ag_pause_all pauses every running agent (a free, whose context is not
 * known); out gets them, NULL-terminated or full. */
static void ag_pause_all(struct agent** out, int max) {
  int n = __atomic_load_n(&nctxs, __ATOMIC_ACQUIRE), k = 0;
  for (int i = 0; i < n && k < max; i++) {
    struct agent* a = __atomic_load_n(&ctxs[i].ag, __ATOMIC_ACQUIRE);
    if (!a || cu.ctxSetCurrent(ctxs[i].ctx) != 0) continue;
    if ((a = ag_pause((uintptr_t)ctxs[i].ctx))) out[k++] = a;
  }
  if (k < max) out[k] = NULL;
}
static void ag_resume_all(struct agent** a, int max) {
  for (int i = 0; i < max && a[i]; i++) ag_resume(a[i]);
}

/* ag_ticket answers an event query of a ticket: 1 passed, 0 not yet, -1
 * the agent stopped before it (its kernel failed). */
static int ag_ticket(uintptr_t ctx, uintptr_t ev) {
  struct agent* a = ag_find(ctx);
  uint64_t s = (uint64_t)ev >> 1;
  if (!a) return -1;
  if (ag_done(a) >= s) return 1;
  if (!__atomic_load_n(&a->live, __ATOMIC_ACQUIRE)) return -1;
  /* Now and then, ask whether the kernel still runs. */
  if ((__atomic_add_fetch(&a->polls, 1, __ATOMIC_RELAXED) & 4095) == 0 && cu.streamQuery) {
    CUresult r = cu.streamQuery(a->stream);
    if (r != ERROR_NOT_READY && ag_done(a) < s) return -1;
  }
  return 0;
}

/* rmaw_cuda_agents_stop ends every agent (plugin finalize). */
void rmaw_cuda_agents_stop(void) {
  int n = __atomic_load_n(&nctxs, __ATOMIC_ACQUIRE);
  for (int i = 0; i < n; i++) {
    struct agent* a = __atomic_load_n(&ctxs[i].ag, __ATOMIC_ACQUIRE);
    if (!a) continue;
    pthread_mutex_lock(&a->mu);
    if (cu.ctxSetCurrent(ctxs[i].ctx) == 0) {
      __atomic_store_n(&a->live, 0, __ATOMIC_RELEASE);
      /* A kernel that never started may start later: it finds EXIT. */
      ag_stop(a);
    }
    pthread_mutex_unlock(&a->mu);
  }
}

/* rmaw_cuda_agent_start starts the agent of ctx when it is one of the
 * plugin's copy contexts (registration, after its pinned allocations). */
void rmaw_cuda_agent_start(uintptr_t ctx) {
  int own = 0;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < copyContexts; i++)
    if ((uintptr_t)copyCtxs[i].own == ctx) own = 1;
  pthread_mutex_unlock(&mu);
  if (!own) return;
  CUresult r;
  ctxstream* e = ctx_stream(ctx, &r);
  if (!e) return;
  pthread_mutex_lock(&mu);
  struct agent* a = e->ag;
  if (!a) {
    ag_start(e);
  } else {
    pthread_mutex_lock(&a->mu);
    char note[160];
    if (!a->live && ag_done(a) >= a->seq) {
      /* Stopped at a finalize; this registration starts it again. */
      if (ag_launch(a, note, sizeof note) != 0) {
        ag_note("off: restarting it: %s", note);
      } else {
        a->streamLast = 1;
        __atomic_store_n(&a->live, 1, __ATOMIC_RELEASE);
      }
    }
    pthread_mutex_unlock(&a->mu);
  }
  pthread_mutex_unlock(&mu);
}

/* rmaw_cuda_agent_note copies what the last start or stop of an agent
 * found. */
void rmaw_cuda_agent_note(char* out, size_t n) {
  pthread_mutex_lock(&nmu);
  snprintf(out, n, "%s", agentNote);
  pthread_mutex_unlock(&nmu);
}
