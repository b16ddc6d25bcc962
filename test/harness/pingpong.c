/*
 * pingpong.c - --scenario pingpong: the 8-byte put+signal half round trip
 * through the C ABI from a C thread, as NCCL's RMA proxy thread drives the
 * plugin, beside a raw TCP 8-byte ping-pong between the same two processes.
 *
 * Rank 0 iputSignals 8 bytes with an ADD 1 on rank 1's signal word for it
 * (host memory, FORCE_SO|SIGNAL_NEVER_RESET); rank 1 polls that word the
 * way the proxy's loop does (rmaProgress, test() of its own requests in
 * flight, the word; sched_yield after --spin empty turns) and answers the
 * same way. Each side keeps up to PP_SLOTS requests in flight, as the proxy
 * does: an answer does not wait for the previous put's completion (arrival
 * at the target, a round trip of its own), and every request is still
 * tested to completion. Every signal word must equal the count of pings
 * exactly, and every 8-byte payload (a function of sender and count) must
 * already be in place when its signal is seen.
 *
 * The raw baseline: a loopback TCP connection the ranks open themselves
 * (TCP_NODELAY, blocking read and write of 8 bytes, each value checked).
 * Blocks of --iters round trips alternate between the two (raw first in
 * even blocks, plugin first in odd ones) so that noise hits both; rank 0
 * times each block and reports the medians over --blocks blocks.
 */
#include "harness.h" /* first: _GNU_SOURCE (accept4) */

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/socket.h>

#define PP_SLOTS 16 /* 8-byte source / destination slots = requests in flight per side */

static int pp_fd = -1;      /* the raw TCP connection */
static uint64_t pp_sent;    /* plugin pings this rank sent (all blocks) */
static uint64_t pp_got;     /* plugin pings this rank saw (all blocks) */
static uint64_t pp_raw_seq; /* raw messages exchanged (all blocks) */

/* the requests in flight, oldest first */
static void* pp_req[PP_SLOTS];
static int pp_head, pp_n;

static uint64_t pp_value(int sender, uint64_t count) {
  return ((uint64_t)(sender + 1) << 56) ^ (count * 0x9E3779B97F4A7C15ULL >> 8) ^ count;
}

/* pp_poll is one turn of the proxy's loop without the signal check:
 * rmaProgress (as ncclRmaProxyProgress calls it first), then test() of the
 * requests in flight, oldest first, until one is not done. */
static int pp_poll(void) {
  if (!opt.no_progress) {
    ncclResult_t rc = R.pl.t.rmaProgress(R.cm.rctx);
    if (rc != ncclSuccess) {
      failf("pingpong: rmaProgress returned %d (%s)", rc, result_name(rc));
      return -1;
    }
  }
  while (pp_n > 0) {
    int done = 0;
    ncclResult_t rc = R.pl.t.test(R.cm.coll, pp_req[pp_head], &done);
    if (rc != ncclSuccess) {
      failf("pingpong: test(iputSignal) returned %d (%s)", rc, result_name(rc));
      return -1;
    }
    if (!done) break;
    pp_head = (pp_head + 1) % PP_SLOTS;
    pp_n--;
  }
  return 0;
}

static int pp_deadline_passed(double deadline, const char* what) {
  if (now_s() <= deadline) return 0;
  failf("pingpong: %s did not happen within %d s", what, opt.timeout_s);
  return 1;
}

/* pp_send puts ping number pp_sent+1 to the peer: 8 bytes into the slot
 * for it, ADD 1 on the peer's word for us. */
