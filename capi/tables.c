/*
 * tables.c - the three data symbols NCCL/RCCL dlsym (ncclRmaPlugin_v14,
 * _v15, _v16) and the C side of the logger shim.
 *
 * Every slot points at a small static wrapper with the exact C signature of
 * the slot; the wrapper converts handles (void*) to uintptr_t and calls the
 * //export'ed Go function (rmawasm_*), so Go never receives an integer id as
 * a pointer. v14 passes optFlags = 0; v16 adds getRmaProperties.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>

#include "rma_plugin.h"
#include "shim.h"
#include "_cgo_export.h"

#define HIDDEN __attribute__((visibility("hidden")))
#define EXPORTED __attribute__((visibility("default")))

/* ---- logger shim ---- */

static ncclDebugLogger_t rmawasm_logger;

HIDDEN void rmawasm_set_logger(uintptr_t fn) {
  __atomic_store_n(&rmawasm_logger, (ncclDebugLogger_t)fn, __ATOMIC_RELEASE);
}

HIDDEN int rmawasm_has_logger(void) {
  return __atomic_load_n(&rmawasm_logger, __ATOMIC_ACQUIRE) != NULL;
}

HIDDEN void rmawasm_log(int level, unsigned long flags, const char* file, int line,
                        const char* msg) {
  ncclDebugLogger_t f = __atomic_load_n(&rmawasm_logger, __ATOMIC_ACQUIRE);
  if (f != NULL) f(level, flags, file, line, "%s", msg);
}

HIDDEN const char* rmawasm_object_path(uintptr_t fn) {
  Dl_info info;
  if (fn == 0 || dladdr((void*)fn, &info) == 0) return NULL;
  return info.dli_fname;
}

/* ---- slot wrappers (shared by all versions) ---- */

#define H(p) ((uintptr_t)(p))
#define R(x) ((ncclResult_t)(x))

static ncclResult_t w_init(void** ctx, uint64_t commId, ncclDebugLogger_t logFunction) {
  return R(rmawasm_init((uintptr_t*)ctx, commId, (uintptr_t)logFunction));
}
static ncclResult_t w_devices(int* ndev) { return R(rmawasm_devices(ndev)); }
static ncclResult_t w_getRmaProperties(void* collComm, ncclRmaProperties_v16_t* rmaProps) {
  return R(rmawasm_getRmaProperties(H(collComm), rmaProps));
}
static ncclResult_t w_getProperties(int dev, ncclNetProperties_v12_t* props) {
  return R(rmawasm_getProperties(dev, props));
}
static ncclResult_t w_listen(void* ctx, int dev, void* handle, void** listenComm) {
  return R(rmawasm_listen(H(ctx), dev, handle, (uintptr_t*)listenComm));
}
static ncclResult_t w_connect(void* ctx, void* handles[], int nranks, int rank, void* listenComm,
                              void** collComm) {
  return R(rmawasm_connect(H(ctx), handles, nranks, rank, H(listenComm), (uintptr_t*)collComm));
}
static ncclResult_t w_createContext(void* collComm, ncclRmaConfig_v15_t* config, void** rmaCtx) {
  return R(rmawasm_createContext(H(collComm), config, (uintptr_t*)rmaCtx));
}
static ncclResult_t w_regMrSym(void* collComm, void* data, size_t size, int type,
                               uint64_t mrFlags, void** mhandle) {
  return R(rmawasm_regMrSym(H(collComm), H(data), size, type, mrFlags, (uintptr_t*)mhandle));
}
static ncclResult_t w_regMrSymDmaBuf(void* collComm, void* data, size_t size, int type,
                                     uint64_t offset, int fd, uint64_t mrFlags, void** mhandle) {
  return R(rmawasm_regMrSymDmaBuf(H(collComm), H(data), size, type, offset, fd, mrFlags,
                                  (uintptr_t*)mhandle));
}
static ncclResult_t w_deregMrSym(void* collComm, void* mhandle) {
  return R(rmawasm_deregMrSym(H(collComm), H(mhandle)));
}
static ncclResult_t w_destroyContext(void* rmaCtx) { return R(rmawasm_destroyContext(H(rmaCtx))); }
static ncclResult_t w_closeColl(void* collComm) { return R(rmawasm_closeColl(H(collComm))); }
static ncclResult_t w_closeListen(void* listenComm) {
  return R(rmawasm_closeListen(H(listenComm)));
}
static ncclResult_t w_iput(void* rmaCtx, int context, uint64_t srcOff, void* srcMhandle,
                           size_t size, uint64_t dstOff, void* dstMhandle, uint32_t rank,
                           uint32_t optFlags, void** request) {
  return R(rmawasm_iput(H(rmaCtx), context, srcOff, H(srcMhandle), size, dstOff, H(dstMhandle),
                        rank, optFlags, (uintptr_t*)request));
}
static ncclResult_t w_iputSignal(void* rmaCtx, int context, uint64_t srcOff, void* srcMhandle,
                                 size_t size, uint64_t dstOff, void* dstMhandle, uint32_t rank,
                                 uint64_t signalOff, void* signalMhandle, uint64_t signalValue,
                                 uint32_t signalOp, bool isStrongSignal, uint32_t optFlags,
                                 void** request) {
  return R(rmawasm_iputSignal(H(rmaCtx), context, srcOff, H(srcMhandle), size, dstOff,
                              H(dstMhandle), rank, signalOff, H(signalMhandle), signalValue,
                              signalOp, isStrongSignal, optFlags, (uintptr_t*)request));
}
static ncclResult_t w_iget(void* rmaCtx, int context, uint64_t remoteOff, void* remoteMhandle,
                           size_t size, uint64_t localOff, void* localMhandle, uint32_t rank,
                           uint32_t optFlags, void** request) {
  return R(rmawasm_iget(H(rmaCtx), context, remoteOff, H(remoteMhandle), size, localOff,
                        H(localMhandle), rank, optFlags, (uintptr_t*)request));
}
static ncclResult_t w_iflush(void* rmaCtx, int context, void* mhandle, uint32_t rank,
                             void** request) {
  return R(rmawasm_iflush(H(rmaCtx), context, H(mhandle), rank, (uintptr_t*)request));
}
static ncclResult_t w_test(void* collComm, void* request, int* done) {
  return R(rmawasm_test(H(collComm), H(request), done));
}
static ncclResult_t w_rmaProgress(void* rmaCtx) { return R(rmawasm_rmaProgress(H(rmaCtx))); }
static ncclResult_t w_queryLastError(void* rmaCtx, bool* hasError) {
  return R(rmawasm_queryLastError(H(rmaCtx), hasError));
}
static ncclResult_t w_finalize(void* ctx) { return R(rmawasm_finalize(H(ctx))); }

