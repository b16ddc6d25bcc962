/* devrt.h: the ops table of a device runtime. Each runtime's C file (cuda.c
 * over libcuda.so.1, hip.c over libamdhip64.so, both found with dlopen)
 * fills one with its own functions; package devrt calls through it, so the
 * Go side of every runtime is one set of wrappers. Every function that can
 * fail returns 0 on success, or -1 with a message in err (errlen bytes). A
 * context (ctx) is what inspect returned for the memory: what copies of it
 * must run in (a CUcontext for CUDA, the device ordinal + 1 for HIP). */
#ifndef RMAW_DEVRT_H
#define RMAW_DEVRT_H
#include <stddef.h>
#include <stdint.h>

typedef struct rmaw_devrt_ops {
  /* inspect accepts [ptr, ptr+size) when it is device memory of one
   * device, and returns the context its copies run in. */
  int (*inspect)(uint64_t ptr, uint64_t size, uintptr_t* ctx, char* err, size_t errlen);
  /* copy moves n bytes between host memory and device address dev, to the
   * device when to_device, and waits for the copy. */
  int (*copy)(uintptr_t ctx, int to_device, void* host, uint64_t dev, uint64_t n, char* err, size_t errlen);
  /* host_alloc returns n bytes of pinned host memory usable by every
   * context; host_free releases it. */
  int (*host_alloc)(uintptr_t ctx, uint64_t n, void** p, char* err, size_t errlen);
  void (*host_free)(void* p);
  /* host_register pins host memory the caller mapped, for every context;
   * host_unregister undoes it with ctx current. */
  int (*host_register)(uintptr_t ctx, void* p, uint64_t n, char* err, size_t errlen);
  void (*host_unregister)(uintptr_t ctx, void* p);
  /* export_dmabuf exports [base, base+n) (page-aligned) as a DMA-BUF fd. */
  int (*export_dmabuf)(uintptr_t ctx, uint64_t base, uint64_t n, int* fd, char* err, size_t errlen);
} rmaw_devrt_ops;

/* RMAW_DEVRT_OPS(p) is the table of the functions p_inspect, p_copy,
 * p_host_alloc, p_host_free, p_host_register, p_host_unregister and
 * p_export_dmabuf, which a runtime's C file defines. */
#define RMAW_DEVRT_OPS(p)                                                                   \
  {                                                                                         \
    .inspect = p##_inspect, .copy = p##_copy, .host_alloc = p##_host_alloc,                 \
    .host_free = p##_host_free, .host_register = p##_host_register,                         \
    .host_unregister = p##_host_unregister, .export_dmabuf = p##_export_dmabuf,             \
  }

#endif
