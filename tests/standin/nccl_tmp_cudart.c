/* nccl_tmp_cudart.c — TEMPORARY minimal cudart stand-in (test-only), used
 * by the nccl stand-in's tests only until the real one (cudart_standin.c,
 * branch standin) is merged; then this file and its CMake target go.
 * Streams are threads running their queue in order; events record
 * completion generations; device memory is a list of live allocations.
 * Threads: every function may be called from any thread (one mutex).
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin.h"

typedef struct item {
  standin_fn fn;
  void *arg;
  void (*release)(void *);
  struct item *next;
} item;

struct CUstream_st {
  pthread_t th;
  item *head, *tail;
  bool busy, quit;
  cudaError_t err;
};

struct CUevent_st {
  unsigned long recorded, completed;
};

typedef struct alloc {
  char *p;
  size_t n;
  struct alloc *next;
} alloc;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static alloc *allocs;
static struct CUstream_st *legacy;
static char last[256];

void standin_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last, sizeof last, fmt, ap);
  va_end(ap);
  fprintf(stderr, "cuda stand-in: %s\n", last);
}

const char *standin_last_error(void) {
  return last;
}

void standin_set_delay_us(unsigned us) {
  (void)us;
}

bool standin_is_device(const void *p) {
  pthread_mutex_lock(&mu);
  bool found = false;
  for (alloc *a = allocs; a && !found; a = a->next)
    found = (const char *)p >= a->p && (const char *)p < a->p + a->n;
  pthread_mutex_unlock(&mu);
  return found;
}

cudaError_t standin_check_device(const void *p, size_t bytes, const char *what) {
  pthread_mutex_lock(&mu);
  bool ok = false;
  for (alloc *a = allocs; a && !ok; a = a->next)
    ok = (const char *)p >= a->p && (const char *)p + (bytes ? bytes : 1) <= a->p + a->n;
  pthread_mutex_unlock(&mu);
  if (ok)
    return cudaSuccess;
  standin_error("%s: %p (%zu bytes) is not inside one live device allocation", what, p, bytes);
  return cudaErrorInvalidValue;
}

static void *stream_main(void *arg) {
  struct CUstream_st *s = arg;
  pthread_mutex_lock(&mu);
  for (;;) {
    while (!s->head && !s->quit)
      pthread_cond_wait(&cv, &mu);
    if (!s->head)
      break;
    item *it = s->head;
    s->busy = true;
    pthread_mutex_unlock(&mu);
    cudaError_t e = it->fn(it->arg);
    if (it->release)
      it->release(it->arg);
    pthread_mutex_lock(&mu);
    if (e != cudaSuccess && s->err == cudaSuccess)
      s->err = e;
    s->head = it->next;
    if (!s->head)
      s->tail = NULL;
    s->busy = false;
    free(it);
    pthread_cond_broadcast(&cv);
  }
  pthread_mutex_unlock(&mu);
  return NULL;
}

static struct CUstream_st *stream_new(void) {
  struct CUstream_st *s = calloc(1, sizeof *s);
  pthread_create(&s->th, NULL, stream_main, s);
  return s;
}

static struct CUstream_st *resolve(cudaStream_t s) {
  if (s)
    return s;
  pthread_mutex_lock(&mu);
  if (!legacy)
    legacy = stream_new();
  pthread_mutex_unlock(&mu);
  return legacy;
}

cudaError_t standin_enqueue(cudaStream_t st, standin_fn fn, void *arg, void (*release)(void *)) {
  struct CUstream_st *s = resolve(st);
  item *it = calloc(1, sizeof *it);
  *it = (item){fn, arg, release, NULL};
  pthread_mutex_lock(&mu);
  if (s->tail)
    s->tail->next = it;
  else
    s->head = it;
  s->tail = it;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
  (void)flags;
  *s = stream_new();
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) {
  return cudaStreamCreateWithFlags(s, 0);
}

cudaError_t cudaStreamSynchronize(cudaStream_t st) {
  struct CUstream_st *s = resolve(st);
  pthread_mutex_lock(&mu);
  while (s->head)
    pthread_cond_wait(&cv, &mu);
  cudaError_t e = s->err;
  pthread_mutex_unlock(&mu);
  return e;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  cudaStreamSynchronize(s);
  pthread_mutex_lock(&mu);
  s->quit = true;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
  pthread_join(s->th, NULL);
  free(s);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
  (void)flags;
  *e = calloc(1, sizeof **e);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  free(e);
  return cudaSuccess;
}

typedef struct ev_arg {
  cudaEvent_t e;
  unsigned long gen;
} ev_arg;

static cudaError_t ev_mark(void *arg) {
  ev_arg *a = arg;
  pthread_mutex_lock(&mu);
  if (a->e->completed < a->gen)
    a->e->completed = a->gen;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

static cudaError_t ev_wait(void *arg) {
  ev_arg *a = arg;
  pthread_mutex_lock(&mu);
  while (a->e->completed < a->gen)
    pthread_cond_wait(&cv, &mu);
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  ev_arg *a = malloc(sizeof *a);
  pthread_mutex_lock(&mu);
  a->e = e;
  a->gen = ++e->recorded;
  pthread_mutex_unlock(&mu);
  return standin_enqueue(s, ev_mark, a, free);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  (void)flags;
  ev_arg *a = malloc(sizeof *a);
  pthread_mutex_lock(&mu);
  a->e = e;
  a->gen = e->recorded;
  pthread_mutex_unlock(&mu);
  return standin_enqueue(s, ev_wait, a, free);
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  pthread_mutex_lock(&mu);
  bool done = e->completed >= e->recorded;
  pthread_mutex_unlock(&mu);
  return done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaMalloc(void **p, size_t n) {
  alloc *a = malloc(sizeof *a);
  a->p = calloc(1, n ? n : 1);
  a->n = n;
  pthread_mutex_lock(&mu);
  a->next = allocs;
  allocs = a;
  pthread_mutex_unlock(&mu);
  *p = a->p;
  return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
  pthread_mutex_lock(&mu);
  for (alloc **pp = &allocs; *pp; pp = &(*pp)->next)
    if ((*pp)->p == p) {
      alloc *a = *pp;
      *pp = a->next;
      free(a->p);
      free(a);
      break;
    }
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
  (void)kind;
  cudaDeviceSynchronize();
  memcpy(dst, src, n);
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  return cudaStreamSynchronize(NULL);
}

const char *cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : e == cudaErrorNotReady ? "device not ready" : "stand-in error";
}

cudaError_t cudaStreamQuery(cudaStream_t st) {
  struct CUstream_st *s = resolve(st);
  pthread_mutex_lock(&mu);
  cudaError_t e = s->err != cudaSuccess ? s->err : s->head ? cudaErrorNotReady : cudaSuccess;
  pthread_mutex_unlock(&mu);
  return e;
}
