/* group_comm_nccl.c — NCCL collectives for one stage group
 * (zb_group_comm.h has the contract; docs/model.md, Collectives (nccl)).
 *
 *   connect         ncclCommInitRankConfig with config.blocking = 0, polled
 *                   with ncclCommGetAsyncError (timeout, stop flag); then a
 *                   watchdog (transport_nccl_watch.h) owns the communicator.
 *   all_reduce      ncclAllReduce(buf, buf, n, ncclFloat, ncclSum).
 *   reduce_scatter  ncclReduceScatter in place, on buf when d divides n,
 *                   else on the padded staging buffer (shard j at j * c,
 *                   c = ceil(n/d)) with copies in and out.
 *   all_gather      ncclAllGather in place, likewise.
 * Each is enqueued on the comm stream between two events (compute ->
 * comm before, comm -> compute after, at once or at join for a started
 * all-reduce); wait polls the second on the host.
 *
 * NCCL/CUDA calls: ncclGetUniqueId, ncclCommInitRankConfig,
 * ncclCommGetAsyncError, ncclCommAbort (the watch's), ncclAllReduce,
 * ncclReduceScatter, ncclAllGather, ncclGetErrorString, ncclGetLastError;
 * cudaGetDevice, cudaSetDevice, cudaStreamCreateWithFlags,
 * cudaStreamDestroy, cudaEventCreateWithFlags, cudaEventDestroy,
 * cudaEventRecord, cudaStreamWaitEvent, cudaEventQuery, cudaMalloc,
 * cudaFree, cudaMemcpyAsync, cudaMemcpy2DAsync, cudaPeekAtLastError,
 * cudaGetLastError, cudaGetErrorString.
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "transport_nccl_watch.h"
#include "zb_alloc.h"
#include "zb_clock.h"
#include "zb_collective.h"
#include "zb_group_comm.h"

#define GC_POLL_NS 1000000L /* at most 1 ms between polls */

struct zb_group_comm {
  int32_t stage;
  int size, index;
  int device; /* the CUDA device current at creation */
  ncclUniqueId id;
  cudaStream_t compute, comm_stream;
  cudaEvent_t ready, done; /* compute -> comm, comm -> compute */
  const atomic_bool *stop;
  double timeout_s;
  ncclComm_t comm;      /* until the watch owns it */
  zb_nccl_watch *watch; /* owns comm once connected */
  float *staging;       /* the padded layout (odd n); device memory */
  size_t staging_cap;   /* floats */
  bool in_flight;       /* collectives enqueued since the last wait */
  char what[160];       /* the last one, for the watchdog and errors */
  char name[128];
  zb_err failed;
  char failure[512]; /* longer than a zb_diag: the name and the reason, cut where diag is */
};

const char *zb_group_comm_name(const zb_group_comm *g) {
  return g->name;
}

/* Records the first failure (prefixed by the group's name), aborts the
 * communicator so the other members' watchdogs see it, and sets diag. */
