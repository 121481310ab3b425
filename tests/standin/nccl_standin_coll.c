/* nccl_standin_coll.c — the NCCL stand-in's collectives (test-only;
 * nccl_standin.h has the design; docs/model.md, The CPU stand-in):
 * ncclAllReduce, ncclReduceScatter, ncclAllGather.
 *
 * NCCL's rules it keeps: every rank of the communicator must call the
 * same collective with the same count, datatype and op, in the same
 * order; the call checks its arguments and enqueues the work on the given
 * stream, returning at once; the work completes only once every rank has
 * joined; every rank ends with the same bits; in-place calls
 * (ReduceScatter's recvbuff = sendbuff + rank * recvcount, AllGather's
 * sendbuff = recvbuff + rank * sendcount, AllReduce's sendbuff = recvbuff)
 * work; inside ncclGroupStart/End the call is deferred to the outermost
 * ncclGroupEnd; errors are sticky; a failed collective blocks its stream
 * until this rank's own ncclCommAbort, whatever the peers do.
 *
 * How: one stream item per call, on the communicator's transports. First
 * a join: a zero-byte message to and from every other rank on the credit
 * connections, tagged (REDUCE_GRAD, stage = kind << 16 | datatype << 8 |
 * op, mb = count's low 32 bits), so a rank whose call differs fails as
 * ncclInvalidUsage naming both calls before any data moves, and one that
 * never calls fails after ZB_STANDIN_NCCL_TIMEOUT_MS naming it
 * (ncclSystemError; real NCCL says nothing). Then the link delay
 * (ZB_STANDIN_NCCL_DELAY_US), then the data: every rank sends every other
 * rank what it needs (AllReduce: the whole buffer; ReduceScatter: the
 * peer's shard; AllGather: its own part) in one tcp group, and reduces in
 * rank order 0, 1, ..., n - 1 on every rank alike: the same bits
 * everywhere, and an order deliberately other than the ring's
 * (zb_collective.h), so a test comparing the two compares within rounding.
 * ncclAvg is the sum divided by the rank count.
 *
 * Not kept: reductions of types other than ncclFloat32 and ncclFloat64
 * (ncclInvalidArgument naming the type); the bandwidth of NCCL's
 * algorithms (every rank moves (n - 1) full parts); several streams
 * using one communicator at once; and inside a group, the order between a
 * communicator's point-to-point calls and its collectives (the
 * point-to-point ones run first).
 *
 * Threads: the deferred calls are thread-local (as NCCL's groups); items
 * run on stream threads; errors go to the communicator (ncclsi_error).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_standin.h"
#include "standin_internal.h"

typedef enum { COLL_ALL_REDUCE = 1, COLL_REDUCE_SCATTER = 2, COLL_ALL_GATHER = 3 } coll_kind;

static const char *const coll_call[] = {"a point-to-point call", "ncclAllReduce", "ncclReduceScatter",
                                        "ncclAllGather"};
static const char *const op_names[] = {"ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg"};

typedef struct coll_item {
  coll_kind kind;
  ncclComm_t comm; /* one reference held */
  cudaStream_t stream;
  const unsigned char *send; /* views */
  unsigned char *recv;
  size_t count; /* AllReduce: count; ReduceScatter: recvcount; AllGather: sendcount */
  ncclDataType_t dt;
  ncclRedOp_t op; /* AllGather: ncclSum, unused */
} coll_item;

static _Thread_local coll_item **g_pending; /* deferred by an open group */
static _Thread_local int g_npending, g_cap;

/* "ncclAllReduce of 10 x ncclFloat32 (ncclSum)" */
static const char *coll_name(int kind, int dt, int op, size_t count, char *buf, size_t len) {
  bool reduces = kind == COLL_ALL_REDUCE || kind == COLL_REDUCE_SCATTER;
  snprintf(buf, len, "%s of %zu x %s%s%s%s", kind >= 1 && kind <= 3 ? coll_call[kind] : "an unknown call",
           count, ncclsi_dt_name(dt), reduces ? " (" : "", reduces && op >= 0 && op < 5 ? op_names[op] : "",
           reduces ? ")" : "");
  return buf;
}

