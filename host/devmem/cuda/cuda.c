/* The CUDA driver, found with dlopen at run time and never linked, so the
 * library loads on machines without a GPU. Declarations are our own minimal
 * subset of the driver API (types are plain integers and pointers). Copies
 * run on a non-blocking stream per context and wait for that stream only:
 * the legacy default stream would wait for user kernels, and a GIN kernel
 * that spins on a signal we are about to write would then never finish.
 * Each thread has its own stream per context: lanes copy at once, and a
 * shared stream would make each wait for the others' copies too. */
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cuda_shim.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void* CUcontext;
typedef void* CUstream;
typedef int CUdevice;

enum {
  ATTR_CONTEXT = 1,
  ATTR_MEMORY_TYPE = 2,
  ATTR_DEVICE_ORDINAL = 9,
  MEMTYPE_DEVICE = 2,
  STREAM_NON_BLOCKING = 1,
};

static struct {
  CUresult (*init)(unsigned);
  CUresult (*deviceGetCount)(int*);
  CUresult (*deviceGet)(CUdevice*, int);
  CUresult (*primaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*pointerGetAttribute)(void*, int, CUdeviceptr);
  CUresult (*ctxSetCurrent)(CUcontext);
  CUresult (*streamCreate)(CUstream*, unsigned);
  CUresult (*streamSynchronize)(CUstream);
  CUresult (*dtoh)(void*, CUdeviceptr, size_t, CUstream);
  CUresult (*htod)(CUdeviceptr, const void*, size_t, CUstream);
  CUresult (*getErrorString)(CUresult, const char**);
  CUresult (*memHostAlloc)(void**, size_t, unsigned);
  CUresult (*memFreeHost)(void*);
  CUresult (*memGetAddressRange)(CUdeviceptr*, size_t*, CUdeviceptr);
  CUresult (*memHostRegister)(void*, size_t, unsigned);   /* optional */
  CUresult (*memHostUnregister)(void*);                   /* optional */
  CUresult (*getHandleForRange)(void*, CUdeviceptr, size_t, int, unsigned long long); /* optional, 11.7 */
} cu;

enum { MEMHOSTALLOC_PORTABLE = 1 };

#define MAX_CTX 64
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  CUcontext ctx;
  CUstream stream;
} streams[MAX_CTX];
static int nstreams;

static const char* errstr(CUresult r) {
  const char* s = NULL;
  if (cu.getErrorString && cu.getErrorString(r, &s) == 0 && s) return s;
  return "unknown CUDA error";
}

int rmaw_cuda_open(char* err, size_t errlen) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(err, errlen, "%s", dlerror());
    return -1;
  }
#define SYM(field, name)                                     \
  do {                                                       \
    *(void**)&cu.field = dlsym(h, name);                     \
    if (!cu.field) {                                         \
      snprintf(err, errlen, "libcuda.so.1 has no %s", name); \
      return -1;                                             \
    }                                                        \
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
  *(void**)&cu.memHostRegister = dlsym(h, "cuMemHostRegister_v2");
  *(void**)&cu.memHostUnregister = dlsym(h, "cuMemHostUnregister");
  if (!cu.memHostRegister || !cu.memHostUnregister) cu.memHostRegister = NULL;
  *(void**)&cu.getHandleForRange = dlsym(h, "cuMemGetHandleForAddressRange");
  CUresult r = cu.init(0);
  if (r != 0) {
    snprintf(err, errlen, "cuInit: %s (%d)", errstr(r), r);
    return -1;
  }
  int n = 0;
  r = cu.deviceGetCount(&n);
  if (r != 0 || n < 1) {
    snprintf(err, errlen, "no CUDA device (cuDeviceGetCount: %d devices, status %d)", n, r);
    return -1;
  }
  return n;
}

/* cuda_inspect accepts [ptr, ptr+size) when every byte of it is CUDA
 * device memory of one device: one allocation, or several mapped next to
 * each other in one VMM reservation (NCCL's symmetric windows), walked
 * allocation by allocation with cuMemGetAddressRange. */
