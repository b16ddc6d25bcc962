/* rmaw.h - Guest ABI v1.1 SDK for C backends of rccl-rma-wasm.
 *
 * Build a backend (freestanding, no libc, no WASI) with the flags of
 * guests/buildflags/cflags.txt (make and the tests read that file):
 *   clang $(cat guests/buildflags/cflags.txt) -I guests/c -o mybackend.wasm mybackend.c
 *
 * Every backend must:
 *   RMAW_ABI_V1();              declare the ABI (exports rmaw_abi_v1)
 *   RMAW_DEFINE_AREA(cap);      reserve the descriptor area (exports rmaw_area)
 *   RMAW_EXPORT(rmaw_init) int64_t rmaw_init(int64_t host_features) { ... }
 * and may export rmaw_devices, rmaw_conn_plan, rmaw_ctx_open, rmaw_ctx_close,
 * rmaw_plan_op, rmaw_completions and rmaw_finalize (signatures below).
 * The normative text is SPEC.md §8; the constants mirror abi/guestabi.
 */
#ifndef RMAW_H
#define RMAW_H

#include <stddef.h>
#include <stdint.h>

#define RMAW_ABI_VERSION 1 /* the marker's and the area's version */
#define RMAW_ABI_MINOR 1   /* v1.1: the RMAW_FEATURE_* bits 2..7 below */
#define RMAW_AREA_MAGIC 0x57414d52u /* "RMAW" */

/* Feature bits (rmaw_init's argument offers, its result enables). */
#define RMAW_FEATURE_PLAN_OP     ((int64_t)1 << 0)
#define RMAW_FEATURE_COMPLETIONS ((int64_t)1 << 1)
/* v1.1: offered by v1.1 hosts; enable only what host_features offers. */
#define RMAW_FEATURE_CHUNK       ((int64_t)1 << 2) /* plan.chunk_size acts */
#define RMAW_FEATURE_DELAY       ((int64_t)1 << 3) /* plan.delay_ns acts */
#define RMAW_FEATURE_COMPRESSION ((int64_t)1 << 4) /* plan.codec, conn.codec act */
#define RMAW_FEATURE_TRANSPORTS  ((int64_t)1 << 5) /* conn.transport may be FABRIC */
#define RMAW_FEATURE_PLAN_BATCH  ((int64_t)1 << 6) /* aggregated ops planned by rmaw_plan_ops */
#define RMAW_FEATURE_LANE_EVENTS ((int64_t)1 << 7) /* completion batches carry RMAW_EVENT_LANE_DOWN records */
#define RMAW_MAX_BATCH 256

/* Status codes. rmaw_plan_op may also return 1..6 (an ncclResult_t) to fail
 * the operation on purpose. */
#define RMAW_OK             0
#define RMAW_ERR_INVAL     -1
#define RMAW_ERR_NOTSUP    -2
#define RMAW_ERR_NOMEM     -3
#define RMAW_ERR_INTERNAL  -4
#define RMAW_ERR_BOUNDS    -5

/* ncclResult_t values usable as rmaw_plan_op answers. */
#define RMAW_NCCL_SYSTEM_ERROR    2
#define RMAW_NCCL_INTERNAL_ERROR  3
#define RMAW_NCCL_INVALID_ARGUMENT 4
#define RMAW_NCCL_INVALID_USAGE   5
#define RMAW_NCCL_REMOTE_ERROR    6

#define RMAW_LOG_ERROR 0
#define RMAW_LOG_WARN  1
#define RMAW_LOG_INFO  2
#define RMAW_LOG_TRACE 3

#define RMAW_OP_PUT        1
#define RMAW_OP_PUT_SIGNAL 2
#define RMAW_OP_GET        3
#define RMAW_OP_FLUSH      4
/* A completion record that is no operation (RMAW_FEATURE_LANE_EVENTS): lane
 * `lane` to `peer` failed, the host moved its operations (`size` of them) to
 * the other lanes; it stays down. status is RMAW_NCCL_REMOTE_ERROR. */
#define RMAW_EVENT_LANE_DOWN 5

#define RMAW_TRANSPORT_AUTO      0
#define RMAW_TRANSPORT_TCP       1
#define RMAW_TRANSPORT_INTRANODE 2
#define RMAW_TRANSPORT_FABRIC    3 /* RMAW_FEATURE_TRANSPORTS */