static int pp_send(int peer) {
  double deadline = now_s() + opt.timeout_s;
  for (long s = 0; pp_n == PP_SLOTS; s++) { /* the slot's previous request must be done */
    if (pp_poll()) return -1;
    if ((s & 1023) == 1023 && pp_deadline_passed(deadline, "completion of a request in flight")) return -1;
  }
  uint64_t count = pp_sent + 1;
  size_t slot = (size_t)(pp_sent % PP_SLOTS) * 8;
  uint64_t v = pp_value(g_rank, count);
  memcpy(R.cm.src + (size_t)peer * opt.size + slot, &v, 8);
  void* rq = NULL;
  ncclResult_t rc = R.pl.t.iputSignal(R.cm.rctx, 0, (uint64_t)peer * opt.size + slot, R.cm.srcMh, 8,
                                      (uint64_t)g_rank * opt.size + slot, R.cm.dstMh, (uint32_t)peer,
                                      (uint64_t)g_rank * 8, R.cm.sigMh, 1, NCCL_NET_SIGNAL_OP_ADD,
                                      true, 0, &rq);
  if (rc != ncclSuccess || rq == NULL) {
    failf("pingpong: iputSignal %llu to rank %d returned %d (%s), request %p",
          (unsigned long long)count, peer, rc, result_name(rc), rq);
    return -1;
  }
  pp_req[(pp_head + pp_n) % PP_SLOTS] = rq;
  pp_n++;
  pp_sent = count;
  return 0;
}

/* pp_wait waits until the peer's word reaches pp_got+1 and checks that it
 * is exactly that and that the payload arrived first. */
static int pp_wait(int peer) {
  uint64_t want = pp_got + 1;
  uint64_t* w = &R.cm.sig[peer];
  double deadline = now_s() + opt.timeout_s;
  /* a turn as the proxy's: progress and test() first, then the word, then
   * (after --spin empty turns) sched_yield */
  for (long turn = 0;; turn++) {
    if (pp_poll()) return -1;
    uint64_t got = __atomic_load_n(w, __ATOMIC_ACQUIRE);
    if (got >= want) {
      /* In a flush round the peer may be a round ahead already: its next
       * put needs nothing of ours. */
      if (got != want && !(opt.flush_round && got == want + 1)) {
        failf("pingpong: signal word of rank %d is %llu, want exactly %llu", peer,
              (unsigned long long)got, (unsigned long long)want);
        return -1;
      }
      break;
    }
    if (turn >= opt.spin) sched_yield();
    if ((turn & 1023) == 1023 && pp_deadline_passed(deadline, "a ping's signal")) return -1;
  }
  uint64_t v;
  memcpy(&v, R.cm.dst + (size_t)peer * opt.size + (size_t)(pp_got % PP_SLOTS) * 8, 8);
  if (v != pp_value(peer, want)) {
    failf("pingpong: ping %llu from rank %d carried %016llx, want %016llx (the signal was applied "
          "before its payload)",
          (unsigned long long)want, peer, (unsigned long long)v,
          (unsigned long long)pp_value(peer, want));
    return -1;
  }
  pp_got = want;
  return 0;
}

static int pp_drain(void) {
  double deadline = now_s() + opt.timeout_s;
  for (long s = 0; pp_n > 0; s++) {
    if (pp_poll()) return -1;
    if (pp_n > 0 && s >= opt.spin) sched_yield();
    if ((s & 1023) == 1023 && pp_deadline_passed(deadline, "completion of the last requests")) return -1;
  }
  return 0;
}

/* pp_flush is GIN's flush after a round's puts: iflush to the peer, then
 * test() of everything in flight until it all completed. */
static int pp_flush(int peer) {
  /* NCCL's device flush (2.30.7) only waits until the proxy saw every put
   * complete; it posts a flush (iflush) only after gets. */
  if (opt.gin_flush) return pp_drain();
  void* rq = NULL;
  ncclResult_t rc = R.pl.t.iflush(R.cm.rctx, 0, R.cm.sigMh, (uint32_t)peer, &rq);
  if (rc != ncclSuccess) {
    failf("pingpong: iflush to rank %d returned %d (%s)", peer, rc, result_name(rc));
    return -1;
  }
  for (int done = rq == NULL; !done;) {
    if ((rc = R.pl.t.test(R.cm.coll, rq, &done)) != ncclSuccess) {
      failf("pingpong: test(iflush) returned %d (%s)", rc, result_name(rc));
      return -1;
    }
  }
  return pp_drain();
}

