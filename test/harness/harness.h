/*
 * harness.h - what the parts of rma_driver share.
 *
 * rma_driver is the conformance and stress harness: it drives an NCCL/RCCL
 * RMA plugin the way RCCL loads it. The parent forks one process per rank
 * (before anything is dlopen'ed) and acts as the bootstrap hub over
 * socketpairs: allgather of the 128-byte listen handles, barriers, and
 * per-rank reports. Each child dlopens the plugin with RTLD_NOW|RTLD_LOCAL,
 * dlsyms ncclRmaPlugin_v<V> and runs init .. finalize (optionally several
 * cycles), moving patterned data with iput / iputSignal / iget from several
 * threads and verifying every byte.
 *
 *   main.c       options, fork, the final report
 *   bootstrap.c  the parent hub and the ranks' allgather / barrier / report
 *   plugin.c     dlopen + the v14/v15/v16 tables, the logger (and --summary capture)
 *   rank.c       one rank: run_cycle, worker threads, signal waits, verification
 *   scenarios.c  bad-input, kill, teardown, signal storm
 *   pingpong.c   8-byte put+signal ping-pong beside raw TCP (--scenario pingpong)
 *
 * Build: make build/rma_driver (gcc -O2 -Wall -Wextra -Werror -pthread -Icapi test/harness/{main,bootstrap,plugin,rank,scenarios,pingpong}.c -ldl)
 * Usage: see samples/README.md or --help.
 */
#ifndef RMA_HARNESS_H
#define RMA_HARNESS_H

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "rma_plugin.h"

/* ---- options (main.c) ---- */

enum scenario { SC_BASIC, SC_BAD_INPUT, SC_KILL, SC_TEARDOWN, SC_FAULT, SC_PINGPONG };

/* --fault (scenario fault): what happens to --kill-rank after round 0 */
enum fault { F_KILL_PUT, F_KILL_GET, F_KILL_SIGNAL, F_STOP, F_STOP_CONT, F_RESET, F_LANE_RESET };

typedef struct {
  const char* lib;
  int version;
  int ranks;
  size_t size;
  int iters;
  int threads;
  int cycles;
  enum scenario scenario;
  int kill_rank;
  int timeout_s;
  int verbose;
  int no_progress;
  int no_ptrace;
  int signal_storm;
  int summary;
  int compressible;
  enum fault fault;
  int fault_delay_ms; /* kill-*, reset: after the fault phase began */
  int stop_ms;        /* stop-cont: how long the rank stays stopped */
  int nofile;         /* > 0: RLIMIT_NOFILE of every rank */
  const char* netns;  /* rank r joins the network namespace <netns><r> */
  int device;
  int comms; /* communicators per rank, each with its own contexts and buffers */
  int blocks; /* pingpong: timed blocks of --iters round trips per path */
  int spin;   /* pingpong: empty polls before each wait starts to sched_yield */
  int pp_only; /* pingpong: -1 every kind, else only this one (raw, raw-poll, plugin) */
  int yield_after_post; /* pingpong: sched_yield after each post, as NCCL's proxy ends its turn */
  int flush_round;      /* pingpong: both put, wait, iflush and wait for completion (a GIN round) */
  int gin_flush;        /* with flush_round: no iflush, test() alone (NCCL's device flush without gets) */
  int intranode;        /* pingpong: keep the intra-node path (shared-memory streams) */
} options_t;

extern options_t opt;

const char* scenario_name(enum scenario s);
const char* fault_name(enum fault f);
double now_s(void);
const char* result_name(int r);

/* ---- what a rank learned from the plugin's INFO lines (--summary) ---- */

#define SUMMARY_NOTES 4
#define SUMMARY_MAX_RANKS 256

typedef struct {
  char backend[32];       /* "initialized ... with backend NAME" */
  char features[64];      /* "wasm: backend NAME loaded (features ...)"; empty for native */
  char connect_time[24];  /* "connected to N ranks in T" */
  int32_t connected;      /* N, or -1 when the line never came */
  int32_t intra;          /* ranks on the intra-node path at connect, -1 unknown */
  int32_t lanes;          /* TCP lanes per peer, -1 unknown (an older library) */
  uint8_t refused[SUMMARY_MAX_RANKS]; /* peers the kernel refused process_vm_writev to */
  int32_t nnotes;         /* the backend's own INFO lines, the last SUMMARY_NOTES */
  char notes[SUMMARY_NOTES][112];
} summary_t;

/* ---- bootstrap (bootstrap.c) ---- */

enum { MSG_COLL = 1, MSG_REPORT = 2 };
enum { TAG_HANDLES = 1, TAG_BARRIER = 2, TAG_KILL = 3 };

