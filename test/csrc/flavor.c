/*
 * flavor.c - loads a logger library (argv[2]) and the plugin (argv[1]),
 * optionally setenv()s NCCL_RMA_WASM_LOG_FLAVOR=argv[3] *after* loading the
 * plugin (the plugin must read it through libc getenv), then calls
 * init(ctx=NULL) on table v15 and prints the result and the level of the
 * WARN line the plugin logged.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "rma_plugin.h"

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  void* lg = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  if (!lg) {
    printf("error %s\n", dlerror());
    return 1;
  }
  ncclDebugLogger_t logger = (ncclDebugLogger_t)dlsym(lg, "fake_logger");
  int (*last_level)(void) = (int (*)(void))dlsym(lg, "fake_last_level");
  const char* (*last_msg)(void) = (const char* (*)(void))dlsym(lg, "fake_last_msg");
  void* pl = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!pl || !logger || !last_level || !last_msg) {
    printf("error %s\n", dlerror());
    return 1;
  }
  const ncclRma_v15_t* t = dlsym(pl, "ncclRmaPlugin_v15");
  if (!t) {
    printf("error no table\n");
    return 1;
  }
  if (argc > 3) setenv("NCCL_RMA_WASM_LOG_FLAVOR", argv[3], 1);
  ncclResult_t rc = t->init(NULL, 1, logger);
  printf("rc %d\nlevel %d\nmsg %s\n", (int)rc, last_level(), last_msg());
  return 0;
}
