/* inbox.c: the peer inbox of a context's device agent (agent.c's ring
 * header words 25..29, agent.ptx's ISCAN; NCCL_RMA_WASM_INTRANODE_INBOX).
 *
 * A put+signal between two processes of a host otherwise reaches the
 * target's signal word through the target's host: its lane reads the
 * header, waits for the sender's mark, and hands its own agent an add
 * through the pinned ring (a bus round trip for the agent to see it, one
 * more for the fields). With the inbox the sender's agent, right after its
 * copy into the target's mapped window, writes one 8-byte entry into a row
 * of device memory the target made and shared; the target's agent, which
 * looks at its rows between commands, adds the entry's value to the signal
 * word the entry names through a table only the target writes. The
 * target's host still reads the header, to number and acknowledge the
 * operation, and waits there until its agent took the entry, so that every
 * later signal it applies follows this one's payload.
 *
 * The rows are one cuMem allocation with a POSIX fd (the peers map it and
 * may write all of it: a peer may forge another peer's entries, which only
 * adds to words the table names); beside them, with host rows
 * (NCCL_RMA_WASM_INTRANODE_INBOX_HOST_ROWS), a second set of 16 rows in
 * a sealed memfd the plugin made, mapped and pinned, which a sender's host
 * writes itself (a signal alone, no agent command) and the kernel looks at
 * only when its ring is empty (header word 30; their counts follow the
 * device rows' in the counts' page). The table is a cuMem allocation of ours
 * without a shareable handle, which no peer maps, so an entry reaches no
 * word outside a registration the table holds. The counts of entries taken are pinned host memory. */
#include <string.h>

#include "cuda_internal.h"

#define IB_ROWS 16
#define IB_LOGE 6
#define IB_E (1u << IB_LOGE)
#define IB_TABLE 64

struct inbox {
  CUcontext ctx;
  unsigned long long h; /* the rows' allocation */
  CUdeviceptr rows;
  size_t size;
  CUdeviceptr table; /* IB_TABLE {base, size}: ours alone, never exported */
  unsigned long long th;
  size_t tsize;
  volatile uint64_t* taken; /* pinned: per row, entries taken | 1 << 62 once one was refused; device rows, then host rows */
  uint64_t* tab;            /* pinned: the table's host copy, the agent's copy source */
  void* page;               /* tab's page (and taken's, unless the caller's) */
  int nrows;
  uint64_t hrows; /* host rows beside the device rows: the caller's pinned memory (0: none) */
};

static struct inbox boxes[MAX_CTX];
static int nboxes;
static pthread_mutex_t ibmu = PTHREAD_MUTEX_INITIALIZER;

static struct inbox* ib_find(uintptr_t ctx) {
  for (int i = 0; i < nboxes; i++)
    if (boxes[i].ctx == (CUcontext)ctx) return &boxes[i];
  return NULL;
}

/* ib_config writes the ring header's inbox words (agent.c), read by the
 * kernel when it starts: the agent is paused around it. */
static void ib_config(struct inbox* b) {
  struct agent* a = rmacu_ag_pause((uintptr_t)b->ctx);
  volatile uint64_t* h = rmacu_ag_header((uintptr_t)b->ctx);
  if (h) {
    h[25] = b->rows;
    h[26] = (uint64_t)b->nrows;
    h[27] = IB_LOGE;
    h[28] = (uint64_t)(uintptr_t)b->taken;
    h[29] = b->table;
    h[30] = b->hrows;
  }
  rmacu_ag_resume(a);
}

/* rmaw_cuda_inbox_open makes ctx's inbox once (the agent must run there):
 * 0, or -1 with err. taken (not 0: IB_ROWS words of pinned host memory the
 * agent reaches, which the caller shares with the peers so that a sender
 * sees how far its row was taken) receives the counts; 0: a page of its
 * own (2 * IB_ROWS words: device rows', then host rows'). rows (not 0:
 * rowsize bytes of pinned host memory the agent reaches, the caller's,
 * which it shares and frees) holds the host rows beside the device rows
 * (which are a cuMem allocation exported to the peers); 0: none. */
