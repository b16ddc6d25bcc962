/* agent.c: the device agent (it uses the driver table and the context
 * streams of the other files: cuda_internal.h).
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
 * The kernel parks (ends) after ag_idle_ns of an empty ring, and the
 * next command launches it again (ag_put): a module load waits for the
 * kernels already running on the device, and a kernel that never ended
 * made it wait for ever. A call that can wait for the context's kernels
 * (pinned allocation and registration, unmapping) first stops it (an
 * EXIT command) and starts it again after (rmacu_ag_pause,
 * rmacu_ag_resume). It runs only in the plugin's own contexts, never the
 * application's: the application's device synchronisations never wait
 * for it. Events of an agent context are tickets, (sequence << 1) | 1,
 * passed once the done word reached the sequence; interprocess events
 * stay real events. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_internal.h"

/* The ring: a header, then AG_SLOTS slots of 128 bytes. Header words (byte
 * offsets): done at 0 (agent writes), epoch at 64 (the stream writes),
 * started at 128 (agent writes 1 when it runs), slow reads at 136 (the
 * one-read kernel counts there the slots it took the two-trip way,
 * ag_check), awake at 192 (1 while a
 * kernel polls; the kernel writes 0 when it parks, the host 1 when it
 * launches one), the peer inbox at 200..240 (below). A slot: seq at 0 (written last, with release), its check word
 * at 8 (ag_check), then kind, n, src, dst, val, sig at 16..64, then up to AG_INLINE payload
 * bytes at 64..128 (an inline command's). Once thread 0 saw the seq,
 * lanes 1..3 of the first warp read bytes 16..64 in one coalesced access
 * (lanes 1..7, bytes 16..128, in a kernel started for inline commands,
 * ag_inline), so an inline payload costs no read of its own: one thread
 * reading the fields in turn cost about 0.5 us per 16 bytes on an H100. */
#define AG_SLOTS 1024
#define AG_HDR 256
#define AG_SLOT 128
#define AG_THREADS 128

/* The kernel (agent.ptx), sm_70 PTX (acquire loads, nanosleep), which the driver
 * compiles for the GPU at hand. Thread 0 polls the next slot (backing
 * off with nanosleep once idle for a while) and shares its address; the
 * first warp's lanes read its fields and inline bytes into shared memory
 * (see the ring above); every thread copies its share of a
 * COPY (16-byte accesses, four in flight per thread, when both ends are
 * 16-byte aligned, else bytes) or one byte of an inline payload; each
 * fences its writes at system scope before the barrier; thread 0 then
 * writes or adds the signal (a WRITE's or ADD's word, or a fused
 * command's sig), or waits for the epoch, fences again and publishes
 * done. Loads are relaxed at system scope: the sources
 * were written by the CPU or by another process's kernel. In a COPY,
 * n16 is n rounded down to 16 when src and dst are 16-aligned (else 0):
 * VLOOP copies that much in 16-byte accesses, BLOOP the rest in bytes. */
/* The peer inbox (agent.ptx, ISCAN), read from the ring header when the
 * kernel starts: at 200 the device address of P rows of E 8-byte entries
 * (peer i's row at i * E * 8), at 208 P (at most 16; 0: no inbox), at 216
 * log2 E, at 224 the pinned host words where the kernel publishes, per row,
 * how many entries it took (bit 62 set once one was refused), at 232 the
 * device address of the table of the signal words it may add to (64
 * entries of {base, size}). A peer's agent writes row i's entry for
 * position p (as a command's signal word, after its copy and fence): bits
 * 56..63 the lap (p / E) % 255 + 1, 50..55 the table index, 28..49 the
 * word's offset in that entry / 8, 0..27 the value. Thread 0 looks at
 * each row's next entry after every command and each empty look at the
 * ring; an entry of the expected lap is taken, its value added (relaxed,
 * at system scope, after an acquire-release fence, so that a reader of
 * the word sees the peer's copy) where the table's entry holds the word,
 * else refused; either way the row moves on and the count is published.
 * Nothing in the plugin fills these words yet: agent_probe measures the
 * path (a peer's copy and entry, against its copy, mark, and an add the
 * host asks for). */
char rmacu_agent_ptx[16384]; /* agent.ptx, NUL-terminated (ptx.go) */

/* rmacu_agent_mode: 0 off, 1 on, 2 auto (on when MPS looks active);
 * rmacu_agent_max: the largest copy the agent takes (bytes). */
int rmacu_agent_mode = 0; /* read by the host-memory calls (copy.c) */
uint64_t rmacu_agent_max = 64 << 10;
/* ag_idle_ns: how long the kernel polls an empty ring before it parks
 * (ends; the next submission launches it again); 0 never. */
