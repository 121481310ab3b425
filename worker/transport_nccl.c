/* transport_nccl.c — the nccl transport (zb_transport.h; docs/model.md,
 * Transports): every zb_transport call maps onto NCCL 2.28 point-to-point
 * on a comm stream of the transport's own.
 *
 *   connect    non-blocking ncclCommInitRankConfig (config.blocking = 0),
 *              polled with ncclCommGetAsyncError until ncclSuccess, bounded
 *              by the timeout and the stop flag. NCCL connects peers lazily,
 *              so addresses and peers are ignored; a second call is a no-op.
 *   send/recv  one ncclSend/ncclRecv of len bytes: ncclFloat with len / 4
 *              elements when len % 4 == 0 (every activation and gradient),
 *              else ncclUint8 with len elements. Both ends derive the same
 *              (count, datatype) from the same len, as NCCL requires.
 *   group      ncclGroupStart ... ncclGroupEnd around the recorded ops;
 *              outside a group each call is a group of its own.
 *
 * Ordering with the compute stream (docs/model.md, Transports; docs/
 * schedules.md, Execution model): group_end orders the group after all
 * compute work so far (an event), makes the compute stream wait for it and
 * polls its completion event on the host (5 us doubling to 1 ms, with
 * ncclCommGetAsyncError, the stop flag and the timeout). group_post orders
 * it after a mark (its sends' producers) or nothing, records its end in a
 * ring of `window` events and returns: order_device makes the compute
 * stream wait on one, drain and a full window poll them as group_end does.
 * One comm stream carries every group, so they complete in posting order
 * and two ranks' calls to each other meet in list order (separate send
 * and receive streams would split a batch group, which must progress as
 * one). NCCL has no progress figure: the timeout counts from each wait.
 * The posted groups live in transport_nccl_post.c; what both files share
 * is in transport_nccl_internal.h.
 *
 * Tags cannot travel in NCCL: the tag check of zb_transport.h is the tcp
 * transport's only; here peer and length are checked locally, and tags
 * name the ops in errors.
 *
 * Failure: any error ncclCommAborts the communicator (peers blocked on this
 * rank then fail too) and poisons the transport: every later call returns
 * the first error. abort(why) does the same on purpose.
 *
 * Threads: one thread uses a transport at a time (zb_transport.h); the stop
 * flag may be raised from any. Every entry first makes the CUDA device that
 * was current at creation current again, since NCCL binds a communicator to
 * the device current at init and the calling thread may change. Buffers
 * must stay valid until their group has completed.
 *
 * NCCL/CUDA calls: ncclGetUniqueId, ncclCommInitRankConfig,
 * ncclCommGetAsyncError, ncclCommAbort, ncclCommDestroy, ncclGroupStart,
 * ncclGroupEnd, ncclSend, ncclRecv, ncclGetErrorString, ncclGetLastError;
 * cudaStreamCreateWithFlags, cudaStreamDestroy, cudaEventCreateWithFlags,
 * cudaEventDestroy, cudaEventRecord, cudaStreamWaitEvent, cudaEventQuery,
 * cudaStreamSynchronize, cudaGetDevice, cudaSetDevice, cudaPeekAtLastError,
 * cudaGetLastError, cudaGetErrorString.
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "transport_nccl_internal.h"
#include "transport_nccl_watch.h"
#include "zb_alloc.h"
#include "zb_clock.h"
#include "zb_transport.h"

static bool nccl_stopped(const nccl_transport *t) {
  return t->stop && atomic_load(t->stop);
}

/* Waits before the next poll: 5 us, doubling to NCCL_POLL_NS, so a group
 * of small messages (tens of microseconds on a GPU) is not held to a 1 ms
 * floor, and a long one costs ~1000 polls a second. *wait_ns starts at 0. */
static void nccl_sleep_poll(long *wait_ns) {
  *wait_ns = *wait_ns ? *wait_ns * 2 : 5000L;
  if (*wait_ns > NCCL_POLL_NS)
    *wait_ns = NCCL_POLL_NS;
  struct timespec ts = {0, *wait_ns};
  nanosleep(&ts, NULL);
}

