/* cuda_internal.h: what the CUDA runtime's C files share. One file per
 * concern, so that each reads on its own; cgo compiles every .c of this
 * directory into the library, and this is their one internal header:
 *
 *   driver.c     the driver table (libcuda.so.1 found with dlopen, never linked), errstr, the ops table
 *   context.c    contexts and pools: inspection, copy contexts, each context's shared stream and copy-stream pool, caps
 *   copy.c       copies: synchronous ones on the pool, stream-ordered ones, pinned host memory
 *   ipc.c        IPC and events: events (agent tickets included), cuMem export and import, DMA-BUF, interprocess events
 *   atomics.c    signal words on the stream: writes, the stream-atomic probe, the add kernel (atomics.ptx)
 *   gdr.c        GDRCopy: signal words through a CPU mapping of their GPU page
 *   agent.c      the device agent: one resident block per copy context polling a command ring (agent.ptx)
 *   agent.ptx, atomics.ptx   the kernels, embedded by ptx.go (go:embed) and handed over at init
 *   cuda_shim.h  what Go calls (cuda.go); cuda_internal.h includes it
 *
 * Why one header and prefixed names: what one file defines and another uses
 * (the driver table, the context table and its lock, the agent's entry
 * points) is declared here once, named rmacu_* and hidden (the pragma
 * below), so that nothing clashes with the other packages' C in the final
 * library and its exported symbols stay those Go calls. Everything else
 * stays static in the file that uses it; the agent's struct is agent.c's
 * alone (the other files hold a struct agent* and pass it back). */
#ifndef RMACU_INTERNAL_H
#define RMACU_INTERNAL_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cuda_shim.h"

#pragma GCC visibility push(hidden)

/* The driver's types, our own minimal subset of its API (types are plain
 * integers and pointers). */
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void* CUcontext;
typedef void* CUstream;
typedef int CUdevice;
/* CUipcEventHandle: 64 opaque bytes, passed by value. */
typedef struct {
  unsigned char reserved[64];
} cuIpcEventHandle;

enum {
  ATTR_CONTEXT = 1,
  ATTR_MEMORY_TYPE = 2,
  ATTR_DEVICE_ORDINAL = 9,
  MEMTYPE_DEVICE = 2,
  STREAM_NON_BLOCKING = 1,
  ATTR_64_BIT_MEM_OPS_V1 = 93,  /* CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1 */
  ATTR_64_BIT_MEM_OPS = 122,    /* CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS */
  EVENT_DISABLE_TIMING = 2,
  ERROR_NOT_READY = 600,
  ATTR_ATOMIC_REDUCTION = 148,  /* CU_DEVICE_ATTRIBUTE_ATOMIC_REDUCTION_SUPPORTED (CUDA 13.1) */
  MEMOP_BARRIER = 6,            /* CU_STREAM_MEM_OP_BARRIER; flags 0: system scope */
  MEMOP_ATOMIC_REDUCTION = 8,   /* CU_STREAM_MEM_OP_ATOMIC_REDUCTION (CUDA 13.1) */
  REDUCTION_OP_ADD = 0,         /* CU_STREAM_ATOMIC_REDUCTION_OP_ADD = CU_ATOMIC_OPERATION_INTEGER_ADD */
};

/* One operation of cuStreamBatchMemOp_v2: the driver's union is 48 bytes;
 * an atomic reduction fills the first 40 (operation, flags, reduction op
 * and data type as 32-bit enums, then address, operand and a word the
 * driver uses). A barrier uses the first two fields. */
typedef union {
  struct {
    uint32_t operation, flags, reductionOp, dataType;
    uint64_t address, value, alias;
  } reduce;
  uint64_t pad[6];
} memop;
_Static_assert(sizeof(memop) == 48, "CUstreamBatchMemOpParams is 48 bytes");

