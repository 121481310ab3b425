/* nccl_standin_p2p.c — the NCCL stand-in's groups and point-to-point
 * calls (test-only; nccl_standin.h has the design): ncclGroupStart,
 * ncclGroupEnd, ncclSend, ncclRecv. The outermost ncclGroupEnd also runs
 * the collectives deferred by the group (nccl_standin_coll.c).
 *
 * A call outside a group is a group of its own. At the outermost
 * ncclGroupEnd the recorded calls of each communicator become one stream
 * item (standin_enqueue) that runs them as one tcp transport group: each
 * call is one message tagged (F, stage = datatype, mb = count's low 32
 * bits) of count * size bytes, so the receiver's tag and length check is
 * NCCL's "same count and datatype" rule, and a mismatch names both.
 *
 * The link delay (ZB_STANDIN_NCCL_DELAY_US, read once; also
 * standin_set_nccl_delay_us): once every call of an item has met its
 * peer's (the credits), the item sleeps this long before the data moves,
 * on both ranks at once, so a group takes about that long as on a slow
 * link, and only the comm stream is held (docs/model.md, The CPU
 * stand-in). It adds to ZB_STANDIN_DELAY_US, which delays every item.
 *
 * Threads: the group being recorded is thread-local (as in NCCL); items
 * run on stream threads; errors go to the communicator (ncclsi_error).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nccl_standin.h"
#include "standin_internal.h"

typedef struct p2p_op {
  bool is_send;
  void *buf;
  size_t count;
  ncclDataType_t dt;
  int peer;
  ncclComm_t comm;
  cudaStream_t stream;
} p2p_op;

/* One communicator's share of a group, owned by its stream item. */
typedef struct p2p_item {
  ncclComm_t comm;
  int n;
  p2p_op ops[];
} p2p_item;

static pthread_once_t g_delay_once = PTHREAD_ONCE_INIT;
static atomic_uint g_link_delay_us;

static void read_link_delay(void) {
  const char *s = getenv("ZB_STANDIN_NCCL_DELAY_US");
  if (!s || !*s)
    return;
  char *end;
  unsigned long v = strtoul(s, &end, 10);
  if (*end || v > 10000000ul)
    fprintf(stderr,
            "nccl stand-in: ZB_STANDIN_NCCL_DELAY_US='%s' is not a delay in microseconds (0..10000000); "
            "ignored\n",
            s);
  else
    atomic_store(&g_link_delay_us, (unsigned)v);
}

void standin_set_nccl_delay_us(unsigned us) {
  pthread_once(&g_delay_once, read_link_delay);
  atomic_store(&g_link_delay_us, us);
}

void ncclsi_link_delay(void) {
  pthread_once(&g_delay_once, read_link_delay);
  unsigned us = atomic_load(&g_link_delay_us);
  struct timespec ts = {us / 1000000u, (long)(us % 1000000u) * 1000L};
  while (us && nanosleep(&ts, &ts) != 0) {
  }
}

static _Thread_local int g_depth;

bool ncclsi_grouping(void) {
  return g_depth > 0;
}

static _Thread_local p2p_op *g_ops;
static _Thread_local int g_n, g_cap;

/* "ncclSend of 256 x ncclFloat32 to peer 1" */
static const char *op_name(const p2p_op *op, char *buf, size_t len) {
  snprintf(buf, len, "%s of %zu x %s %s peer %d", op->is_send ? "ncclSend" : "ncclRecv", op->count,
           ncclsi_dt_name(op->dt), op->is_send ? "to" : "from", op->peer);
  return buf;
}

/* Turns the transport's failure into the communicator's async error,
 * named in NCCL's terms. */
