/* nccl_standin.c — the CPU stand-in of the NCCL subset the nccl transport
 * calls (test-only; docs/model.md, The CPU stand-in; nccl_standin.h has
 * the design): communicators, groups, ncclSend/ncclRecv, errors.
 *
 * NCCL's rules it keeps: ncclCommInitRank blocks, ncclCommInitRankConfig
 * with config.blocking = 0 returns ncclInProgress and joins in the
 * background (ncclCommGetAsyncError says when); send and receive are
 * enqueued on the given stream and run asynchronously; the calls of one
 * group on one communicator progress together (one stream item); calls to
 * one peer in one direction match in order; a receive whose peer sent
 * another count or datatype fails naming both; an op whose peer never posts
 * the match records an error after ZB_STANDIN_NCCL_TIMEOUT_MS (default
 * 10000) naming it (real NCCL says nothing); ncclCommAbort unblocks
 * everything within 100 ms. A failed op blocks its stream as NCCL's
 * kernels do: neither the error nor a peer's death or abort wakes it, only
 * this rank's own ncclCommAbort. Async errors: ncclRemoteError when a
 * peer's connection closed or failed (NCCL over sockets; with
 * ZB_STANDIN_NCCL_PEER_LOSS=hang nothing at all, as NCCL over shared
 * memory or NVLink), ncclSystemError for the timeout, ncclInvalidUsage for
 * a count/datatype mismatch; ncclGetLastError(comm) has the message.
 *
 * Not kept: send/recv to self, and the ops of one group on several streams
 * (the group runs on the first op's stream); both fail or are documented
 * here rather than emulated. Buffers must be the cudart stand-in's device
 * memory (standin_check_device).
 *
 * Threads: groups are thread-local as in NCCL; a communicator may be used
 * from any thread; its mutex guards its state.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_standin.h"
#include "standin_internal.h"

static pthread_mutex_t g_last_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_last[256];

ncclResult_t ncclsi_error(ncclComm_t comm, ncclResult_t res, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "nccl stand-in: %s\n", msg);
  pthread_mutex_lock(&g_last_mu);
  snprintf(g_last, sizeof g_last, "%s", msg);
  pthread_mutex_unlock(&g_last_mu);
  if (comm) {
    pthread_mutex_lock(&comm->mu);
    if (comm->async == ncclSuccess || comm->async == ncclInProgress) {
      comm->async = res;
      snprintf(comm->last, sizeof comm->last, "%s", msg);
    }
    pthread_mutex_unlock(&comm->mu);
  }
  return res;
}

double ncclsi_timeout_s(void) {
  const char *s = getenv("ZB_STANDIN_NCCL_TIMEOUT_MS");
  long ms = s && *s ? strtol(s, NULL, 10) : 10000;
  return (double)(ms > 0 ? ms : 10000) * 1e-3;
}

bool ncclsi_peer_loss_silent(void) {
  const char *s = getenv("ZB_STANDIN_NCCL_PEER_LOSS");
  return s && strcmp(s, "hang") == 0;
}

size_t ncclsi_dt_size(ncclDataType_t dt) {
  switch (dt) {
  case ncclInt8:
  case ncclUint8:
  case ncclFloat8e4m3:
  case ncclFloat8e5m2: return 1;
  case ncclFloat16:
  case ncclBfloat16: return 2;
  case ncclInt32:
  case ncclUint32:
  case ncclFloat32: return 4;
  case ncclInt64:
  case ncclUint64:
  case ncclFloat64: return 8;
  default: return 0;
  }
}

const char *ncclsi_dt_name(int dt) {
  static const char *names[] = {"ncclInt8",    "ncclUint8",    "ncclInt32",      "ncclUint32",
                                "ncclInt64",   "ncclUint64",   "ncclFloat16",    "ncclFloat32",
                                "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2"};
  return dt >= 0 && dt < ncclNumTypes ? names[dt] : "an unknown datatype";
}

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
  case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
  case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
  case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
  case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  default: return "unknown result code";
  }
}

const char *ncclGetLastError(ncclComm_t comm) {
  if (comm && comm->last[0])
    return comm->last; /* written once, under the mutex, before async turns to an error */
  pthread_mutex_lock(&g_last_mu);
  static _Thread_local char copy[256];
  memcpy(copy, g_last, sizeof copy);
  pthread_mutex_unlock(&g_last_mu);
  return copy;
}