/* The driver table (driver.c fills it at rmaw_cuda_open). */
typedef struct {
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
  CUresult (*dtod)(CUdeviceptr, CUdeviceptr, size_t, CUstream); /* optional */
  CUresult (*getErrorString)(CUresult, const char**);
  CUresult (*memHostAlloc)(void**, size_t, unsigned);
  CUresult (*memFreeHost)(void*);
  CUresult (*memGetAddressRange)(CUdeviceptr*, size_t*, CUdeviceptr);
  CUresult (*memHostRegister)(void*, size_t, unsigned);   /* optional */
  CUresult (*memHostUnregister)(void*);                   /* optional */
  CUresult (*getHandleForRange)(void*, CUdeviceptr, size_t, int, unsigned long long); /* optional, 11.7 */
  /* Optional, for stream-ordered signals and asynchronous copies. */
  CUresult (*ctxGetDevice)(CUdevice*);
  CUresult (*deviceGetAttribute)(int*, int, CUdevice);
  CUresult (*deviceGetP2PAttribute)(int*, int, CUdevice, CUdevice); /* optional */
  CUresult (*writeValue64)(CUstream, CUdeviceptr, unsigned long long, unsigned);
  /* Optional, for the copy context (rmaw_cuda_copy_context). */
  CUresult (*ctxCreate)(CUcontext*, unsigned, CUdevice);
  CUresult (*memRetain)(unsigned long long*, void*);
  CUresult (*memRelease)(unsigned long long);
  int writeValueAttr; /* the attribute saying writeValue64 works */
  CUresult (*moduleLoadData)(void**, const void*);
  CUresult (*moduleGetFunction)(void**, void*, const char*);
  CUresult (*launchKernel)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                           void**, void**);
  CUresult (*eventCreate)(void**, unsigned);
  CUresult (*eventRecord)(void*, CUstream);
  CUresult (*eventQuery)(void*);
  CUresult (*eventDestroy)(void*);
  /* Optional, for stream atomics (CUDA 13.1 drivers): see rmacu_reduce_probe. */
  CUresult (*batchMemOp)(CUstream, unsigned, memop*, unsigned);
  CUresult (*memAlloc)(CUdeviceptr*, size_t);
  /* Optional, for IPC between the processes of a host (ipc.c). */
  CUresult (*memExport)(void*, unsigned long long, int, unsigned long long);
  CUresult (*memImport)(unsigned long long*, void*, int);
  CUresult (*addressReserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*addressFree)(CUdeviceptr, size_t);
  CUresult (*memMap)(CUdeviceptr, size_t, size_t, unsigned long long, unsigned long long);
  CUresult (*memUnmap)(CUdeviceptr, size_t);
  CUresult (*memSetAccess)(CUdeviceptr, size_t, const void*, size_t);
  CUresult (*ipcGetEventHandle)(void*, void*);
  CUresult (*ipcOpenEventHandle)(void**, cuIpcEventHandle);
  CUresult (*streamWaitEvent)(CUstream, void*, unsigned);
  /* Optional, for the device agent (agent.c). */
  CUresult (*waitValue64)(CUstream, CUdeviceptr, unsigned long long, unsigned);
  CUresult (*memHostGetDevicePointer)(CUdeviceptr*, void*, unsigned);
  CUresult (*streamQuery)(CUstream);
  /* Optional, for the agent's peer inbox (inbox.c). */
  CUresult (*memCreate)(unsigned long long*, size_t, const void*, unsigned long long);
  CUresult (*granularity)(size_t*, const void*, int);
} rmacu_driver;
extern rmacu_driver rmacu_cu;

/* rmacu_errstr is the driver's text for r (driver.c). */
const char* rmacu_errstr(CUresult r);

enum { MEMHOSTALLOC_PORTABLE = 1 };

/* CUmemAllocationProp (inbox.c's allocation, selftest.go's). */
typedef struct {
  int type, handleTypes, locType, locId;
  void* win32;
  unsigned char compression, rdma;
  unsigned short usage;
  unsigned char reserved[4];
} allocProp;
_Static_assert(sizeof(allocProp) == 32, "CUmemAllocationProp is 32 bytes");