/* The communicator's asynchronous state (ncclInProgress, ncclSuccess or its
 * error), or the query's own failure. */
static ncclResult_t nccl_async(const nccl_transport *t) {
  ncclComm_t c = t->watch ? zb_nccl_watch_get(t->watch) : t->comm;
  ncclResult_t async = ncclSuccess, r = c ? ncclCommGetAsyncError(c, &async) : ncclInvalidUsage;
  if (t->watch)
    zb_nccl_watch_put(t->watch);
  return r != ncclSuccess ? r : async;
}

/* NCCL's own last message for comm (may be NULL) or "" . */
static const char *nccl_last(ncclComm_t comm) {
  const char *s = ncclGetLastError(comm);
  return s ? s : "";
}

/* NCCL's last message for the communicator, or the watchdog's reason once
 * it aborted it (the handle is gone then). */
static const char *nccl_why(nccl_transport *t) {
  if (!t->watch)
    return nccl_last(t->comm);
  ncclComm_t c = zb_nccl_watch_get(t->watch);
  snprintf(t->why, sizeof t->why, "%s", c ? nccl_last(c) : "");
  zb_nccl_watch_put(t->watch);
  if (!c)
    zb_nccl_watch_aborted(t->watch, t->why, sizeof t->why);
  return t->why;
}

zb_err zbn_fail(nccl_transport *t, zb_err err, zb_diag *diag, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->failure, sizeof t->failure, fmt, ap);
  va_end(ap);
  t->failed = err;
  if (t->watch)
    zb_nccl_watch_abort(t->watch, t->failure); /* it owns the communicator */
  else if (t->comm)
    ncclCommAbort(t->comm);
  t->comm = NULL;
  t->n_ops = 0;
  t->depth = 0;
  return zb_diag_set(diag, err, "%s", t->failure);
}

zb_err zbn_failed_before(const nccl_transport *t, zb_diag *diag) {
  return zb_diag_set(diag, t->failed, "transport failed before: %s", t->failure);
}

/* Makes the transport's device current on the calling thread. */
zb_err zbn_enter(nccl_transport *t, zb_diag *diag) {
  cudaError_t ce = cudaSetDevice(t->device);
  if (ce != cudaSuccess)
    return zbn_fail(t, ZB_ERR_IO, diag, "nccl: rank %d: cudaSetDevice(%d): %s", t->rank, t->device,
                    cudaGetErrorString(ce));
  return ZB_OK;
}

/* The smaller positive of two timeouts (<= 0: none). */
static double nccl_bound(double a, double b) {
  if (a <= 0)
    return b;
  return b <= 0 || a < b ? a : b;
}

/* Waits until the non-blocking communicator's pending work (init, or the
 * enqueueing of a group) is done: ncclCommGetAsyncError leaves
 * ncclInProgress. Fails on an error, the stop flag or timeout_s. */
static zb_err nccl_wait_ready(nccl_transport *t, const char *what, double timeout_s, zb_diag *diag) {
  int64_t start = zb_clock_ns();
  long wait_ns = 0;
  for (;;) {
    ncclResult_t async = nccl_async(t);
    if (async == ncclSuccess)
      return ZB_OK;
    if (nccl_stopped(t)) /* first: a stop is the reason, whatever NCCL says next */
      return zbn_fail(t, ZB_ERR_IO, diag, "stopped (stop flag raised) during nccl %s of rank %d", what,
                      t->rank);
    if (async != ncclInProgress)
      return zbn_fail(t, ZB_ERR_IO, diag, "nccl: rank %d: %s failed: %s: %s", t->rank, what,
                      ncclGetErrorString(async), nccl_why(t));
    if (timeout_s > 0 && (double)(zb_clock_ns() - start) * 1e-9 > timeout_s)
      return zbn_fail(t, ZB_ERR_IO, diag, "nccl: rank %d of %d: %s timed out after %.1f s", t->rank,
                      t->nranks, what, timeout_s);
    nccl_sleep_poll(&wait_ns);
  }
}