/* pp_meet: both ranks exchange a byte over the raw connection. */
static int pp_meet(void) {
  char c = 1;
  if (write_full(pp_fd, &c, 1) || read_full(pp_fd, &c, 1)) {
    failf("pingpong: meeting over the raw TCP connection failed: %s", strerror(errno));
    return -1;
  }
  return 0;
}

/* one plugin block; rank 0 returns the half round trip in µs (with
 * --flush-round: a whole round) */
static int plugin_block(int iters, double* half_us) {
  int peer = 1 - g_rank;
  double t0 = now_s();
  if (opt.flush_round) {
    for (int i = 0; i < iters; i++) {
      if (pp_send(peer) || pp_wait(peer) || pp_flush(peer)) return -1;
      /* --gin-flush: the ranks meet before the next round, as the GIN
       * kernel's barrier lines them up, so that both put at once (over
       * the raw connection: nothing of the plugin's). */
      if (opt.gin_flush && pp_meet()) return -1;
    }
    *half_us = (now_s() - t0) * 1e6 / iters;
    return 0;
  }
  for (int i = 0; i < iters; i++) {
    if (g_rank == 0) {
      if (pp_send(peer)) return -1;
      if (opt.yield_after_post) sched_yield();
      if (pp_wait(peer)) return -1;
    } else {
      if (pp_wait(peer) || pp_send(peer)) return -1;
      if (opt.yield_after_post) sched_yield();
    }
  }
  double el = now_s() - t0;
  if (pp_drain()) return -1;
  *half_us = el * 1e6 / (2.0 * iters);
  return 0;
}

/* raw_read_poll reads 8 bytes the way the plugin's waiter waits: a
 * non-blocking recv per turn, sched_yield after --spin empty turns. */
static int raw_read_poll(uint64_t* b) {
  size_t got = 0;
  for (long turn = 0; got < 8; turn++) {
    ssize_t k = recv(pp_fd, (char*)b + got, 8 - got, MSG_DONTWAIT);
    if (k > 0) {
      got += (size_t)k;
      continue;
    }
    if (k == 0 || (errno != EAGAIN && errno != EINTR)) return -1;
    if (turn >= opt.spin) sched_yield();
  }
  return 0;
}

static int raw_xfer(int out, int poll, uint64_t v) {
  uint64_t b = v;
  if (out ? write_full(pp_fd, &b, 8) : poll ? raw_read_poll(&b) : read_full(pp_fd, &b, 8)) {
    failf("pingpong: raw TCP %s failed: %s", out ? "write" : "read", strerror(errno));
    return -1;
  }
  if (!out && b != v) {
    failf("pingpong: raw TCP message %llu carried %016llx, want %016llx", (unsigned long long)pp_raw_seq,
          (unsigned long long)b, (unsigned long long)v);
    return -1;
  }
  return 0;
}

/* raw_block: poll 0 blocks in read(), 1 polls as the plugin's waiter does */
static int raw_block(int iters, int poll, double* half_us) {
  double t0 = now_s();
  for (int i = 0; i < iters; i++) {
    for (int side = 0; side < 2; side++) { /* rank 0 writes first, rank 1 reads first */
      uint64_t v = pp_value(side, ++pp_raw_seq);
      if (raw_xfer(side == g_rank, poll, v) == 0) continue;
      return -1;
    }
  }
  *half_us = (now_s() - t0) * 1e6 / (2.0 * iters);
  return 0;
}

/* raw_connect: rank 1 listens on loopback, rank 0 connects (port through
 * the bootstrap). */