/* The device agent (agent.c); its struct is agent.c's alone. */
struct agent;

/* A context's shared stream and its copy-stream pool (context.c,
 * rmacu_ctx_stream). */
#define MAX_CTX 64
#define NCOPY 8
typedef struct {
  CUcontext ctx;
  CUstream stream;
  int caps;
  void* add;         /* the rmaw_add64 kernel, NULL: none */
  uint32_t reduceTy; /* the data type verified as a 64-bit add (rmacu_reduce_probe), 0: none */
  /* The synchronous copies' streams (rmaw_pool_take), each owned by one copy
   * at a time. */
  CUstream copy[NCOPY];
  pthread_mutex_t cmu[NCOPY];
  unsigned next;
  struct agent* ag; /* the device agent (agent.c), NULL: none */
  unsigned skip;    /* bit i: copy[i] shares the agent's hardware queue, unused */
} ctxstream;

/* context.c: the lock of the context table, the copy contexts, the stream
 * atomic probe's note and the agent's host ranges; the context table
 * (entries published with a release store of rmacu_nctxs, found without a
 * lock). */
extern pthread_mutex_t rmacu_mu;
extern ctxstream rmacu_ctxs[MAX_CTX];
extern int rmacu_nctxs;
/* rmacu_ctx_stream makes ctx current and returns its stream entry, creating
 * it on first use; NULL with *r set on failure. */
ctxstream* rmacu_ctx_stream(uintptr_t ctx, CUresult* r);
/* rmacu_own_context reports whether ctx is one of the plugin's copy
 * contexts (takes rmacu_mu). */
int rmacu_own_context(uintptr_t ctx);

/* CTX_STREAM declares r and e, ctx's stream entry, or fails the calling
 * op with what in its message. */
#define CTX_STREAM(e, what)                 \
  CUresult r;                               \
  ctxstream* e = rmacu_ctx_stream(ctx, &r); \
  if (!e) return rmaw_fail(err, errlen, "%s: no stream for the context: %s", what, rmacu_errstr(r))

/* atomics.c: rmacu_reduce_probe sets e->reduceTy (under rmacu_mu, the
 * context current); rmacu_add64_ptx is atomics.ptx (cuda_shim.h). */
void rmacu_reduce_probe(ctxstream* e, int have_dev, CUdevice dev);

/* agent.c. rmacu_agent_mode: 0 off, 1 on, 2 auto (on when MPS looks
 * active); rmacu_agent_max: the largest copy the agent takes (bytes). */
extern int rmacu_agent_mode;
extern uint64_t rmacu_agent_max;
/* Kinds 7-10 copy, then write or add the signal word at slot word 7: from
 * src (COPY_*), or from the payload bytes the slot carries (INLINE_*, at
 * most AG_INLINE). */
enum {
  AG_NOP = 0, /* nothing (a launch of a parked kernel is its point) */
  AG_COPY = 1,
  AG_WRITE = 2,
  AG_ADD = 3,
  AG_WAIT = 4,
  AG_EXIT = 5,
  AG_COPY_WRITE = 7,
  AG_COPY_ADD = 8,
  AG_INLINE_WRITE = 9,
  AG_INLINE_ADD = 10
};
/* AG_AFTER_MARK, or'ed into a WRITE or an ADD: first wait until the 8-byte
 * host word at src (a peer's mark page, registered here) reached n; the
 * kernel gives up, skipping the signal and counting it at header byte 152,
 * once the host word at the slot's sig (when not 0) is not 0 (the peer's
 * process is gone) or after 30 s. */
#define AG_AFTER_MARK 16
#define AG_INLINE 64
struct agent* rmacu_ag_live(ctxstream* e);
int rmacu_ag_submit(ctxstream* e, uint64_t kind, uint64_t n, uint64_t src, uint64_t dst, uint64_t val, char* err,
                    size_t errlen);
