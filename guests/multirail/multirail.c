/* multirail.c - stripe large operations over the lanes (rails) of each peer
 * and keep traffic off a lane that fails, without failing an operation.
 * README: guests/multirail/README.md.
 *
 * Configuration (NCCL_RMA_WASM_CONFIG or multirail.conf), comma separated:
 *   lanes=N       lanes (TCP streams) per peer, 1..8 (default 4)
 *   stripe=BYTES  ops at least this large are striped over every lane of the
 *                 peer while all are up (default 256k)
 *   small=BYTES   ops smaller than this stay on the peer's first lane that is
 *                 up instead of going round robin (default 16k; 0: none)
 *   fail_after=N  consecutive failed completions on a lane that take it out
 *                 of rotation for that peer (default 1)
 *   probe=N       while a lane is out, every Nth op to that peer goes on it
 *                 as a probe; a successful probe brings it back (default 256)
 *   down=MASK     lanes out of rotation from the start (bit i = lane i),
 *                 e.g. a rail the operator knows is bad (default 0)
 */
#include "rmaw.h"

RMAW_ABI_V1()
RMAW_DEFINE_AREA(64)

#define MAX_PEERS 512

struct peer_state {
  uint8_t down;     /* bit i: lane i out of rotation */
  uint8_t gone;     /* bit i: the host failed lane i over (lane event): never probed again */
  uint8_t probing;  /* bit i: a probe op on lane i is in flight */
  uint8_t rr;       /* next lane of the round robin */
  uint8_t fails[RMAW_MAX_LANES];
  uint32_t since_probe;
};

static struct {
  int64_t lanes, stripe, small, fail_after, probe, down;
  int chunk; /* FEATURE_CHUNK negotiated */
  int32_t rank;
  uint64_t planned[RMAW_MAX_LANES], completed[RMAW_MAX_LANES], failed[RMAW_MAX_LANES];
  uint64_t striped, striped_done, probes, failovers, recoveries, no_lane, lane_events, moved, kept;
} st;

static struct peer_state peers[MAX_PEERS + 1]; /* the last: every higher rank */
static char cfg[512];

static struct peer_state *peer_of(uint32_t peer) { return &peers[peer < MAX_PEERS ? peer : MAX_PEERS]; }

RMAW_EXPORT(rmaw_init) int64_t rmaw_init(int64_t host_features) {
  int32_t len = RMAW_CONFIG_KEYS(cfg, {"lanes", &st.lanes, 4}, {"stripe", &st.stripe, 256 << 10},
                                      {"small", &st.small, 16 << 10},
                                      {"fail_after", &st.fail_after, 1}, {"probe", &st.probe, 256},
                                      {"down", &st.down, 0});
  if (len < 0) return len;
  if (st.lanes < 1 || st.lanes > RMAW_MAX_LANES || st.stripe < 1 || st.small < 0 || st.fail_after < 1 || st.probe < 1 ||
      st.down < 0 || st.down >= (1 << st.lanes)) {
    rmaw_log(RMAW_LOG_WARN, "multirail: want lanes=1..8, stripe>0, small>=0, fail_after>0, probe>0, down=a mask of those lanes");
    return RMAW_ERR_INVAL;
  }
  for (uint32_t i = 0; i <= MAX_PEERS; i++) peers[i].down = (uint8_t)st.down;
  int64_t want = RMAW_FEATURE_PLAN_OP | RMAW_FEATURE_COMPLETIONS | RMAW_FEATURE_CHUNK | RMAW_FEATURE_LANE_EVENTS;
  st.chunk = (host_features & RMAW_FEATURE_CHUNK) != 0;
  return want & host_features;
}

/* The runtime must never stripe on its own: that would put pieces on a
 * lane this backend took out. Striping is decided per op below. */
RMAW_CONN_PLAN_LANES(st.lanes, ~(uint64_t)0)

RMAW_CTX_OPEN_RANK(st.rank)

static uint32_t all_lanes(void) { return (1u << st.lanes) - 1; }

/* The chunk that keeps an op whole (at most the ABI's bound). */
static uint64_t whole(uint64_t sz) { return sz == 0 ? 1 : sz > RMAW_MAX_CHUNK ? RMAW_MAX_CHUNK : sz; }