/* Codec words (plan.codec, conn.codec; RMAW_FEATURE_COMPRESSION). */
#define RMAW_CODEC_NONE 0
#define RMAW_CODEC_S2   1 /* level 0/1 Encode, 2 EncodeBetter */
#define RMAW_CODEC_ZSTD 2 /* level 0 (= 1) .. 4 */
#define RMAW_CODEC(id, level) ((uint32_t)(id) | ((uint32_t)(level) << 8))

#define RMAW_MAX_DELAY_NS 10000000ull   /* plan.delay_ns cap (10 ms) */
#define RMAW_MAX_CHUNK (1ull << 40)
#define RMAW_MIN_PLAN_CHUNK 4096
#define RMAW_MAX_PIECES_PER_OP 1024

#define RMAW_MAX_LANES   8
#define RMAW_MAX_DEVICES 8
#define RMAW_MAX_COMP_CAP 4096
#define RMAW_MAX_METRICS_LEN (256 << 10)

#define RMAW_EXPORT(name) __attribute__((export_name(#name), visibility("default")))
#define RMAW_IMPORT(name) __attribute__((import_module("rmaw"), import_name(#name)))

/* ---- descriptors (little-endian, in the guest's own memory) ---- */

struct rmaw_plan {            /* pre-filled by the host before rmaw_plan_op */
  int32_t lane;               /* -1 = runtime's choice, else 0..lanes-1 */
  uint32_t flags;             /* reserved, 0 */
  uint64_t chunk_size;        /* RMAW_FEATURE_CHUNK: striping unit, 0 = the connection's */
  uint64_t delay_ns;          /* RMAW_FEATURE_DELAY: wait before sending, <= RMAW_MAX_DELAY_NS */
  uint32_t codec;             /* RMAW_FEATURE_COMPRESSION: RMAW_CODEC(id, level), pre-filled with conn.codec */
  uint32_t reserved;
};

struct rmaw_conn_plan {       /* pre-filled with the defaults before rmaw_conn_plan */
  int32_t lanes;              /* 1..RMAW_MAX_LANES */
  int32_t transport;          /* RMAW_TRANSPORT_* */
  uint64_t stripe_threshold;  /* ops at least this large are striped */
  uint64_t chunk_size;        /* stripe unit, > 0 */
  uint32_t codec;             /* RMAW_FEATURE_COMPRESSION: codec word for every peer */
  uint32_t reserved;
};

struct rmaw_device {          /* written by rmaw_devices */
  char name[64];              /* NUL-terminated, at most 63 bytes */
  int32_t speed_mbps;         /* > 0 */
  float latency_us;           /* >= 0 */
  uint64_t reserved;
};

struct rmaw_completion {      /* written by the host before rmaw_completions */
  uint32_t kind;              /* RMAW_OP_* */
  uint32_t peer;
  uint64_t size;
  int32_t status;             /* ncclResult_t, 0 = success */
  int32_t lane;               /* the lane the op's plan asked for, -1 = runtime's choice (v1.1 host; a v1 host writes 0) */
  uint64_t latency_ns;        /* measured by the host */
};

struct rmaw_plan_rec {        /* RMAW_FEATURE_PLAN_BATCH: one op of a batch (rmaw_plan_recs()) */
  uint32_t kind;              /* RMAW_OP_* */
  uint32_t peer;
  uint64_t size;
  uint32_t opt_flags;
  uint32_t signal_op;
  struct rmaw_plan plan;      /* pre-filled like the area's plan; edit in place */
  int32_t status;             /* 0 go ahead, 1..6 fail this op with that ncclResult_t */
  uint32_t reserved;
};

struct rmaw_area {
  uint32_t magic;             /* RMAW_AREA_MAGIC */
  uint32_t version;           /* RMAW_ABI_VERSION */
  uint32_t area_size;         /* bytes, including the completion records */
  uint32_t comp_cap;          /* completion records that follow */
  struct rmaw_plan plan;
  struct rmaw_conn_plan conn;
  struct rmaw_device devices[RMAW_MAX_DEVICES];
  /* comp_cap struct rmaw_completion records follow (rmaw_completion_ring()) */
};