static zb_err gc_fail(zb_group_comm *g, zb_err err, zb_diag *diag, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static zb_err gc_fail(zb_group_comm *g, zb_err err, zb_diag *diag, const char *fmt, ...) {
  char msg[sizeof g->failure - sizeof g->name - 8];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(g->failure, sizeof g->failure, "nccl %s: %s", g->name, msg);
  g->failed = err;
  if (g->watch)
    zb_nccl_watch_abort(g->watch, g->failure);
  else if (g->comm)
    ncclCommAbort(g->comm);
  g->comm = NULL;
  g->in_flight = false;
  return zb_diag_set(diag, err, "%s", g->failure);
}

static zb_err gc_failed_before(const zb_group_comm *g, zb_diag *diag) {
  return zb_diag_set(diag, g->failed, "failed before: %s", g->failure);
}

static void gc_sleep_poll(long *wait_ns) {
  *wait_ns = *wait_ns ? *wait_ns * 2 : 5000L;
  if (*wait_ns > GC_POLL_NS)
    *wait_ns = GC_POLL_NS;
  struct timespec ts = {0, *wait_ns};
  nanosleep(&ts, NULL);
}

/* The communicator under the watch's lock (or before the watch): pair
 * with gc_put. NULL once aborted. */
static ncclComm_t gc_get(zb_group_comm *g) {
  return g->watch ? zb_nccl_watch_get(g->watch) : g->comm;
}

static void gc_put(zb_group_comm *g) {
  if (g->watch)
    zb_nccl_watch_put(g->watch);
}

/* ncclCommGetAsyncError's answer, or the query's own failure. */
static ncclResult_t gc_async(zb_group_comm *g) {
  ncclComm_t c = gc_get(g);
  ncclResult_t async = ncclSuccess, r = c ? ncclCommGetAsyncError(c, &async) : ncclInvalidUsage;
  gc_put(g);
  return r != ncclSuccess ? r : async;
}

/* NCCL's last message about the communicator, or the watchdog's reason
 * once it aborted it; into buf. */
static const char *gc_why(zb_group_comm *g, char *buf, size_t len) {
  ncclComm_t c = gc_get(g);
  const char *s = c ? ncclGetLastError(c) : NULL;
  snprintf(buf, len, "%s", s ? s : "");
  gc_put(g);
  if (!c)
    zb_nccl_watch_aborted(g->watch, buf, len);
  return buf;
}

static bool gc_stopped(const zb_group_comm *g) {
  return g->stop && atomic_load(g->stop);
}

/* Waits until the communicator leaves ncclInProgress (init, or a
 * non-blocking call still enqueueing), bounded by the timeout and stop. */
static zb_err gc_wait_ready(zb_group_comm *g, const char *what, zb_diag *diag) {
  int64_t start = zb_clock_ns();
  long wait_ns = 0;
  char why[256];
  for (;;) {
    ncclResult_t async = gc_async(g);
    if (async == ncclSuccess)
      return ZB_OK;
    if (gc_stopped(g))
      return gc_fail(g, ZB_ERR_IO, diag, "stopped (stop flag raised) during %s", what);
    if (async != ncclInProgress)
      return gc_fail(g, ZB_ERR_IO, diag, "%s failed: %s: %s", what, ncclGetErrorString(async),
                     gc_why(g, why, sizeof why));
    if (g->timeout_s > 0 && (double)(zb_clock_ns() - start) * 1e-9 > g->timeout_s)
      return gc_fail(g, ZB_ERR_IO, diag, "%s timed out after %.1f s", what, g->timeout_s);
    gc_sleep_poll(&wait_ns);
  }
}

static zb_err gc_enter(zb_group_comm *g, zb_diag *diag) {
  cudaError_t ce = cudaSetDevice(g->device);
  if (ce != cudaSuccess)
    return gc_fail(g, ZB_ERR_IO, diag, "cudaSetDevice(%d): %s", g->device, cudaGetErrorString(ce));
  return ZB_OK;
}

zb_err zb_group_comm_connect(zb_group_comm *g, zb_diag *diag) {
  if (g->failed)
    return gc_failed_before(g, diag);
  if (g->watch)
    return ZB_OK;
  zb_err err = gc_enter(g, diag);
  if (err)
    return err;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&comm, g->size, g->id, g->index, &cfg);
  g->comm = comm;
  if (r != ncclSuccess && r != ncclInProgress) {
    const char *last = ncclGetLastError(comm);
    return gc_fail(g, ZB_ERR_IO, diag, "ncclCommInitRankConfig: %s: %s", ncclGetErrorString(r),
                   last ? last : "");
  }
  err = gc_wait_ready(g, "init (ncclCommInitRankConfig)", diag);
  if (err)
    return err;
  zb_diag wd = {{0}};
  g->watch = zb_nccl_watch_start(g->comm, g->index, g->stop, g->timeout_s, &wd);
  if (!g->watch)
    return gc_fail(g, ZB_ERR_IO, diag, "%s", wd.msg);
  g->comm = NULL; /* the watch's now */
  return ZB_OK;
}