static uint64_t ag_idle_ns = 1000000;
/* ag_inline: the kernel reads each slot's inline bytes (its flags
 * parameter's bit 0), so that inline commands may be sent; set only with
 * NCCL_RMA_WASM_FUSED_LANDING, so that the default kernel reads what it
 * did before fused landings existed. */
static int ag_inline;
/* ag_one_read: the kernel reads a slot whole in one round trip (its flags
 * parameter's bit 1, NCCL_RMA_WASM_DEVICE_AGENT_ONE_READ), see ag_check. */
static int ag_one_read;
/* ag_stagger: lane 0 of warps 1-3 poll the ring beside thread 0, each
 * round's first look 256 ns apart per warp, so that a command is seen
 * sooner than one load's round trip after it lands (its flags parameter's
 * bit 2, NCCL_RMA_WASM_DEVICE_AGENT_STAGGER; two-trip reads only). */
static int ag_stagger;
static char agentNote[240] = "not started (no copy context used yet)";
/* nmu guards agentNote alone: notes are set under rmacu_mu or an agent's lock. */
static pthread_mutex_t nmu = PTHREAD_MUTEX_INITIALIZER;

__attribute__((format(printf, 1, 2))) static void ag_note(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&nmu);
  vsnprintf(agentNote, sizeof agentNote, fmt, ap);
  pthread_mutex_unlock(&nmu);
  va_end(ap);
}

void rmaw_cuda_agent(int mode, uint64_t max, uint64_t idle_us, int inl, int one_read, int stagger) {
  rmacu_agent_mode = mode;
  rmacu_agent_max = max;
  ag_idle_ns = idle_us * 1000;
  ag_inline = inl;
  ag_one_read = one_read;
  ag_stagger = stagger;
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
  /* Counts (under mu), for the INFO line at finalize: commands by kind,
   * epoch waits (stream work before agent work: one stream write each),
   * stream waits for the agent, launches after the kernel parked, marked
   * copies (rmaw_cuda_copy_mark), inbox entries the host wrote itself
   * with nothing queued (rmaw_cuda_write_idle). */
  uint64_t nkind[16], follows, leads, wakes, syncs, marks, direct, afterMarks;
  /* The stall watch's own (rmaw_cuda_agent_stalled): the done word it saw
   * last, and since when (ns) commands have waited with done unchanged. */
  uint64_t wdone, wsince;
};

/* Host memory the agent may read or write: what rmacu_host_alloc returned
 * and what rmacu_host_register pinned, where the device reaches it at the
 * same address. Entries are appended (published with a release store of
 * nhr) and cleared, never moved. */
#define MAX_HR 256
static struct {
  uint64_t p, n;
} hr[MAX_HR];
static int nhr;