static zb_err nccl_connect(void *self, const char *const *addresses, const bool *peers, double timeout_s,
                           zb_diag *diag) {
  (void)addresses; /* NCCL finds its peers through the unique id */
  (void)peers;
  nccl_transport *t = self;
  if (t->failed)
    return zbn_failed_before(t, diag);
  if (t->comm)
    return ZB_OK; /* additive and idempotent: NCCL connects every peer lazily */
  zb_err err = zbn_enter(t, diag);
  if (err)
    return err;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&comm, t->nranks, t->id, t->rank, &cfg);
  t->comm = comm;
  if (r != ncclSuccess && r != ncclInProgress)
    return zbn_fail(t, ZB_ERR_IO, diag, "nccl: rank %d of %d: ncclCommInitRankConfig: %s: %s", t->rank,
                    t->nranks, ncclGetErrorString(r), nccl_last(comm));
  err = nccl_wait_ready(t, "init (ncclCommInitRankConfig)", nccl_bound(timeout_s, t->timeout_s), diag);
  if (!err && !(t->watch = zb_nccl_watch_start(t->comm, t->rank, t->stop, t->timeout_s, diag)))
    return zbn_fail(t, ZB_ERR_IO, diag, "%s", diag ? diag->msg : "nccl: the watchdog did not start");
  return err;
}

/* ---- groups ---- */

/* "to rank 2 (send F s1 mb3), from rank 0 (recv B s3 mb1)" for the
 * group's ops, as far as they fit. */
const char *zbn_describe(const nccl_transport *t, char *buf, size_t len) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < t->n_ops && used + 1 < len; i++) {
    const nccl_op *op = &t->ops[i];
    char tb[48];
    int n =
        snprintf(buf + used, len - used, "%s%s rank %d (%s %s)", i ? ", " : "", op->is_send ? "to" : "from",
                 op->peer, op->is_send ? "send" : "recv", zb_tag_format(op->tag, tb, sizeof tb));
    if (n < 0)
      break;
    used += (size_t)n;
  }
  return buf;
}

/* Host messages (the optimizer's reductions, docs/model.md, Optimizer and
 * step) go through a device bounce buffer, since NCCL moves device memory
 * only: sends are copied in on the comm stream before the group (sends
 * true); receives are copied out after the group has completed (false),
 * then waited for. Not before: into pageable memory cudaMemcpyAsync returns
 * only once the copy is done, so a copy queued behind a receive would block
 * this thread, out of reach of the timeout and the stop flag, for as long
 * as the peer does not send. */
static cudaError_t nccl_stage_host(nccl_transport *t, bool sends) {
  bool any = false;
  for (int i = 0; i < t->n_ops; i++) {
    const nccl_op *op = &t->ops[i];
    if (!op->host || op->is_send != sends)
      continue;
    cudaError_t ce =
        sends ? cudaMemcpyAsync(op->buf, op->host, op->len, cudaMemcpyHostToDevice, t->comm_stream)
              : cudaMemcpyAsync(op->host, op->buf, op->len, cudaMemcpyDeviceToHost, t->comm_stream);
    if (ce != cudaSuccess)
      return ce;
    any = true;
  }
  return any && !sends ? cudaStreamSynchronize(t->comm_stream) : cudaSuccess;
}

/* Points op at a device buffer: buf itself, or (host memory) op slot i's
 * bounce buffer, grown to len. */
static cudaError_t nccl_place(nccl_transport *t, int i, nccl_op *op, void *buf) {
  struct cudaPointerAttributes attr;
  memset(&attr, 0, sizeof attr);
  cudaError_t ce = cudaPointerGetAttributes(&attr, buf);
  if (ce != cudaSuccess)
    return ce;
  if (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) {
    op->buf = buf;
    return cudaSuccess;
  }
  nccl_bounce *b = &t->bounce[i];
  if (b->cap < op->len) {
    if (b->p && (ce = cudaFree(b->p)) != cudaSuccess)
      return ce;
    b->p = NULL;
    b->cap = 0;
    if ((ce = cudaMalloc(&b->p, op->len)) != cudaSuccess)
      return ce;
    b->cap = op->len;
  }
  op->host = buf;
  op->buf = b->p;
  return cudaSuccess;
}

