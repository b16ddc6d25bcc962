/* The runtime table: the AMD HIP runtime, found with dlopen at run time
 * and never linked, so the library loads on machines without ROCm.
 * Declarations are our own minimal subset (types are plain integers and
 * pointers: hip_internal.h). A "context" here is the device ordinal + 1 (0
 * means host memory to the data path); every copy sets that device on the
 * calling thread first (hipSetDevice), since NCCL's progress threads and
 * Go's threads have none, and runs on a non-blocking stream of the
 * device's, for the reasons the CUDA side gives (host/devmem/cuda,
 * context.c). The ops table that package devrt calls through is at the
 * end. */
#include <dlfcn.h>

#include "hip_internal.h"

rmahip_runtime rmahip_rt;

int rmahip_memtype_device = 2;

const char* rmahip_errstr(hipError_t r) {
  const char* s = rmahip_rt.getErrorString ? rmahip_rt.getErrorString(r) : NULL;
  return s ? s : "unknown HIP error";
}

/* lib, when not NULL, is the only name tried (tests). */
int rmaw_hip_open(const char* lib, char* err, size_t errlen) {
  static const char* names[] = {"libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"};
  void* h = lib ? dlopen(lib, RTLD_NOW | RTLD_LOCAL) : NULL;
  for (size_t i = 0; !lib && i < sizeof names / sizeof names[0] && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!h) return rmaw_fail(err, errlen, "%s", dlerror());
#define SYM(field, name)                                                             \
  do {                                                                               \
    *(void**)&rmahip_rt.field = dlsym(h, name);                                            \
    if (!rmahip_rt.field) return rmaw_fail(err, errlen, "libamdhip64.so has no %s", name); \
  } while (0)
  SYM(init, "hipInit");
  SYM(getDeviceCount, "hipGetDeviceCount");
  SYM(runtimeGetVersion, "hipRuntimeGetVersion");
  SYM(pointerGetAttributes, "hipPointerGetAttributes");
  SYM(setDevice, "hipSetDevice");
  SYM(streamCreateWithFlags, "hipStreamCreateWithFlags");
  SYM(streamSynchronize, "hipStreamSynchronize");
  SYM(memcpyAsync, "hipMemcpyAsync");
  SYM(hostMalloc, "hipHostMalloc");
  SYM(hostFree, "hipHostFree");
  SYM(getErrorString, "hipGetErrorString");
#undef SYM
  *(void**)&rmahip_rt.hostRegister = dlsym(h, "hipHostRegister");
  *(void**)&rmahip_rt.hostUnregister = dlsym(h, "hipHostUnregister");
  if (!rmahip_rt.hostUnregister) rmahip_rt.hostRegister = NULL;
  *(void**)&rmahip_rt.getHandleForRange = dlsym(h, "hipMemGetHandleForAddressRange");
  *(void**)&rmahip_rt.writeValue64 = dlsym(h, "hipStreamWriteValue64");
  *(void**)&rmahip_rt.eventCreateWithFlags = dlsym(h, "hipEventCreateWithFlags");
  *(void**)&rmahip_rt.eventRecord = dlsym(h, "hipEventRecord");
  *(void**)&rmahip_rt.eventQuery = dlsym(h, "hipEventQuery");
  *(void**)&rmahip_rt.eventDestroy = dlsym(h, "hipEventDestroy");
  *(void**)&rmahip_rt.memGetAddressRange = dlsym(h, "hipMemGetAddressRange");
  *(void**)&rmahip_rt.ipcGetMemHandle = dlsym(h, "hipIpcGetMemHandle");
  *(void**)&rmahip_rt.ipcOpenMemHandle = dlsym(h, "hipIpcOpenMemHandle");
  *(void**)&rmahip_rt.ipcCloseMemHandle = dlsym(h, "hipIpcCloseMemHandle");
  *(void**)&rmahip_rt.ipcGetEventHandle = dlsym(h, "hipIpcGetEventHandle");
  *(void**)&rmahip_rt.ipcOpenEventHandle = dlsym(h, "hipIpcOpenEventHandle");
  *(void**)&rmahip_rt.streamWaitEvent = dlsym(h, "hipStreamWaitEvent");
  int v = 0;
  if (rmahip_rt.runtimeGetVersion(&v) == 0 && v > 0 && v < 60000000) rmahip_memtype_device = 1;
  hipError_t r = rmahip_rt.init(0);
  int n = 0;
  if (r == 0) r = rmahip_rt.getDeviceCount(&n);
  if (r != 0 || n < 1)
    return rmaw_fail(err, errlen, "no HIP device (hipGetDeviceCount: %d devices, status %d: %s)", n, r, rmahip_errstr(r));
  return n;
}

/* The HIP runtime's entries of the ops table package devrt calls through. */
const rmaw_devrt_ops rmaw_hip_ops = RMAW_DEVRT_OPS(rmahip);