static int cuda_inspect(uint64_t ptr, uint64_t size, uintptr_t* ctx, char* err, size_t errlen) {
  int ordinal = -1;
  uint64_t end = ptr + (size ? size : 1);
  for (uint64_t p = ptr; p < end;) {
    unsigned int memtype = 0;
    CUresult r = cu.pointerGetAttribute(&memtype, ATTR_MEMORY_TYPE, (CUdeviceptr)p);
    if (r != 0 || memtype != MEMTYPE_DEVICE) {
      snprintf(err, errlen, "%s CUDA device memory (at offset %llu: memory type %u, status %s)",
               p == ptr ? "not" : "the range leaves", (unsigned long long)(p - ptr), memtype, errstr(r));
      return -1;
    }
    int o = -1;
    if (cu.pointerGetAttribute(&o, ATTR_DEVICE_ORDINAL, (CUdeviceptr)p) != 0 || (ordinal >= 0 && o != ordinal)) {
      snprintf(err, errlen, "the range spans allocations of more than one device");
      return -1;
    }
    ordinal = o;
    CUdeviceptr base = 0;
    size_t n = 0;
    if (cu.memGetAddressRange(&base, &n, (CUdeviceptr)p) != 0 || base + n <= p) {
      /* No range known: the first and last bytes decide, as before. */
      if (p == ptr && size > 1) {
        p = end - 1;
        continue;
      }
      break;
    }
    p = base + n;
  }
  CUcontext c = NULL;
  CUresult r = cu.pointerGetAttribute(&c, ATTR_CONTEXT, (CUdeviceptr)ptr);
  if (r != 0 || c == NULL) {
    /* VMM allocations carry no context: use the device's primary one. */
    CUdevice dev;
    if (ordinal < 0 || cu.deviceGet(&dev, ordinal) != 0 || cu.primaryCtxRetain(&c, dev) != 0) {
      snprintf(err, errlen, "cannot find the CUDA context of this memory");
      return -1;
    }
  }
  *ctx = (uintptr_t)c;
  return 0;
}

/* rmaw_cuda_ordinal is the device ordinal of a CUDA address (-1: none). */
int rmaw_cuda_ordinal(uint64_t ptr) {
  int o = -1;
  if (cu.pointerGetAttribute(&o, ATTR_DEVICE_ORDINAL, (CUdeviceptr)ptr) != 0) return -1;
  return o;
}

#define MAX_TLS 8
static __thread struct {
  CUcontext ctx;
  CUstream stream;
} tstreams[MAX_TLS];
static __thread int ntstreams;

/* stream_for returns this thread's copy stream for ctx, creating it once;
 * past MAX_TLS contexts on one thread, a stream shared per context. */
static CUstream stream_for(CUcontext ctx, CUresult* r) {
  for (int i = 0; i < ntstreams; i++)
    if (tstreams[i].ctx == ctx) return tstreams[i].stream;
  if (ntstreams < MAX_TLS) {
    CUstream s = NULL;
    *r = cu.streamCreate(&s, STREAM_NON_BLOCKING);
    if (*r != 0) return NULL;
    tstreams[ntstreams].ctx = ctx;
    tstreams[ntstreams].stream = s;
    ntstreams++;
    return s;
  }
  pthread_mutex_lock(&mu);
  for (int i = 0; i < nstreams; i++)
    if (streams[i].ctx == ctx) {
      CUstream s = streams[i].stream;
      pthread_mutex_unlock(&mu);
      return s;
    }
  CUstream s = NULL;
  *r = cu.streamCreate(&s, STREAM_NON_BLOCKING);
  if (*r == 0 && nstreams < MAX_CTX) {
    streams[nstreams].ctx = ctx;
    streams[nstreams].stream = s;
    nstreams++;
  }
  pthread_mutex_unlock(&mu);
  return *r == 0 ? s : NULL;
}

static int cuda_copy(uintptr_t ctx, int to_device, void* host, uint64_t dev, uint64_t n, char* err,
                     size_t errlen) {
  /* The calling thread (an NCCL progress thread, a Go goroutine's thread)
   * may have no context: set the one captured at registration. */
  CUresult r = cu.ctxSetCurrent((CUcontext)ctx);
  if (r != 0) {
    snprintf(err, errlen, "cuCtxSetCurrent: %s", errstr(r));
    return -1;
  }
  CUstream s = stream_for((CUcontext)ctx, &r);
  if (!s) {
    snprintf(err, errlen, "cuStreamCreate: %s", errstr(r));
    return -1;
  }
  r = to_device ? cu.htod((CUdeviceptr)dev, host, (size_t)n, s) : cu.dtoh(host, (CUdeviceptr)dev, (size_t)n, s);
  if (r == 0) r = cu.streamSynchronize(s);
  if (r != 0) {
    snprintf(err, errlen, "%s of %llu bytes: %s", to_device ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync",
             (unsigned long long)n, errstr(r));
    return -1;
  }
  return 0;
}

