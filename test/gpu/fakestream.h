/* fakestream.h - in-order streams and events for the stand-in runtimes
 * (fakecuda.c, fakehip.c). A stream runs its work in order: at once when
 * it is queued, or, when the variable fs_new names says n, on a worker
 * thread n microseconds after it was queued (plus op_delay_us), so that
 * work the plugin orders wrongly shows. Events follow the stream; the
 * interprocess ones are fakeipcev.h's.
 *
 * The includer defines struct op with the fields next, kind, dst and v
 * (kind 4 marks an interprocess event reached, 5 waits for one), and
 * declares static void run_op(struct op*) and static long
 * op_delay_us(const struct op*) before including this file. */
#ifndef FAKESTREAM_H
#define FAKESTREAM_H
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
#include "fakeipcev.h"

struct fstream {
  pthread_mutex_t m;
  pthread_cond_t c;
  struct op *head, *tail;
  long issued, done;
  int dev; /* the device it was made for (HIP) */
};
static pthread_mutex_t fs_mu = PTHREAD_MUTEX_INITIALIZER;
static long fs_async_us = -1;

static void* fs_worker(void* arg) {
  struct fstream* s = arg;
  pthread_mutex_lock(&s->m);
  for (;;) {
    while (!s->head) pthread_cond_wait(&s->c, &s->m);
    struct op* o = s->head;
    pthread_mutex_unlock(&s->m);
    usleep(fs_async_us + op_delay_us(o));
    run_op(o);
    pthread_mutex_lock(&s->m);
    s->head = o->next;
    if (!s->head) s->tail = NULL;
    free(o);
    s->done++;
    pthread_cond_broadcast(&s->c);
  }
  return NULL;
}

/* fs_new makes a stream; env names the variable that delays its work. */
static inline struct fstream* fs_new(const char* env, int dev) {
  struct fstream* s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->dev = dev;
  pthread_mutex_init(&s->m, NULL);
  pthread_cond_init(&s->c, NULL);
  pthread_mutex_lock(&fs_mu);
  if (fs_async_us < 0) fs_async_us = getenv(env) ? atol(getenv(env)) : 0;
  pthread_mutex_unlock(&fs_mu);
  if (fs_async_us > 0) {
    pthread_t t;
    pthread_create(&t, NULL, fs_worker, s);
    pthread_detach(t);
  }
  return s;
}

/* fs_enqueue runs o now (no delay: in order, under the stream's lock) or
 * hands it to the stream's worker. */
static inline int fs_enqueue(struct fstream* s, struct op o) {
  struct op* p = malloc(sizeof *p);
  if (!p) return 2;
  *p = o;
  p->next = NULL;
  pthread_mutex_lock(&s->m);
  s->issued++;
  if (fs_async_us <= 0) {
    run_op(p);
    free(p);
    s->done++;
  } else {
    if (s->tail) s->tail->next = p;
    else s->head = p;
    s->tail = p;
    pthread_cond_broadcast(&s->c);
  }
  pthread_mutex_unlock(&s->m);
  return 0;
}

/* fs_sync waits until everything queued on s ran. */
static inline void fs_sync(struct fstream* s) {
  pthread_mutex_lock(&s->m);
  while (s->done < s->issued) pthread_cond_wait(&s->c, &s->m);
  pthread_mutex_unlock(&s->m);
}

/* An event: a plain one remembers its stream and how much was queued on
 * it; an interprocess one is a pair of fakeipcev.h (x). */
struct fevent {
  struct fstream* s;
  long seq;
  long* x;
};

/* fs_record records ev after what s holds; who names the fake (logs). */
static inline int fs_record(struct fevent* ev, struct fstream* s, const char* who) {
  if (ev->x) return fs_enqueue(s, (struct op){.kind = 4, .dst = &ev->x[1], .v = (uint64_t)ipcev_record(ev->x, who)});
  pthread_mutex_lock(&s->m);
  ev->s = s;
  ev->seq = s->issued;
  pthread_mutex_unlock(&s->m);
  return 0;
}

/* fs_passed reports whether the work before ev's last recording ran. */
static inline int fs_passed(struct fevent* ev) {
  if (ev->x) return ipcev_passed(ev->x);
  if (!ev->s) return 1;
  pthread_mutex_lock(&ev->s->m);
  int done = ev->s->done >= ev->seq;
  pthread_mutex_unlock(&ev->s->m);
  return done;
}

/* fs_wait makes what s queues from now on wait for another process's
 * event ev; 1 for an event of this process (the plugin waits only for
 * interprocess ones). */
static inline int fs_wait(struct fstream* s, struct fevent* ev, const char* who) {
  if (!ev->x) return 1;
  long v = ipcev_waits(ev->x, who);
  return fs_enqueue(s, (struct op){.kind = 5, .dst = &ev->x[1], .v = (uint64_t)v});
}
#endif
