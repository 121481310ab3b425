/* executor.c — one rank's action list over a backend and a transport
 * (zb_executor.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_clock.h"
#include "zb_executor.h"
#include "zb_format.h"

struct zb_executor {
  int rank, nranks;
  int peer_base; /* the plan's peer q is transport rank peer_base + q */
  zb_err (*reduce)(void *ud, int stage, int iteration, zb_diag *diag);
  zb_err (*reduce_wait)(void *ud, int iteration, zb_diag *diag);
  void (*reduce_abort)(void *ud, const char *why);
  bool reduce_pending; /* this iteration: a reduction started, not yet waited for */
  void *reduce_ud;
  zb_action *actions;
  int n;
  zb_costs *costs;
  double rank_mf;
  size_t bpa;
  const atomic_bool *stop;
  zb_backend *backend;
  zb_transport *transport;
  void **bufs;         /* scratch: the buffers of one group */
  bool device_ordered; /* groups posted on the device (zb_executor.h, Walking the list) */
  int *link;           /* per action: a compute op's RECV, a SEND's producer, or -1 (exec_links) */
  bool *marked;        /* per compute action: a SEND reads its output, so a mark follows it */
  int64_t *point;      /* this iteration: a RECV's group ticket, a marked compute op's mark */
  int trace_every;
  zb_tl_op *tl; /* the sampled iteration's ops: one per action at most */
  int tl_n;
};

/* Prefixes diag's message with where it happened; returns err. */
static zb_err exec_wrap(const zb_executor *e, int iteration, int i, zb_err err, zb_diag *diag) {
  if (!diag)
    return err;
  char act[48] = "";
  if (i >= 0 && i < e->n)
    zb_action_format(&e->actions[i], act, sizeof act);
  char inner[sizeof diag->msg];
  memcpy(inner, diag->msg, sizeof inner);
  if (i >= 0)
    return zb_diag_set(diag, err, "rank %d, iteration %d, action %d (%s): %s", e->rank, iteration, i, act,
                       inner);
  return zb_diag_set(diag, err, "rank %d, iteration %d: %s", e->rank, iteration, inner);
}

static bool exec_stopped(const zb_executor *e) {
  return e->stop && atomic_load(e->stop);
}

void zb_executor_peers(const zb_action *actions, int n_actions, int nranks, bool *peers) {
  memset(peers, 0, sizeof(bool) * (size_t)nranks);
  for (int i = 0; i < n_actions; i++)
    if (zb_op_is_comm(actions[i].op) && actions[i].peer >= 0 && actions[i].peer < nranks)
      peers[actions[i].peer] = true;
}

/* The tag a comm action sends or expects (zb_transport.h). */
static zb_tag exec_tag(const zb_action *a) {
  switch (a->op) {
  case ZB_OP_SEND_F: return (zb_tag){.kind = ZB_OP_F, .stage = a->stage, .mb = a->mb};
  case ZB_OP_RECV_F: return (zb_tag){.kind = ZB_OP_F, .stage = a->stage - 1, .mb = a->mb};
  case ZB_OP_SEND_B: return (zb_tag){.kind = ZB_OP_B, .stage = a->stage, .mb = a->mb};
  default: return (zb_tag){.kind = ZB_OP_B, .stage = a->stage + 1, .mb = a->mb};
  }
}