/* Enqueues the recorded ops as one NCCL group on the comm stream, ordered
 * after event `after` of the compute stream (NULL: nothing), and records
 * ev after it; join: the compute stream waits on ev as well (group_end). */
zb_err zbn_launch(nccl_transport *t, cudaEvent_t after, cudaEvent_t ev, bool join, zb_diag *diag) {
  const char *call = "cudaStreamWaitEvent"; /* named in the error: which call failed */
  cudaError_t ce = after ? cudaStreamWaitEvent(t->comm_stream, after, 0) : cudaSuccess;
  if (ce != cudaSuccess)
    return zbn_fail(t, ZB_ERR_IO, diag, "nccl: rank %d: ordering after the compute stream: %s: %s", t->rank,
                    call, cudaGetErrorString(ce));
  if ((ce = nccl_stage_host(t, true)) != cudaSuccess)
    return zbn_fail(t, ZB_ERR_IO, diag, "nccl: rank %d: staging a host message: %s", t->rank,
                    cudaGetErrorString(ce));
  ncclComm_t comm = t->watch ? zb_nccl_watch_get(t->watch) : t->comm; /* not aborted meanwhile */
  ncclResult_t r = comm ? ncclGroupStart() : ncclInvalidUsage;
  int bad = -1;
  for (int i = 0; i < t->n_ops && r == ncclSuccess; i++) {
    const nccl_op *op = &t->ops[i];
    bool words = op->len % 4 == 0;
    size_t count = words ? op->len / 4 : op->len;
    ncclDataType_t dt = words ? ncclFloat : ncclUint8;
    r = op->is_send ? ncclSend(op->buf, count, dt, op->peer, comm, t->comm_stream)
                    : ncclRecv(op->buf, count, dt, op->peer, comm, t->comm_stream);
    if (r != ncclSuccess && r != ncclInProgress)
      bad = i;
    else
      r = ncclSuccess;
  }
  ncclResult_t re = comm ? ncclGroupEnd() : ncclInvalidUsage; /* always closes the group it opened */
  if (t->watch)
    zb_nccl_watch_put(t->watch);
  char tb[48];
  if (bad >= 0)
    return zbn_fail(t, ZB_ERR_IO, diag, "nccl: rank %d: %s %s %s rank %d: %s: %s", t->rank,
                    t->ops[bad].is_send ? "ncclSend" : "ncclRecv",
                    zb_tag_format(t->ops[bad].tag, tb, sizeof tb), t->ops[bad].is_send ? "to" : "from",
                    t->ops[bad].peer, ncclGetErrorString(r), nccl_why(t));
  if (r != ncclSuccess || (re != ncclSuccess && re != ncclInProgress))
    return zbn_fail(t, ZB_ERR_IO, diag, "nccl: rank %d: ncclGroup: %s: %s", t->rank,
                    ncclGetErrorString(r != ncclSuccess ? r : re), nccl_why(t));
  if (re == ncclInProgress) { /* a non-blocking comm may still be enqueueing */
    zb_err err = nccl_wait_ready(t, "ncclGroupEnd", t->timeout_s, diag);
    if (err)
      return err;
  }
  call = "cudaEventRecord";
  ce = cudaEventRecord(ev, t->comm_stream);
  if (ce == cudaSuccess && join) {
    call = "cudaStreamWaitEvent";
    ce = cudaStreamWaitEvent(t->compute, ev, 0);
  }
  if (ce != cudaSuccess)
    return zbn_fail(t, ZB_ERR_IO, diag, "nccl: rank %d: ordering the compute stream after the group: %s: %s",
                    t->rank, call, cudaGetErrorString(ce));
  return ZB_OK;
}

/* Polls a launched group until its completion event ev fires, failing on
 * an NCCL or CUDA error, or when the watchdog aborted the communicator (an
 * async error, the stop flag, or transfer_timeout_s counted from the start
 * of this wait), naming its peers (ops, as zbn_describe wrote them). */