static int raw_connect(void) {
  int lfd = -1;
  uint32_t port = 0;
  if (g_rank == 1) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr*)&a, sizeof a) || listen(lfd, 1) ||
        getsockname(lfd, (struct sockaddr*)&a, &al)) {
      failf("pingpong: raw TCP listen on 127.0.0.1: %s", strerror(errno));
      return -1;
    }
    port = ntohs(a.sin_port);
  }
  uint32_t ports[2];
  if (boot_allgather(TAG_HANDLES, &port, sizeof port, ports)) {
    failf("pingpong: bootstrap allgather of the raw TCP port failed (a rank died?)");
    return -1;
  }
  if (g_rank == 1) {
    pp_fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    close(lfd);
  } else {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                            .sin_port = htons((uint16_t)ports[1])};
    pp_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (pp_fd >= 0 && connect(pp_fd, (struct sockaddr*)&a, sizeof a)) {
      close(pp_fd);
      pp_fd = -1;
    }
  }
  int one = 1;
  if (pp_fd < 0 || setsockopt(pp_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one)) {
    failf("pingpong: raw TCP %s: %s", g_rank == 1 ? "accept" : "connect", strerror(errno));
    return -1;
  }
  return 0;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static double median(const double* v, int n) {
  double s[n];
  memcpy(s, v, sizeof s);
  qsort(s, (size_t)n, sizeof *s, cmp_double);
  return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

/* the three kinds of block; their order rotates from block to block */
enum { PP_RAW, PP_RAW_POLL, PP_PLUGIN, PP_KINDS };

int pingpong_phase(void) {
  if (raw_connect()) return -1;
  int n = opt.blocks;
  double us[PP_KINDS][n], ratio[n], ratio_poll[n];
  int warm = opt.iters < 200 ? opt.iters : 200;
  for (int b = -1; b < n; b++) { /* block -1 warms every path up, untimed */
    int it = b < 0 ? warm : opt.iters;
    for (int k = 0; k < PP_KINDS; k++) {
      int kind = (k + (b < 0 ? 0 : b)) % PP_KINDS;
      if (opt.pp_only >= 0 && kind != opt.pp_only) { /* --only (profiling): the others are not run */
        us[kind][b < 0 ? 0 : b] = 0;
        continue;
      }
      if (boot_barrier(TAG_BARRIER)) {
        failf("pingpong: bootstrap barrier failed (a rank died?)");
        return -1;
      }
      double t = 0;
      if (kind == PP_PLUGIN ? plugin_block(it, &t) : raw_block(it, kind == PP_RAW_POLL, &t)) return -1;
      if (b >= 0) us[kind][b] = t;
    }
    if (b >= 0) {
      ratio[b] = us[PP_PLUGIN][b] / us[PP_RAW][b];
      ratio_poll[b] = us[PP_PLUGIN][b] / us[PP_RAW_POLL][b];
    }
  }
  R.sigs += pp_got;
  R.ops += pp_sent;
  R.bytes += 8 * pp_got;
  bool err = false;
  CALL(R.pl.t.queryLastError(R.cm.rctx, &err));
  if (err) {
    failf("pingpong: queryLastError reports an error");
    return -1;
  }
  if (boot_barrier(TAG_BARRIER)) {
    failf("pingpong: bootstrap barrier failed (a rank died?)");
    return -1;
  }
  close(pp_fd);
  pp_fd = -1;
  if (g_rank == 0) {
    double lo = ratio[0], hi = ratio[0];
    for (int b = 1; b < n; b++) lo = ratio[b] < lo ? ratio[b] : lo, hi = ratio[b] > hi ? ratio[b] : hi;
    double mr = median(us[PP_RAW], n), mq = median(us[PP_RAW_POLL], n), mp = median(us[PP_PLUGIN], n);
    snprintf(R.pp_line, sizeof R.pp_line,
             "PINGPONG raw_us=%.2f plugin_us=%.2f ratio=%.2f raw_poll_us=%.2f ratio_poll=%.2f "
             "block_ratio_median=%.2f block_ratio_range=%.2f-%.2f block_ratio_poll_median=%.2f "
             "blocks=%d iters=%d spin=%d size=8",
             mr, mp, mp / mr, mq, mp / mq, median(ratio, n), lo, hi, median(ratio_poll, n), n, opt.iters,
             opt.spin);
    printf("[rank 0] %s\n", R.pp_line);
  }
  return 0;
}