static zb_tag coll_tag(const coll_item *it) {
  return (zb_tag){.kind = ZB_OP_REDUCE_GRAD,
                  .stage = (int32_t)(it->kind << 16 | (int)it->dt << 8 | (int)it->op),
                  .mb = (int32_t)(uint32_t)it->count};
}

/* Turns the transport's failure into the communicator's async error. */
static void coll_failed(const void *arg, zb_err err, const char *msg) {
  const coll_item *it = arg;
  ncclComm_t c = it->comm;
  char mine[96], theirs[96];
  coll_name(it->kind, it->dt, it->op, it->count, mine, sizeof mine);
  const char *got = strstr(msg, "got message ");
  char kind = 0;
  int stage = 0, mb = 0, peer = -1;
  unsigned long long bytes = 0;
  if (err == ZB_ERR_INVALID_SCHEDULE && got &&
      sscanf(got, "got message %c s%d mb%d (%llu bytes) from peer rank %d", &kind, &stage, &mb, &bytes,
             &peer) == 5) {
    if (kind == 'R')
      coll_name(stage >> 16, stage >> 8 & 0xff, stage & 0xff, (size_t)(uint32_t)mb, theirs, sizeof theirs);
    else
      snprintf(theirs, sizeof theirs, "point-to-point call (ncclSend/ncclRecv)");
    ncclsi_error(c, ncclInvalidUsage, "rank %d: %s does not match peer %d's %s", c->rank, mine, peer, theirs);
    return;
  }
  const char *idle = strstr(msg, "no progress with peer rank ");
  if (idle && sscanf(idle, "no progress with peer rank %d", &peer) == 1) {
    ncclsi_error(c, ncclSystemError, "rank %d: %s: peer %d did not join within %.1f s", c->rank, mine, peer,
                 ncclsi_timeout_s());
    return;
  }
  if (!ncclsi_peer_loss_silent()) /* as the p2p calls: NCCL over sockets sees a lost peer */
    ncclsi_error(c, ncclRemoteError, "rank %d: %s: %s", c->rank, mine, msg);
}

/* The join: a zero-byte message to and from every other rank. */
static zb_err coll_join(zb_transport *ack, const void *arg, zb_diag *d) {
  const coll_item *it = arg;
  zb_tag tag = coll_tag(it);
  zb_err err = ZB_OK;
  zb_transport_group_start(ack);
  for (int p = 0; p < it->comm->nranks && !err; p++)
    if (p != it->comm->rank) {
      err = zb_transport_send(ack, p, tag, NULL, 0, d);
      if (!err)
        err = zb_transport_recv(ack, p, tag, NULL, 0, d);
    }
  zb_err end = zb_transport_group_end(ack, d);
  return err ? err : end;
}

#define REDUCE_AS(T)                                                                                         \
  do {                                                                                                       \
    for (size_t e = 0; e < it->count; e++) {                                                                 \
      T acc = ((const T *)got)[e];                                                                           \
      for (int r = 1; r < n; r++) {                                                                          \
        T x = ((const T *)(got + (size_t)r * slot))[e];                                                      \
        acc = it->op == ncclProd  ? acc * x                                                                  \
              : it->op == ncclMax ? (x > acc ? x : acc)                                                      \
              : it->op == ncclMin ? (x < acc ? x : acc)                                                      \
                                  : acc + x;                                                                 \
      }                                                                                                      \
      if (it->op == ncclAvg)                                                                                 \
        acc /= (T)n;                                                                                         \
      memcpy(it->recv + e * sizeof(T), &acc, sizeof(T));                                                     \
    }                                                                                                        \
  } while (0)

