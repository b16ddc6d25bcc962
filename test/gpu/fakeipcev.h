/* fakeipcev.h - interprocess events for the stand-in runtimes
 * (fakecuda.c, fakehip.c). An event is a pair {recorded, reached} in a
 * memfd arena that another process maps through /proc/<pid>/fd/<fd> when
 * it opens the event's handle: a recording bumps recorded and queues a
 * mark that raises reached to it (ipcev_reach, in stream order); a stream
 * waiting for the event queues a wait until reached catches up with the
 * count read when the wait was queued (ipcev_wait). */
#ifndef FAKEIPCEV_H
#define FAKEIPCEV_H
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define NIPCEV 4096
typedef struct {
  unsigned magic;
  int pid, fd, index;
  unsigned char pad[48];
} ipcev_handle_t;
_Static_assert(sizeof(ipcev_handle_t) == 64, "an interprocess event handle is 64 bytes");

static pthread_mutex_t ipcev_mu = PTHREAD_MUTEX_INITIALIZER;
static long* ipcev_arena;
static int ipcev_fd = -1, ipcev_next;

/* ipcev_new returns a fresh {recorded, reached} pair, NULL when the arena
 * cannot be made or is full. */
static inline long* ipcev_new(const char* name) {
  pthread_mutex_lock(&ipcev_mu);
  if (!ipcev_arena) {
    ipcev_fd = memfd_create(name, MFD_CLOEXEC);
    void* m = MAP_FAILED;
    if (ipcev_fd >= 0 && ftruncate(ipcev_fd, NIPCEV * 2 * sizeof(long)) == 0)
      m = mmap(NULL, NIPCEV * 2 * sizeof(long), PROT_READ | PROT_WRITE, MAP_SHARED, ipcev_fd, 0);
    ipcev_arena = m == MAP_FAILED ? NULL : m;
  }
  long* x = ipcev_arena && ipcev_next < NIPCEV ? ipcev_arena + 2 * ipcev_next++ : NULL;
  pthread_mutex_unlock(&ipcev_mu);
  return x;
}

/* ipcev_get writes the handle of the pair x (from ipcev_new). */
static inline void ipcev_get(long* x, unsigned magic, void* h) {
  ipcev_handle_t v = {.magic = magic, .pid = getpid(), .fd = ipcev_fd, .index = (int)((x - ipcev_arena) / 2)};
  memcpy(h, &v, sizeof v);
}

/* ipcev_open maps another process's event from its handle: its pair, or
 * NULL (a handle of this process, a wrong magic, an arena it cannot map).
 * The mapping stays for the process's life. */
static inline long* ipcev_open(const void* h, unsigned magic) {
  ipcev_handle_t v;
  memcpy(&v, h, sizeof v);
  if (v.magic != magic || v.pid == getpid() || v.index < 0 || v.index >= NIPCEV) return NULL;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", v.pid, v.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return NULL;
  long* m = mmap(NULL, NIPCEV * 2 * sizeof(long), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  return m == MAP_FAILED ? NULL : m + 2 * v.index;
}

/* ipcev_record bumps the recorded count of x and returns it: the value a
 * mark queued on the recording stream raises reached to. The first
 * recording of the process says so on stderr (tests look for it). */
static inline long ipcev_record(long* x, const char* who) {
  static int said;
  if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED)) fprintf(stderr, "%s: an interprocess event recorded\n", who);
  return __atomic_add_fetch(&x[0], 1, __ATOMIC_ACQ_REL);
}

/* ipcev_passed reports whether every recording of x ran. */
static inline int ipcev_passed(const long* x) {
  return __atomic_load_n(&x[1], __ATOMIC_ACQUIRE) >= __atomic_load_n(&x[0], __ATOMIC_ACQUIRE);
}

/* ipcev_waits returns the recording a stream that waits for x now waits
 * for. The first wait of the process says so on stderr. */
static inline long ipcev_waits(const long* x, const char* who) {
  static int said;
  if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED)) fprintf(stderr, "%s: a stream waits for another process's event\n", who);
  return __atomic_load_n(&x[0], __ATOMIC_ACQUIRE);
}

/* ipcev_reach raises reached to v (a recording ran). */
static inline void ipcev_reach(long* reached, long v) {
  long cur = __atomic_load_n(reached, __ATOMIC_ACQUIRE);
  while (cur < v && !__atomic_compare_exchange_n(reached, &cur, v, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
  }
}

/* ipcev_wait waits until another process's stream reached recording v. */
static inline void ipcev_wait(const long* reached, long v) {
  while (__atomic_load_n(reached, __ATOMIC_ACQUIRE) < v) usleep(5);
}
#endif
