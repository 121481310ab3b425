/* cudart_standin.c — the CPU stand-in of the CUDA runtime's device,
 * error, stream and event calls (test-only; docs/model.md, The CPU
 * stand-in). Memory and copies are in cudart_memory.c.
 *
 * Streams: every cudaStream_t, and the legacy default stream (0,
 * cudaStreamLegacy; cudaStreamPerThread maps to it too), is a thread that
 * runs its queue of items in order. An item first sleeps the delay knob
 * (ZB_STANDIN_DELAY_US, read once; standin_set_delay_us), then waits for
 * its dependencies (cudaStreamWaitEvent, and the legacy default stream's
 * implicit ordering with blocking streams), then runs. A stream counts
 * items enqueued and completed; an event records (stream id, count), and
 * has completed once the stream's completed count reaches it.
 *
 * Errors: an item that fails poisons its stream: later items of that
 * stream are skipped (markers and waits still run, so nothing hangs),
 * every synchronisation on it returns the error, and the error is also
 * the device's sticky error (cudaDeviceSynchronize, cudaGetLastError).
 * The last API error is per host thread, as in CUDA. A query's "not ready"
 * (cudaStreamQuery, cudaEventQuery) is recorded as the last error too: CUDA
 * may leave it there (PyTorch clears it after every query), and then the
 * next launch's cudaGetLastError reports it, so a caller that polls must
 * clear it and the stand-in shows one that forgets.
 *
 * Threads: one mutex (g_mu) guards streams, events and queues; items run
 * without it. g_progress is broadcast whenever an item completes.
 */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "standin_internal.h"

#define STANDIN_MAGIC_STREAM 0x5a425354u
#define MAX_STREAMS 256
#define MAX_DEPS_INLINE 4

typedef struct dep {
  uint64_t stream_id, target;
} dep;

typedef struct item {
  struct item *next;
  standin_fn fn;
  void *arg;
  void (*release)(void *arg);
  bool always; /* runs on a poisoned stream too (markers, waits) */
  int ndeps;
  dep *deps;
} item;

struct CUstream_st {
  uint64_t id;
  unsigned flags;
  pthread_t thread;
  pthread_cond_t wake;
  item *head, *tail;
  uint64_t enqueued, completed;
  bool stop, dying;
  cudaError_t sticky;
};

struct CUevent_st {
  unsigned flags;
  int refs;       /* the event itself plus markers in flight */
  bool destroyed; /* by cudaEventDestroy; freed when refs reaches 0 */
  bool recorded, stamped;
  uint64_t gen, stream_id, target;
  int64_t t_ns;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_progress = PTHREAD_COND_INITIALIZER;
static struct CUstream_st *g_streams[MAX_STREAMS]; /* every live stream, the default one too */
static struct CUstream_st *g_default;
static int g_nstreams;
static uint64_t g_next_id = 1;
static cudaError_t g_sticky;
static struct CUevent_st **g_events;
static size_t g_nevents, g_capevents;

static _Thread_local cudaError_t t_last;
static pthread_mutex_t g_msg_mu = PTHREAD_MUTEX_INITIALIZER; /* may be taken under g_mu */
static char g_msg[512];
static _Thread_local char t_msg[512];

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static atomic_uint g_delay_us;

static void read_env(void) {
  const char *s = getenv("ZB_STANDIN_DELAY_US");
  if (s && *s) {
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (*end || v > 10000000ul)
      fprintf(stderr,
              "cuda stand-in: ZB_STANDIN_DELAY_US='%s' is not a delay in microseconds (0..10000000); "
              "ignored\n",
              s);
    else
      atomic_store(&g_delay_us, (unsigned)v);
  }
}

void standin_set_delay_us(unsigned us) {
  pthread_once(&g_once, read_env);
  atomic_store(&g_delay_us, us);
}

int64_t standin_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

cudaError_t standin_set_last(cudaError_t e) {
  if (e != cudaSuccess)
    t_last = e;
  return e;
}

void standin_error(const char *fmt, ...) {
  char buf[sizeof g_msg];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&g_msg_mu);
  memcpy(g_msg, buf, sizeof buf);
  pthread_mutex_unlock(&g_msg_mu);
  fprintf(stderr, "cuda stand-in: %s\n", buf);
}