static zb_err exec_check(const zb_executor_config *cfg, zb_diag *diag) {
  if (cfg->nranks < 1 || cfg->rank < 0 || cfg->rank >= cfg->nranks)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "executor: rank %d is not in 0..%d", cfg->rank,
                       cfg->nranks - 1);
  if (!cfg->costs || cfg->n_actions < 0 || (cfg->n_actions > 0 && !cfg->actions))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "executor: rank %d has no costs or no action list",
                       cfg->rank);
  int S = cfg->costs->n_stages;
  for (int i = 0; i < cfg->n_actions; i++) {
    const zb_action *a = &cfg->actions[i];
    char act[48];
    zb_action_format(a, act, sizeof act);
    if (!zb_op_is_compute(a->op) && !zb_op_is_comm(a->op))
      continue;
    if (a->stage < 0 || a->stage >= S || a->mb < 0)
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                         "executor: rank %d action %d (%s): stage or microbatch out of range (%d stages)",
                         cfg->rank, i, act, S);
    if (!zb_op_is_comm(a->op))
      continue;
    zb_tag tag = exec_tag(a);
    if (a->peer < 0 || a->peer >= cfg->nranks || a->peer == cfg->rank || tag.stage < 0 || tag.stage >= S)
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                         "executor: rank %d action %d (%s): peer rank %d or the sending stage is invalid",
                         cfg->rank, i, act, a->peer);
  }
  return ZB_OK;
}

/* Per action, the action it depends on across streams, earlier in the
 * list, or -1: for F of (s, mb) RECV_F of (s, mb), for B or BW RECV_B (the
 * consumer waits for the message); for SEND_F of (s, mb) F of (s, mb), for
 * SEND_B its B or BW (the send waits for its producer). Caller frees. */
static int *exec_links(const zb_action *a, int n, int stages) {
  int *link = zb_malloc(sizeof *link * (size_t)(n ? n : 1));
  int mbs = 1;
  for (int i = 0; i < n; i++)
    mbs = a[i].mb >= mbs ? a[i].mb + 1 : mbs;
  size_t cells = (size_t)stages * (size_t)mbs;
  int *at[4]; /* by cell: the last RECV_F, RECV_B, F, B or BW seen so far */
  for (int k = 0; k < 4; k++) {
    at[k] = zb_malloc(sizeof(int) * cells);
    for (size_t c = 0; c < cells; c++)
      at[k][c] = -1;
  }
  for (int i = 0; i < n; i++) { /* one pass: a link goes to an earlier action only */
    link[i] = -1;
    if (!zb_op_is_compute(a[i].op) && !zb_op_is_comm(a[i].op))
      continue;
    size_t c = (size_t)a[i].stage * (size_t)mbs + (size_t)a[i].mb; /* exec_check kept both in range */
    switch (a[i].op) {
    case ZB_OP_RECV_F: at[0][c] = i; break;
    case ZB_OP_RECV_B: at[1][c] = i; break;
    case ZB_OP_F:
      link[i] = at[0][c];
      at[2][c] = i;
      break;
    case ZB_OP_B:
    case ZB_OP_BW:
      link[i] = at[1][c];
      at[3][c] = i;
      break;
    case ZB_OP_SEND_F: link[i] = at[2][c]; break;
    case ZB_OP_SEND_B: link[i] = at[3][c]; break;
    default: break; /* W reads nothing that travels */
    }
  }
  for (int k = 0; k < 4; k++)
    free(at[k]);
  return link;
}