ncclResult_t ncclGetVersion(int *version) {
  if (!version)
    return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

/* ---- communicators ---- */

void ncclsi_unref(ncclComm_t c) {
  pthread_mutex_lock(&c->mu);
  bool last = --c->refs == 0;
  pthread_mutex_unlock(&c->mu);
  if (!last)
    return;
  zb_transport_free(c->tp);
  zb_transport_free(c->ack);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c);
}

static ncclResult_t comm_init(ncclComm_t *out, int nranks, ncclUniqueId id, int rank, bool blocking) {
  if (!out)
    return ncclsi_error(NULL, ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return ncclsi_error(NULL, ncclInvalidArgument, "ncclCommInitRank: rank %d is not in 0..%d", rank,
                        nranks - 1);
  if (memcmp(id.internal + NCCLSI_TAIL, NCCLSI_MAGIC, 8) != 0)
    return ncclsi_error(NULL, ncclInvalidArgument,
                        "ncclCommInitRank: the id carries no stand-in rendezvous (not made by the "
                        "stand-in's ncclGetUniqueId?)");
  ncclComm_t c = calloc(1, sizeof *c);
  c->rank = rank;
  c->nranks = nranks;
  c->id = id;
  memcpy(&c->session, id.internal, 8);
  atomic_init(&c->aborted, false);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  c->refs = 1;
  c->async = ncclInProgress;
  c->init_running = true;
  c->init_joinable = true;
  if (pthread_create(&c->init_thread, NULL, ncclsi_join, c) != 0) {
    free(c);
    return ncclsi_error(NULL, ncclSystemError, "ncclCommInitRank: cannot start the init thread");
  }
  *out = c;
  if (!blocking)
    return ncclInProgress;
  pthread_join(c->init_thread, NULL);
  c->init_joinable = false;
  ncclResult_t r = c->async;
  if (r != ncclSuccess) {
    ncclsi_unref(c); /* NCCL frees a communicator whose blocking init failed */
    *out = NULL;
  }
  return r;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
  if (standin_inject("ncclCommInitRank", STANDIN_SITE))
    return ncclsi_error(NULL, ncclSystemError, "ncclCommInitRank: injected failure");
  return comm_init(comm, nranks, commId, rank, true);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config) {
  if (standin_inject("ncclCommInitRankConfig", STANDIN_SITE))
    return ncclsi_error(NULL, ncclSystemError, "ncclCommInitRankConfig: injected failure");
  if (config && config->magic != 0xcafebeef)
    return ncclsi_error(NULL, ncclInvalidArgument,
                        "ncclCommInitRankConfig: config not initialized with NCCL_CONFIG_INITIALIZER");
  bool blocking = !config || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
  return comm_init(comm, nranks, commId, rank, blocking);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  if (!comm || !asyncError)
    return ncclsi_error(NULL, ncclInvalidArgument, "ncclCommGetAsyncError: comm or asyncError is NULL");
  pthread_mutex_lock(&comm->mu);
  *asyncError = comm->async;
  pthread_mutex_unlock(&comm->mu);
  return ncclSuccess;
}

/* Waits for the init thread and a running group to leave, then closes the
 * transport (peers see the connections close) and drops the handle. */
static void comm_close(ncclComm_t c) {
  bool join = false;
  pthread_mutex_lock(&c->mu);
  while (c->running)
    pthread_cond_wait(&c->cv, &c->mu);
  join = c->init_joinable;
  c->init_joinable = false;
  pthread_mutex_unlock(&c->mu);
  if (join)
    pthread_join(c->init_thread, NULL);
  pthread_mutex_lock(&c->mu);
  zb_transport *tp = c->tp, *ack = c->ack;
  c->tp = c->ack = NULL;
  pthread_mutex_unlock(&c->mu);
  zb_transport_free(tp);
  zb_transport_free(ack);
  ncclsi_unref(c);
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm)
    return ncclSuccess;
  atomic_store(&comm->aborted, true); /* the transport and the rendezvous look at it every 100 ms */
  comm_close(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm)
    return ncclSuccess;
  comm_close(comm);
  return ncclSuccess;
}