const char *standin_last_error(void) {
  pthread_mutex_lock(&g_msg_mu);
  memcpy(t_msg, g_msg, sizeof t_msg);
  pthread_mutex_unlock(&g_msg_mu);
  return t_msg;
}

bool standin_is_active(void) {
  return true;
}

/* ---- streams ---- */

static struct CUstream_st *find_stream_id(uint64_t id) {
  for (int i = 0; i < g_nstreams; i++)
    if (g_streams[i]->id == id)
      return g_streams[i];
  return NULL;
}

/* A stream that is gone has completed everything (destroy drains it). */
static bool deps_done(const item *it) {
  for (int i = 0; i < it->ndeps; i++) {
    struct CUstream_st *o = find_stream_id(it->deps[i].stream_id);
    if (o && o->completed < it->deps[i].target)
      return false;
  }
  return true;
}

static void run_item(struct CUstream_st *s, item *it) {
  pthread_once(&g_once, read_env);
  unsigned us = atomic_load(&g_delay_us);
  if (us) {
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (long)(us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0) {
    }
  }
  pthread_mutex_lock(&g_mu);
  while (!deps_done(it))
    pthread_cond_wait(&g_progress, &g_mu);
  bool skip = s->sticky != cudaSuccess && !it->always;
  pthread_mutex_unlock(&g_mu);
  cudaError_t e = cudaSuccess;
  if (it->fn && !skip)
    e = it->fn(it->arg);
  if (it->release)
    it->release(it->arg);
  pthread_mutex_lock(&g_mu);
  if (e != cudaSuccess && s->sticky == cudaSuccess) {
    s->sticky = e;
    if (g_sticky == cudaSuccess)
      g_sticky = e;
  }
  s->completed++;
  pthread_cond_broadcast(&g_progress);
  pthread_mutex_unlock(&g_mu);
  if (it->deps && it->ndeps > 0)
    free(it->deps);
  free(it);
}

static void *stream_main(void *p) {
  struct CUstream_st *s = p;
  pthread_mutex_lock(&g_mu);
  for (;;) {
    while (!s->head && !s->stop)
      pthread_cond_wait(&s->wake, &g_mu);
    if (!s->head)
      break;
    item *it = s->head;
    s->head = it->next;
    if (!s->head)
      s->tail = NULL;
    pthread_mutex_unlock(&g_mu);
    run_item(s, it);
    pthread_mutex_lock(&g_mu);
  }
  pthread_mutex_unlock(&g_mu);
  return NULL;
}

/* Under g_mu. */
static cudaError_t stream_new(unsigned flags, struct CUstream_st **out) {
  if (g_nstreams == MAX_STREAMS) {
    standin_error("cudaStreamCreate: more than %d streams", MAX_STREAMS);
    return cudaErrorMemoryAllocation;
  }
  struct CUstream_st *s = calloc(1, sizeof *s);
  if (!s)
    return cudaErrorMemoryAllocation;
  s->id = g_next_id++;
  s->flags = flags;
  pthread_cond_init(&s->wake, NULL);
  if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
    pthread_cond_destroy(&s->wake);
    free(s);
    standin_error("cudaStreamCreate: cannot start the stream's thread");
    return cudaErrorMemoryAllocation;
  }
  g_streams[g_nstreams++] = s;
  *out = s;
  return cudaSuccess;
}

static bool is_default_handle(cudaStream_t h) {
  return h == NULL || h == cudaStreamLegacy || h == cudaStreamPerThread;
}

/* Under g_mu: the stream behind handle h (the default one made on first use). */
static cudaError_t resolve(cudaStream_t h, struct CUstream_st **out) {
  if (is_default_handle(h)) {
    if (!g_default) {
      cudaError_t e = stream_new(0, &g_default);
      if (e != cudaSuccess)
        return e;
    }
    *out = g_default;
    return cudaSuccess;
  }
  for (int i = 0; i < g_nstreams; i++)
    if (g_streams[i] == h && !h->dying)
      return *out = h, cudaSuccess;
  standin_error("stream %p is not a live stream (never created, or destroyed)", (void *)h);
  return cudaErrorInvalidResourceHandle;
}

static bool blocking(const struct CUstream_st *s) {
  return s != g_default && !(s->flags & cudaStreamNonBlocking);
}