typedef struct {
  int32_t status; /* 0 pass */
  int32_t warns;
  int32_t cycles_done;
  int32_t pad;
  double seconds;       /* time in the data phases */
  uint64_t bytes;       /* bytes put + got by this rank (each one verified) */
  uint64_t ops;         /* data operations issued */
  uint64_t sigs;        /* signal operations whose effect this rank verified */
  char reason[512];
  int32_t setup_failed; /* --nofile: a setup call failed cleanly (code + WARN) */
  int32_t pad2;
  summary_t sum;
  char pp_line[256]; /* pingpong, rank 0: the PINGPONG figures */
} report_t;

typedef struct {
  pid_t pid;
  int fd;
  int alive;      /* fd still open */
  int killed;     /* by us (kill scenario) */
  int pending;    /* contributed to the current collective */
  int tag;
  char* data;
  size_t len;
  int has_report;
  report_t rep;
  int status;
  int reaped;
} child_t;

extern int g_rank; /* -1 in the parent */

void reap_child(child_t* c);
int write_full(int fd, const void* p, size_t n);
int read_full(int fd, void* p, size_t n);
void boot_attach(int rank, int fd);
int boot_allgather(int tag, const void* in, size_t len, void* out);
int boot_barrier(int tag);
void boot_report(const report_t* rep);
/* hub_run serves the ranks' collectives until every rank is gone, reaps
 * them, and returns NULL or why the hub itself failed. */
const char* hub_run(child_t* C, int N);

/* ---- the plugin, seen through a v15-shaped table (plugin.c) ---- */

typedef struct {
  ncclRma_v15_t t; /* v14 calls go through adapters */
  ncclResult_t (*getRmaProperties)(void* collComm, ncclRmaProperties_v16_t* p); /* v16 only */
  void* dl;
} plugin_t;

extern atomic_int g_warns;
extern atomic_int g_expecting_warn; /* inside a bad-input check: count, don't print */

int load_plugin(plugin_t* p, char* err, size_t errlen);
void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
            const char* fmt, ...) __attribute__((format(printf, 5, 6)));
/* summary_snapshot copies what the logger captured so far. */
void summary_snapshot(summary_t* out);

/* ---- one rank (rank.c) ---- */

#define SIG_INC_ADD 0x10000ULL /* value of the per-sender ADD signal */
#define BOGUS_CTX ((void*)(uintptr_t)0xBAD0C0DEULL)
#define GARBAGE_HANDLE ((void*)(uintptr_t)0x7a7a7a7a12345ULL)

#define MAX_COMMS 16

/* What the data rounds use of one communicator. comm 0 is the rank's own
 * (R.cm), which every scenario uses; --comms adds 1..C-1 beside it. */
typedef struct {
  void* coll;
  void* rctx;
  uint8_t *src, *dst, *getsrc, *getdst;
  uint64_t* sig;
  void *srcMh, *dstMh, *getsrcMh, *getdstMh, *sigMh;
} comm_t;

typedef struct {
  plugin_t pl;
  int cycle;
  void* ctx;
  void* ginCtx; /* NCCL inits the plugin a second time for the GIN proxy */
  void* listenComm;
  comm_t cm; /* the rank's own communicator, which every scenario uses */
  char err[512];
  atomic_int failed;
  uint64_t bytes, ops, sigs;
  double seconds;
  double round_s; /* the last round's data phase */
  atomic_int running; /* worker threads still posting (lane-reset) */
  int iter;
  char pp_line[256]; /* pingpong (pingpong.c) */
} rank_t;

extern rank_t R;

void failf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

#define CALL(expr)                                                                   \
  do {                                                                               \
    ncclResult_t rc_ = (expr);                                                       \
    if (rc_ != ncclSuccess) {                                                        \
      failf("cycle %d: %s returned %d (%s)", R.cycle, #expr, rc_, result_name(rc_)); \
      return -1;                                                                     \
    }                                                                                \
  } while (0)

uint64_t put_key(int src, int dst, int cycle, int iter, int t);
void fill(uint8_t* b, size_t off, size_t len, uint64_t k);
long check(const uint8_t* b, size_t off, size_t len, uint64_t k);
void* xalloc(size_t n);
void sig_words(const uint64_t* sig, int n, char* b, size_t cap);
__attribute__((noreturn)) void rank_main(int rank, int fd);

/* ---- scenarios (scenarios.c) ---- */

extern int bad_count;
int bad_before_init(void);
int bad_after_setup(int ndev);
int bad_after_teardown(void* oldRctx, void* oldColl);
int fault_phase(void);
int fault_storm(void);
/* fault_apply is the parent's side of --scenario fault (bootstrap.c). */
void fault_after_collective(child_t* C, int N, int tag);
void fault_tick(child_t* C, int N);
int reset_sockets(pid_t pid);
int reset_one_lane(pid_t pid, char* what, size_t cap);
void count_resources(long* fds, long* rss_kib, long* threads);
int teardown_phase(void);
void storm_start(void);
/* pingpong.c: the timed blocks, after setup (2 ranks, TCP forced) */
int pingpong_phase(void);
long storm_stop(void); /* SIGUSR1 handled */

#endif
