/*
 * main.c - rma_driver's options, the rank processes and the final report.
 * See harness.h for the parts; samples/README.md for the options.
 */
#include <getopt.h>
#include <signal.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "harness.h"

options_t opt = {"build/librccl-rma-wasm.so", 15, 2, 1 << 20, 3, 2, 1, SC_BASIC, 1, 300, 0, 0, 0, 0, 0, 0,
                 F_KILL_PUT, 300, 1500, 0, NULL, 0, 1, 9, 16, -1, 0, 0, 0, 0};

const char* scenario_name(enum scenario s) {
  return s == SC_BAD_INPUT ? "bad-input" : s == SC_KILL ? "kill" : s == SC_TEARDOWN ? "teardown"
       : s == SC_FAULT ? "fault" : s == SC_PINGPONG ? "pingpong" : "basic";
}

static const char* fault_names[] = {"kill-put", "kill-get", "kill-signal", "stop", "stop-cont", "reset", "lane-reset"};

const char* fault_name(enum fault f) { return fault_names[f]; }

double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char* result_name(int r) {
  static const char* names[] = {"ncclSuccess",       "ncclUnhandledCudaError", "ncclSystemError",
                                "ncclInternalError", "ncclInvalidArgument",    "ncclInvalidUsage",
                                "ncclRemoteError",   "ncclInProgress"};
  return (r >= 0 && r < 8) ? names[r] : "ncclResult(?)";
}

static void usage(FILE* f) {
  fprintf(f,
          "usage: rma_driver [options]\n"
          "  --lib PATH        plugin library (default build/librccl-rma-wasm.so)\n"
          "  --version V       table version 14|15|16 (default 15)\n"
          "  --ranks N         ranks, one process each (default 2)\n"
          "  --size BYTES      bytes per peer region; suffix k/m/g allowed (default 1m)\n"
          "  --iters N         rounds (default 3)\n"
          "  --threads T       threads per rank = nContexts (default 2)\n"
          "  --comms C         communicators per rank, set up side by side on one plugin\n"
          "                    context, each with --threads contexts, its own buffers and\n"
          "                    its own verified traffic (basic scenario; default 1)\n"
          "  --cycles K        init..finalize cycles per process, dlclose between (default 1)\n"
          "  --scenario S      basic | bad-input | kill | teardown | fault | pingpong (default basic)\n"
          "                    pingpong: 2 ranks, TCP forced; 8-byte iputSignal ping-pong driven\n"
          "                    from a C thread (rmaProgress, test(), sched_yield) beside a raw\n"
          "                    TCP 8-byte ping-pong, in alternating timed blocks; prints\n"
          "                    PINGPONG raw_us=.. plugin_us=.. ratio=.. (medians over blocks)\n"
          "  --blocks B        pingpong: timed blocks per path (default 9); --iters is the round\n"
          "                    trips per block there (default 2000)\n"
          "  --spin N          pingpong: empty polls before a wait starts to sched_yield (default 16)\n"
          "  --yield-after-post  pingpong: sched_yield once after each iputSignal, as NCCL's proxy\n"
          "                    loop ends the turn in which it posted (the plugin blocks only)\n"
          "  --flush-round     pingpong: a GIN round instead of a ping-pong: both ranks put+signal,\n"
          "                    wait for the other's signal, iflush and wait until their puts\n"
          "                    completed (the plugin blocks; plugin_us is a whole round)\n"
          "  --gin-flush       with --flush-round: no iflush, only test() until the puts completed,\n"
          "                    as NCCL's device flush does when no get is outstanding\n"
          "  --only K          pingpong: run only blocks of kind K (raw, raw-poll, plugin), for\n"
          "                    profiling; the figures of the others read 0\n"
          "  --kill-rank R     rank the parent SIGKILLs after round 0 (kill; default 1), the\n"
          "                    victim of --fault\n"
          "  --fault F         scenario fault, what happens to --kill-rank after round 0 while\n"
          "                    every rank keeps operations in flight: kill-put | kill-get |\n"
          "                    kill-signal (SIGKILL mid large puts / gets / a signal storm),\n"
          "                    stop (SIGSTOP for good), stop-cont (SIGSTOP, SIGCONT after\n"
          "                    --stop-ms, then the remaining rounds), reset (every TCP\n"
          "                    connection of the rank is reset with ss -K), lane-reset (in\n"
          "                    every round after the first the rank resets one more of its\n"
          "                    outgoing TCP lanes with ss -K --fault-delay-ms into the round;\n"
          "                    every round must still verify)\n"
          "  --fault-delay-ms M  kill-* and reset strike M ms into the fault phase (default 300)\n"
          "  --stop-ms M       stop-cont: how long the rank stays stopped (default 1500)\n"
          "  --nofile N        every rank lowers RLIMIT_NOFILE to N first; a setup call may then\n"
          "                    fail, but only with ncclSystemError/ncclRemoteError and a WARN\n"
          "  --netns PREFIX    rank r joins the network namespace PREFIX<r> (ip netns; root)\n"
          "                    before loading the plugin: ranks as on separate hosts\n"
          "  --timeout S       per-wait timeout in seconds (default 300)\n"
          "  --no-progress     never call rmaProgress (test() must progress alone)\n"
          "  --intranode       pingpong: keep the intra-node path (shared-memory request\n"
          "                    streams) instead of forcing TCP\n"
          "  --no-ptrace       ranks drop CAP_SYS_PTRACE and become non-dumpable, so the\n"
          "                    kernel refuses process_vm_writev between them (fallback test)\n"
          "  --signal-storm    a thread per rank sends SIGUSR1 to the process every 50 us\n"
          "                    (handler installed with SA_ONSTACK, as Go requires)\n"
          "  --compressible    data patterns that compress (runs of 32 bytes from 4 values)\n"
          "                    instead of pseudo-random bytes\n"
          "  --device D        listen on device D (default 0; must be below devices())\n"
          "  --verbose         print INFO/TRACE plugin log lines\n"
          "  --summary         end with a per-rank table: backend, transport to each peer,\n"
          "                    bytes and signals verified, rates (from the plugin's INFO lines)\n");
}

