/* devrt.h: the ops table of a device runtime. Each runtime (host/devmem/cuda
 * over libcuda.so.1, host/devmem/hip over libamdhip64.so, both found with dlopen)
 * fills one with its own functions; package devrt calls through it, so the
 * Go side of every runtime is one set of wrappers. Every function that can
 * fail returns 0 on success, or -1 with a message in err (errlen bytes). A
 * context (ctx) is what inspect returned for the memory: what copies of it
 * must run in (a CUcontext for CUDA, the device ordinal + 1 for HIP). */
#ifndef RMAW_DEVRT_H
#define RMAW_DEVRT_H
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* rmaw_fail writes a printf-style message to err (errlen bytes) and
 * returns -1: how the runtimes' functions fail. */
__attribute__((format(printf, 3, 4))) static inline int rmaw_fail(char* err, size_t errlen, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return -1;
}

/* rmaw_pool_take locks one of the n mutexes of a pool of streams and
 * returns its index: a free one from *next on, else the one *next names,
 * waited for. Both runtimes keep a pool of copy streams made before the
 * data path, where a stream created while a kernel runs can wait for it. */
static inline int rmaw_pool_take(pthread_mutex_t* mu, unsigned* next, int n) {
  unsigned start = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);
  for (int k = 0; k < n; k++) {
    int i = (int)((start + (unsigned)k) % (unsigned)n);
    if (pthread_mutex_trylock(&mu[i]) == 0) return i;
  }
  int i = (int)(start % (unsigned)n);
  pthread_mutex_lock(&mu[i]);
  return i;
}

/* One allocation shared with another process (ipc_export). */
typedef struct {
  int fd; /* -1: the handle bytes name it */
  uint64_t base, size;
  unsigned char handle[64];
} rmaw_ipc_seg;

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
  /* copy_dtod copies n bytes between two device addresses of ctx and
   * waits for the copy (an operation of a rank to itself). NULL where the
   * runtime has none: the caller stages through host memory. */
  int (*copy_dtod)(uintptr_t ctx, uint64_t dst, uint64_t src, uint64_t n, char* err, size_t errlen);
  /* export_dmabuf exports [base, base+n) (page-aligned) as a DMA-BUF fd. */
  int (*export_dmabuf)(uintptr_t ctx, uint64_t base, uint64_t n, int* fd, char* err, size_t errlen);

  /* Stream-ordered work on the context's one shared stream: every thread's
   * calls for ctx queue there in call order, so work queued after a copy
   * executes after it. NULL where the runtime lacks the function; caps
   * says what ctx's device supports (RMAW_CAP_* bits). */
  int (*caps)(uintptr_t ctx);
  /* write64 writes v to the 8-byte word dev (cuStreamWriteValue64). */
  int (*write64)(uintptr_t ctx, uint64_t dev, uint64_t v, char* err, size_t errlen);
  /* add64 adds v to the word dev atomically on the device: a stream
   * memory operation where the device has one (RMAW_CAP_STREAM_ATOMIC),
   * else a one-thread kernel (RMAW_CAP_ADD64). */
  int (*add64)(uintptr_t ctx, uint64_t dev, uint64_t v, char* err, size_t errlen);
  /* copy_async queues a copy and returns; host must stay untouched until
   * an event recorded after it has passed. */
  int (*copy_async)(uintptr_t ctx, int to_device, void* host, uint64_t dev, uint64_t n, char* err, size_t errlen);
  /* event_record records *ev (created when 0) after the work queued so
   * far; event_query: 1 passed, 0 not yet, -1 failed. */
  int (*event_record)(uintptr_t ctx, uintptr_t* ev, char* err, size_t errlen);
  int (*event_query)(uintptr_t ctx, uintptr_t ev);
  void (*event_destroy)(uintptr_t ctx, uintptr_t ev);
  /* stream_sync waits until everything queued on the stream executed. */
  int (*stream_sync)(uintptr_t ctx, char* err, size_t errlen);
  /* copy_dtod_async queues a copy of n bytes between two device addresses
   * of ctx on its shared stream and returns (an operation of a rank to
   * itself, completed by an event recorded after it). NULL where the
   * runtime has none. */
  int (*copy_dtod_async)(uintptr_t ctx, uint64_t dst, uint64_t src, uint64_t n, char* err, size_t errlen);

  /* Sharing device memory with another process of the host (IPC; NULL
   * where the runtime has none). ipc_export describes the allocations
   * that cover [ptr, ptr+size), at most max of them, back to back, in
   * segs[0..*n): each one's address in this process, its size, and its
   * shareable handle: a POSIX fd the caller closes (CUDA's cuMem), or fd
   * -1 and 64 opaque bytes (HIP's hipIpcMemHandle_t, one allocation).
   * ipc_import maps n such segments, back to back, into this process,
   * readable and writable by ctx's device, and returns the address of the
   * first in *va; fds stay the caller's. ipc_unmap undoes it, given the
   * segments' sizes. */
  int (*ipc_export)(uintptr_t ctx, uint64_t ptr, uint64_t size, int max, rmaw_ipc_seg* segs, int* n, char* err,
                    size_t errlen);
  int (*ipc_import)(uintptr_t ctx, int n, const rmaw_ipc_seg* segs, uint64_t* va, char* err, size_t errlen);
  int (*ipc_unmap)(uintptr_t ctx, uint64_t va, int n, const uint64_t* sizes, char* err, size_t errlen);
  /* Events another process of the host can wait for (NULL where the
   * runtime has none). ipc_event_new makes one in ctx, recordable with
   * event_record, and writes its 64-byte shareable handle; ipc_event_open
   * opens a handle from another process in ctx; stream_wait makes the work
   * queued on ctx's stream from now on wait until the work before ev's
   * latest recording (in whichever process) executed. event_query and
   * event_destroy serve both kinds. */
  int (*ipc_event_new)(uintptr_t ctx, uintptr_t* ev, unsigned char* handle, char* err, size_t errlen);
  int (*ipc_event_open)(uintptr_t ctx, const unsigned char* handle, uintptr_t* ev, char* err, size_t errlen);
  int (*stream_wait)(uintptr_t ctx, uintptr_t ev, char* err, size_t errlen);
} rmaw_devrt_ops;

