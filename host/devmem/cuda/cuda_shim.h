#ifndef RMAW_CUDA_SHIM_H
#define RMAW_CUDA_SHIM_H
#include <stddef.h>
#include <stdint.h>

#include "devrt.h"

int rmaw_cuda_open(char* err, size_t errlen);
/* The CUDA driver's ops table (copies, pinned memory, DMA-BUF export). */
extern const rmaw_devrt_ops rmaw_cuda_ops;
int rmaw_cuda_ordinal(uint64_t ptr);
void rmaw_cuda_copy_context(int on);
int rmaw_cuda_copy_contexts(void);
int rmaw_cuda_copy_context_failed(void);
void rmaw_cuda_stream_atomic(int on);
void rmaw_cuda_stream_atomic_note(char* out, size_t n);
void rmaw_cuda_agent(int mode, uint64_t max, uint64_t idle_us, int inl, int one_read, int stagger);
void rmaw_cuda_agent_stats(uint64_t out[15]);
uint64_t rmaw_cuda_agent_stalled(uint64_t* pending);
int rmaw_cuda_agent_runs(uintptr_t ctx);
int rmaw_cuda_agent_wanted(void);
int rmaw_cuda_p2p_atomics(int a, int b);
void rmaw_cuda_agent_start(uintptr_t ctx);
void rmaw_cuda_agents_stop(void);
void rmaw_cuda_agent_note(char* out, size_t n);
int rmaw_cuda_land_signal(uintptr_t ctx, uint64_t dst, const void* host, uint64_t n, uint64_t sig, uint64_t v, int add,
                          char* err, size_t errlen);
int rmaw_cuda_copy_mark(uintptr_t ctx, uint64_t dst, uint64_t src, uint64_t n, uint64_t mark, uint64_t* v, char* err,
                        size_t errlen);
int rmaw_cuda_signal_after_mark(uintptr_t ctx, uint64_t sig, uint64_t v, int add, uint64_t mark, uint64_t mv,
                                uint64_t release, char* err, size_t errlen);
int rmaw_cuda_host_register_ro(uintptr_t ctx, void* p, uint64_t n, char* err, size_t errlen);
int rmaw_cuda_inbox_open(uintptr_t ctx, uint64_t taken, uint64_t rows, uint64_t rowsize, char* err, size_t errlen);
int rmaw_cuda_write_idle(uintptr_t ctx, uint64_t w, uint64_t v);
int rmaw_cuda_inbox_row(uintptr_t ctx, int* row, int* fd, uint64_t* size, char* err, size_t errlen);
int rmaw_cuda_inbox_reset(uintptr_t ctx, int row, char* err, size_t errlen);
int rmaw_cuda_inbox_table(uintptr_t ctx, int idx, uint64_t base, uint64_t n, char* err, size_t errlen);
uint64_t rmaw_cuda_inbox_taken(uintptr_t ctx, int row);
int rmaw_cuda_inbox_kick(uintptr_t ctx, char* err, size_t errlen);
int rmaw_cuda_copy_write(uintptr_t ctx, uint64_t dst, uint64_t src, uint64_t n, uint64_t w, uint64_t v, char* err,
                         size_t errlen);
int rmaw_gdr_open(char* err, size_t errlen);
int rmaw_gdr_add(uintptr_t ctx, uint64_t addr, uint64_t v);
void rmaw_gdr_forget(uint64_t addr, uint64_t size);
/* The kernels (agent.ptx, atomics.ptx), NUL-terminated, copied in at the
 * package's init (ptx.go), before any call above: C buffers that Go fills,
 * rather than a function Go calls or C.CString, because cgo exports a
 * wrapper for each C function a package calls (malloc included) and the
 * library's exported symbols stay as they are. Room for each kernel and
 * its NUL; ptx_test.go fails when one outgrows it. */
extern char rmacu_agent_ptx[16384] __attribute__((visibility("hidden")));
extern char rmacu_add64_ptx[1024] __attribute__((visibility("hidden")));
#endif