zb_err zbn_wait_group(nccl_transport *t, cudaEvent_t ev, const char *ops, zb_diag *diag) {
  zb_err err = ZB_OK;
  long wait_ns = 0;
  zb_nccl_watch_busy(t->watch, ops); /* the transfer deadline starts */
  for (;;) {
    char why[256];
    if (zb_nccl_watch_aborted(t->watch, why, sizeof why)) { /* the error, stop flag or timeout */
      err = zbn_fail(t, ZB_ERR_IO, diag, "nccl: rank %d: %s", t->rank, why);
      break;
    }
    ncclResult_t async = nccl_async(t);
    if (async != ncclSuccess && async != ncclInProgress) {
      err = zbn_fail(t, ZB_ERR_IO, diag, "nccl: rank %d: group %s failed: %s: %s", t->rank, ops,
                     ncclGetErrorString(async), nccl_why(t));
      break;
    }
    cudaError_t q = cudaEventQuery(ev);
    if (q == cudaSuccess && async == ncclSuccess)
      break;
    /* "not ready" may stay behind as the thread's last error, which the
     * next kernel launch's cudaGetLastError (or cuBLAS) would report */
    if (q == cudaErrorNotReady && cudaPeekAtLastError() == cudaErrorNotReady)
      (void)cudaGetLastError();
    if (q != cudaSuccess && q != cudaErrorNotReady) {
      err = zbn_fail(t, ZB_ERR_IO, diag, "nccl: rank %d: group %s: comm stream failed: %s", t->rank, ops,
                     cudaGetErrorString(q));
      break;
    }
    nccl_sleep_poll(&wait_ns);
  }
  zb_nccl_watch_idle(t->watch);
  return err;
}

/* Counts the recorded ops into the stats and forgets them. */
void zbn_account(nccl_transport *t) {
  for (int i = 0; i < t->n_ops; i++) {
    const nccl_op *op = &t->ops[i];
    if (op->is_send) {
      t->stats.bytes_sent += (int64_t)op->len;
      t->stats.messages_sent++;
    } else {
      t->stats.bytes_received += (int64_t)op->len;
      t->stats.messages_received++;
    }
  }
  t->n_ops = 0;
}

/* Runs the recorded ops as one group, waits for it on the host (and the
 * compute stream), and accounts them. */
zb_err zbn_run(nccl_transport *t, zb_diag *diag) {
  if (t->n_ops == 0)
    return ZB_OK;
  char ops[160];
  zbn_describe(t, ops, sizeof ops);
  zb_err err = zbn_enter(t, diag);
  cudaError_t ce = err ? cudaSuccess : cudaEventRecord(t->ready, t->compute); /* after all so far */
  if (ce != cudaSuccess)
    return zbn_fail(t, ZB_ERR_IO, diag,
                    "nccl: rank %d: ordering after the compute stream: cudaEventRecord: %s", t->rank,
                    cudaGetErrorString(ce));
  if (!err)
    err = zbn_launch(t, t->ready, t->done, true, diag);
  if (!err)
    err = zbn_wait_group(t, t->done, ops, diag);
  if (err)
    return err;
  t->complete = t->posted; /* one comm stream: every earlier group is done too */
  ce = nccl_stage_host(t, false);
  if (ce != cudaSuccess)
    return zbn_fail(t, ZB_ERR_IO, diag, "nccl: rank %d: copying a received host message out: %s", t->rank,
                    cudaGetErrorString(ce));
  zbn_account(t);
  return ZB_OK;
}