zb_err zb_executor_new(const zb_executor_config *cfg, zb_backend *backend, zb_transport *transport,
                       zb_executor **out, zb_diag *diag) {
  zb_err err = exec_check(cfg, diag);
  if (err)
    return err;
  if (!backend || !transport)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "executor: rank %d needs a backend and a transport",
                       cfg->rank);
  zb_executor *e = zb_calloc(1, sizeof *e);
  e->rank = cfg->rank;
  e->nranks = cfg->nranks;
  e->peer_base = cfg->peer_base;
  e->reduce = cfg->reduce;
  e->reduce_wait = cfg->reduce_wait;
  e->reduce_abort = cfg->reduce_abort;
  e->reduce_ud = cfg->reduce_ud;
  e->n = cfg->n_actions;
  e->actions = zb_malloc(sizeof *e->actions * (size_t)(e->n ? e->n : 1));
  if (e->n)
    memcpy(e->actions, cfg->actions, sizeof *e->actions * (size_t)e->n);
  e->costs = zb_costs_clone(cfg->costs);
  e->bpa = cfg->bytes_per_activation;
  e->stop = cfg->stop;
  e->backend = backend;
  e->transport = transport;
  e->bufs = zb_calloc((size_t)e->n + 1, sizeof(void *));
  e->trace_every = cfg->trace_every > 0 ? cfg->trace_every : 0;
  e->device_ordered = !cfg->blocking_comm && zb_transport_device_ordered(transport);
  e->link = exec_links(e->actions, e->n, e->costs->n_stages);
  e->marked = zb_calloc((size_t)e->n + 1, sizeof *e->marked);
  for (int i = 0; i < e->n; i++)
    if (zb_op_is_comm(e->actions[i].op) && e->link[i] >= 0)
      e->marked[e->link[i]] = true;
  e->point = zb_calloc((size_t)e->n + 1, sizeof *e->point);
  if (e->trace_every)
    e->tl = zb_calloc((size_t)e->n + 1, sizeof *e->tl);
  /* the rank's M_F: m_f summed over the distinct stages it computes */
  bool *seen = zb_calloc((size_t)e->costs->n_stages, sizeof(bool));
  for (int i = 0; i < e->n; i++)
    if (zb_op_is_compute(e->actions[i].op) && !seen[e->actions[i].stage]) {
      seen[e->actions[i].stage] = true;
      e->rank_mf += e->costs->m_f[e->actions[i].stage];
    }
  free(seen);
  *out = e;
  return ZB_OK;
}

void zb_executor_free(zb_executor *e) {
  if (!e)
    return;
  free(e->actions);
  free(e->tl);
  free(e->bufs);
  free(e->link);
  free(e->marked);
  free(e->point);
  zb_costs_free(e->costs);
  free(e);
}

/* Closes the group of actions [i, j]: device-ordered, posts it and keeps
 * its ticket for the consumers of its receives (on a sampled iteration
 * also waits for it, so the timeline shows its end); else waits for it. */
static zb_err exec_group_close(zb_executor *e, int i, int j, bool trace, zb_diag *diag) {
  if (!e->device_ordered)
    return zb_transport_group_end(e->transport, diag);
  int64_t ticket, after = -1; /* the latest producer of its sends */
  for (int k = i; k <= j; k++)
    if (zb_op_is_comm(e->actions[k].op) && e->link[k] >= 0 && e->point[e->link[k]] > after)
      after = e->point[e->link[k]];
  zb_err err = zb_transport_group_post(e->transport, after, &ticket, diag);
  for (int k = i; k <= j && !err; k++)
    e->point[k] = ticket;
  if (!err && trace)
    err = zb_transport_drain(e->transport, diag);
  return err;
}

/* Posts actions [i, j] as one transport group and closes it
 * (exec_group_close); *at is the action to blame on failure. */
static zb_err exec_group(zb_executor *e, int i, int j, bool trace, int *at, zb_diag *diag) {
  zb_err err = ZB_OK;
  *at = i;
  for (int k = i; k <= j && !e->device_ordered; k++)
    if (e->actions[k].op == ZB_OP_SEND_F || e->actions[k].op == ZB_OP_SEND_B) {
      err = zb_backend_sync(e->backend, diag); /* what we send must be computed */
      if (err)
        return err;
      break;
    }
  for (int k = i; k <= j; k++) { /* all buffers first: a group is never left half-posted by us */
    const zb_action *a = &e->actions[k];
    *at = k;
    err = zb_backend_buffer(e->backend, a->op, a->stage, a->mb, e->bpa, &e->bufs[k - i], diag);
    if (err)
      return err;
  }
  zb_transport_group_start(e->transport);
  for (int k = i; k <= j && !err; k++) {
    const zb_action *a = &e->actions[k];
    *at = k;
    if (a->op == ZB_OP_SEND_F || a->op == ZB_OP_SEND_B)
      err =
          zb_transport_send(e->transport, e->peer_base + a->peer, exec_tag(a), e->bufs[k - i], e->bpa, diag);
    else
      err =
          zb_transport_recv(e->transport, e->peer_base + a->peer, exec_tag(a), e->bufs[k - i], e->bpa, diag);
  }
  if (err) { /* close the group; the transport reports the first failure again */
    zb_transport_group_end(e->transport, NULL);
    return err;
  }
  *at = i;
  return exec_group_close(e, i, j, trace, diag);
}