/* drop_ptrace makes this process a target that process_vm_writev refuses:
 * without CAP_SYS_PTRACE (even as root) a non-dumpable peer is off limits. */
static int drop_ptrace(void) {
  struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  if (syscall(SYS_capget, &hdr, data) != 0) return -1;
  data[CAP_SYS_PTRACE / 32].effective &= ~(1u << (CAP_SYS_PTRACE % 32));
  data[CAP_SYS_PTRACE / 32].permitted &= ~(1u << (CAP_SYS_PTRACE % 32));
  data[CAP_SYS_PTRACE / 32].inheritable &= ~(1u << (CAP_SYS_PTRACE % 32));
  if (syscall(SYS_capset, &hdr, data) != 0) return -1;
  return prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
}

static size_t parse_size(const char* s) {
  char* e;
  double v = strtod(s, &e);
  switch (*e) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1048576; break;
    case 'g': case 'G': v *= 1073741824.0; break;
    default: break;
  }
  return (size_t)v;
}

/* ranges writes the set {r : in[r]} of n ranks as "0-2,5" ("-" when empty). */
static void ranges(char* out, size_t cap, const uint8_t* in, int n) {
  size_t o = 0;
  out[0] = 0;
  for (int r = 0; r < n && o + 16 < cap; r++) {
    if (!in[r]) continue;
    int e = r;
    while (e + 1 < n && in[e + 1]) e++;
    o += (size_t)snprintf(out + o, cap - o, o ? ",%d" : "%d", r);
    if (e > r) o += (size_t)snprintf(out + o, cap - o, "-%d", e);
    r = e;
  }
  if (o == 0) snprintf(out, cap, "-");
}

