/*
 * rma_plugin.h - our own C declarations of the NCCL/RCCL RMA plugin ABI
 * (tables v14, v15, v16): result codes, the logger, ncclNetProperties_v12_t,
 * the RMA configs and the three function tables, in the slot order and with
 * the signatures of the public ABI that NCCL and RCCL load (what each slot
 * must do: SPEC.md sections 1 to 3). It is not a copy of any upstream
 * header. The _Static_asserts pin the x86-64 layout that abi/ mirrors in Go
 * (test/layout_test.go checks the two against each other).
 */
#ifndef RCCL_RMA_WASM_RMA_PLUGIN_H
#define RCCL_RMA_WASM_RMA_PLUGIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Result codes (int-sized). Plugins only return 0..6. */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;

/* The level argument of the logger is an int-sized enum whose numbering
 * differs between NCCL and RCCL (RCCL inserts ERROR = 1); we keep it a
 * plain int and pick numbers at run time. */
typedef int ncclDebugLogLevel;
#define RMA_NCCL_LOG_NONE 0
#define RMA_NCCL_LOG_VERSION 1
#define RMA_NCCL_LOG_WARN 2
#define RMA_NCCL_LOG_INFO 3
#define RMA_NCCL_LOG_ABORT 4
#define RMA_NCCL_LOG_TRACE 5

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags,
                                  const char* file, int line, const char* fmt, ...);

/* Memory types, registration flags, signal ops, sizes. */
#define NCCL_PTR_HOST 0x1
#define NCCL_PTR_CUDA 0x2
#define NCCL_PTR_DMABUF 0x4
#define NCCL_NET_MR_FLAG_FORCE_SO (1 << 0)
#define NCCL_NET_MR_FLAG_SIGNAL_NEVER_RESET (1 << 1)
#define NCCL_NET_SIGNAL_OP_INC 0x1
#define NCCL_NET_SIGNAL_OP_ADD 0x2
#define NCCL_NET_HANDLE_MAXSIZE 128
#define NCCL_NET_MAX_REQUESTS 32
#define NCCL_NET_MAX_DEVS_PER_NIC_V12 8
#define NCCL_RMA_OPT_FLAGS_DEFAULT 0
#define NCCL_RMA_OPT_FLAGS_AGGREGATE_REQUESTS (1 << 0)

typedef enum {
  NCCL_NET_DEVICE_HOST = 0,
  NCCL_NET_DEVICE_UNPACK = 1,
  NCCL_NET_DEVICE_GIN_PROXY = 2,
  NCCL_NET_DEVICE_GIN_GDAKI = 3,
  NCCL_NET_DEVICE_GIN_GPI = 4,
} ncclNetDeviceType;

typedef struct {
  int ndevs;
  int devs[NCCL_NET_MAX_DEVS_PER_NIC_V12];
} ncclNetVDeviceProps_v12_t;

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v12_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
  int16_t railId;
  int16_t planeId;
} ncclNetProperties_v12_t;

typedef struct {
  int nContexts;
  int trafficClass;
  int rankStride;
} ncclRmaConfig_v14_t;
typedef ncclRmaConfig_v14_t ncclRmaConfig_v15_t;
typedef ncclRmaConfig_v14_t ncclRmaConfig_v16_t;

typedef struct {
  bool flushesAllPutsOnAnySignal;
} ncclRmaProperties_v16_t;