int rmaw_cuda_inbox_open(uintptr_t ctx, uint64_t taken, uint64_t rows, uint64_t rowsize, char* err, size_t errlen) {
  pthread_mutex_lock(&ibmu);
  struct inbox* b = ib_find(ctx);
  if (b) {
    pthread_mutex_unlock(&ibmu);
    return 0;
  }
  int rc = -1;
  CUresult r = 0;
  const char* what = NULL;
  CUdevice dev = 0;
  struct inbox x = {.ctx = (CUcontext)ctx};
  void* hp = NULL;
  ctxstream* e = rmacu_ctx_stream(ctx, &r);
  if (nboxes == MAX_CTX) what = "too many contexts";
  else if (!e || !rmacu_ag_live(e)) what = "no device agent runs in the context";
  else if (!rmacu_cu.memCreate || !rmacu_cu.granularity || !rmacu_cu.memExport || !rmacu_cu.memMap)
    what = "the driver lacks cuMemCreate";
  else if ((r = rmacu_cu.ctxSetCurrent((CUcontext)ctx)) != 0 || (r = rmacu_cu.ctxGetDevice(&dev)) != 0)
    what = "the context's device";
  if (what) goto out;
  allocProp prop = {.type = 1 /* PINNED */, .handleTypes = 1 /* POSIX fd */, .locType = 1 /* device */, .locId = dev};
  size_t gran = 0;
  if ((r = rmacu_cu.granularity(&gran, &prop, 0)) != 0) {
    what = "cuMemGetAllocationGranularity";
    goto out;
  }
  x.size = (IB_ROWS * IB_E * 8 + gran - 1) / gran * gran;
  if (rows) {
    if (rowsize < IB_ROWS * IB_E * 8 || (rows & 7) || !rmacu_hr_ok((const void*)(uintptr_t)rows, IB_ROWS * IB_E * 8)) {
      what = "the host rows are not pinned memory the agent reaches";
      goto out;
    }
    x.hrows = rows;
  }
  x.tsize = (IB_TABLE * 16 + gran - 1) / gran * gran;
  /* The table: a cuMem allocation too (the agent reaches those in its
   * context), with no shareable handle. */
  allocProp tprop = prop;
  tprop.handleTypes = 0;
  if (rmacu_host_alloc(ctx, 4096, &hp, err, errlen) != 0) goto fail;
  memset(hp, 0, 4096);
  x.taken = taken ? (volatile uint64_t*)(uintptr_t)taken : (volatile uint64_t*)hp;
  if (taken && !rmacu_hr_ok((const void*)(uintptr_t)taken, 2 * IB_ROWS * 8)) {
    what = "the counts' memory is not the agent's";
    rmacu_host_free(hp);
    goto out;
  }
  for (int i = 0; i < 2 * IB_ROWS; i++) x.taken[i] = 0;
  x.page = hp;
  x.tab = (uint64_t*)hp + 256; /* bytes 2048..3071 */
  struct agent* a = rmacu_ag_pause(ctx);
  int mapped = 0;
  if ((r = rmacu_cu.ctxSetCurrent((CUcontext)ctx)) != 0) what = "cuCtxSetCurrent";
  else if ((r = rmacu_cu.memCreate(&x.h, x.size, &prop, 0)) != 0) what = "cuMemCreate (POSIX fd)";
  else if ((r = rmacu_cu.addressReserve(&x.rows, x.size, 0, 0, 0)) != 0) what = "cuMemAddressReserve";
  else if ((r = rmacu_cu.memMap(x.rows, x.size, 0, x.h, 0)) != 0) what = "cuMemMap";
  else {
    int acc[3] = {1 /* device */, dev, 3 /* read and write */};
    mapped = 1;
    if ((r = rmacu_cu.memSetAccess(x.rows, x.size, acc, 1)) != 0) what = "cuMemSetAccess";
    else if ((r = rmacu_cu.memCreate(&x.th, x.tsize, &tprop, 0)) != 0 || (r = rmacu_cu.addressReserve(&x.table, x.tsize, 0, 0, 0)) != 0 ||
             (r = rmacu_cu.memMap(x.table, x.tsize, 0, x.th, 0)) != 0 || (mapped = 2, r = rmacu_cu.memSetAccess(x.table, x.tsize, acc, 1)) != 0)
      what = "the table's cuMem allocation";
    else {
      static const unsigned char zero[IB_ROWS * IB_E * 8];
      /* Zeroed with the agent stopped: no row reads as an entry, no
       * table entry names a word (the kernel reads no further). */
      if (x.hrows) memset((void*)(uintptr_t)x.hrows, 0, sizeof zero);
      r = rmacu_cu.htod(x.rows, zero, sizeof zero, e->stream);
      if (r == 0) r = rmacu_cu.htod(x.table, zero, IB_TABLE * 16, e->stream);
      if (r == 0) r = rmacu_cu.streamSynchronize(e->stream);
      if (r != 0) what = "zeroing the rows";
    }
  }
  if (what) {
    if (mapped == 2) rmacu_cu.memUnmap(x.table, x.tsize);
    if (x.table) rmacu_cu.addressFree(x.table, x.tsize);
    if (x.th) rmacu_cu.memRelease(x.th);
    if (mapped) rmacu_cu.memUnmap(x.rows, x.size);
    if (x.rows) rmacu_cu.addressFree(x.rows, x.size);
    if (x.h) rmacu_cu.memRelease(x.h);
  }
  rmacu_ag_resume(a);
  if (what) {
    rmacu_host_free(hp);
    goto out;
  }
  boxes[nboxes] = x;
  __atomic_store_n(&nboxes, nboxes + 1, __ATOMIC_RELEASE);
  rc = 0;
out:
  if (what) rc = rmaw_fail(err, errlen, "peer inbox: %s%s%s", what, r ? ": " : "", r ? rmacu_errstr(r) : "");
fail:
  pthread_mutex_unlock(&ibmu);
  return rc;
}

