/* GDRCopy: device signal words through a CPU mapping of their GPU page. */
#include <dlfcn.h>

#include "cuda_internal.h"

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
  if (!h) return rmaw_fail(err, errlen, "%s", dlerror());
#define SYM(field, name)                                                           \
  do {                                                                             \
    *(void**)&gdr.field = dlsym(h, name);                                          \
    if (!gdr.field) return rmaw_fail(err, errlen, "libgdrapi.so has no %s", name); \
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
  if (!gdrh) return rmaw_fail(err, errlen, "gdr_open failed (is the gdrdrv module loaded, /dev/gdrdrv readable?)");
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
  if (rmacu_cu.ctxSetCurrent((CUcontext)ctx) != 0 || rmacu_cu.memGetAddressRange(&base, &n, (CUdeviceptr)page) != 0 ||
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