/* Reduces the n ranks' parts (slot bytes each, in rank order) into recv. */
static void coll_reduce(const coll_item *it, const unsigned char *got, size_t slot, int n) {
  if (it->dt == ncclFloat32)
    REDUCE_AS(float);
  else
    REDUCE_AS(double);
}

/* The data: every rank's part to every other rank in one tcp group, then
 * the reduction (or concatenation) in rank order. */
static zb_err coll_exchange(zb_transport *tp, const void *arg, zb_diag *d) {
  const coll_item *it = arg;
  int n = it->comm->nranks, me = it->comm->rank;
  size_t slot = it->count * ncclsi_dt_size(it->dt);
  bool scatter = it->kind == COLL_REDUCE_SCATTER;
  size_t in_bytes = scatter ? slot * (size_t)n : slot;
  unsigned char *mine = malloc(in_bytes + 1), *got = malloc(slot * (size_t)n + 1);
  memcpy(mine, it->send, in_bytes); /* first: the call may be in place */
  memcpy(got + (size_t)me * slot, scatter ? mine + (size_t)me * slot : mine, slot);
  zb_tag tag = coll_tag(it);
  zb_err err = ZB_OK;
  zb_transport_group_start(tp);
  for (int p = 0; p < n && !err; p++)
    if (p != me) {
      err = zb_transport_send(tp, p, tag, scatter ? mine + (size_t)p * slot : mine, slot, d);
      if (!err)
        err = zb_transport_recv(tp, p, tag, got + (size_t)p * slot, slot, d);
    }
  zb_err end = zb_transport_group_end(tp, d);
  err = err ? err : end;
  if (!err && it->kind == COLL_ALL_GATHER)
    memcpy(it->recv, got, slot * (size_t)n);
  else if (!err)
    coll_reduce(it, got, slot, n);
  free(mine);
  free(got);
  return err;
}

/* The stream item. */
static cudaError_t coll_run(void *arg) {
  static const ncclsi_item_fns fns = {.meet = coll_join, .move = coll_exchange, .failed = coll_failed};
  ncclsi_run_item(((coll_item *)arg)->comm, arg, &fns);
  return cudaSuccess; /* NCCL reports through ncclCommGetAsyncError, not the stream */
}

static void coll_release(void *arg) {
  coll_item *it = arg;
  ncclsi_unref(it->comm);
  free(it);
}

static ncclResult_t coll_enqueue(coll_item *it) {
  ncclComm_t c = it->comm;
  const char *fn = coll_call[it->kind];
  cudaError_t ce = standin_enqueue(it->stream, coll_run, it, coll_release);
  if (ce == cudaSuccess)
    return ncclSuccess;
  ncclResult_t res =
      ncclsi_error(c, ncclUnhandledCudaError, "%s: the stream does not exist (%d)", fn, (int)ce);
  coll_release(it);
  return res;
}

ncclResult_t ncclsi_coll_flush(bool run) {
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < g_npending; i++) {
    ncclResult_t r = run ? coll_enqueue(g_pending[i]) : ncclSuccess;
    if (!run)
      coll_release(g_pending[i]);
    if (res == ncclSuccess)
      res = r;
  }
  free(g_pending); /* thread-local: a thread that ends must not leave it behind */
  g_pending = NULL;
  g_npending = g_cap = 0;
  return res;
}

/* The buffers' byte counts for a call of `count` on n ranks, or false on
 * overflow. */
static bool coll_sizes(coll_kind k, size_t count, size_t sz, int n, size_t *send, size_t *recv) {
  if (count > SIZE_MAX / sz / (size_t)n)
    return false;
  size_t one = count * sz, all = one * (size_t)n;
  *send = k == COLL_REDUCE_SCATTER ? all : one;
  *recv = k == COLL_ALL_GATHER ? all : one;
  return true;
}