/* rmaw_cuda_inbox_row hands out ctx's next row when *row is negative (for
 * a peer: the caller keeps which), or hands row *row (one handed out
 * before) again, with an fd of the rows' allocation for that peer to map
 * (*size bytes; the caller sends and closes it; host rows are the
 * caller's to share); the kernel polls the rows handed out, and their
 * twins among the host rows. -1 when none is left. */
int rmaw_cuda_inbox_row(uintptr_t ctx, int* row, int* fd, uint64_t* size, char* err, size_t errlen) {
  pthread_mutex_lock(&ibmu);
  struct inbox* b = ib_find(ctx);
  int rc = -1;
  if (!b) rc = rmaw_fail(err, errlen, "peer inbox: none in the context");
  else if (*row >= b->nrows) rc = rmaw_fail(err, errlen, "peer inbox: row %d was not handed out", *row);
  else if (*row < 0 && b->nrows == IB_ROWS) rc = rmaw_fail(err, errlen, "peer inbox: all %d rows handed out", IB_ROWS);
  else {
    CUresult r = rmacu_cu.memExport(fd, b->h, 1 /* POSIX fd */, 0);
    if (r != 0 || *fd < 0) rc = rmaw_fail(err, errlen, "peer inbox: cuMemExportToShareableHandle: %s", rmacu_errstr(r));
    else {
      *size = b->size;
      if (*row < 0) {
        *row = b->nrows++;
        ib_config(b);
      }
      rc = 0;
    }
  }
  pthread_mutex_unlock(&ibmu);
  return rc;
}

/* rmaw_cuda_inbox_reset empties row (one handed out) for a new sender: its
 * entries zeroed and its count 0, with the agent stopped, which reloads
 * its position from the count when it starts again. The caller knows that
 * no sender writes the row any more (its process exited, or it asked
 * afresh). */
int rmaw_cuda_inbox_reset(uintptr_t ctx, int row, char* err, size_t errlen) {
  pthread_mutex_lock(&ibmu);
  struct inbox* b = ib_find(ctx);
  int rc = -1;
  CUresult r = 0;
  ctxstream* e = rmacu_ctx_stream(ctx, &r);
  if (!b || !e) rc = rmaw_fail(err, errlen, "peer inbox: none in the context");
  else if (row < 0 || row >= b->nrows) rc = rmaw_fail(err, errlen, "peer inbox: row %d was not handed out", row);
  else {
    static const unsigned char zero[IB_E * 8];
    struct agent* a = rmacu_ag_pause(ctx);
    if (b->hrows) memset((void*)(uintptr_t)(b->hrows + (uint64_t)row * IB_E * 8), 0, sizeof zero);
    if ((r = rmacu_cu.ctxSetCurrent((CUcontext)ctx)) == 0 &&
        (r = rmacu_cu.htod(b->rows + (uint64_t)row * IB_E * 8, zero, sizeof zero, e->stream)) == 0)
      r = rmacu_cu.streamSynchronize(e->stream);
    if (r == 0) {
      __atomic_store_n(&b->taken[row], 0, __ATOMIC_RELEASE);
      __atomic_store_n(&b->taken[IB_ROWS + row], 0, __ATOMIC_RELEASE);
      rc = 0;
    } else rc = rmaw_fail(err, errlen, "peer inbox: zeroing row %d: %s", row, rmacu_errstr(r));
    rmacu_ag_resume(a);
  }
  pthread_mutex_unlock(&ibmu);
  return rc;
}

/* rmaw_cuda_inbox_table sets table entry idx of ctx's inbox to the n
 * bytes of device memory at base (n 0: empty), through the agent, and
 * waits until it ran: an entry that names it comes only after the caller
 * announced it. */