/* Adds (o, o's last item) to the list when o has work still to do. */
static void add_dep(dep *d, int *n, const struct CUstream_st *o) {
  if (o->completed < o->enqueued)
    d[(*n)++] = (dep){o->id, o->enqueued};
}

/* Under g_mu: appends an item to s. The legacy default stream waits for
 * all blocking streams' earlier work and they for its (CUDA's implicit
 * synchronisation); `extra` (may be NULL) is one more dependency. */
static cudaError_t enqueue_locked(struct CUstream_st *s, standin_fn fn, void *arg, void (*release)(void *),
                                  bool always, const dep *extra) {
  item *it = calloc(1, sizeof *it);
  dep *d = calloc((size_t)g_nstreams + 1, sizeof *d);
  if (!it || !d) {
    free(it);
    free(d);
    return cudaErrorMemoryAllocation;
  }
  int n = 0;
  if (s == g_default) {
    for (int i = 0; i < g_nstreams; i++)
      if (blocking(g_streams[i]))
        add_dep(d, &n, g_streams[i]);
  } else if (blocking(s) && g_default) {
    add_dep(d, &n, g_default);
  }
  if (extra)
    d[n++] = *extra;
  *it = (item){.fn = fn, .arg = arg, .release = release, .always = always, .ndeps = n, .deps = d};
  if (n == 0) {
    free(d);
    it->deps = NULL;
  }
  if (s->tail)
    s->tail->next = it;
  else
    s->head = it;
  s->tail = it;
  s->enqueued++;
  pthread_cond_signal(&s->wake);
  return cudaSuccess;
}

cudaError_t standin_enqueue(cudaStream_t h, standin_fn fn, void *arg, void (*release)(void *arg)) {
  struct CUstream_st *s;
  pthread_mutex_lock(&g_mu);
  cudaError_t e = resolve(h, &s);
  if (e == cudaSuccess)
    e = s->sticky;
  if (e == cudaSuccess)
    e = enqueue_locked(s, fn, arg, release, false, NULL);
  pthread_mutex_unlock(&g_mu);
  return e;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags) {
  if (standin_inject("cudaStreamCreateWithFlags", STANDIN_SITE))
    return standin_set_last(cudaErrorMemoryAllocation);
  if (!out || (flags & ~(unsigned)cudaStreamNonBlocking)) {
    standin_error("cudaStreamCreateWithFlags: %s", out ? "unknown flags" : "NULL stream pointer");
    return standin_set_last(cudaErrorInvalidValue);
  }
  struct CUstream_st *s;
  pthread_mutex_lock(&g_mu);
  cudaError_t e = stream_new(flags, &s);
  pthread_mutex_unlock(&g_mu);
  if (e == cudaSuccess)
    *out = s;
  return standin_set_last(e);
}

cudaError_t cudaStreamCreate(cudaStream_t *out) {
  return cudaStreamCreateWithFlags(out, cudaStreamDefault);
}

/* Waits for its queued work (CUDA returns at once and releases the stream
 * later; waiting here is the same to every caller), then frees it. */
cudaError_t cudaStreamDestroy(cudaStream_t h) {
  struct CUstream_st *s = NULL;
  pthread_mutex_lock(&g_mu);
  cudaError_t e = is_default_handle(h) ? cudaErrorInvalidResourceHandle : resolve(h, &s);
  if (e == cudaSuccess) {
    s->dying = s->stop = true;
    pthread_cond_signal(&s->wake);
  } else if (is_default_handle(h)) {
    standin_error("cudaStreamDestroy: the default stream cannot be destroyed");
  }
  pthread_mutex_unlock(&g_mu);
  if (e != cudaSuccess)
    return standin_set_last(e);
  pthread_join(s->thread, NULL);
  pthread_mutex_lock(&g_mu);
  for (int i = 0; i < g_nstreams; i++)
    if (g_streams[i] == s) {
      g_streams[i] = g_streams[--g_nstreams];
      break;
    }
  pthread_cond_broadcast(&g_progress);
  pthread_mutex_unlock(&g_mu);
  pthread_cond_destroy(&s->wake);
  free(s);
  return cudaSuccess;
}

/* Under g_mu: waits until stream `id` completed `target` items. */
static void wait_for(uint64_t id, uint64_t target) {
  dep d = {id, target};
  item it = {.ndeps = 1, .deps = &d};
  while (!deps_done(&it))
    pthread_cond_wait(&g_progress, &g_mu);
}