/* Checks the call's arguments (NCCL's checks), or returns the error. */
static ncclResult_t coll_check(coll_kind k, size_t sz, ncclDataType_t dt, ncclRedOp_t op, ncclComm_t comm) {
  const char *fn = coll_call[k];
  if (!comm)
    return ncclsi_error(NULL, ncclInvalidArgument, "%s: comm is NULL", fn);
  ncclResult_t async;
  ncclCommGetAsyncError(comm, &async);
  if (async == ncclInProgress)
    return ncclsi_error(NULL, ncclInvalidUsage, "%s: the communicator of rank %d is still initializing", fn,
                        comm->rank);
  if (async != ncclSuccess)
    return async; /* errors are sticky, as in NCCL */
  if (sz == 0)
    return ncclsi_error(NULL, ncclInvalidArgument, "%s: datatype %d is not an NCCL datatype", fn, (int)dt);
  if (k != COLL_ALL_GATHER && ((int)op < 0 || (int)op > (int)ncclAvg))
    return ncclsi_error(NULL, ncclInvalidArgument, "%s: op %d is not a built-in reduction", fn, (int)op);
  if (k != COLL_ALL_GATHER && dt != ncclFloat32 && dt != ncclFloat64)
    return ncclsi_error(NULL, ncclInvalidArgument,
                        "%s: the stand-in reduces ncclFloat32 and ncclFloat64 only, not %s", fn,
                        ncclsi_dt_name(dt));
  return ncclSuccess;
}

/* Checks, translates the buffers to views and enqueues (or, in a group,
 * defers) one collective. */
static ncclResult_t coll_post(coll_kind k, const void *send, void *recv, size_t count, ncclDataType_t dt,
                              ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  size_t sz = ncclsi_dt_size(dt), sbytes = 0, rbytes = 0;
  ncclResult_t r = coll_check(k, sz, dt, op, comm);
  if (r != ncclSuccess)
    return r;
  if (!coll_sizes(k, count, sz, comm->nranks, &sbytes, &rbytes))
    return ncclsi_error(NULL, ncclInvalidArgument, "%s: count %zu overflows", coll_call[k], count);
  char what[64];
  snprintf(what, sizeof what, "%s sendbuff", coll_call[k]);
  const void *sv = count > 0 ? standin_view(send, sbytes, what) : NULL;
  snprintf(what, sizeof what, "%s recvbuff", coll_call[k]);
  void *rv = count > 0 && sv ? standin_view(recv, rbytes, what) : NULL;
  if (count > 0 && !rv)
    return ncclsi_error(NULL, ncclInvalidArgument, "%s", standin_last_error());
  coll_item *it = malloc(sizeof *it);
  *it = (coll_item){k, comm, stream, sv, rv, count, dt, k == COLL_ALL_GATHER ? ncclSum : op};
  pthread_mutex_lock(&comm->mu);
  comm->refs++;
  pthread_mutex_unlock(&comm->mu);
  if (!ncclsi_grouping())
    return coll_enqueue(it);
  if (g_npending == g_cap) {
    g_cap = g_cap ? 2 * g_cap : 8;
    g_pending = realloc(g_pending, sizeof *g_pending * (size_t)g_cap);
  }
  g_pending[g_npending++] = it;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (standin_inject("ncclAllReduce", STANDIN_SITE))
    return ncclsi_error(NULL, ncclSystemError, "ncclAllReduce: injected failure");
  return coll_post(COLL_ALL_REDUCE, sendbuff, recvbuff, count, datatype, op, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  if (standin_inject("ncclReduceScatter", STANDIN_SITE))
    return ncclsi_error(NULL, ncclSystemError, "ncclReduceScatter: injected failure");
  return coll_post(COLL_REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  if (standin_inject("ncclAllGather", STANDIN_SITE))
    return ncclsi_error(NULL, ncclSystemError, "ncclAllGather: injected failure");
  return coll_post(COLL_ALL_GATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, comm, stream);
}