int rmaw_cuda_inbox_table(uintptr_t ctx, int idx, uint64_t base, uint64_t n, char* err, size_t errlen) {
  if (idx < 0 || idx >= IB_TABLE) return rmaw_fail(err, errlen, "peer inbox: table entry %d of %d", idx, IB_TABLE);
  pthread_mutex_lock(&ibmu);
  struct inbox* b = ib_find(ctx);
  int rc = -1;
  CUresult r;
  ctxstream* e = rmacu_ctx_stream(ctx, &r);
  if (!b || !e) rc = rmaw_fail(err, errlen, "peer inbox: none in the context");
  else {
    /* The host copy is the agent's source, one slot per entry: a later
     * change of another entry does not race this copy. */
    b->tab[idx * 2] = n ? base : 0;
    b->tab[idx * 2 + 1] = n;
    rc = rmacu_ag_submit(e, AG_COPY, 16, (uint64_t)(uintptr_t)(b->tab + idx * 2), b->table + (uint64_t)idx * 16, 0, err,
                         errlen);
    int s = rc == 0 ? rmacu_ag_sync(e) : 0;
    if (s > 0) rc = rmacu_stream_sync(ctx, err, errlen);
    else if (s < 0) rc = rmaw_fail(err, errlen, "peer inbox: the device agent stopped");
  }
  pthread_mutex_unlock(&ibmu);
  return rc;
}

/* rmaw_cuda_inbox_taken is row's count of entries taken (the self-check's:
 * the plugin reads the counts in the mark page), bit 62 set once
 * one was refused; 0 for no inbox. */
uint64_t rmaw_cuda_inbox_taken(uintptr_t ctx, int row) {
  int n = __atomic_load_n(&nboxes, __ATOMIC_ACQUIRE);
  for (int i = 0; i < n; i++)
    if (boxes[i].ctx == (CUcontext)ctx && row >= 0 && row < 2 * IB_ROWS) return __atomic_load_n(&boxes[i].taken[row], __ATOMIC_ACQUIRE);
  return 0;
}

/* rmaw_cuda_inbox_kick launches ctx's agent when it parked: an inbox
 * entry does not wake it, the host that waits for the entry does. */
int rmaw_cuda_inbox_kick(uintptr_t ctx, char* err, size_t errlen) {
  volatile uint64_t* h = rmacu_ag_header(ctx);
  if (!h || __atomic_load_n(&h[24], __ATOMIC_ACQUIRE) != 0) return 0;
  CTX_STREAM(e, "peer inbox");
  (void)r;
  return rmacu_ag_submit(e, AG_NOP, 0, 0, 0, 0, err, errlen);
}

/* rmaw_cuda_copy_write queues, as one agent command after the context's
 * earlier work, the copy of n bytes from device address src to dst (a
 * peer's window mapped here) and then the write of v to the 8-byte device
 * word w (a peer's inbox row mapped here); n 0: the write alone. 1
 * (nothing queued): the context runs no agent, or the copy is too large
 * for it. */
int rmaw_cuda_copy_write(uintptr_t ctx, uint64_t dst, uint64_t src, uint64_t n, uint64_t w, uint64_t v, char* err,
                         size_t errlen) {
  CTX_STREAM(e, "inbox entry");
  (void)r;
  if (!rmacu_ag_live(e) || n > rmacu_agent_max) return 1;
  if (w & 7) return rmaw_fail(err, errlen, "inbox entry %#llx not 8-byte aligned", (unsigned long long)w);
  if (n == 0) return rmacu_ag_submit(e, AG_WRITE, 0, 0, w, v, err, errlen);
  return rmacu_ag_submit_sig(e, AG_COPY_WRITE, n, src, dst, v, w, err, errlen);
}

/* rmacu_inbox_close frees every inbox (finalize, the agents stopped). */
void rmacu_inbox_close(void) {
  pthread_mutex_lock(&ibmu);
  for (int i = 0; i < nboxes; i++) {
    struct inbox* b = &boxes[i];
    volatile uint64_t* h = rmacu_ag_header((uintptr_t)b->ctx);
    if (h) h[25] = h[26] = h[28] = h[29] = h[30] = 0; /* a kernel started later polls none */
    if (rmacu_cu.ctxSetCurrent(b->ctx) == 0) {
      rmacu_cu.memUnmap(b->table, b->tsize);
      rmacu_cu.addressFree(b->table, b->tsize);
      rmacu_cu.memRelease(b->th);
      rmacu_cu.memUnmap(b->rows, b->size);
      rmacu_cu.addressFree(b->rows, b->size);
      rmacu_cu.memRelease(b->h);
    }
    rmacu_host_free(b->page);
  }
  __atomic_store_n(&nboxes, 0, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&ibmu);
}