cudaError_t cudaStreamSynchronize(cudaStream_t h) {
  if (standin_inject("cudaStreamSynchronize", STANDIN_SITE))
    return standin_set_last(cudaErrorLaunchFailure);
  struct CUstream_st *s;
  pthread_mutex_lock(&g_mu);
  cudaError_t e = resolve(h, &s);
  if (e == cudaSuccess) {
    wait_for(s->id, s->enqueued);
    e = s->sticky;
  }
  pthread_mutex_unlock(&g_mu);
  return standin_set_last(e);
}

cudaError_t cudaStreamQuery(cudaStream_t h) {
  struct CUstream_st *s;
  pthread_mutex_lock(&g_mu);
  cudaError_t e = resolve(h, &s);
  if (e == cudaSuccess)
    e = s->sticky != cudaSuccess ? s->sticky : s->completed < s->enqueued ? cudaErrorNotReady : cudaSuccess;
  pthread_mutex_unlock(&g_mu);
  return standin_set_last(e); /* "not ready" too: see the header */
}

cudaError_t cudaDeviceSynchronize(void) {
  pthread_mutex_lock(&g_mu);
  dep d[MAX_STREAMS];
  int n = g_nstreams;
  for (int i = 0; i < n; i++)
    d[i] = (dep){g_streams[i]->id, g_streams[i]->enqueued};
  for (int i = 0; i < n; i++)
    wait_for(d[i].stream_id, d[i].target);
  cudaError_t e = g_sticky;
  pthread_mutex_unlock(&g_mu);
  return standin_set_last(e);
}

/* ---- events ---- */

/* Under g_mu. */
static cudaError_t find_event(cudaEvent_t e, const char *what) {
  for (size_t i = 0; i < g_nevents; i++)
    if (g_events[i] == e)
      return cudaSuccess;
  standin_error("%s: event %p is not a live event (never created, or destroyed)", what, (void *)e);
  return cudaErrorInvalidResourceHandle;
}

static void event_unref(struct CUevent_st *e) {
  if (--e->refs == 0)
    free(e);
}

static cudaError_t event_create(cudaEvent_t *out, unsigned int flags);

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned int flags) {
  if (standin_inject("cudaEventCreateWithFlags", STANDIN_SITE))
    return standin_set_last(cudaErrorMemoryAllocation);
  return event_create(out, flags);
}

static cudaError_t event_create(cudaEvent_t *out, unsigned int flags) {
  unsigned known = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
  if (!out || (flags & ~known) || (flags & cudaEventInterprocess)) {
    standin_error("cudaEventCreateWithFlags: %s", !out ? "NULL event pointer" : "flags not supported");
    return standin_set_last(cudaErrorInvalidValue);
  }
  struct CUevent_st *e = calloc(1, sizeof *e);
  if (!e)
    return standin_set_last(cudaErrorMemoryAllocation);
  e->flags = flags;
  e->refs = 1;
  pthread_mutex_lock(&g_mu);
  if (g_nevents == g_capevents) {
    size_t cap = g_capevents ? 2 * g_capevents : 64;
    struct CUevent_st **n = realloc(g_events, cap * sizeof *n);
    if (!n) {
      pthread_mutex_unlock(&g_mu);
      free(e);
      return standin_set_last(cudaErrorMemoryAllocation);
    }
    g_events = n;
    g_capevents = cap;
  }
  g_events[g_nevents++] = e;
  pthread_mutex_unlock(&g_mu);
  *out = e;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *out) {
  if (standin_inject("cudaEventCreate", STANDIN_SITE))
    return standin_set_last(cudaErrorMemoryAllocation);
  return event_create(out, cudaEventDefault);
}

/* Markers in flight keep the event's memory until they ran. */
cudaError_t cudaEventDestroy(cudaEvent_t ev) {
  pthread_mutex_lock(&g_mu);
  cudaError_t e = find_event(ev, "cudaEventDestroy");
  if (e == cudaSuccess) {
    for (size_t i = 0; i < g_nevents; i++)
      if (g_events[i] == ev) {
        g_events[i] = g_events[--g_nevents];
        break;
      }
    ev->destroyed = true;
    event_unref(ev);
  }
  if (g_nevents == 0) {
    free(g_events);
    g_events = NULL;
    g_capevents = 0;
  }
  pthread_mutex_unlock(&g_mu);
  return standin_set_last(e);
}