void rmacu_hr_add(void* p, uint64_t n) {
  if (!rmacu_cu.memHostGetDevicePointer) return;
  CUdeviceptr d = 0;
  if (rmacu_cu.memHostGetDevicePointer(&d, p, 0) != 0 || d != (CUdeviceptr)(uintptr_t)p) return;
  pthread_mutex_lock(&rmacu_mu);
  for (int i = 0; i < nhr; i++)
    if (__atomic_load_n(&hr[i].n, __ATOMIC_ACQUIRE) == 0) {
      __atomic_store_n(&hr[i].p, (uint64_t)(uintptr_t)p, __ATOMIC_RELAXED);
      __atomic_store_n(&hr[i].n, n, __ATOMIC_RELEASE);
      pthread_mutex_unlock(&rmacu_mu);
      return;
    }
  if (nhr < MAX_HR) {
    hr[nhr].p = (uint64_t)(uintptr_t)p;
    hr[nhr].n = n;
    __atomic_store_n(&nhr, nhr + 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&rmacu_mu);
}

void rmacu_hr_drop(void* p) {
  pthread_mutex_lock(&rmacu_mu);
  for (int i = 0; i < nhr; i++)
    if (hr[i].p == (uint64_t)(uintptr_t)p) __atomic_store_n(&hr[i].n, 0, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&rmacu_mu);
}

/* rmacu_hr_ok reports whether [p, p+n) lies in one range the agent may touch. */
int rmacu_hr_ok(const void* p, uint64_t n) {
  uint64_t a = (uint64_t)(uintptr_t)p;
  int k = __atomic_load_n(&nhr, __ATOMIC_ACQUIRE);
  for (int i = 0; i < k; i++) {
    uint64_t len = __atomic_load_n(&hr[i].n, __ATOMIC_ACQUIRE);
    uint64_t base = __atomic_load_n(&hr[i].p, __ATOMIC_RELAXED);
    if (len && a >= base && a + n <= base + len && a + n >= a) return 1;
  }
  return 0;
}

/* ag_check is a slot's check word (its word 1). The classic pickup costs
 * two round trips over PCIe: thread 0's acquire load that sees the seq,
 * then the first warp's loads of the fields. A kernel started with bit 1
 * of its flags (ag_one_read) has its first warp read the whole slot each
 * time it looks, in one request (lanes 0..3, or 0..7 with inline bytes,
 * 16 bytes each, in one instruction: a thread's own loads of host memory
 * go to the bus one after another), with relaxed loads that may see some
 * words of the slot's previous command beside the new seq; it takes the slot only
 * when the words it read give this check word, and after three reads
 * that do not it takes the two-trip path. The check: the XOR over the
 * slot's words j (8, or 16 when the kernel reads inline bytes; word 1
 * counted as 0) of splitmix64's finalizer of (word ^ j * the golden
 * ratio), so that a torn read passes with a chance of about 2^-64. It is
 * written only where the kernel reads slots that way: the default's
 * commands, on NCCL's proxy thread, do not pay for it. */
static uint64_t ag_mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
static uint64_t ag_check(const volatile uint64_t* sl, uint64_t seq, int words) {
  uint64_t h = 0;
  for (int j = 0; j < words; j++) h ^= ag_mix((j == 0 ? seq : j == 1 ? 0 : sl[j]) ^ (uint64_t)j * 0x9e3779b97f4a7c15ull);
  return h;
}

static struct agent* ag_find(uintptr_t ctx);
static ctxstream* ctx_find(uintptr_t ctx);

static volatile uint64_t* ag_slot(struct agent* a, uint64_t s) {
  return a->mem + (AG_HDR + (s & (AG_SLOTS - 1)) * AG_SLOT) / 8;
}
static uint64_t ag_done(struct agent* a) { return __atomic_load_n(&a->mem[0], __ATOMIC_ACQUIRE); }

/* ag_kernel launches the kernel on the agent's stream, awake set first
 * (under a->mu): the function is its context's, made current. */
static CUresult ag_kernel(struct agent* a) {
  unsigned long long ring = a->dev, mask = AG_SLOTS - 1, idle = ag_idle_ns,
                     flags = (ag_inline ? 1 : 0) | (ag_one_read ? 2 : 0) | (ag_stagger ? 4 : 0);
  void* args[] = {&ring, &mask, &idle, &flags};
  __atomic_store_n(&a->mem[24], 1, __ATOMIC_RELEASE);
  CUresult r = rmacu_cu.ctxSetCurrent(a->ctx);
  return r != 0 ? r : rmacu_cu.launchKernel(a->fn, 1, 1, 1, AG_THREADS, 1, 1, 0, a->stream, args, NULL);
}

/* ag_wake launches the kernel again after it parked (under a->mu); it
 * does not wait for it to start: the commands wait in the ring. */
static int ag_wake(struct agent* a, char* err, size_t errlen) {
  CUresult r = ag_kernel(a);
  if (r != 0) {
    __atomic_store_n(&a->live, 0, __ATOMIC_RELEASE);
    ag_note("stopped: launching it after it parked: cuLaunchKernel: %s", rmacu_errstr(r));
    return rmaw_fail(err, errlen, "device agent: cuLaunchKernel after it parked: %s", rmacu_errstr(r));
  }
  a->wakes++;
  return 0;
}

/* ag_put writes command s (under a->mu): it waits, for at most two
 * seconds, for the slot's previous command to be done. */
static int ag_put(struct agent* a, uint64_t kind, uint64_t n, uint64_t src, uint64_t dst, uint64_t val, uint64_t sig,
                  const void* inl, char* err, size_t errlen) {
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
  sl[7] = sig;
  if (inl) memcpy((void*)(sl + 8), inl, (size_t)n); /* n <= AG_INLINE (rmaw_cuda_land_signal) */
  if (ag_one_read) sl[1] = ag_check(sl, s, ag_inline ? 16 : 8);
  __atomic_store_n(&sl[0], s, __ATOMIC_RELEASE);
  a->seq = s;
  a->nkind[kind & 15]++;
  /* The kernel parks when idle: it writes awake = 0, fences, and looks at
   * the next slot once more. The host publishes the slot, fences, and
   * looks at awake. One of the two sees the other's store, so a command
   * is never left without a kernel; both seeing it only queues a second
   * kernel behind the first on its stream, which reads done at its start
   * and parks in turn. */
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  if (__atomic_load_n(&a->mem[24], __ATOMIC_ACQUIRE) == 0) return ag_wake(a, err, errlen);
  return 0;
}

/* ag_follow makes the agent's next command wait for the stream's work
 * queued so far (under a->mu). */
static int ag_follow(ctxstream* e, char* err, size_t errlen) {
  struct agent* a = e->ag;
  if (!a->streamLast) return 0;
  CUresult r = rmacu_cu.writeValue64(e->stream, a->dev + 64, (unsigned long long)(a->epoch + 1), 0);
  if (r != 0) return rmaw_fail(err, errlen, "cuStreamWriteValue64 (agent epoch): %s", rmacu_errstr(r));
  a->epoch++;
  a->streamLast = 0;
  a->follows++;
  return ag_put(a, AG_WAIT, 0, 0, a->dev + 64, a->epoch, 0, NULL, err, errlen);
}

/* ag_lead makes the stream's next work wait for the agent's commands
 * submitted so far (under a->mu). */
static int ag_lead(ctxstream* e, char* err, size_t errlen) {
  struct agent* a = e->ag;
  if (a->waited >= a->seq) return 0;
  CUresult r = rmacu_cu.waitValue64(e->stream, a->dev, (unsigned long long)a->seq, 0 /* GEQ */);
  if (r != 0) return rmaw_fail(err, errlen, "cuStreamWaitValue64 (agent done): %s", rmacu_errstr(r));
  a->waited = a->seq;
  a->leads++;
  return 0;
}

/* rmacu_ag_live returns e's agent when it runs and takes work, else NULL. */
struct agent* rmacu_ag_live(ctxstream* e) {
  struct agent* a = __atomic_load_n(&e->ag, __ATOMIC_ACQUIRE);
  return a && __atomic_load_n(&a->live, __ATOMIC_ACQUIRE) ? a : NULL;
}

/* ag_submit queues one command after the context's earlier work: a
 * fused one names its signal word sig, an inline one carries its payload
 * inl (NULL: none). With own (not NULL) the value written is the
 * command's own number, stored in *own: numbered under the lock, so a
 * word written only this way grows in the order the agent runs them (a
 * marked copy, rmaw_cuda_copy_mark). */
static int ag_submit(ctxstream* e, uint64_t kind, uint64_t n, uint64_t src, uint64_t dst, uint64_t val, uint64_t sig,
                     const void* inl, uint64_t* own, char* err, size_t errlen) {
  struct agent* a = e->ag;
  pthread_mutex_lock(&a->mu);
  int rc = -1;
  if (!a->live) rc = rmaw_fail(err, errlen, "the device agent stopped");
  else if (ag_follow(e, err, errlen) == 0) {
    if (own) val = *own = a->seq + 1;
    rc = ag_put(a, kind, n, src, dst, val, sig, inl, err, errlen);
    if (rc == 0 && own) a->marks++;
    if (rc == 0 && (kind & AG_AFTER_MARK)) a->afterMarks++;
  }
  pthread_mutex_unlock(&a->mu);
  return rc;
}

/* rmacu_ag_submit queues one command after the context's earlier work. */
int rmacu_ag_submit(ctxstream* e, uint64_t kind, uint64_t n, uint64_t src, uint64_t dst, uint64_t val, char* err,
                    size_t errlen) {
  return ag_submit(e, kind, n, src, dst, val, 0, NULL, NULL, err, errlen);
}

/* rmaw_cuda_land_signal queues, as one agent command after the context's
 * earlier work, the copy of n bytes from pinned host memory host to device
 * address dst and then the write (add 0) or atomic add (add 1) of v to the
 * device word sig: a payload of at most AG_INLINE bytes rides in the
 * command's slot. 1 (nothing queued): the context runs no agent, or the
 * copy is too large for it, or host is memory it cannot read. */
int rmaw_cuda_land_signal(uintptr_t ctx, uint64_t dst, const void* host, uint64_t n, uint64_t sig, uint64_t v, int add,
                      char* err, size_t errlen) {
  CTX_STREAM(e, "fused landing");
  (void)r;
  if (!rmacu_ag_live(e) || n == 0 || n > rmacu_agent_max) return 1;
  if (sig & 7) return rmaw_fail(err, errlen, "signal word %#llx not 8-byte aligned", (unsigned long long)sig);
  int inl = ag_inline && n <= AG_INLINE;
  if (!inl && !rmacu_hr_ok(host, n)) return 1;
  uint64_t kind = inl ? (add ? AG_INLINE_ADD : AG_INLINE_WRITE) : (add ? AG_COPY_ADD : AG_COPY_WRITE);
  return ag_submit(e, kind, n, inl ? 0 : (uint64_t)(uintptr_t)host, dst, v, sig, inl ? host : NULL, NULL, err, errlen);
}

/* rmaw_cuda_copy_mark queues, as one agent command after the context's
 * earlier work, the copy of n bytes from device address src to dst (a
 * peer's window mapped here) and then the write of the command's own
 * number to the 8-byte word mark, pinned host memory the agent reaches (the
 * process's mark page, which the peers of this host map): *v is that
 * number. The agent runs its commands in order and fences a copy's writes
 * at system scope before it writes, so mark >= *v says the copy is visible
 * to every process. 1 (nothing queued): the context runs no agent, or the
 * copy is too large for it, or mark is memory it cannot reach. */
int rmaw_cuda_copy_mark(uintptr_t ctx, uint64_t dst, uint64_t src, uint64_t n, uint64_t mark, uint64_t* v, char* err,
                        size_t errlen) {
  CTX_STREAM(e, "marked copy");
  (void)r;
  if (!rmacu_ag_live(e) || n == 0 || n > rmacu_agent_max) return 1;
  if ((mark & 7) || !rmacu_hr_ok((const void*)(uintptr_t)mark, 8)) return 1;
  return ag_submit(e, AG_COPY_WRITE, n, src, dst, 0, mark, NULL, v, err, errlen);
}

/* rmaw_cuda_signal_after_mark queues, as one agent command after the
 * context's earlier work, the write (add 0) or atomic add (add 1) of v to
 * the device word sig once the host word mark (a peer's mark page,
 * registered here read-only) reached mv: the kernel polls it with acquire
 * loads and fences (acquire-release, system scope) before the signal, so
 * a reader of sig sees what the peer's agent copied before it marked. The
 * host does not wait for the mark. With release (not 0, a pinned host
 * word), the kernel skips the signal once that word is not 0: the host
 * sets it when the peer's process is gone. 1 (nothing queued): the context
 * runs no agent, or mark or release is memory it cannot reach. */
int rmaw_cuda_signal_after_mark(uintptr_t ctx, uint64_t sig, uint64_t v, int add, uint64_t mark, uint64_t mv,
                                uint64_t release, char* err, size_t errlen) {
  CTX_STREAM(e, "signal after a mark");
  (void)r;
  if (!rmacu_ag_live(e)) return 1;
  if ((mark & 7) || !rmacu_hr_ok((const void*)(uintptr_t)mark, 8)) return 1;
  if (release && ((release & 7) || !rmacu_hr_ok((const void*)(uintptr_t)release, 8))) return 1;
  if (sig & 7) return rmaw_fail(err, errlen, "signal word %#llx not 8-byte aligned", (unsigned long long)sig);
  return ag_submit(e, (add ? AG_ADD : AG_WRITE) | AG_AFTER_MARK, mv, mark, sig, v, release, NULL, NULL, err, errlen);
}

/* rmacu_ag_submit_sig queues a fused command (kinds 7 and 8) after the
 * context's earlier work: its copy, then its signal word sig. */
int rmacu_ag_submit_sig(ctxstream* e, uint64_t kind, uint64_t n, uint64_t src, uint64_t dst, uint64_t val, uint64_t sig,
                        char* err, size_t errlen) {
  return ag_submit(e, kind, n, src, dst, val, sig, NULL, NULL, err, errlen);
}

/* rmaw_cuda_write_idle stores v to the host word w (a peer's inbox row in
 * shared host memory) from this thread when everything queued in ctx ran:
 * the agent's done word reached its last command and the stream got no
 * work after it (work before it, the agent waited for). Under the agent's
 * lock, so no command is queued meanwhile. 0: stored; 1: not so (work
 * still queued, or no live agent), the caller queues the write on the
 * agent instead. */
int rmaw_cuda_write_idle(uintptr_t ctx, uint64_t w, uint64_t v) {
  ctxstream* e = ctx_find(ctx);
  struct agent* a = e ? __atomic_load_n(&e->ag, __ATOMIC_ACQUIRE) : NULL;
  if (!a || (w & 7) || !w) return 1;
  pthread_mutex_lock(&a->mu);
  int rc = 1;
  /* Stream work after the agent's last command that has all run needs no
   * wait any more: the flag goes, here and for the next command. */
  if (a->live && a->streamLast && ag_done(a) >= a->seq && rmacu_cu.streamQuery && rmacu_cu.streamQuery(e->stream) == 0)
    a->streamLast = 0;
  if (a->live && !a->streamLast && ag_done(a) >= a->seq) {
    __atomic_store_n((uint64_t*)(uintptr_t)w, v, __ATOMIC_RELEASE);
    a->direct++;
    rc = 0;
  }
  pthread_mutex_unlock(&a->mu);
  return rc;
}

/* rmacu_ag_header is the ring header of ctx's agent, NULL: none. */
volatile uint64_t* rmacu_ag_header(uintptr_t ctx) {
  struct agent* a = ag_find(ctx);
  return a ? a->mem : NULL;
}

/* rmacu_ag_record records a ticket in *ev (an event of a's context): the
 * agent's last command, after the stream's work. */
int rmacu_ag_record(ctxstream* e, struct agent* a, uintptr_t* ev, char* err, size_t errlen) {
  pthread_mutex_lock(&a->mu);
  int rc = a->live ? ag_follow(e, err, errlen) : rmaw_fail(err, errlen, "the device agent stopped");
  if (rc == 0) *ev = (uintptr_t)(a->seq << 1 | 1);
  pthread_mutex_unlock(&a->mu);
  return rc;
}

/* rmacu_ag_sync waits on the host until everything queued in e ran, when
 * e's agent took the last work (the stream got none after its last
 * command: the first agent command after stream work waited for it).
 * Returns 0 when it waited, 1 when the stream must be synchronized
 * instead (no live agent, or stream work after the agent's), -1 when the
 * agent stopped first. */
int rmacu_ag_sync(ctxstream* e) {
  struct agent* a = rmacu_ag_live(e);
  if (!a) return 1;
  pthread_mutex_lock(&a->mu);
  uint64_t want = a->seq;
  int stream = !a->live || a->streamLast;
  if (!stream) a->syncs++;
  pthread_mutex_unlock(&a->mu);
  if (stream) return 1;
  for (unsigned spin = 0;; spin++) {
    int t = rmacu_ag_ticket((uintptr_t)a->ctx, (uintptr_t)(want << 1 | 1));
    if (t != 0) return t > 0 ? 0 : -1;
    if (spin < 1000) sched_yield();
    else usleep(20);
  }
}

/* rmacu_on_stream locks e's agent, if any (*a, NULL: none), and makes the
 * stream's next work wait for the agent's commands; on failure it unlocks
 * and returns -1. rmacu_off_stream records whether the stream got work and
 * unlocks. */
int rmacu_on_stream(ctxstream* e, struct agent** a, char* err, size_t errlen) {
  *a = __atomic_load_n(&e->ag, __ATOMIC_ACQUIRE);
  if (!*a) return 0;
  pthread_mutex_lock(&(*a)->mu);
  if ((*a)->live && ag_lead(e, err, errlen) != 0) {
    pthread_mutex_unlock(&(*a)->mu);
    return -1;
  }
  return 0;
}
void rmacu_off_stream(struct agent* a, int queued) {
  if (!a) return;
  if (queued) a->streamLast = 1;
  pthread_mutex_unlock(&a->mu);
}

/* ag_launch starts the kernel at command seq+1 and waits up to 500 ms
 * for it to run (under a->mu, the context current); 0 when it runs. */
static int ag_launch(struct agent* a, char* note, size_t notelen) {
  __atomic_store_n(&a->mem[16], 0, __ATOMIC_RELEASE);
  __atomic_store_n(&a->mem[0], a->seq, __ATOMIC_RELEASE); /* the kernel starts at done + 1 */
  CUresult r = ag_kernel(a);
  if (r != 0) {
    snprintf(note, notelen, "launching its kernel: %s", rmacu_errstr(r));
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
  if (ag_put(a, AG_EXIT, 0, 0, 0, 0, 0, NULL, err, sizeof err) == 0 && started) {
    for (int i = 0; i < 20000 && ag_done(a) < a->seq; i++) usleep(50);
  }
  if (ag_done(a) >= a->seq && rmacu_cu.ctxSetCurrent(a->ctx) == 0) {
    rmacu_cu.streamSynchronize(a->stream);
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
 * driver's documented aliasing. */
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

/* ag_mps reports whether MPS's control pipe exists (the path it looked at
 * in path). */
static int ag_mps(char* path, size_t n) {
  const char* dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
  snprintf(path, n, "%s/control", dir && *dir ? dir : "/tmp/nvidia-mps");
  return access(path, F_OK) == 0;
}

/* rmaw_cuda_agent_wanted reports whether the mode asks for agents here:
 * on, or auto with MPS running (whether one then starts depends on the
 * driver and the contexts). */
int rmaw_cuda_agent_wanted(void) {
  char path[512];
  return rmacu_agent_mode == 1 || (rmacu_agent_mode == 2 && ag_mps(path, sizeof path));
}

/* ag_start makes and launches e's agent (under rmacu_mu, e's context current;
 * e is one of the plugin's own contexts). A failure leaves the stream
 * paths, with the reason in agentNote. */
static void ag_start(ctxstream* e) {
  if (!rmacu_agent_mode || e->ag) return;
  char path[512];
  if (rmacu_agent_mode == 2 && !ag_mps(path, sizeof path)) {
    ag_note("off: MPS is not running (no %.150s; NCCL_RMA_WASM_DEVICE_AGENT=1 forces it)", path);
    return;
  }
  if (!rmacu_cu.launchKernel || !rmacu_cu.moduleLoadData || !rmacu_cu.waitValue64 || !rmacu_cu.memHostGetDevicePointer ||
      !(e->caps & RMAW_CAP_WRITE64)) {
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
  else if ((r = rmacu_cu.moduleLoadData(&mod, rmacu_agent_ptx)) != 0) what = "cuModuleLoadData";
  else if ((r = rmacu_cu.moduleGetFunction(&a->fn, mod, "rmaw_agent")) != 0) what = "cuModuleGetFunction";
  else if ((r = rmacu_cu.memHostAlloc(&p, AG_HDR + AG_SLOTS * AG_SLOT, 3 /* PORTABLE | DEVICEMAP */)) != 0) what = "cuMemHostAlloc";
  else if ((r = rmacu_cu.memHostGetDevicePointer(&a->dev, p, 0)) != 0) what = "cuMemHostGetDevicePointer";
  else if ((r = rmacu_cu.streamCreate(&a->stream, STREAM_NON_BLOCKING)) != 0) what = "cuStreamCreate";
  if (what) {
    ag_note("off: %s: %s", what, a ? rmacu_errstr(r) : "calloc");
    if (p) rmacu_cu.memFreeHost(p);
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
           AG_THREADS, (unsigned long long)rmacu_agent_max);
}

/* ag_find returns the agent of ctx without making ctx current. */
/* ctx_find is ctx's entry in the context table, without a lock; NULL:
 * none. */
static ctxstream* ctx_find(uintptr_t ctx) {
  int n = __atomic_load_n(&rmacu_nctxs, __ATOMIC_ACQUIRE);
  for (int i = 0; i < n; i++)
    if (rmacu_ctxs[i].ctx == (CUcontext)ctx) return &rmacu_ctxs[i];
  return NULL;
}

static struct agent* ag_find(uintptr_t ctx) {
  ctxstream* e = ctx_find(ctx);
  return e ? __atomic_load_n(&e->ag, __ATOMIC_ACQUIRE) : NULL;
}

/* rmacu_ag_pause stops ctx's agent around a call that may wait for the
 * context's kernels; it returns the agent to hand rmacu_ag_resume, locked, or
 * NULL (none running). */
struct agent* rmacu_ag_pause(uintptr_t ctx) {
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

void rmacu_ag_resume(struct agent* a) {
  if (!a) return;
  char note[160];
  if (ag_launch(a, note, sizeof note) != 0) {
    __atomic_store_n(&a->live, 0, __ATOMIC_RELEASE);
    ag_note("stopped: restarting it after a pinned allocation: %s", note);
  }
  pthread_mutex_unlock(&a->mu);
}

/* rmacu_ag_pause_all pauses every running agent (a free, whose context is not
 * known); out gets them, NULL-terminated or full. */
void rmacu_ag_pause_all(struct agent** out, int max) {
  int n = __atomic_load_n(&rmacu_nctxs, __ATOMIC_ACQUIRE), k = 0;
  for (int i = 0; i < n && k < max; i++) {
    struct agent* a = __atomic_load_n(&rmacu_ctxs[i].ag, __ATOMIC_ACQUIRE);
    if (!a || rmacu_cu.ctxSetCurrent(rmacu_ctxs[i].ctx) != 0) continue;
    if ((a = rmacu_ag_pause((uintptr_t)rmacu_ctxs[i].ctx))) out[k++] = a;
  }
  if (k < max) out[k] = NULL;
}
void rmacu_ag_resume_all(struct agent** a, int max) {
  for (int i = 0; i < max && a[i]; i++) rmacu_ag_resume(a[i]);
}

/* rmacu_ag_ticket answers an event query of a ticket: 1 passed, 0 not yet, -1
 * the agent stopped before it (its kernel failed). */
int rmacu_ag_ticket(uintptr_t ctx, uintptr_t ev) {
  struct agent* a = ag_find(ctx);
  uint64_t s = (uint64_t)ev >> 1;
  if (!a) return -1;
  if (ag_done(a) >= s) return 1;
  if (!__atomic_load_n(&a->live, __ATOMIC_ACQUIRE)) return -1;
  /* Now and then, ask whether the kernel still runs. */
  if ((__atomic_add_fetch(&a->polls, 1, __ATOMIC_RELAXED) & 4095) == 0 && rmacu_cu.streamQuery) {
    /* Under a->mu: a submission launches the kernel again, if it parked,
     * before it lets go, so an idle stream with the ticket not done means
     * the kernel failed. */
    pthread_mutex_lock(&a->mu);
    CUresult r = ag_done(a) >= s ? ERROR_NOT_READY : rmacu_cu.streamQuery(a->stream);
    int dead = r != ERROR_NOT_READY && ag_done(a) < s;
    pthread_mutex_unlock(&a->mu);
    if (dead) return -1;
  }
  return 0;
}

/* rmaw_cuda_agents_stop ends every agent (plugin finalize). */
void rmaw_cuda_agents_stop(void) {
  int n = __atomic_load_n(&rmacu_nctxs, __ATOMIC_ACQUIRE);
  for (int i = 0; i < n; i++) {
    struct agent* a = __atomic_load_n(&rmacu_ctxs[i].ag, __ATOMIC_ACQUIRE);
    if (!a) continue;
    pthread_mutex_lock(&a->mu);
    if (rmacu_cu.ctxSetCurrent(rmacu_ctxs[i].ctx) == 0) {
      __atomic_store_n(&a->live, 0, __ATOMIC_RELEASE);
      /* A kernel that never started may start later: it finds EXIT. */
      ag_stop(a);
    }
    pthread_mutex_unlock(&a->mu);
  }
  rmacu_inbox_close();
}

/* rmaw_cuda_agent_start starts the agent of ctx when it is one of the
 * plugin's copy contexts (registration, after its pinned allocations). */
void rmaw_cuda_agent_start(uintptr_t ctx) {
  if (!rmacu_own_context(ctx)) return;
  CUresult r;
  ctxstream* e = rmacu_ctx_stream(ctx, &r);
  if (!e) return;
  pthread_mutex_lock(&rmacu_mu);
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
  pthread_mutex_unlock(&rmacu_mu);
}

/* rmaw_cuda_agent_runs reports whether ctx's agent runs and takes work. */
int rmaw_cuda_agent_runs(uintptr_t ctx) {
  struct agent* a = ag_find(ctx);
  return a && __atomic_load_n(&a->live, __ATOMIC_ACQUIRE);
}

/* rmaw_cuda_agent_stats sums every agent's counts: out[0] copies, [1]
 * signal writes and adds, [2] epoch waits, [3] stream waits for the
 * agent, [4] launches after parking, [5] agents, [6] synchronizations
 * waited for on the host, [7] adds, [8] fused landings (copy, then the
 * signal), [9] of them inline, [10] marked copies (counted apart from the
 * fused landings, whose command they share), [11] slots the one-read
 * kernel took the two-trip way (ag_check), [12] host writes of inbox rows
 * (rmaw_cuda_write_idle), [13] signals queued to follow a peer's mark
 * (rmaw_cuda_signal_after_mark), [14] of them skipped (the release word
 * set, or no mark within 30 s). */
void rmaw_cuda_agent_stats(uint64_t out[15]) {
  memset(out, 0, 15 * sizeof out[0]);
  int n = __atomic_load_n(&rmacu_nctxs, __ATOMIC_ACQUIRE);
  for (int i = 0; i < n; i++) {
    struct agent* a = __atomic_load_n(&rmacu_ctxs[i].ag, __ATOMIC_ACQUIRE);
    if (!a) continue;
    pthread_mutex_lock(&a->mu);
    out[0] += a->nkind[AG_COPY];
    out[1] += a->nkind[AG_WRITE] + a->nkind[AG_ADD];
    out[7] += a->nkind[AG_ADD];
    out[8] += a->nkind[AG_COPY_WRITE] - a->marks + a->nkind[AG_COPY_ADD] + a->nkind[AG_INLINE_WRITE] + a->nkind[AG_INLINE_ADD];
    out[9] += a->nkind[AG_INLINE_WRITE] + a->nkind[AG_INLINE_ADD];
    out[2] += a->follows;
    out[3] += a->leads;
    out[4] += a->wakes;
    out[5]++;
    out[6] += a->syncs;
    out[10] += a->marks;
    out[11] += __atomic_load_n(&a->mem[17], __ATOMIC_RELAXED);
    out[12] += a->direct;
    out[13] += a->afterMarks;
    out[14] += __atomic_load_n(&a->mem[19], __ATOMIC_RELAXED);
    pthread_mutex_unlock(&a->mu);
  }
}

/* rmaw_cuda_agent_stalled returns the longest time, in ms, that an agent
 * with commands waiting has done none of them (0: none), and in *pending
 * how many wait there. A kernel launched but not running (no SM free for
 * its block) leaves commands waiting with nothing to say so: the watch
 * (one goroutine, cuda.go) WARNs. Only the watch calls it. */
uint64_t rmaw_cuda_agent_stalled(uint64_t* pending) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  uint64_t now = (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec, worst = 0;
  *pending = 0;
  int n = __atomic_load_n(&rmacu_nctxs, __ATOMIC_ACQUIRE);
  for (int i = 0; i < n; i++) {
    struct agent* a = __atomic_load_n(&rmacu_ctxs[i].ag, __ATOMIC_ACQUIRE);
    if (!a) continue;
    pthread_mutex_lock(&a->mu);
    uint64_t seq = a->seq;
    int live = a->live;
    pthread_mutex_unlock(&a->mu);
    uint64_t d = ag_done(a);
    if (!live || d >= seq) {
      a->wsince = 0;
      continue;
    }
    if (!a->wsince || d != a->wdone) {
      a->wdone = d;
      a->wsince = now;
      continue;
    }
    if (now - a->wsince > worst) {
      worst = now - a->wsince;
      *pending = seq - d;
    }
  }
  return worst / 1000000;
}

/* rmaw_cuda_agent_note copies what the last start or stop of an agent
 * found. */
void rmaw_cuda_agent_note(char* out, size_t n) {
  pthread_mutex_lock(&nmu);
  snprintf(out, n, "%s", agentNote);
  pthread_mutex_unlock(&nmu);
}