/* ---- v14 adapters: no optFlags ---- */

static ncclResult_t w14_iput(void* rmaCtx, int context, uint64_t srcOff, void* srcMhandle,
                             size_t size, uint64_t dstOff, void* dstMhandle, uint32_t rank,
                             void** request) {
  return w_iput(rmaCtx, context, srcOff, srcMhandle, size, dstOff, dstMhandle, rank, 0, request);
}
static ncclResult_t w14_iputSignal(void* rmaCtx, int context, uint64_t srcOff, void* srcMhandle,
                                   size_t size, uint64_t dstOff, void* dstMhandle, uint32_t rank,
                                   uint64_t signalOff, void* signalMhandle, uint64_t signalValue,
                                   uint32_t signalOp, bool isStrongSignal, void** request) {
  return w_iputSignal(rmaCtx, context, srcOff, srcMhandle, size, dstOff, dstMhandle, rank,
                      signalOff, signalMhandle, signalValue, signalOp, isStrongSignal, 0, request);
}
static ncclResult_t w14_iget(void* rmaCtx, int context, uint64_t remoteOff, void* remoteMhandle,
                             size_t size, uint64_t localOff, void* localMhandle, uint32_t rank,
                             void** request) {
  return w_iget(rmaCtx, context, remoteOff, remoteMhandle, size, localOff, localMhandle, rank, 0,
                request);
}

/* ---- the tables ---- */

#define RMAWASM_NAME "wasm" /* = host.PluginName; checked by test/layout_test.go */

EXPORTED const ncclRma_v15_t ncclRmaPlugin_v15 = {
    .name = RMAWASM_NAME,
    .init = w_init,
    .devices = w_devices,
    .getProperties = w_getProperties,
    .listen = w_listen,
    .connect = w_connect,
    .createContext = w_createContext,
    .regMrSym = w_regMrSym,
    .regMrSymDmaBuf = w_regMrSymDmaBuf,
    .deregMrSym = w_deregMrSym,
    .destroyContext = w_destroyContext,
    .closeColl = w_closeColl,
    .closeListen = w_closeListen,
    .iput = w_iput,
    .iputSignal = w_iputSignal,
    .iget = w_iget,
    .iflush = w_iflush,
    .test = w_test,
    .rmaProgress = w_rmaProgress,
    .queryLastError = w_queryLastError,
    .finalize = w_finalize,
};

EXPORTED const ncclRma_v14_t ncclRmaPlugin_v14 = {
    .name = RMAWASM_NAME,
    .init = w_init,
    .devices = w_devices,
    .getProperties = w_getProperties,
    .listen = w_listen,
    .connect = w_connect,
    .createContext = w_createContext,
    .regMrSym = w_regMrSym,
    .regMrSymDmaBuf = w_regMrSymDmaBuf,
    .deregMrSym = w_deregMrSym,
    .destroyContext = w_destroyContext,
    .closeColl = w_closeColl,
    .closeListen = w_closeListen,
    .iput = w14_iput,
    .iputSignal = w14_iputSignal,
    .iget = w14_iget,
    .iflush = w_iflush,
    .test = w_test,
    .rmaProgress = w_rmaProgress,
    .queryLastError = w_queryLastError,
    .finalize = w_finalize,
};

EXPORTED const ncclRma_v16_t ncclRmaPlugin_v16 = {
    .name = RMAWASM_NAME,
    .init = w_init,
    .devices = w_devices,
    .getRmaProperties = w_getRmaProperties,
    .getProperties = w_getProperties,
    .listen = w_listen,
    .connect = w_connect,
    .createContext = w_createContext,
    .regMrSym = w_regMrSym,
    .regMrSymDmaBuf = w_regMrSymDmaBuf,
    .deregMrSym = w_deregMrSym,
    .destroyContext = w_destroyContext,
    .closeColl = w_closeColl,
    .closeListen = w_closeListen,
    .iput = w_iput,
    .iputSignal = w_iputSignal,
    .iget = w_iget,
    .iflush = w_iflush,
    .test = w_test,
    .rmaProgress = w_rmaProgress,
    .queryLastError = w_queryLastError,
    .finalize = w_finalize,
};