_Static_assert(offsetof(struct rmaw_area, plan) == 0x10, "plan offset");
_Static_assert(offsetof(struct rmaw_area, conn) == 0x30, "conn offset");
_Static_assert(offsetof(struct rmaw_area, devices) == 0x50, "devices offset");
_Static_assert(sizeof(struct rmaw_area) == 0x2d0, "area header size");
_Static_assert(sizeof(struct rmaw_device) == 80, "device size");
_Static_assert(sizeof(struct rmaw_completion) == 32, "completion size");
_Static_assert(sizeof(struct rmaw_plan_rec) == 64, "plan record size");
_Static_assert(offsetof(struct rmaw_plan_rec, plan) == 24, "plan record plan");
_Static_assert(offsetof(struct rmaw_plan_rec, status) == 56, "plan record status");

/* ---- the declarations a backend implements ---- */
int64_t rmaw_init(int64_t host_features);
int32_t rmaw_devices(int32_t max);
int32_t rmaw_conn_plan(int32_t nranks, int32_t rank);
int32_t rmaw_ctx_open(int32_t ctx, int64_t comm_id, int32_t nranks, int32_t rank, int32_t ncontexts);
int32_t rmaw_ctx_close(int32_t ctx);
int32_t rmaw_plan_op(int32_t ctx, int32_t kind, int32_t peer, int64_t size, int32_t opt_flags, int32_t signal_op);
int32_t rmaw_completions(int32_t ctx, int32_t n);
int32_t rmaw_finalize(void);
/* Optional (v1.1): the address (high 32 bits) and length (low 32 bits) of
 * Prometheus text the host writes to NCCL_RMA_WASM_METRICS_FILE and serves
 * at NCCL_RMA_WASM_METRICS_ADDR; at most RMAW_MAX_METRICS_LEN bytes. */
int64_t rmaw_metrics(void);
int32_t rmaw_plan_ops(int32_t ctx, int32_t n); /* n records at rmaw_plan_recs(); < 0 fails them all */

/* Declares Guest ABI v1. */
#define RMAW_ABI_V1() RMAW_EXPORT(rmaw_abi_v1) void rmaw_abi_v1(void) {}

/* Reserves the descriptor area with room for CAP completion records and
 * exports rmaw_area. Use rmaw_area_ptr() to reach it. */
#define RMAW_DEFINE_AREA(CAP)                                                        \
  static struct {                                                                    \
    struct rmaw_area a;                                                              \
    struct rmaw_completion c[(CAP) > 0 ? (CAP) : 1];                                 \
  } __attribute__((aligned(8))) rmaw__area = {                                       \
      .a = {.magic = RMAW_AREA_MAGIC, .version = RMAW_ABI_VERSION,                   \
            .area_size = sizeof(rmaw__area), .comp_cap = (CAP)}};                    \
  static inline __attribute__((unused)) struct rmaw_area *rmaw_area_ptr(void) { return &rmaw__area.a; }      \
  static inline __attribute__((unused)) struct rmaw_completion *rmaw_completion_ring(void) { return rmaw__area.c; } \
  static inline __attribute__((unused)) struct rmaw_plan_rec *rmaw_plan_recs(void) { return (struct rmaw_plan_rec *)(void *)rmaw__area.c; } \
  RMAW_EXPORT(rmaw_area) uint32_t rmaw_area(void) { return (uint32_t)(uintptr_t)&rmaw__area; }

/* ---- host functions (module "rmaw") ---- */
RMAW_IMPORT(log) int32_t rmaw_log_raw(int32_t level, const char *msg, uint32_t len);
RMAW_IMPORT(get_config) int32_t rmaw_get_config(char *buf, uint32_t limit);

/* ---- helpers (no libc) ---- */
static inline uint32_t rmaw_strlen(const char *s) {
  uint32_t n = 0;
  while (s[n]) n++;
  return n;
}

static inline int32_t rmaw_log(int32_t level, const char *msg) {
  return rmaw_log_raw(level, msg, rmaw_strlen(msg));
}

static inline void rmaw_strlcpy(char *dst, const char *src, uint32_t size) {
  uint32_t i = 0;
  for (; i + 1 < size && src[i]; i++) dst[i] = src[i];
  for (; i < size; i++) dst[i] = 0;
}

/* Writes v in decimal to buf (at least 21 bytes); returns the length. */
static inline uint32_t rmaw_utoa(uint64_t v, char *buf) {
  char tmp[21];
  uint32_t n = 0, i;
  do { tmp[n++] = (char)('0' + v % 10); v /= 10; } while (v);
  for (i = 0; i < n; i++) buf[i] = tmp[n - 1 - i];
  buf[n] = 0;
  return n;
}

