/* A stand-in libgdrapi.so for test/gpu/fakecuda.c, whose "device memory" is
 * host memory: a pinned page maps to itself. Lets staging_bench.sh --fake
 * run the plugin's GDRCopy signal path (pin, map, add, forget). */
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

typedef struct {
  unsigned long h;
} gdr_mh_t;
static int g;
static int pinned;
void* gdr_open(void) { return &g; }
int gdr_pin_buffer(void* gh, unsigned long addr, size_t size, uint64_t tok, uint32_t vas, gdr_mh_t* h) {
  (void)gh, (void)size, (void)tok, (void)vas;
  h->h = addr;
  /* Says that the plugin's GDRCopy path ran (once per process). */
  if (pinned++ == 0) fprintf(stderr, "fakegdr: page %#lx pinned and mapped\n", addr);
  return 0;
}
int gdr_unpin_buffer(void* gh, gdr_mh_t h) {
  (void)gh, (void)h;
  fprintf(stderr, "fakegdr: page %#lx unpinned\n", h.h);
  return 0;
}
int gdr_map(void* gh, gdr_mh_t h, void** va, size_t size) { (void)gh, (void)size; *va = (void*)h.h; return 0; }
int gdr_unmap(void* gh, gdr_mh_t h, void* va, size_t size) { (void)gh, (void)h, (void)va, (void)size; return 0; }
int gdr_get_callback_flag(void* gh, gdr_mh_t h, int* flag) { (void)gh, (void)h; *flag = 0; return 0; }