/* print_summary tells what happened, from the ranks' reports: the plugin's
 * INFO lines (backend, connection plan, intra-node refusals) next to what
 * each rank verified itself. */
static void print_summary(const child_t* C, int N) {
  printf("rma_driver: summary (%d ranks; transport and backend as the plugin logged them)\n", N);
  printf("  %-4s %-14s %-10s %-10s %-14s %-10s %-12s %-10s %-8s %s\n", "rank", "backend", "lanes/peer",
         "intra-node", "TCP only", "connect", "bytes ok", "signals ok", "ops", "MB/s");
  const report_t* first = NULL;
  for (int r = 0; r < N; r++) {
    if (!C[r].has_report) {
      printf("  %-4d %s\n", r, C[r].killed ? "(killed on purpose)" : "(no report)");
      continue;
    }
    const report_t* p = &C[r].rep;
    const summary_t* s = &p->sum;
    if (first == NULL) first = p;
    /* Peers the kernel refused go over TCP; the others use the intra-node
     * path when the plugin said it had one for every rank, else TCP. */
    uint8_t intra[SUMMARY_MAX_RANKS], tcp[SUMMARY_MAX_RANKS];
    int n = N < SUMMARY_MAX_RANKS ? N : SUMMARY_MAX_RANKS;
    for (int q = 0; q < n; q++) {
      int on = s->intra >= n && !s->refused[q];
      intra[q] = (uint8_t)on;
      tcp[q] = (uint8_t)!on;
    }
    char ib[64], tb[64], lanes[16];
    ranges(ib, sizeof ib, intra, n);
    ranges(tb, sizeof tb, tcp, n);
    if (s->connected < 0) snprintf(ib, sizeof ib, "?"), snprintf(tb, sizeof tb, "?");
    if (s->lanes > 0) snprintf(lanes, sizeof lanes, "%d", s->lanes);
    else snprintf(lanes, sizeof lanes, "?");
    char mib[32];
    snprintf(mib, sizeof mib, "%.1f MiB", (double)p->bytes / 1048576.0);
    printf("  %-4d %-14s %-10s %-10s %-14s %-10s %-12s %-10llu %-8llu %.1f\n", r,
           s->backend[0] ? s->backend : "?", lanes, ib, tb,
           s->connect_time[0] ? s->connect_time : "?", mib, (unsigned long long)p->sigs,
           (unsigned long long)p->ops, p->seconds > 0 ? (double)p->bytes / p->seconds / 1e6 : 0.0);
  }
  if (first == NULL) return;
  const summary_t* s = &first->sum;
  if (s->features[0])
    printf("  backend %s runs as Wasm (features %s)\n", s->backend, s->features);
  else
    printf("  backend %s runs in the host (no Wasm guest)\n", s->backend[0] ? s->backend : "?");
  for (int r = 0; r < N; r++) {
    if (!C[r].has_report || C[r].rep.sum.nnotes == 0) continue;
    printf("  rank %d, the backend's last lines:", r);
    for (int i = 0; i < C[r].rep.sum.nnotes; i++)
      printf("%s %s", i ? ";" : "", C[r].rep.sum.notes[i]);
    printf("\n");
  }
  printf("  verified: every byte put and got (pattern per source, destination, round, thread) and "
         "every signal word's exact sum\n");
}