/* v15: 21 pointer-sized slots. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v12_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, void* handles[], int nranks, int rank, void* listenComm,
                          void** collComm);
  ncclResult_t (*createContext)(void* collComm, ncclRmaConfig_v15_t* config, void** rmaCtx);
  ncclResult_t (*regMrSym)(void* collComm, void* data, size_t size, int type, uint64_t mrFlags,
                           void** mhandle);
  ncclResult_t (*regMrSymDmaBuf)(void* collComm, void* data, size_t size, int type,
                                 uint64_t offset, int fd, uint64_t mrFlags, void** mhandle);
  ncclResult_t (*deregMrSym)(void* collComm, void* mhandle);
  ncclResult_t (*destroyContext)(void* rmaCtx);
  ncclResult_t (*closeColl)(void* collComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*iput)(void* rmaCtx, int context, uint64_t srcOff, void* srcMhandle, size_t size,
                       uint64_t dstOff, void* dstMhandle, uint32_t rank, uint32_t optFlags,
                       void** request);
  ncclResult_t (*iputSignal)(void* rmaCtx, int context, uint64_t srcOff, void* srcMhandle,
                             size_t size, uint64_t dstOff, void* dstMhandle, uint32_t rank,
                             uint64_t signalOff, void* signalMhandle, uint64_t signalValue,
                             uint32_t signalOp, bool isStrongSignal, uint32_t optFlags,
                             void** request);
  ncclResult_t (*iget)(void* rmaCtx, int context, uint64_t remoteOff, void* remoteMhandle,
                       size_t size, uint64_t localOff, void* localMhandle, uint32_t rank,
                       uint32_t optFlags, void** request);
  ncclResult_t (*iflush)(void* rmaCtx, int context, void* mhandle, uint32_t rank, void** request);
  ncclResult_t (*test)(void* collComm, void* request, int* done);
  ncclResult_t (*rmaProgress)(void* rmaCtx);
  ncclResult_t (*queryLastError)(void* rmaCtx, bool* hasError);
  ncclResult_t (*finalize)(void* ctx);
} ncclRma_v15_t;

/* v14: as v15 without optFlags in iput/iputSignal/iget. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v12_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, void* handles[], int nranks, int rank, void* listenComm,
                          void** collComm);
  ncclResult_t (*createContext)(void* collComm, ncclRmaConfig_v14_t* config, void** rmaCtx);
  ncclResult_t (*regMrSym)(void* collComm, void* data, size_t size, int type, uint64_t mrFlags,
                           void** mhandle);
  ncclResult_t (*regMrSymDmaBuf)(void* collComm, void* data, size_t size, int type,
                                 uint64_t offset, int fd, uint64_t mrFlags, void** mhandle);
  ncclResult_t (*deregMrSym)(void* collComm, void* mhandle);
  ncclResult_t (*destroyContext)(void* rmaCtx);
  ncclResult_t (*closeColl)(void* collComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*iput)(void* rmaCtx, int context, uint64_t srcOff, void* srcMhandle, size_t size,
                       uint64_t dstOff, void* dstMhandle, uint32_t rank, void** request);
  ncclResult_t (*iputSignal)(void* rmaCtx, int context, uint64_t srcOff, void* srcMhandle,
                             size_t size, uint64_t dstOff, void* dstMhandle, uint32_t rank,
                             uint64_t signalOff, void* signalMhandle, uint64_t signalValue,
                             uint32_t signalOp, bool isStrongSignal, void** request);
  ncclResult_t (*iget)(void* rmaCtx, int context, uint64_t remoteOff, void* remoteMhandle,
                       size_t size, uint64_t localOff, void* localMhandle, uint32_t rank,
                       void** request);
  ncclResult_t (*iflush)(void* rmaCtx, int context, void* mhandle, uint32_t rank, void** request);
  ncclResult_t (*test)(void* collComm, void* request, int* done);
  ncclResult_t (*rmaProgress)(void* rmaCtx);
  ncclResult_t (*queryLastError)(void* rmaCtx, bool* hasError);
  ncclResult_t (*finalize)(void* ctx);
} ncclRma_v14_t;

/* v16: v15 + getRmaProperties inserted after devices (22 slots). */
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getRmaProperties)(void* collComm, ncclRmaProperties_v16_t* rmaProps);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v12_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, void* handles[], int nranks, int rank, void* listenComm,
                          void** collComm);
  ncclResult_t (*createContext)(void* collComm, ncclRmaConfig_v16_t* config, void** rmaCtx);
  ncclResult_t (*regMrSym)(void* collComm, void* data, size_t size, int type, uint64_t mrFlags,
                           void** mhandle);
  ncclResult_t (*regMrSymDmaBuf)(void* collComm, void* data, size_t size, int type,
                                 uint64_t offset, int fd, uint64_t mrFlags, void** mhandle);
  ncclResult_t (*deregMrSym)(void* collComm, void* mhandle);
  ncclResult_t (*destroyContext)(void* rmaCtx);
  ncclResult_t (*closeColl)(void* collComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*iput)(void* rmaCtx, int context, uint64_t srcOff, void* srcMhandle, size_t size,
                       uint64_t dstOff, void* dstMhandle, uint32_t rank, uint32_t optFlags,
                       void** request);
  ncclResult_t (*iputSignal)(void* rmaCtx, int context, uint64_t srcOff, void* srcMhandle,
                             size_t size, uint64_t dstOff, void* dstMhandle, uint32_t rank,
                             uint64_t signalOff, void* signalMhandle, uint64_t signalValue,
                             uint32_t signalOp, bool isStrongSignal, uint32_t optFlags,
                             void** request);
  ncclResult_t (*iget)(void* rmaCtx, int context, uint64_t remoteOff, void* remoteMhandle,
                       size_t size, uint64_t localOff, void* localMhandle, uint32_t rank,
                       uint32_t optFlags, void** request);
  ncclResult_t (*iflush)(void* rmaCtx, int context, void* mhandle, uint32_t rank, void** request);
  ncclResult_t (*test)(void* collComm, void* request, int* done);
  ncclResult_t (*rmaProgress)(void* rmaCtx);
  ncclResult_t (*queryLastError)(void* rmaCtx, bool* hasError);
  ncclResult_t (*finalize)(void* ctx);
} ncclRma_v16_t;

