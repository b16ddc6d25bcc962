/* The driver table: the CUDA driver, found with dlopen at run time and
 * never linked, so the library loads on machines without a GPU.
 * Declarations are our own minimal subset of the driver API (types are
 * plain integers and pointers: cuda_internal.h). The ops table that package
 * devrt calls through is at the end. */
#include <dlfcn.h>

#include "cuda_internal.h"

rmacu_driver rmacu_cu;

const char* rmacu_errstr(CUresult r) {
  const char* s = NULL;
  if (rmacu_cu.getErrorString && rmacu_cu.getErrorString(r, &s) == 0 && s) return s;
  return "unknown CUDA error";
}

int rmaw_cuda_open(char* err, size_t errlen) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) return rmaw_fail(err, errlen, "%s", dlerror());
#define SYM(field, name)                                                          \
  do {                                                                            \
    *(void**)&rmacu_cu.field = dlsym(h, name);                                          \
    if (!rmacu_cu.field) return rmaw_fail(err, errlen, "libcuda.so.1 has no %s", name); \
  } while (0)
  SYM(init, "cuInit");
  SYM(deviceGetCount, "cuDeviceGetCount");
  SYM(deviceGet, "cuDeviceGet");
  SYM(primaryCtxRetain, "cuDevicePrimaryCtxRetain");
  SYM(pointerGetAttribute, "cuPointerGetAttribute");
  SYM(ctxSetCurrent, "cuCtxSetCurrent");
  SYM(streamCreate, "cuStreamCreate");
  SYM(streamSynchronize, "cuStreamSynchronize");
  SYM(dtoh, "cuMemcpyDtoHAsync_v2");
  SYM(htod, "cuMemcpyHtoDAsync_v2");
  SYM(getErrorString, "cuGetErrorString");
  SYM(memHostAlloc, "cuMemHostAlloc");
  SYM(memFreeHost, "cuMemFreeHost");
  SYM(memGetAddressRange, "cuMemGetAddressRange_v2");
#undef SYM
  *(void**)&rmacu_cu.memHostRegister = dlsym(h, "cuMemHostRegister_v2");
  *(void**)&rmacu_cu.memHostUnregister = dlsym(h, "cuMemHostUnregister");
  if (!rmacu_cu.memHostRegister || !rmacu_cu.memHostUnregister) rmacu_cu.memHostRegister = NULL;
  *(void**)&rmacu_cu.getHandleForRange = dlsym(h, "cuMemGetHandleForAddressRange");
  *(void**)&rmacu_cu.dtod = dlsym(h, "cuMemcpyDtoDAsync_v2");
  *(void**)&rmacu_cu.ctxGetDevice = dlsym(h, "cuCtxGetDevice");
  *(void**)&rmacu_cu.deviceGetAttribute = dlsym(h, "cuDeviceGetAttribute");
  *(void**)&rmacu_cu.deviceGetP2PAttribute = dlsym(h, "cuDeviceGetP2PAttribute");
  /* cuda.h maps cuStreamWriteValue64 to the _v2 entry point from CUDA 11.7
   * on, whose 64-bit support CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS
   * (122) reports; the older entry point answers to the _V1 attribute (93). */
  *(void**)&rmacu_cu.writeValue64 = dlsym(h, "cuStreamWriteValue64_v2");
  rmacu_cu.writeValueAttr = ATTR_64_BIT_MEM_OPS;
  if (!rmacu_cu.writeValue64) {
    *(void**)&rmacu_cu.writeValue64 = dlsym(h, "cuStreamWriteValue64");
    rmacu_cu.writeValueAttr = ATTR_64_BIT_MEM_OPS_V1;
  }
  *(void**)&rmacu_cu.ctxCreate = dlsym(h, "cuCtxCreate_v2");
  *(void**)&rmacu_cu.memRetain = dlsym(h, "cuMemRetainAllocationHandle");
  *(void**)&rmacu_cu.memRelease = dlsym(h, "cuMemRelease");
  *(void**)&rmacu_cu.moduleLoadData = dlsym(h, "cuModuleLoadData");
  *(void**)&rmacu_cu.moduleGetFunction = dlsym(h, "cuModuleGetFunction");
  *(void**)&rmacu_cu.launchKernel = dlsym(h, "cuLaunchKernel");
  *(void**)&rmacu_cu.eventCreate = dlsym(h, "cuEventCreate");
  *(void**)&rmacu_cu.eventRecord = dlsym(h, "cuEventRecord");
  *(void**)&rmacu_cu.eventQuery = dlsym(h, "cuEventQuery");
  *(void**)&rmacu_cu.eventDestroy = dlsym(h, "cuEventDestroy_v2");
  *(void**)&rmacu_cu.batchMemOp = dlsym(h, "cuStreamBatchMemOp_v2");
  *(void**)&rmacu_cu.memAlloc = dlsym(h, "cuMemAlloc_v2");
  *(void**)&rmacu_cu.memExport = dlsym(h, "cuMemExportToShareableHandle");
  *(void**)&rmacu_cu.memImport = dlsym(h, "cuMemImportFromShareableHandle");
  *(void**)&rmacu_cu.addressReserve = dlsym(h, "cuMemAddressReserve");
  *(void**)&rmacu_cu.addressFree = dlsym(h, "cuMemAddressFree");
  *(void**)&rmacu_cu.memMap = dlsym(h, "cuMemMap");
  *(void**)&rmacu_cu.memUnmap = dlsym(h, "cuMemUnmap");
  *(void**)&rmacu_cu.memSetAccess = dlsym(h, "cuMemSetAccess");
  *(void**)&rmacu_cu.ipcGetEventHandle = dlsym(h, "cuIpcGetEventHandle");
  *(void**)&rmacu_cu.ipcOpenEventHandle = dlsym(h, "cuIpcOpenEventHandle");
  *(void**)&rmacu_cu.streamWaitEvent = dlsym(h, "cuStreamWaitEvent");
  *(void**)&rmacu_cu.waitValue64 = dlsym(h, "cuStreamWaitValue64_v2");
  if (!rmacu_cu.waitValue64 || rmacu_cu.writeValueAttr != ATTR_64_BIT_MEM_OPS) rmacu_cu.waitValue64 = NULL;
  *(void**)&rmacu_cu.memHostGetDevicePointer = dlsym(h, "cuMemHostGetDevicePointer_v2");
  *(void**)&rmacu_cu.streamQuery = dlsym(h, "cuStreamQuery");
  *(void**)&rmacu_cu.memCreate = dlsym(h, "cuMemCreate");
  *(void**)&rmacu_cu.granularity = dlsym(h, "cuMemGetAllocationGranularity");
  CUresult r = rmacu_cu.init(0);
  if (r != 0) return rmaw_fail(err, errlen, "cuInit: %s (%d)", rmacu_errstr(r), r);
  int n = 0;
  r = rmacu_cu.deviceGetCount(&n);
  if (r != 0 || n < 1) return rmaw_fail(err, errlen, "no CUDA device (cuDeviceGetCount: %d devices, status %d)", n, r);
  return n;
}

/* The CUDA driver's entries of the ops table package devrt calls through. */
const rmaw_devrt_ops rmaw_cuda_ops = RMAW_DEVRT_OPS(rmacu);