/* Appends an op of a sampled iteration (times in ns from its start). */
static void tl_push(zb_executor *e, const zb_action *a, int group_size, int64_t t0, int64_t t1) {
  e->tl[e->tl_n++] = (zb_tl_op){.op = a->op,
                                .stage = a->stage,
                                .mb = a->mb,
                                .group_size = group_size,
                                .start = (double)t0 * 1e-9,
                                .end = (double)t1 * 1e-9};
}

/* Runs compute action a; on a sampled iteration (trace) waits for it and
 * records it, times from base. */
static zb_err exec_compute(zb_executor *e, int i, bool trace, int64_t base, zb_diag *diag) {
  const zb_action *a = &e->actions[i];
  int64_t t0 = trace ? zb_clock_ns() : 0;
  zb_err err = ZB_OK;
  if (e->device_ordered && e->link[i] >= 0) /* its input's receive */
    err = zb_transport_order_device(e->transport, e->point[e->link[i]], diag);
  if (!err)
    err = zb_backend_submit(e->backend, a->op, a->stage, a->mb, diag);
  if (!err && e->device_ordered && e->marked[i]) /* a send reads its output */
    err = zb_transport_mark(e->transport, &e->point[i], diag);
  if (!err && trace)
    err = zb_backend_sync(e->backend, diag);
  if (!err && trace)
    tl_push(e, a, 0, t0 - base, zb_clock_ns() - base);
  return err;
}

/* What one iteration's walk adds up, for its zb_rank_iteration. */
typedef struct exec_tally {
  double mem, peak, comm; /* plan-accounted memory now and at most; seconds in groups */
  int32_t groups, comm_actions;
} exec_tally;

/* Posts the group that starts at action i and waits for it; *next is the
 * action after it (or, on failure, the one to blame). */
static zb_err exec_comm(zb_executor *e, int i, bool trace, int64_t base, exec_tally *t, int *next,
                        zb_diag *diag) {
  int j = zb_comm_group_end(e->actions, e->n, i), at;
  int64_t c0 = zb_clock_ns();
  zb_err err = exec_group(e, i, j, trace, &at, diag);
  int64_t c1 = zb_clock_ns();
  t->comm += (double)(c1 - c0) * 1e-9;
  if (trace && !err)
    tl_push(e, &e->actions[i], j - i + 1, c0 - base, c1 - base);
  t->groups++;
  t->comm_actions += j - i + 1;
  *next = err ? at : j + 1;
  return err;
}

/* Device-ordered, before compute action i: posts the groups after those
 * posted so far (from *ahead on) that the device can take now: each send's
 * producer lies before i (submitted, marked), and the window has room, so
 * posting never waits. A receive is then in flight while the ops before
 * its place in the list run; the comm stream still gets the groups in
 * list order, so the device does what it would have done
 * (docs/schedules.md, Execution model). On failure *ahead is the action
 * to blame. */
static zb_err exec_ahead(zb_executor *e, int i, int64_t start, exec_tally *t, int *ahead, zb_diag *diag) {
  int k = *ahead > i ? *ahead : i;
  while (k < e->n) {
    if (!zb_op_is_comm(e->actions[k].op)) {
      k++;
      continue;
    }
    int j = zb_comm_group_end(e->actions, e->n, k);
    for (int q = k; q <= j; q++)
      if ((e->actions[q].op == ZB_OP_SEND_F || e->actions[q].op == ZB_OP_SEND_B) && e->link[q] >= i)
        return ZB_OK; /* its producer is not submitted yet */
    if (zb_transport_room(e->transport) <= 0)
      return ZB_OK;
    zb_err err = exec_comm(e, k, false, start, t, &k, diag);
    *ahead = k; /* on failure, the action to blame */
    if (err)
      return err;
  }
  return ZB_OK;
}