typedef struct marker {
  struct CUevent_st *ev;
  uint64_t gen;
} marker;

static cudaError_t marker_run(void *arg) {
  marker *m = arg;
  int64_t t = standin_now_ns();
  pthread_mutex_lock(&g_mu);
  if (m->ev->gen == m->gen) { /* not recorded again since */
    m->ev->t_ns = t;
    m->ev->stamped = true;
  }
  pthread_mutex_unlock(&g_mu);
  return cudaSuccess;
}

static void marker_release(void *arg) {
  marker *m = arg;
  pthread_mutex_lock(&g_mu);
  event_unref(m->ev);
  pthread_mutex_unlock(&g_mu);
  free(m);
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t h) {
  if (standin_inject("cudaEventRecord", STANDIN_SITE))
    return standin_set_last(cudaErrorLaunchFailure);
  struct CUstream_st *s;
  marker *m = malloc(sizeof *m);
  if (!m)
    return standin_set_last(cudaErrorMemoryAllocation);
  pthread_mutex_lock(&g_mu);
  cudaError_t e = find_event(ev, "cudaEventRecord");
  if (e == cudaSuccess)
    e = resolve(h, &s);
  if (e == cudaSuccess) {
    *m = (marker){ev, ++ev->gen};
    ev->refs++;
    e = enqueue_locked(s, marker_run, m, marker_release, true, NULL);
    if (e != cudaSuccess)
      ev->refs--;
  }
  if (e == cudaSuccess) {
    ev->recorded = true;
    ev->stamped = false;
    ev->stream_id = s->id;
    ev->target = s->enqueued;
  } else {
    free(m);
  }
  pthread_mutex_unlock(&g_mu);
  return standin_set_last(e);
}

/* Under g_mu. A stream that is gone has completed all it had. */
static bool event_done(const struct CUevent_st *ev) {
  if (!ev->recorded)
    return true;
  struct CUstream_st *s = find_stream_id(ev->stream_id);
  return !s || s->completed >= ev->target;
}

cudaError_t cudaEventQuery(cudaEvent_t ev) {
  pthread_mutex_lock(&g_mu);
  cudaError_t e = find_event(ev, "cudaEventQuery");
  if (e == cudaSuccess && !event_done(ev))
    e = cudaErrorNotReady;
  pthread_mutex_unlock(&g_mu);
  return standin_set_last(e); /* "not ready" too: see the header */
}

cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
  if (standin_inject("cudaEventSynchronize", STANDIN_SITE))
    return standin_set_last(cudaErrorLaunchFailure);
  pthread_mutex_lock(&g_mu);
  cudaError_t e = find_event(ev, "cudaEventSynchronize");
  if (e == cudaSuccess && ev->recorded) {
    wait_for(ev->stream_id, ev->target);
    struct CUstream_st *s = find_stream_id(ev->stream_id);
    e = s ? s->sticky : cudaSuccess;
  }
  pthread_mutex_unlock(&g_mu);
  return standin_set_last(e);
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  if (standin_inject("cudaEventElapsedTime", STANDIN_SITE))
    return standin_set_last(cudaErrorInvalidResourceHandle);
  pthread_mutex_lock(&g_mu);
  cudaError_t e = find_event(start, "cudaEventElapsedTime start");
  if (e == cudaSuccess)
    e = find_event(end, "cudaEventElapsedTime end");
  if (e == cudaSuccess && !ms) {
    standin_error("cudaEventElapsedTime: NULL ms");
    e = cudaErrorInvalidValue;
  }
  if (e == cudaSuccess && ((start->flags | end->flags) & cudaEventDisableTiming)) {
    standin_error("cudaEventElapsedTime: an event was created with cudaEventDisableTiming");
    e = cudaErrorInvalidResourceHandle;
  } else if (e == cudaSuccess && (!start->recorded || !end->recorded)) {
    standin_error("cudaEventElapsedTime: an event was never recorded");
    e = cudaErrorInvalidResourceHandle;
  } else if (e == cudaSuccess && (!event_done(start) || !event_done(end))) {
    e = cudaErrorNotReady;
  } else if (e == cudaSuccess && (!start->stamped || !end->stamped)) {
    e = cudaErrorUnknown; /* cannot happen: a completed marker stamped its event */
  }
  if (e == cudaSuccess)
    *ms = (float)((double)(end->t_ns - start->t_ns) / 1e6);
  pthread_mutex_unlock(&g_mu);
  return standin_set_last(e);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t h, cudaEvent_t ev, unsigned int flags) {
  if (standin_inject("cudaStreamWaitEvent", STANDIN_SITE))
    return standin_set_last(cudaErrorLaunchFailure);
  struct CUstream_st *s;
  pthread_mutex_lock(&g_mu);
  cudaError_t e = find_event(ev, "cudaStreamWaitEvent");
  if (e == cudaSuccess && flags != 0 && flags != cudaEventWaitExternal) {
    standin_error("cudaStreamWaitEvent: unknown flags %u", flags);
    e = cudaErrorInvalidValue;
  }
  if (e == cudaSuccess)
    e = resolve(h, &s);
  if (e == cudaSuccess && ev->recorded) { /* an event never recorded is complete: no wait */
    dep d = {ev->stream_id, ev->target};
    e = enqueue_locked(s, NULL, NULL, NULL, true, &d);
  }
  pthread_mutex_unlock(&g_mu);
  return standin_set_last(e);
}