enum {
  RMAW_CAP_WRITE64 = 1, /* write64 */
  RMAW_CAP_ADD64 = 2,   /* add64 */
  RMAW_CAP_ASYNC = 4,   /* copy_async, events, stream_sync */
  RMAW_CAP_STREAM_ATOMIC = 8, /* add64 is a stream memory operation (no kernel) */
};

/* RMAW_DEVRT_OPS(p) is the table of the functions p_inspect, p_copy,
 * p_host_alloc, p_host_free, p_host_register, p_host_unregister,
 * p_copy_dtod, p_export_dmabuf, the stream-ordered p_caps ... p_copy_dtod_async and
 * p_ipc_export, p_ipc_import, p_ipc_unmap, p_ipc_event_new, p_ipc_event_open and p_stream_wait,
 * which a runtime's C file defines (a name #defined to NULL where it has none). */
#define RMAW_DEVRT_OPS(p)                                                                   \
  {                                                                                         \
    .inspect = p##_inspect, .copy = p##_copy, .host_alloc = p##_host_alloc,                 \
    .host_free = p##_host_free, .host_register = p##_host_register,                         \
    .host_unregister = p##_host_unregister, .copy_dtod = p##_copy_dtod,                     \
    .export_dmabuf = p##_export_dmabuf,                                                     \
    .caps = p##_caps, .write64 = p##_write64, .add64 = p##_add64, .copy_async = p##_copy_async, \
    .event_record = p##_event_record, .event_query = p##_event_query,                       \
    .event_destroy = p##_event_destroy, .stream_sync = p##_stream_sync,                     \
    .copy_dtod_async = p##_copy_dtod_async, .ipc_export = p##_ipc_export,                   \
    .ipc_import = p##_ipc_import, .ipc_unmap = p##_ipc_unmap,                               \
    .ipc_event_new = p##_ipc_event_new, .ipc_event_open = p##_ipc_event_open,               \
    .stream_wait = p##_stream_wait,                                                         \
  }

#endif