/* Portable page-locked memory: usable by copies of every context. */
static int cuda_host_alloc(uintptr_t ctx, uint64_t n, void** p, char* err, size_t errlen) {
  CUresult r = cu.ctxSetCurrent((CUcontext)ctx);
  if (r == 0) r = cu.memHostAlloc(p, (size_t)n, MEMHOSTALLOC_PORTABLE);
  if (r != 0) {
    snprintf(err, errlen, "cuMemHostAlloc of %llu bytes: %s", (unsigned long long)n, errstr(r));
    return -1;
  }
  return 0;
}

static void cuda_host_free(void* p) { cu.memFreeHost(p); }

/* Pins memory we mapped ourselves (the intra-node staging ring, shared
 * with another process), portable to every context. */
static int cuda_host_register(uintptr_t ctx, void* p, uint64_t n, char* err, size_t errlen) {
  if (!cu.memHostRegister) {
    snprintf(err, errlen, "the driver has no cuMemHostRegister");
    return -1;
  }
  CUresult r = cu.ctxSetCurrent((CUcontext)ctx);
  if (r == 0) r = cu.memHostRegister(p, (size_t)n, MEMHOSTALLOC_PORTABLE);
  if (r != 0) {
    snprintf(err, errlen, "cuMemHostRegister of %llu bytes: %s", (unsigned long long)n, errstr(r));
    return -1;
  }
  return 0;
}

/* Called from threads with no context (closeColl's, a service goroutine's
 * at teardown): set the registering one. */
static void cuda_host_unregister(uintptr_t ctx, void* p) {
  if (cu.memHostUnregister && cu.ctxSetCurrent((CUcontext)ctx) == 0) cu.memHostUnregister(p);
}

/* Exports [base, base+n) (page-aligned by the caller) as a DMA-BUF fd
 * (CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD), for a NIC that imports it. */
static int cuda_export_dmabuf(uintptr_t ctx, uint64_t base, uint64_t n, int* fd, char* err, size_t errlen) {
  if (!cu.getHandleForRange) {
    snprintf(err, errlen, "the driver has no cuMemGetHandleForAddressRange");
    return -1;
  }
  CUresult r = cu.ctxSetCurrent((CUcontext)ctx);
  if (r == 0) r = cu.getHandleForRange(fd, (CUdeviceptr)base, (size_t)n, 1, 0);
  if (r != 0) {
    snprintf(err, errlen, "cuMemGetHandleForAddressRange of %llu bytes: %s", (unsigned long long)n, errstr(r));
    return -1;
  }
  return 0;
}

/* The CUDA driver's entries of the ops table package devrt calls through. */
const rmaw_devrt_ops rmaw_cuda_ops = RMAW_DEVRT_OPS(cuda);

/* GDRCopy (libgdrapi.so, loaded at run time and never linked): device
 * signal words are updated through a CPU mapping of their 64 KiB GPU page
 * (BAR1) instead of two copies. Pages are pinned and mapped on first use
 * and kept in a small table; a page that cannot be pinned (not 64 KiB
 * aligned inside one cuMemAlloc allocation, VMM memory with an old
 * gdrdrv) is remembered as such and its words keep the copy path. All
 * accesses hold gmu, so Forget (deregistration) never unmaps a page under
 * a write. */
typedef struct {
  unsigned long h;
} gdr_mh_t;
static struct {
  void* (*open)(void);
  int (*pin)(void*, unsigned long, size_t, uint64_t, uint32_t, gdr_mh_t*);
  int (*unpin)(void*, gdr_mh_t);
  int (*map)(void*, gdr_mh_t, void**, size_t);
  int (*unmap)(void*, gdr_mh_t, void*, size_t);
  int (*callbackFlag)(void*, gdr_mh_t, int*); /* optional */
  CUresult (*setAttr)(const void*, int, CUdeviceptr); /* cuPointerSetAttribute, optional */
} gdr;
static void* gdrh;

#define GDR_PAGE ((uint64_t)1 << 16)
#define GDR_MAX 256
enum { ATTR_SYNC_MEMOPS = 6 };
static pthread_mutex_t gmu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  uint64_t page;
  int ok; /* 1 mapped, 0 cannot be mapped */
  gdr_mh_t mh;
  void* va;
} gmaps[GDR_MAX];
static int ngmaps;