/* ---- the device ---- */

cudaError_t cudaGetDeviceCount(int *count) {
  if (standin_inject("cudaGetDeviceCount", STANDIN_SITE))
    return standin_set_last(cudaErrorNoDevice);
  if (!count)
    return standin_set_last(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (standin_inject("cudaSetDevice", STANDIN_SITE))
    return standin_set_last(cudaErrorDevicesUnavailable);
  if (device != 0) {
    standin_error("cudaSetDevice(%d): the stand-in has one device, 0", device);
    return standin_set_last(cudaErrorInvalidDevice);
  }
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
  if (!device)
    return standin_set_last(cudaErrorInvalidValue);
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
  if (standin_inject("cudaGetDeviceProperties", STANDIN_SITE))
    return standin_set_last(cudaErrorDevicesUnavailable);
  if (!prop)
    return standin_set_last(cudaErrorInvalidValue);
  if (device != 0) {
    standin_error("cudaGetDeviceProperties(%d): the stand-in has one device, 0", device);
    return standin_set_last(cudaErrorInvalidDevice);
  }
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "%s", STANDIN_DEVICE_NAME);
  prop->totalGlobalMem = (size_t)16 << 30;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 1;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->sharedMemPerBlock = 48 << 10;
  prop->unifiedAddressing = 1;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v) {
  if (standin_inject("cudaDriverGetVersion", STANDIN_SITE))
    return standin_set_last(cudaErrorInsufficientDriver);
  if (!v)
    return standin_set_last(cudaErrorInvalidValue);
  *v = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v) {
  if (!v)
    return standin_set_last(cudaErrorInvalidValue);
  *v = CUDART_VERSION;
  return cudaSuccess;
}

/* ---- errors ---- */

cudaError_t cudaGetLastError(void) {
  cudaError_t e = t_last;
  t_last = cudaSuccess;
  if (e == cudaSuccess) {
    pthread_mutex_lock(&g_mu);
    e = g_sticky;
    pthread_mutex_unlock(&g_mu);
  }
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  cudaError_t e = t_last;
  if (e == cudaSuccess) {
    pthread_mutex_lock(&g_mu);
    e = g_sticky;
    pthread_mutex_unlock(&g_mu);
  }
  return e;
}

static const struct {
  cudaError_t e;
  const char *name, *text;
} k_errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidPitchValue, "cudaErrorInvalidPitchValue", "invalid pitch argument"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorAssert, "cudaErrorAssert", "device-side assert triggered"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const char *cudaGetErrorName(cudaError_t error) {
  for (size_t i = 0; i < sizeof k_errors / sizeof k_errors[0]; i++)
    if (k_errors[i].e == error)
      return k_errors[i].name;
  return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t error) {
  for (size_t i = 0; i < sizeof k_errors / sizeof k_errors[0]; i++)
    if (k_errors[i].e == error)
      return k_errors[i].text;
  return "unrecognized error code";
}
