/*
 * hello_rma.c - the smallest host of the RMA plugin: how RCCL/NCCL load it
 * and drive one put with a signal between two ranks.
 *
 *   make build/hello_rma && ./build/hello_rma [path/to/librccl-rma-wasm.so]
 *
 * Rank 0 (the parent) and rank 1 (a forked child) each load the library,
 * exchange their 128-byte listen handles over a socketpair (NCCL does this
 * with its bootstrap), connect, register a buffer and a signal word, and
 * rank 0 sends a message with iputSignal. Rank 1 waits for the signal, then
 * reads the message. For every option, version and failure mode see the
 * test harness (test/harness/, build/rma_driver).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rma_plugin.h"

#define MSG_SIZE 4096
static const char kMessage[] = "hello from rank 0, delivered by iputSignal";

static int g_rank;

/* NCCL hands the plugin a printf-like logger; levels use NCCL's numbering. */
static void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                   const char* fmt, ...) {
  (void)flags, (void)file, (void)line;
  if (level == RMA_NCCL_LOG_TRACE) return;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(stderr, "[rank %d] plugin %s: %s\n", g_rank,
          level == RMA_NCCL_LOG_WARN ? "WARN" : "INFO", buf);
}

/* Every plugin call returns an ncclResult_t; anything but success ends the rank. */
#define CHECK(call)                                                               \
  do {                                                                            \
    ncclResult_t rc_ = (call);                                                    \
    if (rc_ != ncclSuccess) {                                                     \
      fprintf(stderr, "[rank %d] %s failed: ncclResult %d\n", g_rank, #call, rc_); \
      return 1;                                                                   \
    }                                                                             \
  } while (0)

/* The bootstrap NCCL provides: here, one socketpair between the two ranks. */
static int exchange(int fd, const void* mine, void* theirs, size_t n) {
  if (write(fd, mine, n) != (ssize_t)n) return -1;
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char*)theirs + got, n - got);
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

/* Wait until a request is done: test() alone drives it to completion. */
static int wait_done(const ncclRma_v15_t* rma, void* coll, void* req) {
  for (int done = 0; !done;)
    CHECK(rma->test(coll, req, &done));
  return 0;
}

static int run_rank(int rank, int fd, const char* lib) {
  g_rank = rank;
  alarm(60); /* a lost peer ends the example instead of hanging it */

  /* 1. Load the library as RCCL does and resolve the v15 table. */
  void* dl = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (dl == NULL) {
    fprintf(stderr, "[rank %d] dlopen: %s\n", rank, dlerror());
    return 1;
  }
  const ncclRma_v15_t* rma = dlsym(dl, "ncclRmaPlugin_v15");
  if (rma == NULL) {
    fprintf(stderr, "[rank %d] dlsym: %s\n", rank, dlerror());
    return 1;
  }

  /* 2. init, then listen: the handle is an opaque 128-byte address. */
  void* ctx = NULL;
  CHECK(rma->init(&ctx, 0x4e110ULL /* the communicator's id */, logger));
  char handles[2][NCCL_NET_HANDLE_MAXSIZE] = {{0}};
  void* listenComm = NULL;
  CHECK(rma->listen(ctx, 0 /* device */, handles[rank], &listenComm));

  /* 3. Exchange handles, connect every rank to every rank. */
  if (exchange(fd, handles[rank], handles[1 - rank], NCCL_NET_HANDLE_MAXSIZE)) return 1;
  void* hs[2] = {handles[0], handles[1]};
  void* coll = NULL;
  CHECK(rma->connect(ctx, hs, 2, rank, listenComm, &coll));
  CHECK(rma->closeListen(listenComm));

  /* 4. One RMA context (one lane of issue, any traffic class). */
  ncclRmaConfig_v15_t cfg = {.nContexts = 1, .trafficClass = INT_MIN, .rankStride = 1};
  void* rmaCtx = NULL;
  CHECK(rma->createContext(coll, &cfg, &rmaCtx));

  /* 5. Symmetric registrations: every rank registers the same sizes, in the
   * same order; offsets name bytes in the peer's registration. The signal
   * word is strongly ordered and never reset, as NCCL registers it. */
  char* buf = aligned_alloc(4096, MSG_SIZE);
  uint64_t* sig = aligned_alloc(4096, 4096);
  memset(buf, 0, MSG_SIZE);
  memset(sig, 0, 4096);
  void *bufMh = NULL, *sigMh = NULL;
  CHECK(rma->regMrSym(coll, buf, MSG_SIZE, NCCL_PTR_HOST, 0, &bufMh));
  CHECK(rma->regMrSym(coll, sig, sizeof *sig, NCCL_PTR_HOST,
                      NCCL_NET_MR_FLAG_FORCE_SO | NCCL_NET_MR_FLAG_SIGNAL_NEVER_RESET, &sigMh));

  int rc = 0;
  if (rank == 0) {
    /* 6a. Put the message into rank 1's buffer, then INC its signal word.
     * The signal lands only after every byte of the put. */
    snprintf(buf, MSG_SIZE, "%s", kMessage);
    void* req = NULL;
    CHECK(rma->iputSignal(rmaCtx, 0, 0, bufMh, sizeof kMessage, 0, bufMh, 1 /* peer */, 0, sigMh,
                          0 /* value, unused by INC */, NCCL_NET_SIGNAL_OP_INC, true,
                          NCCL_RMA_OPT_FLAGS_DEFAULT, &req));
    if (wait_done(rma, coll, req)) return 1;
    printf("[rank 0] iputSignal of %zu bytes to rank 1 completed\n", sizeof kMessage);
  } else {
    /* 6b. The target never calls the plugin to receive: it watches the word. */
    while (__atomic_load_n(sig, __ATOMIC_ACQUIRE) != 1) usleep(10);
    rc = memcmp(buf, kMessage, sizeof kMessage) != 0;
    printf("[rank 1] signal arrived; message %s: \"%s\"\n", rc ? "CORRUPT" : "intact", buf);
  }

  /* 7. Teardown in NCCL's order: contexts, registrations, communicator,
   * plugin. Posted operations are delivered even if nobody waits. */
  CHECK(rma->destroyContext(rmaCtx));
  CHECK(rma->deregMrSym(coll, bufMh));
  CHECK(rma->deregMrSym(coll, sigMh));
  CHECK(rma->closeColl(coll));
  CHECK(rma->finalize(ctx));
  free(buf);
  free(sig);
  return rc;
}

int main(int argc, char** argv) {
  const char* lib = argc > 1 ? argv[1] : "build/librccl-rma-wasm.so";
  setvbuf(stdout, NULL, _IOLBF, 0); /* keep the two ranks' lines in order */
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp)) {
    perror("socketpair");
    return 1;
  }
  /* Fork before loading anything: a Go runtime does not survive fork. */
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    return 1;
  }
  if (pid == 0) {
    close(sp[0]);
    int rc = run_rank(1, sp[1], lib);
    fflush(stdout);
    _exit(rc); /* leave without running the parent's exit handlers twice */
  }
  close(sp[1]);
  int rc0 = run_rank(0, sp[0], lib);
  if (rc0) kill(pid, SIGKILL); /* rank 1 would wait for the signal forever */
  int st = 0;
  waitpid(pid, &st, 0);
  int ok = rc0 == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  printf("hello_rma: %s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