static zb_err nccl_post(nccl_transport *t, bool is_send, int peer, zb_tag tag, void *buf, size_t len,
                        zb_diag *diag) {
  char tb[48];
  const char *what = is_send ? "send" : "recv";
  if (t->failed)
    return zbn_failed_before(t, diag);
  if (peer < 0 || peer >= t->nranks || peer == t->rank)
    return zbn_fail(t, ZB_ERR_INVALID_ARG, diag, "nccl %s %s: peer rank %d is not another rank of 0..%d",
                    what, zb_tag_format(tag, tb, sizeof tb), peer, t->nranks - 1);
  if (!t->comm)
    return zbn_fail(t, ZB_ERR_INVALID_ARG, diag,
                    "nccl %s %s to/from rank %d: not connected (call connect first)", what,
                    zb_tag_format(tag, tb, sizeof tb), peer);
  if (tag.kind != ZB_OP_F && tag.kind != ZB_OP_B)
    return zbn_fail(t, ZB_ERR_INVALID_ARG, diag, "tag kind must be F or B, not %s", zb_op_name(tag.kind));
  if (len == 0 || !buf)
    return zbn_fail(t, ZB_ERR_INVALID_ARG, diag, "nccl %s %s with rank %d: %s", what,
                    zb_tag_format(tag, tb, sizeof tb), peer, len == 0 ? "empty message" : "no buffer");
  if (t->n_ops == t->cap_ops) {
    int cap = t->cap_ops ? 2 * t->cap_ops : 8;
    t->ops = zb_realloc(t->ops, sizeof *t->ops * (size_t)cap);
    t->bounce = zb_realloc(t->bounce, sizeof *t->bounce * (size_t)cap);
    memset(t->bounce + t->cap_ops, 0, sizeof *t->bounce * (size_t)(cap - t->cap_ops));
    t->cap_ops = cap;
  }
  zb_err err = zbn_enter(t, diag);
  if (err)
    return err;
  nccl_op *op = &t->ops[t->n_ops];
  *op = (nccl_op){.is_send = is_send, .peer = peer, .tag = tag, .len = len};
  cudaError_t ce = nccl_place(t, t->n_ops, op, buf);
  if (ce != cudaSuccess)
    return zbn_fail(t, ZB_ERR_IO, diag, "nccl %s %s with rank %d: a device buffer for it: %s", what,
                    zb_tag_format(tag, tb, sizeof tb), peer, cudaGetErrorString(ce));
  t->n_ops++;
  return t->depth > 0 ? ZB_OK : zbn_run(t, diag);
}

static zb_err nccl_send(void *self, int peer, zb_tag tag, const void *buf, size_t len, zb_diag *diag) {
  return nccl_post(self, true, peer, tag, (void *)(uintptr_t)buf, len, diag);
}

static zb_err nccl_recv(void *self, int peer, zb_tag tag, void *buf, size_t len, zb_diag *diag) {
  return nccl_post(self, false, peer, tag, buf, len, diag);
}

static void nccl_group_start(void *self) {
  ((nccl_transport *)self)->depth++;
}

static zb_err nccl_group_end(void *self, zb_diag *diag) {
  nccl_transport *t = self;
  if (t->failed)
    return zbn_failed_before(t, diag);
  if (t->depth == 0)
    return zbn_fail(t, ZB_ERR_INVALID_ARG, diag, "group_end without group_start");
  if (--t->depth > 0)
    return ZB_OK;
  return zbn_run(t, diag);
}

/* ---- life cycle ---- */

static const char *nccl_address(void *self) {
  (void)self;
  return ""; /* NCCL finds peers through the unique id */
}

static void nccl_stats(void *self, zb_transport_stats *out) {
  *out = ((nccl_transport *)self)->stats;
}

static void nccl_abort(void *self, const char *why) {
  nccl_transport *t = self;
  if (!t->failed)
    zbn_fail(t, ZB_ERR_IO, NULL, "rank %d aborted: %s", t->rank, why ? why : "no reason given");
}