/* Layout pins (x86-64 / LP64). */
#if defined(__x86_64__) || defined(__aarch64__)
_Static_assert(sizeof(ncclResult_t) == 4, "ncclResult_t is int-sized");
_Static_assert(sizeof(ncclNetDeviceType) == 4, "ncclNetDeviceType is int-sized");
_Static_assert(sizeof(ncclNetVDeviceProps_v12_t) == 36, "vProps size");
_Static_assert(sizeof(ncclNetProperties_v12_t) == 128, "ncclNetProperties_v12_t size");
_Static_assert(_Alignof(ncclNetProperties_v12_t) == 8, "ncclNetProperties_v12_t align");
_Static_assert(offsetof(ncclNetProperties_v12_t, name) == 0, "name");
_Static_assert(offsetof(ncclNetProperties_v12_t, pciPath) == 8, "pciPath");
_Static_assert(offsetof(ncclNetProperties_v12_t, guid) == 16, "guid");
_Static_assert(offsetof(ncclNetProperties_v12_t, ptrSupport) == 24, "ptrSupport");
_Static_assert(offsetof(ncclNetProperties_v12_t, regIsGlobal) == 28, "regIsGlobal");
_Static_assert(offsetof(ncclNetProperties_v12_t, forceFlush) == 32, "forceFlush");
_Static_assert(offsetof(ncclNetProperties_v12_t, speed) == 36, "speed");
_Static_assert(offsetof(ncclNetProperties_v12_t, port) == 40, "port");
_Static_assert(offsetof(ncclNetProperties_v12_t, latency) == 44, "latency");
_Static_assert(offsetof(ncclNetProperties_v12_t, maxComms) == 48, "maxComms");
_Static_assert(offsetof(ncclNetProperties_v12_t, maxRecvs) == 52, "maxRecvs");
_Static_assert(offsetof(ncclNetProperties_v12_t, netDeviceType) == 56, "netDeviceType");
_Static_assert(offsetof(ncclNetProperties_v12_t, netDeviceVersion) == 60, "netDeviceVersion");
_Static_assert(offsetof(ncclNetProperties_v12_t, vProps) == 64, "vProps");
_Static_assert(offsetof(ncclNetProperties_v12_t, maxP2pBytes) == 104, "maxP2pBytes");
_Static_assert(offsetof(ncclNetProperties_v12_t, maxCollBytes) == 112, "maxCollBytes");
_Static_assert(offsetof(ncclNetProperties_v12_t, maxMultiRequestSize) == 120, "maxMultiRequestSize");
_Static_assert(offsetof(ncclNetProperties_v12_t, railId) == 124, "railId");
_Static_assert(offsetof(ncclNetProperties_v12_t, planeId) == 126, "planeId");
_Static_assert(sizeof(ncclRmaConfig_v15_t) == 12, "ncclRmaConfig size");
_Static_assert(offsetof(ncclRmaConfig_v15_t, trafficClass) == 4, "trafficClass");
_Static_assert(offsetof(ncclRmaConfig_v15_t, rankStride) == 8, "rankStride");
_Static_assert(sizeof(ncclRmaProperties_v16_t) == 1, "ncclRmaProperties_v16_t size");
_Static_assert(sizeof(ncclRma_v14_t) == 21 * 8, "v14 table: 21 slots");
_Static_assert(sizeof(ncclRma_v15_t) == 21 * 8, "v15 table: 21 slots");
_Static_assert(sizeof(ncclRma_v16_t) == 22 * 8, "v16 table: 22 slots");
_Static_assert(offsetof(ncclRma_v15_t, iput) == 104, "v15 iput slot");
_Static_assert(offsetof(ncclRma_v15_t, finalize) == 160, "v15 finalize slot");
_Static_assert(offsetof(ncclRma_v16_t, getRmaProperties) == 24, "v16 getRmaProperties slot");
_Static_assert(offsetof(ncclRma_v16_t, iput) == 112, "v16 iput slot");
_Static_assert(offsetof(ncclRma_v16_t, finalize) == 168, "v16 finalize slot");
#endif

#ifdef __cplusplus
}
#endif
#endif /* RCCL_RMA_WASM_RMA_PLUGIN_H */