/* Whether REDUCE_GRAD leaves its reduction running (zb_executor.h,
 * REDUCE_GRAD): device-ordered with a reduce_wait hook, off a sampled
 * iteration (whose timeline shows each op's end). */
static bool exec_reduce_overlaps(const zb_executor *e, bool trace) {
  return e->device_ordered && e->reduce_wait && !trace;
}

/* REDUCE_GRAD(stage) through the reduce hook. Overlapped: the hook starts
 * the reduction after the compute submitted so far, on the device, and
 * the walk goes on. Else host-blocking: the groups in flight drained, the
 * backend synced (the gradients it reads must be final), the hook, and
 * reduce_wait at once. */
static zb_err exec_reduce(zb_executor *e, int i, int iteration, bool trace, int64_t base, exec_tally *t,
                          zb_diag *diag) {
  const zb_action *a = &e->actions[i];
  int64_t c0 = zb_clock_ns();
  bool overlap = exec_reduce_overlaps(e, trace);
  zb_err err = e->device_ordered && !overlap ? zb_transport_drain(e->transport, diag) : ZB_OK;
  if (!err && !overlap)
    err = zb_backend_sync(e->backend, diag);
  if (!err)
    err = e->reduce(e->reduce_ud, a->stage, iteration, diag);
  e->reduce_pending = !err && e->reduce_wait;
  if (!err && !overlap && e->reduce_wait) {
    err = e->reduce_wait(e->reduce_ud, iteration, diag);
    e->reduce_pending = false;
  }
  int64_t c1 = zb_clock_ns();
  t->comm += (double)(c1 - c0) * 1e-9;
  if (!err && trace)
    tl_push(e, a, 0, c0 - base, c1 - base);
  return err;
}

/* WAIT_REDUCE_GRAD, or the end of a walk with a reduction pending: the
 * hook orders the gradients' consumers after every started reduction
 * and waits for them (zb_executor.h), timed as communication. */
static zb_err exec_reduce_wait(zb_executor *e, int iteration, exec_tally *t, zb_diag *diag) {
  if (!e->reduce_pending)
    return ZB_OK;
  int64_t c0 = zb_clock_ns();
  zb_err err = e->reduce_wait(e->reduce_ud, iteration, diag);
  e->reduce_pending = false;
  t->comm += (double)(zb_clock_ns() - c0) * 1e-9;
  return err;
}

/* Walks the list once; *failed_at is the action to blame on failure. */
static zb_err exec_walk(zb_executor *e, int iteration, bool trace, int64_t start, exec_tally *t,
                        int *failed_at, zb_diag *diag) {
  int i = 0, ahead = 0; /* comm actions before `ahead` are posted already */
  bool look = e->device_ordered && !trace;
  zb_err err = ZB_OK;
  while (i < e->n && !err) {
    const zb_action *a = &e->actions[i];
    if (exec_stopped(e)) {
      err = zb_diag_set(diag, ZB_ERR_IO, "stopped (stop flag raised)");
    } else if (zb_op_is_compute(a->op)) {
      err = look ? exec_ahead(e, i, start, t, &ahead, diag) : ZB_OK;
      if (err) {
        i = ahead;
        break;
      }
      err = exec_compute(e, i, trace, start, diag);
      if (!err) {
        t->mem += zb_costs_mem(e->costs, a->op, a->stage);
        t->peak = t->mem > t->peak ? t->mem : t->peak;
        i++;
      }
    } else if (zb_op_is_comm(a->op) && i < ahead) {
      i = zb_comm_group_end(e->actions, e->n, i) + 1; /* posted ahead */
    } else if (zb_op_is_comm(a->op)) {
      err = exec_comm(e, i, trace, start, t, &i, diag);
      ahead = i > ahead ? i : ahead;
    } else if (a->op == ZB_OP_REDUCE_GRAD && e->reduce) {
      err = exec_reduce(e, i, iteration, trace, start, t, diag);
      i += err ? 0 : 1;
    } else if (a->op == ZB_OP_WAIT_REDUCE_GRAD) {
      err = exec_reduce_wait(e, iteration, t, diag);
      i += err ? 0 : 1;
    } else {
      i++; /* FSDP and empty actions take no time here */
    }
  }
  if (!err) { /* a list without WAIT_REDUCE_GRAD: before the drain and sync */
    i = -1;
    err = exec_reduce_wait(e, iteration, t, diag);
  }
  *failed_at = i;
  return err;
}