/* ---- one collective ---- */

typedef enum { GC_ALL_REDUCE, GC_REDUCE_SCATTER, GC_ALL_GATHER } gc_kind;

static const char *const gc_call[] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather"};
static const char *const gc_label[] = {"all-reduce", "reduce-scatter", "all-gather"};

/* Checks a call before anything is enqueued; a bad argument poisons the
 * group (and aborts the communicator, so the other members do not wait). */
static zb_err gc_check(zb_group_comm *g, gc_kind k, const float *buf, size_t n, zb_diag *diag) {
  if (g->failed)
    return gc_failed_before(g, diag);
  if (n > 0 && !buf)
    return gc_fail(g, ZB_ERR_INVALID_ARG, diag, "%s of %zu floats: no buffer", gc_label[k], n);
  if (!g->watch)
    return gc_fail(g, ZB_ERR_INVALID_ARG, diag, "%s of %zu floats: not connected (call connect first)",
                   gc_label[k], n);
  return ZB_OK;
}

/* A cudaError_t from step `call` of the collective, as the group's failure. */
static zb_err gc_cuda(zb_group_comm *g, cudaError_t ce, const char *call, zb_diag *diag) {
  return gc_fail(g, ZB_ERR_IO, diag, "%s: %s: %s", g->what, call, cudaGetErrorString(ce));
}

/* Grows the staging buffer to floats (waiting first for the collectives
 * that may still use the old one). */
static zb_err gc_staging(zb_group_comm *g, size_t floats, zb_diag *diag) {
  if (g->staging_cap >= floats)
    return ZB_OK;
  zb_err err = zb_group_comm_wait(g, diag);
  if (err)
    return err;
  cudaError_t ce = g->staging ? cudaFree(g->staging) : cudaSuccess;
  g->staging = NULL;
  g->staging_cap = 0;
  if (ce != cudaSuccess)
    return gc_cuda(g, ce, "cudaFree (the old staging buffer)", diag);
  if ((ce = cudaMalloc((void **)&g->staging, floats * sizeof(float))) != cudaSuccess)
    return gc_cuda(g, ce, "cudaMalloc (the staging buffer)", diag);
  g->staging_cap = floats;
  return ZB_OK;
}

/* Copies every shard between buf (the ring's layout) and the staging
 * buffer (shard j at j * c) on the comm stream; in: buf -> staging. The
 * first r = n % d shards (c floats each) sit at the same offsets in both. */
static zb_err gc_copy_all(zb_group_comm *g, float *buf, size_t n, bool in, zb_diag *diag) {
  size_t d = (size_t)g->size, q = n / d, r = n % d, c = q + 1;
  float *dst = in ? g->staging : buf;
  const float *src = in ? buf : g->staging;
  cudaError_t ce = cudaMemcpyAsync(dst, src, r * c * sizeof(float), cudaMemcpyDeviceToDevice, g->comm_stream);
  if (ce != cudaSuccess)
    return gc_cuda(g, ce, "cudaMemcpyAsync", diag);
  if (q == 0)
    return ZB_OK; /* the other shards are empty */
  size_t wide = c * sizeof(float), narrow = q * sizeof(float);
  ce = cudaMemcpy2DAsync(dst + r * c, in ? wide : narrow, src + r * c, in ? narrow : wide, narrow, d - r,
                         cudaMemcpyDeviceToDevice, g->comm_stream);
  return ce == cudaSuccess ? ZB_OK : gc_cuda(g, ce, "cudaMemcpy2DAsync", diag);
}