/* A bounded line builder for log lines and text (no libc): appends stop
 * when the buffer is full, the text stays NUL-terminated. */
struct rmaw_buf {
  char *p;
  uint32_t n, cap;
};

static inline void rmaw_buf_str(struct rmaw_buf *b, const char *s) {
  while (*s && b->n + 1 < b->cap) b->p[b->n++] = *s++;
  if (b->cap) b->p[b->n] = 0;
}

static inline void rmaw_buf_u64(struct rmaw_buf *b, uint64_t v) {
  char tmp[24];
  rmaw_utoa(v, tmp);
  rmaw_buf_str(b, tmp);
}

static inline void rmaw_buf_i64(struct rmaw_buf *b, int64_t v) {
  if (v < 0) {
    rmaw_buf_str(b, "-");
    rmaw_buf_u64(b, (uint64_t)0 - (uint64_t)v);
  } else {
    rmaw_buf_u64(b, (uint64_t)v);
  }
}

static inline int32_t rmaw_buf_log(int32_t level, const struct rmaw_buf *b) {
  return rmaw_log_raw(level, b->p, b->n);
}

/* Appends fmt, printf-style, with only %s, %d, %u, %lld, %llu and %% (clang
 * checks the arguments against the format: int64_t is %lld, uint64_t %llu). */
static inline __attribute__((format(printf, 2, 3))) void rmaw_buf_fmt(struct rmaw_buf *b, const char *fmt, ...) {
  __builtin_va_list ap;
  char ch[2] = {0, 0};
  __builtin_va_start(ap, fmt);
  for (const char *f = fmt; *f; f++) {
    if (*f != '%' || !f[1]) {
      ch[0] = *f;
      rmaw_buf_str(b, ch);
      continue;
    }
    int ll = f[1] == 'l' && f[2] == 'l' && f[3];
    f += ll ? 3 : 1; /* the conversion */
    if (*f == 's') rmaw_buf_str(b, __builtin_va_arg(ap, const char *));
    else if (*f == 'd') rmaw_buf_i64(b, ll ? __builtin_va_arg(ap, long long) : __builtin_va_arg(ap, int));
    else if (*f == 'u') rmaw_buf_u64(b, ll ? __builtin_va_arg(ap, unsigned long long) : __builtin_va_arg(ap, unsigned));
    else {
      ch[0] = *f; /* %% and anything unknown: the character */
      rmaw_buf_str(b, ch);
    }
  }
  __builtin_va_end(ap);
}

/* Reads the configuration string into buf (at most cap bytes); returns its
 * length, or RMAW_ERR_INTERNAL when the host has none to give. */
static inline int32_t rmaw_config_read(char *buf, int32_t cap) {
  int32_t len = rmaw_get_config(buf, cap);
  if (len < 0) return RMAW_ERR_INTERNAL;
  return len > cap ? cap : len;
}

/* RMAW_ON_COMPLETION(c) { ... } defines rmaw_completions: it refuses a
 * batch larger than the area's completion ring (RMAW_ERR_INVAL) and runs the
 * block once per record, in order, with c pointing at the record (const
 * struct rmaw_completion *); `return;` in the block goes on to the next
 * record. Use it after RMAW_DEFINE_AREA. */
#define RMAW_ON_COMPLETION(c)                                                                 \
  static void rmaw__on_completion(const struct rmaw_completion *c);                           \
  RMAW_EXPORT(rmaw_completions) int32_t rmaw_completions(int32_t ctx, int32_t n) {            \
    (void)ctx;                                                                                \
    if (n < 0 || n > (int32_t)rmaw_area_ptr()->comp_cap) return RMAW_ERR_INVAL;               \
    for (int32_t i = 0; i < n; i++) rmaw__on_completion(&rmaw_completion_ring()[i]);          \
    return RMAW_OK;                                                                           \
  }                                                                                           \
  static void rmaw__on_completion(const struct rmaw_completion *c)

/* RMAW_CTX_OPEN_RANK(var) defines an rmaw_ctx_open that accepts every
 * context and keeps its rank in var (for a backend with one context). */