static void nccl_free(void *self) {
  nccl_transport *t = self;
  cudaSetDevice(t->device);
  if (t->watch)
    zb_nccl_watch_free(t->watch); /* destroys the communicator unless aborted */
  else if (t->comm)
    ncclCommDestroy(t->comm); /* every group completed: nothing is pending */
  if (t->ready)
    cudaEventDestroy(t->ready);
  if (t->done)
    cudaEventDestroy(t->done);
  for (int i = 0; i < NCCL_MARKS; i++)
    if (t->marks[i])
      cudaEventDestroy(t->marks[i]);
  for (int i = 0; t->ring && i < t->window; i++)
    if (t->ring[i])
      cudaEventDestroy(t->ring[i]);
  free(t->ring);
  free(t->ring_what);
  if (t->comm_stream)
    cudaStreamDestroy(t->comm_stream);
  for (int i = 0; i < t->cap_ops; i++)
    if (t->bounce[i].p)
      cudaFree(t->bounce[i].p);
  free(t->bounce);
  free(t->ops);
  free(t);
}

static const zb_transport_ops nccl_ops = {
    .name = "nccl",
    .address = nccl_address,
    .connect = nccl_connect,
    .group_start = nccl_group_start,
    .send = nccl_send,
    .recv = nccl_recv,
    .group_end = nccl_group_end,
    .stats = nccl_stats,
    .mark = zbn_mark,
    .group_post = zbn_group_post,
    .order_device = zbn_order_device,
    .drain = zbn_drain,
    .room = zbn_room,
    .abort = nccl_abort,
    .free = nccl_free,
};

zb_err zb_transport_nccl_new(const zb_nccl_config *cfg, zb_transport **out, zb_diag *diag) {
  if (cfg->nranks < 1 || cfg->rank < 0 || cfg->rank >= cfg->nranks)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "nccl transport: rank %d is not in 0..%d", cfg->rank,
                       cfg->nranks - 1);
  _Static_assert(sizeof(ncclUniqueId) == sizeof cfg->unique_id, "ncclUniqueId is 128 bytes");
  nccl_transport *t = zb_calloc(1, sizeof *t);
  t->rank = cfg->rank;
  t->nranks = cfg->nranks;
  memcpy(&t->id, cfg->unique_id, sizeof t->id);
  t->compute = (cudaStream_t)cfg->compute_stream;
  t->stop = cfg->stop;
  t->timeout_s = cfg->timeout_s;
  const char *step = "cudaGetDevice";
  cudaError_t ce = cudaGetDevice(&t->device);
  if (ce == cudaSuccess) {
    step = "cudaStreamCreateWithFlags";
    ce = cudaStreamCreateWithFlags(&t->comm_stream, cudaStreamNonBlocking);
  }
  if (ce == cudaSuccess) {
    step = "cudaEventCreateWithFlags";
    ce = cudaEventCreateWithFlags(&t->ready, cudaEventDisableTiming);
  }
  if (ce == cudaSuccess)
    ce = cudaEventCreateWithFlags(&t->done, cudaEventDisableTiming);
  t->window = cfg->window > 0 ? cfg->window : ZB_NCCL_WINDOW;
  t->ring = zb_calloc((size_t)t->window, sizeof *t->ring);
  t->ring_what = zb_calloc((size_t)t->window, sizeof *t->ring_what);
  for (int i = 0; i < t->window && ce == cudaSuccess; i++)
    ce = cudaEventCreateWithFlags(&t->ring[i], cudaEventDisableTiming);
  for (int i = 0; i < NCCL_MARKS && ce == cudaSuccess; i++)
    ce = cudaEventCreateWithFlags(&t->marks[i], cudaEventDisableTiming);
  if (ce != cudaSuccess) {
    zb_diag_set(diag, ZB_ERR_IO, "nccl transport: rank %d: %s: %s", cfg->rank, step, cudaGetErrorString(ce));
    nccl_free(t);
    return ZB_ERR_IO;
  }
  zb_transport *h = zb_calloc(1, sizeof *h);
  h->ops = &nccl_ops;
  h->self = t;
  *out = h;
  return ZB_OK;
}

zb_err zb_transport_nccl_unique_id(uint8_t out[128], zb_diag *diag) {
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess)
    return zb_diag_set(diag, ZB_ERR_IO, "ncclGetUniqueId: %s: %s", ncclGetErrorString(r), nccl_last(NULL));
  memcpy(out, &id, sizeof id);
  return ZB_OK;
}