/* Copies this member's shard between buf and the staging buffer. */
static zb_err gc_copy_own(zb_group_comm *g, float *buf, size_t n, bool in, zb_diag *diag) {
  size_t off, len, c = n / (size_t)g->size + 1;
  zb_ring_shard(n, g->size, g->index, &off, &len);
  float *at = g->staging + (size_t)g->index * c;
  cudaError_t ce = cudaMemcpyAsync(in ? at : buf + off, in ? buf + off : at, len * sizeof(float),
                                   cudaMemcpyDeviceToDevice, g->comm_stream);
  return ce == cudaSuccess ? ZB_OK : gc_cuda(g, ce, "cudaMemcpyAsync", diag);
}

/* The NCCL call itself, in place on base (buf, or the staging buffer) of
 * d * per floats. */
static ncclResult_t gc_nccl(zb_group_comm *g, gc_kind k, float *base, size_t n, size_t per, ncclComm_t c) {
  float *own = base + (size_t)g->index * per;
  switch (k) {
  case GC_ALL_REDUCE: return ncclAllReduce(base, base, n, ncclFloat, ncclSum, c, g->comm_stream);
  case GC_REDUCE_SCATTER: return ncclReduceScatter(base, own, per, ncclFloat, ncclSum, c, g->comm_stream);
  default: return ncclAllGather(own, base, per, ncclFloat, c, g->comm_stream);
  }
}

/* Enqueues the NCCL call; a non-blocking communicator may still be
 * enqueueing when it returns ncclInProgress. */
static zb_err gc_enqueue(zb_group_comm *g, gc_kind k, float *base, size_t n, size_t per, zb_diag *diag) {
  ncclComm_t c = gc_get(g);
  ncclResult_t r = c ? gc_nccl(g, k, base, n, per, c) : ncclInvalidUsage;
  gc_put(g);
  char why[256];
  if (r != ncclSuccess && r != ncclInProgress)
    return gc_fail(g, ZB_ERR_IO, diag, "%s: %s: %s: %s", g->what, gc_call[k], ncclGetErrorString(r),
                   gc_why(g, why, sizeof why));
  return r == ncclInProgress ? gc_wait_ready(g, gc_call[k], diag) : ZB_OK;
}

/* The staged path's body (the staging buffer already large enough):
 * copies in, the call on the staging buffer, copies out. */
static zb_err gc_staged(zb_group_comm *g, gc_kind k, float *buf, size_t n, zb_diag *diag) {
  size_t c = n / (size_t)g->size + 1;
  zb_err err =
      k == GC_REDUCE_SCATTER ? gc_copy_all(g, buf, n, true, diag) : gc_copy_own(g, buf, n, true, diag);
  if (!err)
    err = gc_enqueue(g, k, g->staging, n, c, diag);
  if (!err)
    err = k == GC_REDUCE_SCATTER ? gc_copy_own(g, buf, n, false, diag) : gc_copy_all(g, buf, n, false, diag);
  return err;
}

/* Enqueues collective k after the compute stream's work so far; with join
 * the compute stream then waits for it, else zb_group_comm_join does. */
static zb_err gc_run(zb_group_comm *g, gc_kind k, float *buf, size_t n, bool join, zb_diag *diag) {
  zb_err err = gc_check(g, k, buf, n, diag);
  if (err || g->size == 1 || n == 0)
    return err;
  bool even = k == GC_ALL_REDUCE || n % (size_t)g->size == 0;
  if ((err = gc_enter(g, diag)) ||
      (!even && (err = gc_staging(g, (n / (size_t)g->size + 1) * (size_t)g->size, diag))))
    return err;
  snprintf(g->what, sizeof g->what, "%s of %zu floats", gc_label[k], n);
  const char *call = "cudaEventRecord";
  cudaError_t ce = cudaEventRecord(g->ready, g->compute); /* after the producer (the last W) */
  if (ce == cudaSuccess) {
    call = "cudaStreamWaitEvent";
    ce = cudaStreamWaitEvent(g->comm_stream, g->ready, 0);
  }
  if (ce != cudaSuccess)
    return gc_cuda(g, ce, call, diag);
  err = even ? gc_enqueue(g, k, buf, n, n / (size_t)g->size, diag) : gc_staged(g, k, buf, n, diag);
  if (err)
    return err;
  if ((ce = cudaEventRecord(g->done, g->comm_stream)) != cudaSuccess)
    return gc_cuda(g, ce, "cudaEventRecord", diag);
  g->in_flight = true;
  return join ? zb_group_comm_join(g, diag) : ZB_OK;
}