int main(int argc, char** argv) {
  static struct option lo[] = {{"lib", 1, 0, 'l'},       {"version", 1, 0, 'V'},
                               {"ranks", 1, 0, 'n'},     {"size", 1, 0, 's'},
                               {"iters", 1, 0, 'i'},     {"threads", 1, 0, 't'},
                               {"cycles", 1, 0, 'c'},    {"scenario", 1, 0, 'S'},
                               {"kill-rank", 1, 0, 'k'}, {"timeout", 1, 0, 'T'},
                               {"verbose", 0, 0, 'v'},   {"no-progress", 0, 0, 'P'},
                               {"no-ptrace", 0, 0, 'D'},  {"signal-storm", 0, 0, 'G'},
                               {"summary", 0, 0, 'Y'},  {"compressible", 0, 0, 'Z'},
                               {"fault", 1, 0, 'F'},     {"fault-delay-ms", 1, 0, 'd'},
                               {"stop-ms", 1, 0, 'o'},   {"nofile", 1, 0, 'N'},
                               {"netns", 1, 0, 'x'},     {"device", 1, 0, 'e'},   {"comms", 1, 0, 'C'},
                               {"blocks", 1, 0, 'B'},    {"spin", 1, 0, 'p'},     {"only", 1, 0, 'O'},
                               {"yield-after-post", 0, 0, 'Q'}, {"intranode", 0, 0, 'I'}, {"flush-round", 0, 0, 'R'},
                               {"gin-flush", 0, 0, 'g'},
                               {"help", 0, 0, 'h'},      {0, 0, 0, 0}};
  int ch, iters_given = 0;
  while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (ch) {
      case 'l': opt.lib = optarg; break;
      case 'V': opt.version = atoi(optarg); break;
      case 'n': opt.ranks = atoi(optarg); break;
      case 's': opt.size = parse_size(optarg); break;
      case 'i': opt.iters = atoi(optarg), iters_given = 1; break;
      case 'B': opt.blocks = atoi(optarg); break;
      case 'p': opt.spin = atoi(optarg); break;
      case 'Q': opt.yield_after_post = 1; break;
      case 'R': opt.flush_round = 1; break;
      case 'g': opt.gin_flush = 1; break;
      case 'I': opt.intranode = 1; break;
      case 'O':
        opt.pp_only = !strcmp(optarg, "raw") ? 0 : !strcmp(optarg, "raw-poll") ? 1 : !strcmp(optarg, "plugin") ? 2 : -2;
        if (opt.pp_only == -2) { usage(stderr); printf("RESULT FAIL bad --only %s\n", optarg); return 2; }
        break;
      case 't': opt.threads = atoi(optarg); break;
      case 'c': opt.cycles = atoi(optarg); break;
      case 'k': opt.kill_rank = atoi(optarg); break;
      case 'T': opt.timeout_s = atoi(optarg); break;
      case 'v': opt.verbose = 1; break;
      case 'P': opt.no_progress = 1; break;
      case 'D': opt.no_ptrace = 1; break;
      case 'G': opt.signal_storm = 1; break;
      case 'Y': opt.summary = 1; break;
      case 'Z': opt.compressible = 1; break;
      case 'd': opt.fault_delay_ms = atoi(optarg); break;
      case 'o': opt.stop_ms = atoi(optarg); break;
      case 'N': opt.nofile = atoi(optarg); break;
      case 'x': opt.netns = optarg; break;
      case 'F': {
        int found = 0;
        for (int f = 0; f <= F_LANE_RESET; f++)
          if (!strcmp(optarg, fault_names[f])) opt.fault = (enum fault)f, found = 1;
        if (!found) { usage(stderr); printf("RESULT FAIL bad --fault %s\n", optarg); return 2; }
        break;
      }
      case 'e': opt.device = atoi(optarg); break;
      case 'C': opt.comms = atoi(optarg); break;
      case 'S':
        if (!strcmp(optarg, "basic")) opt.scenario = SC_BASIC;
        else if (!strcmp(optarg, "bad-input")) opt.scenario = SC_BAD_INPUT;
        else if (!strcmp(optarg, "kill")) opt.scenario = SC_KILL;
        else if (!strcmp(optarg, "teardown")) opt.scenario = SC_TEARDOWN;
        else if (!strcmp(optarg, "fault")) opt.scenario = SC_FAULT;
        else if (!strcmp(optarg, "pingpong")) opt.scenario = SC_PINGPONG;
        else { usage(stderr); printf("RESULT FAIL bad --scenario %s\n", optarg); return 2; }
        break;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); printf("RESULT FAIL bad command line\n"); return 2;
    }
  }
  if (opt.scenario == SC_PINGPONG) {
    /* one context; 16 eight-byte slots per peer (the requests in flight) */
    if (!iters_given) opt.iters = 2000;
    opt.threads = 1;
    opt.size = 16 * 8;
  }
  if ((opt.scenario == SC_PINGPONG && (opt.ranks != 2 || opt.blocks < 1 || opt.blocks > 1000 || opt.spin < 0)) ||
      (opt.version != 14 && opt.version != 15 && opt.version != 16) || opt.ranks < 1 ||
      opt.ranks > 256 || opt.iters < 1 || opt.threads < 1 || opt.threads > 64 ||
      opt.cycles < 1 || opt.timeout_s < 1 || opt.comms < 1 || opt.comms > MAX_COMMS ||
      (opt.comms > 1 && opt.scenario != SC_BASIC) ||
      (opt.scenario == SC_TEARDOWN && opt.ranks < 2) ||
      ((opt.scenario == SC_KILL || opt.scenario == SC_FAULT) && (opt.ranks < 2 || opt.kill_rank < 0 ||
                                   opt.kill_rank >= opt.ranks)) ||
      (opt.size < 16 && opt.scenario == SC_BAD_INPUT)) {
    usage(stderr);
    printf("RESULT FAIL invalid options (kill needs --ranks >= 2 and 0 <= --kill-rank < ranks; "
           "bad-input needs --size >= 16; --comms 1..16, basic only; pingpong needs --ranks 2, "
           "--blocks 1..1000)\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGPIPE, SIG_IGN);
  int N = opt.ranks;
  printf("rma_driver: lib=%s version=v%d ranks=%d size=%zu iters=%d threads=%d comms=%d cycles=%d "
         "scenario=%s%s%s%s\n",
         opt.lib, opt.version, N, opt.size, opt.iters, opt.threads, opt.comms, opt.cycles,
         scenario_name(opt.scenario), opt.no_progress ? " no-progress" : "",
         opt.scenario == SC_FAULT ? " fault=" : "", opt.scenario == SC_FAULT ? fault_name(opt.fault) : "");
  fflush(stdout);

  child_t* C = calloc((size_t)N, sizeof *C);
  int (*sp)[2] = calloc((size_t)N, sizeof *sp);
  for (int r = 0; r < N; r++)
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp[r])) {
      perror("socketpair");
      printf("RESULT FAIL socketpair\n");
      return 1;
    }
  for (int r = 0; r < N; r++) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      printf("RESULT FAIL fork\n");
      return 1;
    }
    if (pid == 0) {
      /* die with the parent (a killed test harness leaves no ranks behind) */
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() == 1) _exit(4);
      if (opt.no_ptrace && drop_ptrace() != 0) {
        fprintf(stderr, "rank %d: cannot drop CAP_SYS_PTRACE: %s\n", r, strerror(errno));
        _exit(5);
      }
      /* only our end survives, so a dead sibling shows up as EOF at the hub */
      for (int q = 0; q < N; q++) {
        close(sp[q][0]);
        if (q != r) close(sp[q][1]);
      }
      rank_main(r, sp[r][1]);
    }
    C[r].pid = pid;
    C[r].fd = sp[r][0];
    C[r].alive = 1;
  }
  for (int r = 0; r < N; r++) close(sp[r][1]);


  const char* hub_err = hub_run(C, N);


  /* summary: a rank that died without a report is the primary cause;
   * otherwise the first rank that reported a failure. */
  int pass = hub_err == NULL;
  char reason[600] = "";
  double bytes = 0, secs = 0;
  int warns = 0, reporting = 0;
  if (hub_err) snprintf(reason, sizeof reason, "%s", hub_err);
  for (int r = 0; r < N; r++) {
    int st = C[r].status;
    if (C[r].killed || C[r].has_report) continue;
    if (WIFSIGNALED(st))
      printf("rma_driver: rank %d: died with signal %d (%s)\n", r, WTERMSIG(st),
             strsignal(WTERMSIG(st)));
    else
      printf("rma_driver: rank %d: exited with status %d without a report\n", r,
             WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    if (pass) {
      if (WIFSIGNALED(st))
        snprintf(reason, sizeof reason, "rank %d died with signal %d (%s)", r, WTERMSIG(st),
                 strsignal(WTERMSIG(st)));
      else
        snprintf(reason, sizeof reason, "rank %d exited with status %d without a report", r,
                 WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
    pass = 0;
  }
  for (int r = 0; r < N; r++) {
    int st = C[r].status;
    if (C[r].killed) {
      printf("rma_driver: rank %d: killed on purpose\n", r);
      continue;
    }
    if (C[r].has_report && (C[r].rep.status != 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)) {
      if (pass) {
        if (C[r].rep.reason[0])
          snprintf(reason, sizeof reason, "rank %d: %s", r, C[r].rep.reason);
        else
          snprintf(reason, sizeof reason, "rank %d failed (status %d)", r,
                   WIFEXITED(st) ? WEXITSTATUS(st) : -1);
      }
      pass = 0;
    }
    if (C[r].has_report) {
      bytes += (double)C[r].rep.bytes;
      reporting++;
      if (C[r].rep.seconds > secs) secs = C[r].rep.seconds;
      warns += C[r].rep.warns;
      printf("rma_driver: rank %d: %s, %.1f MiB moved in %.3f s = %.1f MB/s, %llu ops, %d WARN "
             "lines\n",
             r, C[r].rep.status ? "FAIL" : "ok", (double)C[r].rep.bytes / 1048576.0,
             C[r].rep.seconds,
             C[r].rep.seconds > 0 ? (double)C[r].rep.bytes / C[r].rep.seconds / 1e6 : 0.0,
             (unsigned long long)C[r].rep.ops, C[r].rep.warns);
    }
  }
  int setup_failed = 0;
  for (int r = 0; r < N; r++)
    if (C[r].has_report && C[r].rep.setup_failed) setup_failed++;
  if (opt.scenario == SC_FAULT && pass && opt.fault != F_STOP_CONT && opt.fault != F_RESET &&
      opt.fault != F_LANE_RESET &&
      !C[opt.kill_rank].killed) {
    pass = 0;
    snprintf(reason, sizeof reason, "the fault point was never reached");
  }
  if (opt.scenario == SC_KILL && pass && !C[opt.kill_rank].killed) {
    pass = 0;
    snprintf(reason, sizeof reason, "the kill point was never reached");
  }
  if (opt.summary) print_summary(C, N);
  if (opt.scenario == SC_PINGPONG && pass && C[0].has_report) printf("%s\n", C[0].rep.pp_line);
  if (pass)
    printf("RESULT PASS ranks=%d version=%d scenario=%s size=%zu iters=%d threads=%d cycles=%d "
           "aggregate=%.2f MB/s per_rank=%.2f MB/s per_rank_Bps=%.0f warns=%d setup_failed=%d\n",
           N, opt.version, scenario_name(opt.scenario), opt.size, opt.iters, opt.threads,
           opt.cycles, secs > 0 ? bytes / secs / 1e6 : 0.0,
           secs > 0 && reporting ? bytes / secs / 1e6 / reporting : 0.0,
           secs > 0 && reporting ? bytes / secs / reporting : 0.0, warns, setup_failed);
  else
    printf("RESULT FAIL %s\n", reason[0] ? reason : "unknown");
  return pass ? 0 : 1;
}

