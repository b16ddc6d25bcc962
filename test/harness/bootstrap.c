/*
 * bootstrap.c - the parent hub and the ranks' side of it.
 *
 * Children talk to the parent over one socketpair each: allgather of the
 * listen handles, barriers, and a final report. When a rank dies, every
 * pending and later collective of the others fails at once (no hangs).
 */
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>

#include "harness.h"

typedef struct {
  int32_t type;
  int32_t tag;
  int64_t len;
} msg_hdr;

typedef struct {
  int32_t status; /* 0 ok, -1 a rank is gone */
  int32_t gone_rank;
  int64_t len;
} reply_hdr;

/* full moves exactly n bytes to (out) or from fd, through short transfers
 * and EINTR; -1 on an error or the end of the stream. */
static int full(int fd, char* c, size_t n, int out) {
  while (n > 0) {
    ssize_t k = out ? write(fd, c, n) : read(fd, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    c += k;
    n -= (size_t)k;
  }
  return 0;
}

/* reap_child waits for child c and reaps it. A rank that died by a signal
 * (killed by a scenario, or crashed) could not remove the shared memory
 * libfabric's shm provider names after its pid ("/dev/shm/<pid>:<ep>:<dom>");
 * left there, it makes a later process that reuses the pid fail to open
 * shm (EBUSY). Those names are removed while the child is a zombie
 * (waitid WNOWAIT): its pid cannot be reused until it is reaped, so every
 * name found is the dead rank's own. */
void reap_child(child_t* c) {
  if (c->reaped) return;
  siginfo_t si;
  memset(&si, 0, sizeof si);
  while (waitid(P_PID, (id_t)c->pid, &si, WEXITED | WNOWAIT) < 0 && errno == EINTR) {
  }
  if (si.si_pid == c->pid && (si.si_code == CLD_KILLED || si.si_code == CLD_DUMPED)) {
    char prefix[32];
    int n = snprintf(prefix, sizeof prefix, "%d:", (int)c->pid);
    DIR* d = opendir("/dev/shm");
    struct dirent* e;
    while (d && (e = readdir(d)) != NULL) {
      if (strncmp(e->d_name, prefix, (size_t)n) != 0) continue;
      char path[300];
      snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
      if (unlink(path) == 0) printf("rma_driver: removed %s, left by rank pid %d\n", path, (int)c->pid);
    }
    if (d) closedir(d);
  }
  while (waitpid(c->pid, &c->status, 0) < 0 && errno == EINTR) {
  }
  c->reaped = 1;
}

int write_full(int fd, const void* p, size_t n) { return full(fd, (char*)p, n, 1); }
int read_full(int fd, void* p, size_t n) { return full(fd, p, n, 0); }

static int g_boot_fd = -1; /* child side */
int g_rank = -1;

void boot_attach(int rank, int fd) {
  g_rank = rank;
  g_boot_fd = fd;
}

/* allgather of len bytes; out gets nranks*len bytes. Returns 0 or -1 (a
 * rank died or the hub is gone); never hangs while the hub lives. */
int boot_allgather(int tag, const void* in, size_t len, void* out) {
  msg_hdr h = {MSG_COLL, tag, (int64_t)len};
  if (write_full(g_boot_fd, &h, sizeof h) || (len && write_full(g_boot_fd, in, len))) return -1;
  reply_hdr r;
  if (read_full(g_boot_fd, &r, sizeof r)) return -1;
  if (r.status != 0) {
    fprintf(stderr, "[rank %d] bootstrap: rank %d is gone\n", g_rank, r.gone_rank);
    return -1;
  }
  if ((size_t)r.len != len * (size_t)opt.ranks) return -1;
  if (r.len && read_full(g_boot_fd, out, (size_t)r.len)) return -1;
  return 0;
}

int boot_barrier(int tag) { return boot_allgather(tag, NULL, 0, NULL); }

void boot_report(const report_t* rep) {
  msg_hdr h = {MSG_REPORT, 0, (int64_t)sizeof *rep};
  if (write_full(g_boot_fd, &h, sizeof h) == 0) write_full(g_boot_fd, rep, sizeof *rep);
}

/* ---- the parent ---- */

static void hub_reply(child_t* C, int r, int status, int gone, const char* data, size_t len) {
  reply_hdr h = {status, gone, (int64_t)len};
  if (write_full(C[r].fd, &h, sizeof h) || (len && write_full(C[r].fd, data, len))) {
    /* the child died; its EOF will show up in poll */
  }
}

const char* hub_run(child_t* C, int N) {
  /* hub: a collective completes when every rank contributed; once a rank
   * is gone every pending or later collective fails. */
  int gone = -1;
  double start = now_s();
  double limit = (double)opt.timeout_s * (opt.cycles + 1) + 120;
  struct pollfd* pfd = calloc((size_t)N, sizeof *pfd);
  const char* hub_err = NULL;
  for (;;) {
    int open_fds = 0;
    for (int r = 0; r < N; r++) {
      pfd[r].fd = C[r].alive ? C[r].fd : -1;
      pfd[r].events = POLLIN;
      pfd[r].revents = 0;
      open_fds += C[r].alive;
    }
    if (open_fds == 0) break;
    if (now_s() - start > limit) {
      hub_err = "global timeout: killing all ranks";
      for (int r = 0; r < N; r++)
        if (C[r].alive) kill(C[r].pid, SIGKILL);
      break;
    }
    if (opt.scenario == SC_FAULT) fault_tick(C, N);
    int n = poll(pfd, (nfds_t)N, opt.scenario == SC_FAULT ? 10 : 1000);
    if (n < 0 && errno != EINTR) break;
    for (int r = 0; r < N && n > 0; r++) {
      if (!pfd[r].revents) continue;
      msg_hdr h;
      if (read_full(C[r].fd, &h, sizeof h) || h.len < 0 || h.len > (1 << 20)) {
        /* EOF: the rank exited or died */
        close(C[r].fd);
        C[r].alive = 0;
        if (gone < 0) gone = r;
        /* fail everybody who is waiting in a collective */
        for (int q = 0; q < N; q++)
          if (C[q].alive && C[q].pending) {
            hub_reply(C, q, -1, r, NULL, 0);
            C[q].pending = 0;
          }
        continue;
      }
      char* data = h.len ? malloc((size_t)h.len) : NULL;
      if (h.len && read_full(C[r].fd, data, (size_t)h.len)) {
        free(data);
        close(C[r].fd);
        C[r].alive = 0;
        if (gone < 0) gone = r;
        continue;
      }
      if (h.type == MSG_REPORT) {
        if ((size_t)h.len == sizeof(report_t)) {
          memcpy(&C[r].rep, data, sizeof(report_t));
          C[r].has_report = 1;
        }
        free(data);
        continue;
      }
      /* a collective contribution */
      int any_gone = 0;
      for (int q = 0; q < N; q++)
        if (!C[q].alive) any_gone = 1;
      if (any_gone) {
        int g = gone >= 0 ? gone : 0;
        hub_reply(C, r, -1, g, NULL, 0);
        free(data);
        continue;
      }
      C[r].pending = 1;
      C[r].tag = h.tag;
      C[r].data = data;
      C[r].len = (size_t)h.len;
      int all = 1;
      for (int q = 0; q < N; q++)
        if (!C[q].pending) all = 0;
      if (!all) continue;
      size_t len = C[0].len;
      int tag = C[0].tag;
      for (int q = 0; q < N; q++)
        if (C[q].len != len || C[q].tag != tag) hub_err = "ranks disagree on a collective";
      char* out = len ? malloc(len * (size_t)N) : NULL;
      for (int q = 0; q < N; q++) {
        if (len) memcpy(out + (size_t)q * len, C[q].data, len);
        free(C[q].data);
        C[q].data = NULL;
        C[q].pending = 0;
      }
      if (tag == TAG_KILL && opt.scenario == SC_KILL) {
        int v = opt.kill_rank;
        printf("rma_driver: round 0 done; SIGKILL rank %d (pid %d)\n", v, (int)C[v].pid);
        kill(C[v].pid, SIGKILL);
        reap_child(&C[v]);
        C[v].killed = 1;
        close(C[v].fd);
        C[v].alive = 0;
      }
      for (int q = 0; q < N; q++)
        if (C[q].alive) hub_reply(C, q, 0, -1, out, len * (size_t)N);
      free(out);
      if (opt.scenario == SC_FAULT) fault_after_collective(C, N, tag);
    }
  }
  for (int r = 0; r < N; r++)
    reap_child(&C[r]);
  free(pfd);
  return hub_err;
}