static void item_failed(const void *arg, zb_err err, const char *msg) {
  const p2p_item *it = arg;
  ncclComm_t c = it->comm;
  char on[96];
  int peer = -1, stage = 0, mb = 0;
  unsigned long long bytes = 0;
  const char *got = strstr(msg, "got message ");
  char kind = 0;
  /* A data message (F) or a credit (B) whose count or datatype differ: the
   * receiver of data, or the sender of the data whose credit came back. */
  if (err == ZB_ERR_INVALID_SCHEDULE && got &&
      sscanf(got, "got message %c s%d mb%d (%llu bytes) from peer rank %d", &kind, &stage, &mb, &bytes,
             &peer) == 5 &&
      kind == 'R') { /* a collective's join (nccl_standin_coll.c) */
    ncclsi_error(c, ncclInvalidUsage, "rank %d: point-to-point calls with peer %d meet the peer's collective",
                 c->rank, peer);
    return;
  }
  if (err == ZB_ERR_INVALID_SCHEDULE && got &&
      sscanf(got, "got message %c s%d mb%d (%llu bytes) from peer rank %d", &kind, &stage, &mb, &bytes,
             &peer) == 5) {
    bool credit = kind == 'B';
    for (int i = 0; i < it->n; i++)
      if (it->ops[i].is_send == credit && it->ops[i].peer == peer) {
        size_t sz = ncclsi_dt_size(stage), count = credit ? (size_t)(uint32_t)mb : sz ? bytes / sz : bytes;
        ncclsi_error(c, ncclInvalidUsage, "rank %d: %s does not match the peer's %s of %zu x %s", c->rank,
                     op_name(&it->ops[i], on, sizeof on), credit ? "ncclRecv" : "ncclSend", count,
                     ncclsi_dt_name(stage));
        return;
      }
  }
  const char *idle = strstr(msg, "no progress with peer rank ");
  if (idle && sscanf(idle, "no progress with peer rank %d", &peer) == 1) {
    char list[160] = "";
    size_t used = 0;
    for (int i = 0; i < it->n && used + 1 < sizeof list; i++)
      if (it->ops[i].peer == peer) {
        int k = snprintf(list + used, sizeof list - used, "%s%s", used ? ", " : "",
                         op_name(&it->ops[i], on, sizeof on));
        used += k > 0 ? (size_t)k : 0;
      }
    ncclsi_error(c, ncclSystemError, "rank %d: unmatched after %.1f s: %s", c->rank, ncclsi_timeout_s(),
                 list);
    return;
  }
  /* A peer's connection closed or failed: what NCCL's socket transport
   * reports (ncclRemoteError, "remote process exited or there was a network
   * error"). Over shared memory or NVLink NCCL sees nothing at all, which
   * ZB_STANDIN_NCCL_PEER_LOSS=hang imitates (docs/model.md, The CPU
   * stand-in). */
  if (!ncclsi_peer_loss_silent())
    ncclsi_error(c, ncclRemoteError, "rank %d: %s", c->rank, msg);
}

void ncclsi_stuck(ncclComm_t c) {
  while (!atomic_load(&c->aborted)) {
    struct timespec ts = {0, 10 * 1000000L};
    nanosleep(&ts, NULL);
  }
}

/* Runs one phase of an item as one transport group: the credits (ack
 * true), then the data (ack false). Each receiver first sends a credit per
 * posted receive, on connections of their own, and each sender waits for
 * one per send: a send completes only once its match was posted (the
 * blocking semantics the lowered schedules assume, docs/schedules.md), and
 * an unmatched send is found by the idle timeout like an unmatched
 * receive. Credits travel when the receive is posted, not when the
 * receiver's whole group is done: NCCL's sends do not wait for the rest of
 * the peer's group either. The credit carries the count and datatype, so a
 * mismatch is found before any data moves. */
static zb_err item_phase(zb_transport *tp, const p2p_item *it, bool ack, zb_diag *d) {
  zb_err err = ZB_OK;
  zb_transport_group_start(tp);
  for (int i = 0; i < it->n && !err; i++) {
    const p2p_op *op = &it->ops[i];
    zb_tag tag = {
        .kind = ack ? ZB_OP_B : ZB_OP_F, .stage = (int32_t)op->dt, .mb = (int32_t)(uint32_t)op->count};
    size_t bytes = ack ? 0 : op->count * ncclsi_dt_size(op->dt);
    void *buf = ack ? NULL : op->buf;
    bool out = op->is_send != ack; /* the receiver sends the ack */
    err = out ? zb_transport_send(tp, op->peer, tag, buf, bytes, d)
              : zb_transport_recv(tp, op->peer, tag, buf, bytes, d);
  }
  zb_err end = zb_transport_group_end(tp, d);
  return err ? err : end;
}

void ncclsi_run_item(ncclComm_t c, const void *it, const ncclsi_item_fns *fns) {
  pthread_mutex_lock(&c->mu);
  bool skip = atomic_load(&c->aborted) || c->async != ncclSuccess || !c->tp;
  if (!skip)
    c->running = true;
  zb_transport *tp = c->tp, *ack = c->ack;
  pthread_mutex_unlock(&c->mu);
  if (skip)
    return; /* like NCCL's kernels after an abort: nothing moves, the stream goes on */
  zb_diag d = {{0}};
  zb_err err = fns->meet(ack, it, &d);
  if (!err)
    ncclsi_link_delay(); /* every rank has met its peers: the data now takes the link's time */
  if (!err)
    err = fns->move(tp, it, &d);
  if (err && !atomic_load(&c->aborted)) {
    fns->failed(it, err, d.msg);
    ncclsi_stuck(c);
  }
  pthread_mutex_lock(&c->mu);
  c->running = false;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

static zb_err item_credits(zb_transport *ack, const void *it, zb_diag *d) {
  return item_phase(ack, it, true, d);
}

static zb_err item_data(zb_transport *tp, const void *it, zb_diag *d) {
  return item_phase(tp, it, false, d);
}

/* The stream item: runs one communicator's share of a group. */
static cudaError_t item_run(void *arg) {
  static const ncclsi_item_fns fns = {.meet = item_credits, .move = item_data, .failed = item_failed};
  ncclsi_run_item(((p2p_item *)arg)->comm, arg, &fns);
  return cudaSuccess; /* NCCL reports through ncclCommGetAsyncError, not the stream */
}

static void item_release(void *arg) {
  p2p_item *it = arg;
  ncclsi_unref(it->comm);
  free(it);
}

/* Enqueues every communicator's share of the recorded group. */
static ncclResult_t group_flush(void) {
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < g_n; i++) {
    ncclComm_t c = g_ops[i].comm;
    if (!c)
      continue; /* taken by an earlier item */
    int n = 0;
    for (int k = i; k < g_n; k++)
      n += g_ops[k].comm == c;
    p2p_item *it = malloc(sizeof *it + sizeof(p2p_op) * (size_t)n);
    it->comm = c;
    it->n = 0;
    for (int k = i; k < g_n; k++)
      if (g_ops[k].comm == c) {
        it->ops[it->n++] = g_ops[k];
        g_ops[k].comm = NULL;
      }
    pthread_mutex_lock(&c->mu);
    c->refs++;
    pthread_mutex_unlock(&c->mu);
    cudaError_t ce = standin_enqueue(it->ops[0].stream, item_run, it, item_release);
    if (ce != cudaSuccess) {
      item_release(it);
      res = ncclsi_error(c, ncclUnhandledCudaError, "ncclGroupEnd: the stream does not exist (%d)", (int)ce);
    }
  }
  g_n = 0;
  free(g_ops); /* thread-local: a thread that ends must not leave it behind */
  g_ops = NULL;
  g_cap = 0;
  return res;
}