int rmaw_gdr_open(char* err, size_t errlen) {
  void* h = dlopen("libgdrapi.so", RTLD_NOW | RTLD_LOCAL);
  if (!h) h = dlopen("libgdrapi.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(err, errlen, "%s", dlerror());
    return -1;
  }
#define SYM(field, name)                                     \
  do {                                                       \
    *(void**)&gdr.field = dlsym(h, name);                    \
    if (!gdr.field) {                                        \
      snprintf(err, errlen, "libgdrapi.so has no %s", name); \
      return -1;                                             \
    }                                                        \
  } while (0)
  SYM(open, "gdr_open");
  SYM(pin, "gdr_pin_buffer");
  SYM(unpin, "gdr_unpin_buffer");
  SYM(map, "gdr_map");
  SYM(unmap, "gdr_unmap");
#undef SYM
  *(void**)&gdr.callbackFlag = dlsym(h, "gdr_get_callback_flag");
  void* cudaLib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (cudaLib) *(void**)&gdr.setAttr = dlsym(cudaLib, "cuPointerSetAttribute");
  gdrh = gdr.open();
  if (!gdrh) {
    snprintf(err, errlen, "gdr_open failed (is the gdrdrv module loaded, /dev/gdrdrv readable?)");
    return -1;
  }
  return 0;
}

static void gdr_drop(int i) {
  if (gmaps[i].ok) {
    gdr.unmap(gdrh, gmaps[i].mh, gmaps[i].va, GDR_PAGE);
    gdr.unpin(gdrh, gmaps[i].mh);
  }
  gmaps[i] = gmaps[--ngmaps];
}

/* gdr_entry returns the table slot of page, mapping it first; -1 when the
 * table is full. Called with gmu held. */
static int gdr_entry(uintptr_t ctx, uint64_t page) {
  for (int i = 0; i < ngmaps; i++)
    if (gmaps[i].page == page) {
      int flag = 0;
      /* Freed and invalidated by the driver since: map again. */
      if (gmaps[i].ok && gdr.callbackFlag && gdr.callbackFlag(gdrh, gmaps[i].mh, &flag) == 0 && flag) {
        gdr_drop(i);
        break;
      }
      return i;
    }
  if (ngmaps == GDR_MAX) return -1;
  int i = ngmaps++;
  gmaps[i].page = page;
  gmaps[i].ok = 0;
  gmaps[i].va = NULL;
  CUdeviceptr base = 0;
  size_t n = 0;
  if (cu.ctxSetCurrent((CUcontext)ctx) != 0 || cu.memGetAddressRange(&base, &n, (CUdeviceptr)page) != 0 ||
      page < base || page + GDR_PAGE > base + n)
    return i;
  if (gdr.setAttr) {
    unsigned one = 1; /* GDRCopy's rule: copies of this memory complete before they return */
    gdr.setAttr(&one, ATTR_SYNC_MEMOPS, base);
  }
  if (gdr.pin(gdrh, (unsigned long)page, GDR_PAGE, 0, 0, &gmaps[i].mh) != 0) return i;
  if (gdr.map(gdrh, gmaps[i].mh, &gmaps[i].va, GDR_PAGE) != 0) {
    gdr.unpin(gdrh, gmaps[i].mh);
    return i;
  }
  gmaps[i].ok = 1;
  return i;
}

/* rmaw_gdr_add adds v to the word at addr through the mapping: 1 done, 0
 * this word takes the copy path. */
int rmaw_gdr_add(uintptr_t ctx, uint64_t addr, uint64_t v) {
  uint64_t page = addr & ~(GDR_PAGE - 1);
  if ((addr & 7) != 0) return 0;
  pthread_mutex_lock(&gmu);
  int i = gdr_entry(ctx, page);
  if (i < 0 || !gmaps[i].ok) {
    pthread_mutex_unlock(&gmu);
    return 0;
  }
  volatile uint64_t* w = (volatile uint64_t*)((char*)gmaps[i].va + (addr - page));
  uint64_t x = *w;
  *w = x + v;
  /* Drain the write-combining buffer: the store leaves for the GPU now. */
  __sync_synchronize();
  pthread_mutex_unlock(&gmu);
  return 1;
}

/* rmaw_gdr_forget unmaps every page that overlaps [addr, addr+size). */
void rmaw_gdr_forget(uint64_t addr, uint64_t size) {
  pthread_mutex_lock(&gmu);
  for (int i = 0; i < ngmaps;)
    if (gmaps[i].page < addr + size && gmaps[i].page + GDR_PAGE > addr) gdr_drop(i);
    else i++;
  pthread_mutex_unlock(&gmu);
}
