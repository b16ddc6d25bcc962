/*
 * recover.c - proves that a Go panic inside the plugin comes back as
 * ncclInternalError with a WARN instead of killing the process: connect is
 * handed a handle pointer (0x10) that faults when read (Go turns a fault
 * below 4 KiB into a nil-dereference panic, which capi recovers). Then it
 * checks that the plugin still answers: devices() and finalize().
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "rma_plugin.h"

static int warns;
static char last[1024];

static void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                   const char* fmt, ...) {
  (void)flags;
  (void)file;
  (void)line;
  (void)fmt;
  if (level == RMA_NCCL_LOG_WARN) {
    __builtin_va_list ap;
    __builtin_va_start(ap, fmt);
    vsnprintf(last, sizeof last, fmt, ap);
    __builtin_va_end(ap);
    warns++;
    fprintf(stderr, "WARN %s\n", last);
  }
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  void* pl = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!pl) {
    printf("error %s\n", dlerror());
    return 1;
  }
  const ncclRma_v15_t* t = dlsym(pl, "ncclRmaPlugin_v15");
  void* ctx = NULL;
  int rc = t->init(&ctx, 7, logger);
  printf("init %d\n", rc);
  int ndev = 0;
  printf("devices %d\n", t->devices(&ndev));
  char handle[NCCL_NET_HANDLE_MAXSIZE] = {0};
  void* lc = NULL;
  printf("listen %d\n", t->listen(ctx, 0, handle, &lc));
  void* hs[1] = {(void*)(uintptr_t)0x10};
  void* coll = (void*)1;
  int w0 = warns;
  rc = t->connect(NULL, hs, 1, 0, lc, &coll);
  printf("connect %d\nconnect_warns %d\nconnect_coll_null %d\n", rc, warns - w0, coll == NULL);
  printf("connect_warn %s\n", last);
  printf("devices_after %d\n", t->devices(&ndev));
  printf("closeListen %d\n", t->closeListen(lc));
  printf("finalize %d\n", t->finalize(ctx));
  return 0;
}