zb_err zb_group_comm_join(zb_group_comm *g, zb_diag *diag) {
  if (g->failed)
    return gc_failed_before(g, diag);
  if (!g->in_flight)
    return ZB_OK;
  zb_err err = gc_enter(g, diag);
  if (err)
    return err;
  /* done was last recorded after the newest collective: one comm stream,
   * so waiting for it waits for every one (before the consumer) */
  cudaError_t ce = cudaStreamWaitEvent(g->compute, g->done, 0);
  return ce == cudaSuccess ? ZB_OK : gc_cuda(g, ce, "cudaStreamWaitEvent", diag);
}

zb_err zb_group_comm_all_reduce_start(zb_group_comm *g, float *buf, size_t n, zb_diag *diag) {
  return gc_run(g, GC_ALL_REDUCE, buf, n, false, diag);
}

zb_err zb_group_comm_all_reduce(zb_group_comm *g, float *buf, size_t n, zb_diag *diag) {
  return gc_run(g, GC_ALL_REDUCE, buf, n, true, diag);
}

zb_err zb_group_comm_reduce_scatter(zb_group_comm *g, float *buf, size_t n, zb_diag *diag) {
  return gc_run(g, GC_REDUCE_SCATTER, buf, n, true, diag);
}

zb_err zb_group_comm_all_gather(zb_group_comm *g, float *buf, size_t n, zb_diag *diag) {
  return gc_run(g, GC_ALL_GATHER, buf, n, true, diag);
}

/* One look at the collectives in flight: ZB_OK and *done, or the failure. */
static zb_err gc_poll(zb_group_comm *g, bool *done, zb_diag *diag) {
  char why[256];
  if (zb_nccl_watch_aborted(g->watch, why, sizeof why)) /* an NCCL error, the stop flag or the timeout */
    return gc_fail(g, ZB_ERR_IO, diag, "%s", why);
  ncclResult_t async = gc_async(g);
  if (async != ncclSuccess && async != ncclInProgress)
    return gc_fail(g, ZB_ERR_IO, diag, "%s failed: %s: %s", g->what, ncclGetErrorString(async),
                   gc_why(g, why, sizeof why));
  cudaError_t q = cudaEventQuery(g->done);
  /* "not ready" must not stay behind as the thread's last error, where
   * the next kernel launch would read it as its own */
  if (q == cudaErrorNotReady && cudaPeekAtLastError() == cudaErrorNotReady)
    (void)cudaGetLastError();
  if (q != cudaSuccess && q != cudaErrorNotReady)
    return gc_cuda(g, q, "cudaEventQuery", diag);
  *done = q == cudaSuccess && async == ncclSuccess;
  return ZB_OK;
}

zb_err zb_group_comm_wait(zb_group_comm *g, zb_diag *diag) {
  if (g->failed)
    return gc_failed_before(g, diag);
  if (!g->in_flight)
    return ZB_OK;
  zb_err err = gc_enter(g, diag);
  if (err)
    return err;
  zb_nccl_watch_busy(g->watch, g->what); /* the transfer deadline starts */
  bool done = false;
  long wait_ns = 0;
  while (!(err = gc_poll(g, &done, diag)) && !done)
    gc_sleep_poll(&wait_ns);
  zb_nccl_watch_idle(g->watch);
  if (!err)
    g->in_flight = false; /* one comm stream: the last one's end is every one's */
  return err;
}