int rmacu_ag_submit_sig(ctxstream* e, uint64_t kind, uint64_t n, uint64_t src, uint64_t dst, uint64_t val, uint64_t sig,
                        char* err, size_t errlen);
volatile uint64_t* rmacu_ag_header(uintptr_t ctx);
void rmacu_inbox_close(void); /* inbox.c */
int rmacu_ag_record(ctxstream* e, struct agent* a, uintptr_t* ev, char* err, size_t errlen);
int rmacu_ag_ticket(uintptr_t ctx, uintptr_t ev);
struct agent* rmacu_ag_pause(uintptr_t ctx);
void rmacu_ag_resume(struct agent* a);
void rmacu_ag_pause_all(struct agent** out, int max);
void rmacu_ag_resume_all(struct agent** a, int max);
int rmacu_ag_sync(ctxstream* e);
int rmacu_on_stream(ctxstream* e, struct agent** a, char* err, size_t errlen);
void rmacu_off_stream(struct agent* a, int queued);
void rmacu_hr_add(void* p, uint64_t n);
void rmacu_hr_drop(void* p);
int rmacu_hr_ok(const void* p, uint64_t n);

/* The ops table's entries (RMAW_DEVRT_OPS(rmacu) in driver.c). */
int rmacu_inspect(uint64_t ptr, uint64_t size, uintptr_t* ctx, char* err, size_t errlen); /* context.c */
int rmacu_caps(uintptr_t ctx);                                                           /* context.c */
/* copy.c */
int rmacu_copy(uintptr_t ctx, int to_device, void* host, uint64_t dev, uint64_t n, char* err, size_t errlen);
int rmacu_copy_dtod(uintptr_t ctx, uint64_t dst, uint64_t src, uint64_t n, char* err, size_t errlen);
int rmacu_copy_async(uintptr_t ctx, int to_device, void* host, uint64_t dev, uint64_t n, char* err, size_t errlen);
int rmacu_copy_dtod_async(uintptr_t ctx, uint64_t dst, uint64_t src, uint64_t n, char* err, size_t errlen);
int rmacu_host_alloc(uintptr_t ctx, uint64_t n, void** p, char* err, size_t errlen);
void rmacu_host_free(void* p);
int rmacu_host_register(uintptr_t ctx, void* p, uint64_t n, char* err, size_t errlen);
void rmacu_host_unregister(uintptr_t ctx, void* p);
/* atomics.c */
int rmacu_write64(uintptr_t ctx, uint64_t dev, uint64_t v, char* err, size_t errlen);
int rmacu_add64(uintptr_t ctx, uint64_t dev, uint64_t v, char* err, size_t errlen);
/* ipc.c */
int rmacu_event_record(uintptr_t ctx, uintptr_t* ev, char* err, size_t errlen);
int rmacu_event_query(uintptr_t ctx, uintptr_t ev);
void rmacu_event_destroy(uintptr_t ctx, uintptr_t ev);
int rmacu_stream_sync(uintptr_t ctx, char* err, size_t errlen);
int rmacu_export_dmabuf(uintptr_t ctx, uint64_t base, uint64_t n, int* fd, char* err, size_t errlen);
int rmacu_ipc_export(uintptr_t ctx, uint64_t ptr, uint64_t size, int max, rmaw_ipc_seg* segs, int* n, char* err,
                     size_t errlen);
int rmacu_ipc_import(uintptr_t ctx, int n, const rmaw_ipc_seg* segs, uint64_t* va, char* err, size_t errlen);
int rmacu_ipc_unmap(uintptr_t ctx, uint64_t va, int n, const uint64_t* sizes, char* err, size_t errlen);
int rmacu_ipc_event_new(uintptr_t ctx, uintptr_t* ev, unsigned char* handle, char* err, size_t errlen);
int rmacu_ipc_event_open(uintptr_t ctx, const unsigned char* handle, uintptr_t* ev, char* err, size_t errlen);
int rmacu_stream_wait(uintptr_t ctx, uintptr_t ev, char* err, size_t errlen);

#pragma GCC visibility pop
#endif