zb_err zb_executor_run_iteration(zb_executor *e, int iteration, zb_rank_iteration *out, zb_diag *diag) {
  zb_backend_stats bs;
  zb_transport_stats ts0, ts1;
  zb_backend_take_stats(e->backend, &bs); /* start a fresh interval */
  zb_transport_stats_get(e->transport, &ts0);
  exec_tally t = {0};
  bool trace = e->trace_every > 0 && iteration % e->trace_every == 0;
  e->tl_n = 0;
  e->reduce_pending = false;
  int64_t start = zb_clock_ns();
  int i;
  zb_err err = exec_walk(e, iteration, trace, start, &t, &i, diag);
  if (!err && e->device_ordered) { /* the host's only wait for groups, the window's aside */
    i = -1;
    int64_t c0 = zb_clock_ns();
    err = zb_transport_drain(e->transport, diag);
    t.comm += (double)(zb_clock_ns() - c0) * 1e-9;
  }
  if (!err) {
    i = -1;
    err = zb_backend_sync(e->backend, diag);
  }
  if (err) {
    err = exec_wrap(e, iteration, i, err, diag);
    /* peers blocked on this rank must not wait for a stop of their own */
    zb_transport_abort(e->transport, diag ? diag->msg : "iteration failed");
    if (e->reduce_abort)
      e->reduce_abort(e->reduce_ud, diag ? diag->msg : "iteration failed");
    return err;
  }
  int64_t end = zb_clock_ns();
  zb_backend_take_stats(e->backend, &bs);
  zb_transport_stats_get(e->transport, &ts1);

  zb_rank_iteration r = {.rank = e->rank, .iteration = iteration};
  r.start_seconds = (double)start * 1e-9;
  r.end_seconds = (double)end * 1e-9;
  r.wall_seconds = (double)(end - start) * 1e-9;
  r.busy_f_seconds = bs.busy_f;
  r.busy_b_seconds = bs.busy_b;
  r.busy_w_seconds = bs.busy_w;
  double idle = r.wall_seconds - (bs.busy_f + bs.busy_b + bs.busy_w);
  r.idle_seconds = idle > 0 ? idle : 0;
  r.bubble_ratio = r.wall_seconds > 0 ? r.idle_seconds / r.wall_seconds : 0;
  r.bytes_sent = ts1.bytes_sent - ts0.bytes_sent;
  r.peak_memory = e->rank_mf > 0 ? t.peak / e->rank_mf : t.peak;
  r.peak_memory_bytes = bs.peak_bytes >= 0 ? bs.peak_bytes : (int64_t)llround(r.peak_memory * (double)e->bpa);
  r.cpu_wait_seconds = bs.cpu_wait;
  r.comm_seconds = t.comm;
  r.comm_groups = t.groups;
  r.comm_actions = t.comm_actions;
  r.host_syncs = bs.host_syncs;
  r.device_peak = bs.device_peak;
  r.device_used = bs.device_used;
  r.timeline = trace ? e->tl : NULL;
  r.n_timeline = trace ? e->tl_n : 0;
  *out = r;
  return ZB_OK;
}

zb_err zb_executor_run(zb_executor *e, int first, int count, zb_iteration_cb cb, void *ud, int *done,
                       zb_diag *diag) {
  int k = 0;
  zb_err err = ZB_OK;
  for (; k < count && !exec_stopped(e); k++) {
    zb_rank_iteration it;
    err = zb_executor_run_iteration(e, first + k, &it, diag);
    if (err)
      break;
    if (cb && !cb(ud, &it)) {
      k++;
      break;
    }
  }
  if (done)
    *done = k;
  return err;
}
