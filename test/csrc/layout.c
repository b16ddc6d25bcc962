/*
 * layout.c - prints the layout of the structs in capi/rma_plugin.h as
 * "key value" lines for test/layout_test.go to compare with abi/.
 * With a library path argument it also dlopens it (RTLD_NOW|RTLD_LOCAL, as
 * RCCL does), prints each table's name and the number of NULL slots.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

#include "rma_plugin.h"

#define SZ(t) printf("sizeof.%s %zu\n", #t, sizeof(t))
#define AL(t) printf("alignof.%s %zu\n", #t, _Alignof(t))
#define OFF(t, f) printf("offsetof.%s.%s %zu\n", #t, #f, offsetof(t, f))
#define VAL(n) printf("value.%s %lld\n", #n, (long long)(n))

static int null_slots(const void* table, size_t size) {
  const void* const* s = table;
  int n = 0;
  for (size_t i = 0; i < size / sizeof(void*); i++)
    if (s[i] == NULL) n++;
  return n;
}

int main(int argc, char** argv) {
  typedef ncclNetProperties_v12_t P;
  SZ(ncclNetProperties_v12_t);
  AL(ncclNetProperties_v12_t);
  OFF(P, name);
  OFF(P, pciPath);
  OFF(P, guid);
  OFF(P, ptrSupport);
  OFF(P, regIsGlobal);
  OFF(P, forceFlush);
  OFF(P, speed);
  OFF(P, port);
  OFF(P, latency);
  OFF(P, maxComms);
  OFF(P, maxRecvs);
  OFF(P, netDeviceType);
  OFF(P, netDeviceVersion);
  OFF(P, vProps);
  OFF(P, vProps.devs);
  OFF(P, maxP2pBytes);
  OFF(P, maxCollBytes);
  OFF(P, maxMultiRequestSize);
  OFF(P, railId);
  OFF(P, planeId);
  SZ(ncclNetVDeviceProps_v12_t);
  SZ(ncclRmaConfig_v14_t);
  SZ(ncclRmaConfig_v15_t);
  SZ(ncclRmaConfig_v16_t);
  OFF(ncclRmaConfig_v15_t, nContexts);
  OFF(ncclRmaConfig_v15_t, trafficClass);
  OFF(ncclRmaConfig_v15_t, rankStride);
  SZ(ncclRmaProperties_v16_t);
  SZ(ncclRma_v14_t);
  SZ(ncclRma_v15_t);
  SZ(ncclRma_v16_t);
  SZ(ncclResult_t);
  SZ(void*);
  OFF(ncclRma_v15_t, getProperties);
  OFF(ncclRma_v15_t, iput);
  OFF(ncclRma_v15_t, finalize);
  OFF(ncclRma_v16_t, getRmaProperties);
  OFF(ncclRma_v16_t, getProperties);
  OFF(ncclRma_v16_t, iput);
  OFF(ncclRma_v16_t, finalize);
  OFF(ncclRma_v14_t, iput);
  OFF(ncclRma_v14_t, finalize);
  VAL(ncclSuccess);
  VAL(ncclInternalError);
  VAL(ncclInvalidArgument);
  VAL(ncclInvalidUsage);
  VAL(ncclRemoteError);
  VAL(NCCL_PTR_HOST);
  VAL(NCCL_PTR_CUDA);
  VAL(NCCL_PTR_DMABUF);
  VAL(NCCL_NET_MR_FLAG_FORCE_SO);
  VAL(NCCL_NET_MR_FLAG_SIGNAL_NEVER_RESET);
  VAL(NCCL_NET_SIGNAL_OP_INC);
  VAL(NCCL_NET_SIGNAL_OP_ADD);
  VAL(NCCL_NET_HANDLE_MAXSIZE);
  VAL(NCCL_NET_MAX_DEVS_PER_NIC_V12);
  VAL(NCCL_NET_DEVICE_GIN_PROXY);
  VAL(NCCL_RMA_OPT_FLAGS_AGGREGATE_REQUESTS);
  VAL(RMA_NCCL_LOG_WARN);
  VAL(RMA_NCCL_LOG_INFO);

  if (argc > 1) {
    void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
      printf("error.dlopen %s\n", dlerror());
      return 1;
    }
    const ncclRma_v14_t* t14 = dlsym(h, "ncclRmaPlugin_v14");
    const ncclRma_v15_t* t15 = dlsym(h, "ncclRmaPlugin_v15");
    const ncclRma_v16_t* t16 = dlsym(h, "ncclRmaPlugin_v16");
    if (!t14 || !t15 || !t16) {
      printf("error.dlsym missing table\n");
      return 1;
    }
    printf("table.v14.name %s\ntable.v14.nullslots %d\n", t14->name, null_slots(t14, sizeof *t14));
    printf("table.v15.name %s\ntable.v15.nullslots %d\n", t15->name, null_slots(t15, sizeof *t15));
    printf("table.v16.name %s\ntable.v16.nullslots %d\n", t16->name, null_slots(t16, sizeof *t16));
    /* v14 and v15 share everything but iput/iputSignal/iget (adapters) */
    printf("table.v14v15.sameinit %d\n", (void*)t14->init == (void*)t15->init);
    printf("table.v16v15.sametest %d\n", (void*)t16->test == (void*)t15->test);
    printf("table.v14v15.diffiput %d\n", (void*)t14->iput != (void*)t15->iput);
  }
  return 0;
}