/* nccl.h declares these two with () rather than (void), which is no
 * prototype in C: the warning is about the header, not this definition. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-prototypes"
ncclResult_t ncclGroupStart(void) {
  g_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (standin_inject("ncclGroupEnd", STANDIN_SITE)) {
    g_depth = g_n = g_cap = 0; /* the group is gone, as after NCCL's failed ncclGroupEnd */
    free(g_ops);
    g_ops = NULL;
    ncclsi_coll_flush(false);
    return ncclsi_error(NULL, ncclSystemError, "ncclGroupEnd: injected failure");
  }
  if (g_depth == 0)
    return ncclsi_error(NULL, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--g_depth > 0)
    return ncclSuccess;
  ncclResult_t res = group_flush(), coll = ncclsi_coll_flush(true); /* p2p first: nccl_standin_coll.c */
  return res != ncclSuccess ? res : coll;
}
#pragma GCC diagnostic pop

/* Checks and records one call; outside a group it is flushed at once. */
static ncclResult_t p2p_post(bool is_send, void *buf, size_t count, ncclDataType_t dt, int peer,
                             ncclComm_t comm, cudaStream_t stream) {
  const char *fn = is_send ? "ncclSend" : "ncclRecv";
  if (!comm)
    return ncclsi_error(NULL, ncclInvalidArgument, "%s: comm is NULL", fn);
  ncclResult_t async;
  ncclCommGetAsyncError(comm, &async);
  if (async == ncclInProgress)
    return ncclsi_error(NULL, ncclInvalidUsage, "%s: the communicator of rank %d is still initializing", fn,
                        comm->rank);
  if (async != ncclSuccess)
    return async; /* errors are sticky, as in NCCL */
  if (peer < 0 || peer >= comm->nranks)
    return ncclsi_error(NULL, ncclInvalidArgument, "%s: peer %d is not in 0..%d", fn, peer, comm->nranks - 1);
  if (peer == comm->rank)
    return ncclsi_error(NULL, ncclInvalidUsage,
                        "%s: to/from self (rank %d) is not implemented by the stand-in", fn, peer);
  size_t sz = ncclsi_dt_size(dt);
  if (sz == 0)
    return ncclsi_error(NULL, ncclInvalidArgument, "%s: datatype %d is not an NCCL datatype", fn, (int)dt);
  char what[64];
  snprintf(what, sizeof what, "%s %s", fn, is_send ? "sendbuff" : "recvbuff");
  void *view = count > 0 ? standin_view(buf, count * sz, what) : NULL; /* what the item reads or writes */
  if (count > 0 && !view)
    return ncclsi_error(NULL, ncclInvalidArgument, "%s", standin_last_error());
  if (g_n == g_cap) {
    g_cap = g_cap ? 2 * g_cap : 16;
    g_ops = realloc(g_ops, sizeof *g_ops * (size_t)g_cap);
  }
  g_ops[g_n++] = (p2p_op){is_send, view, count, dt, peer, comm, stream};
  return g_depth > 0 ? ncclSuccess : group_flush();
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  if (standin_inject("ncclSend", STANDIN_SITE))
    return ncclsi_error(NULL, ncclSystemError, "ncclSend: injected failure");
  return p2p_post(true, (void *)(uintptr_t)sendbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  if (standin_inject("ncclRecv", STANDIN_SITE))
    return ncclsi_error(NULL, ncclSystemError, "ncclRecv: injected failure");
  return p2p_post(false, recvbuff, count, datatype, peer, comm, stream);
}