RMAW_EXPORT(rmaw_plan_op) int32_t rmaw_plan_op(int32_t ctx, int32_t kind, int32_t peer, int64_t size,
                                               int32_t opt_flags, int32_t signal_op) {
  (void)ctx;
  (void)opt_flags;
  (void)signal_op;
  struct rmaw_plan *p = &rmaw_area_ptr()->plan;
  struct peer_state *ps = peer_of((uint32_t)peer);
  uint64_t sz = (uint64_t)size;
  if (kind == RMAW_OP_FLUSH) return RMAW_OK; /* moves nothing */
  uint32_t up = all_lanes() & ~ps->down;
  /* A probe: one op on a lane that is out, to see whether it works again. */
  uint8_t probable = (uint8_t)(ps->down & ~ps->gone);
  if (probable && !ps->probing && ++ps->since_probe >= (uint64_t)st.probe) {
    ps->since_probe = 0;
    for (uint32_t i = 0; i < (uint32_t)st.lanes; i++) {
      uint32_t l = (ps->rr + i) % (uint32_t)st.lanes;
      if (probable & (1u << l)) {
        ps->probing |= (uint8_t)(1u << l);
        p->lane = (int32_t)l;
        if (st.chunk) p->chunk_size = whole(sz);
        st.planned[l]++;
        st.probes++;
        return RMAW_OK;
      }
    }
  }
  if (up == all_lanes() && st.chunk && st.lanes > 1 && sz >= (uint64_t)st.stripe) {
    /* Every lane is up: cut the op into one piece per lane. */
    uint64_t piece = (sz + (uint64_t)st.lanes - 1) / (uint64_t)st.lanes;
    p->lane = -1;
    p->chunk_size = piece > RMAW_MAX_CHUNK ? RMAW_MAX_CHUNK : piece;
    st.striped++;
    return RMAW_OK;
  }
  int none_up = !up;
  if (none_up) { /* every lane failed: keep sending (never drop an op), round robin */
    up = all_lanes() & ~ps->gone;
    if (!up) up = all_lanes(); /* the host fails the peer when its last lane goes */
    st.no_lane++;
  }
  /* A small op gains nothing from another lane, and a stream of them
   * spread over every lane makes the peer read every lane: keep them on
   * the first lane that is up. */
  int keep = !none_up && sz < (uint64_t)st.small;
  uint32_t l = keep ? 0 : ps->rr % (uint32_t)st.lanes;
  while (!(up & (1u << l))) l = (l + 1) % (uint32_t)st.lanes;
  if (keep)
    st.kept++;
  else
    ps->rr = (uint8_t)((l + 1) % (uint32_t)st.lanes);
  p->lane = (int32_t)l;
  if (st.chunk) p->chunk_size = whole(sz); /* whole, on this lane */
  st.planned[l]++;
  return RMAW_OK;
}

static uint32_t logged;

/* Logs a lane's change of state; the first 32 only (a flapping lane). */
static void log_lane(const char *what, uint32_t lane, uint32_t peer) {
  char line[96];
  if (++logged > 32) return;
  struct rmaw_buf b = {line, 0, sizeof line};
  rmaw_buf_str(&b, "multirail: lane ");
  rmaw_buf_u64(&b, lane);
  rmaw_buf_str(&b, what);
  rmaw_buf_u64(&b, peer);
  rmaw_buf_log(RMAW_LOG_WARN, &b);
}

RMAW_ON_COMPLETION(c) {
  if (c->kind == RMAW_OP_FLUSH) return;
  if (c->kind == RMAW_EVENT_LANE_DOWN) {
    /* The host failed this lane over: its operations went to the other
     * lanes and it never comes back. Plan nothing more onto it. */
    if (c->lane < 0 || c->lane >= st.lanes) return;
    uint32_t bit = 1u << (uint32_t)c->lane;
    struct peer_state *ps = peer_of(c->peer);
    st.lane_events++;
    st.moved += c->size;
    if (!(ps->gone & bit)) {
      ps->gone |= (uint8_t)bit;
      ps->down |= (uint8_t)bit;
      ps->probing &= (uint8_t)~bit;
      st.failovers++;
      log_lane(" failed, the host moved its operations; out of rotation for good for rank ", (uint32_t)c->lane,
               c->peer);
    }
    return;
  }
  if (c->lane < 0 || c->lane >= st.lanes) { /* striped (or not ours) */
    if (c->lane == -1) st.striped_done++;
    return;
  }
  uint32_t l = (uint32_t)c->lane, bit = 1u << l;
  struct peer_state *ps = peer_of(c->peer);
  if (c->status) {
    st.failed[l]++;
    ps->probing &= (uint8_t)~bit;
    if (!(ps->down & bit) && ++ps->fails[l] >= st.fail_after) {
      ps->down |= (uint8_t)bit;
      ps->since_probe = 0;
      st.failovers++;
      log_lane(" out of rotation after failed ops to rank ", l, c->peer);
    }
    return;
  }
  st.completed[l]++;
  ps->fails[l] = 0;
  if (ps->down & bit & ps->probing) {
    ps->down &= (uint8_t)~bit;
    st.recoveries++;
    log_lane(" back in rotation (probe succeeded) for rank ", l, c->peer);
  }
  ps->probing &= (uint8_t)~bit;
}

static void put_lanes(struct rmaw_buf *b, const char *name, const uint64_t *v) {
  rmaw_buf_str(b, name);
  for (uint32_t i = 0; i < (uint32_t)st.lanes; i++) {
    rmaw_buf_str(b, i ? " " : "[");
    rmaw_buf_u64(b, v[i]);
  }
  rmaw_buf_str(b, "]");
}

RMAW_EXPORT(rmaw_ctx_close) int32_t rmaw_ctx_close(int32_t ctx) {
  (void)ctx;
  char line[480];
  struct rmaw_buf b = {line, 0, sizeof line};
  rmaw_buf_fmt(&b, "multirail: rank %d", st.rank);
  put_lanes(&b, ": planned per lane ", st.planned);
  put_lanes(&b, ", completed ", st.completed);
  put_lanes(&b, ", failed ", st.failed);
  rmaw_buf_fmt(&b, ", small kept on one lane %llu, striped %llu (completed %llu), probes %llu, failovers %llu, recoveries %llu", st.kept, st.striped,
               st.striped_done, st.probes, st.failovers, st.recoveries);
  rmaw_buf_fmt(&b, ", lane events %llu (operations moved %llu)%s", st.lane_events, st.moved,
               st.chunk ? "" : " (host without FEATURE_CHUNK: no striping)");
  rmaw_buf_log(RMAW_LOG_INFO, &b);
  return RMAW_OK;
}