void zb_group_comm_abort(zb_group_comm *g, const char *why) {
  if (!g->failed)
    gc_fail(g, ZB_ERR_IO, NULL, "aborted: %s", why ? why : "no reason given");
}

/* ---- life cycle ---- */

zb_err zb_group_comm_unique_id(uint8_t out[128], zb_diag *diag) {
  _Static_assert(sizeof(ncclUniqueId) == 128, "ncclUniqueId is 128 bytes");
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) {
    const char *last = ncclGetLastError(NULL);
    return zb_diag_set(diag, ZB_ERR_IO, "stage group id: ncclGetUniqueId: %s: %s", ncclGetErrorString(r),
                       last ? last : "");
  }
  memcpy(out, &id, sizeof id);
  return ZB_OK;
}

/* "stage 1's group (member 0 of 2, ranks 1 3)" into g->name. */
static void gc_name(zb_group_comm *g, const int *ranks) {
  int used = snprintf(g->name, sizeof g->name, "stage %d's group (member %d of %d", (int)g->stage, g->index,
                      g->size);
  for (int i = 0; ranks && i < g->size && used > 0 && (size_t)used < sizeof g->name; i++)
    used += snprintf(g->name + used, sizeof g->name - (size_t)used, "%s%d", i ? " " : ", ranks ", ranks[i]);
  if (used > 0 && (size_t)used < sizeof g->name)
    snprintf(g->name + used, sizeof g->name - (size_t)used, ")");
}

zb_err zb_group_comm_new(const zb_group_comm_config *cfg, zb_group_comm **out, zb_diag *diag) {
  if (cfg->size < 1 || cfg->index < 0 || cfg->index >= cfg->size)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "stage %d's group: member %d is not in 0..%d (of %d)",
                       (int)cfg->stage, cfg->index, cfg->size - 1, cfg->size);
  zb_group_comm *g = zb_calloc(1, sizeof *g);
  g->stage = cfg->stage;
  g->size = cfg->size;
  g->index = cfg->index;
  memcpy(&g->id, cfg->unique_id, sizeof g->id);
  g->compute = (cudaStream_t)cfg->compute_stream;
  g->stop = cfg->stop;
  g->timeout_s = cfg->timeout_s;
  gc_name(g, cfg->ranks);
  const char *step = "cudaGetDevice";
  cudaError_t ce = cudaGetDevice(&g->device);
  if (ce == cudaSuccess) {
    step = "cudaStreamCreateWithFlags";
    ce = cudaStreamCreateWithFlags(&g->comm_stream, cudaStreamNonBlocking);
  }
  if (ce == cudaSuccess) {
    step = "cudaEventCreateWithFlags";
    ce = cudaEventCreateWithFlags(&g->ready, cudaEventDisableTiming);
  }
  if (ce == cudaSuccess)
    ce = cudaEventCreateWithFlags(&g->done, cudaEventDisableTiming);
  if (ce != cudaSuccess) {
    zb_diag_set(diag, ZB_ERR_IO, "nccl %s: %s: %s", g->name, step, cudaGetErrorString(ce));
    zb_group_comm_free(g);
    return ZB_ERR_IO;
  }
  *out = g;
  return ZB_OK;
}

void zb_group_comm_free(zb_group_comm *g) {
  if (!g)
    return;
  cudaSetDevice(g->device);
  if (g->watch && g->in_flight)
    zb_nccl_watch_abort(g->watch, "freed with a collective in flight"); /* destroy would block */
  if (g->watch)
    zb_nccl_watch_free(g->watch); /* destroys the communicator unless aborted */
  else if (g->comm)
    ncclCommAbort(g->comm); /* an init that never finished */
  if (g->staging)
    cudaFree(g->staging);
  if (g->ready)
    cudaEventDestroy(g->ready);
  if (g->done)
    cudaEventDestroy(g->done);
  if (g->comm_stream)
    cudaStreamDestroy(g->comm_stream);
  free(g);
}