#define RMAW_CTX_OPEN_RANK(var)                                                                         \
  RMAW_EXPORT(rmaw_ctx_open) int32_t rmaw_ctx_open(int32_t ctx, int64_t comm, int32_t nranks, int32_t rank, \
                                                   int32_t n) {                                         \
    (void)ctx;                                                                                          \
    (void)comm;                                                                                         \
    (void)nranks;                                                                                       \
    (void)n;                                                                                            \
    var = rank;                                                                                         \
    return RMAW_OK;                                                                                     \
  }

/* Finds key=value in a config string of comma/space/newline separated
 * pairs; returns the value as an integer (decimal, k/m/g suffixes) or def. */
static inline int64_t rmaw_config_int(const char *cfg, uint32_t len, const char *key, int64_t def) {
  uint32_t klen = rmaw_strlen(key), i = 0;
  while (i < len) {
    while (i < len && (cfg[i] == ',' || cfg[i] == ' ' || cfg[i] == '\n' || cfg[i] == '\t')) i++;
    uint32_t j = 0;
    while (j < klen && i + j < len && cfg[i + j] == key[j]) j++;
    if (j == klen && i + j < len && cfg[i + j] == '=') {
      i += j + 1;
      int neg = 0;
      int64_t v = 0;
      if (i < len && cfg[i] == '-') { neg = 1; i++; }
      if (i >= len || cfg[i] < '0' || cfg[i] > '9') return def;
      while (i < len && cfg[i] >= '0' && cfg[i] <= '9') v = v * 10 + (cfg[i++] - '0');
      if (i < len && (cfg[i] == 'k' || cfg[i] == 'K')) v <<= 10;
      else if (i < len && (cfg[i] == 'm' || cfg[i] == 'M')) v <<= 20;
      else if (i < len && (cfg[i] == 'g' || cfg[i] == 'G')) v <<= 30;
      return neg ? -v : v;
    }
    while (i < len && cfg[i] != ',' && cfg[i] != ' ' && cfg[i] != '\n' && cfg[i] != '\t') i++;
  }
  return def;
}

/* One integer setting: rmaw_config_load sets *value from key (def when absent). */
struct rmaw_config_key {
  const char *key;
  int64_t *value;
  int64_t def;
};

/* Reads the configuration string into buf (at most cap bytes) and sets the
 * n keys from it; returns the string's length, or RMAW_ERR_INTERNAL (and
 * sets nothing) when the host has none to give. */
static inline int32_t rmaw_config_load(char *buf, int32_t cap, const struct rmaw_config_key *keys, uint32_t n) {
  int32_t len = rmaw_config_read(buf, cap);
  if (len < 0) return len;
  for (uint32_t i = 0; i < n; i++) *keys[i].value = rmaw_config_int(buf, (uint32_t)len, keys[i].key, keys[i].def);
  return len;
}

/* RMAW_CONFIG_KEYS(buf, {"key", &var, def}, ...) is rmaw_config_load over the
 * listed keys, with buf a char array: int32_t len = RMAW_CONFIG_KEYS(cfg,
 * {"lanes", &st.lanes, 4}, {"stripe", &st.stripe, 65536}); */
#define RMAW_CONFIG_KEYS(buf, ...)                                                              \
  rmaw_config_load(buf, sizeof(buf), (const struct rmaw_config_key[]){__VA_ARGS__},             \
                   sizeof((const struct rmaw_config_key[]){__VA_ARGS__}) / sizeof(struct rmaw_config_key))

/* RMAW_CONN_PLAN_LANES(LANES, STRIPE) defines an rmaw_conn_plan that asks,
 * for every peer, for LANES lanes and striping of ops of at least STRIPE
 * bytes (both evaluated at each call). Use it after RMAW_DEFINE_AREA. */
#define RMAW_CONN_PLAN_LANES(LANES, STRIPE)                                                      \
  RMAW_EXPORT(rmaw_conn_plan) int32_t rmaw_conn_plan(int32_t nranks, int32_t rank) {             \
    struct rmaw_conn_plan *c = &rmaw_area_ptr()->conn;                                           \
    (void)nranks;                                                                                \
    (void)rank;                                                                                  \
    c->lanes = (int32_t)(LANES);                                                                 \
    c->stripe_threshold = (uint64_t)(STRIPE);                                                    \
    return RMAW_OK;                                                                              \
  }

#endif /* RMAW_H */
