/* zb_lower.c — see zb_lower.h. Two forms of one pass: the global walk
 * over the simulated timeline (the definition, here) and the per-rank
 * merge that gives the same lists when every op takes time (the fast
 * path, zb_lower_merge.c); and lowering through a steady state. */
#include "zb_lower.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_lower_internal.h"
#include "zb_period.h"
#include "zb_reduce.h"
#include "zb_sim.h"

/* A pending transfer: the output of a producer op that another rank needs. */
typedef struct lower_xfer {
  double at; /* producer end */
  long seq;  /* emission order, for deterministic ties */
  zb_action send, recv;
  int from, to;
} lower_xfer;

/* A receive whose send went out, waiting on its rank until its tensor
 * arrives (due: producer end plus T_comm). */
typedef struct pending_recv {
  zb_action recv;
  double due;
} pending_recv;

typedef struct recv_queue {
  pending_recv *a;
  int head, n, cap;
} recv_queue;

typedef struct xfer_heap {
  lower_xfer *a;
  int n, cap;
} xfer_heap;

static bool xfer_less(const lower_xfer *x, const lower_xfer *y) {
  return x->at < y->at || (x->at == y->at && x->seq < y->seq);
}

static void xfer_push(xfer_heap *h, lower_xfer x) {
  if (h->n == h->cap) {
    h->cap = h->cap ? h->cap * 2 : 64;
    h->a = zb_realloc(h->a, sizeof *h->a * (size_t)h->cap);
  }
  int i = h->n++;
  h->a[i] = x;
  while (i > 0 && xfer_less(&h->a[i], &h->a[(i - 1) / 2])) {
    lower_xfer t = h->a[i];
    h->a[i] = h->a[(i - 1) / 2];
    h->a[(i - 1) / 2] = t;
    i = (i - 1) / 2;
  }
}

static lower_xfer xfer_pop(xfer_heap *h) {
  lower_xfer top = h->a[0];
  h->a[0] = h->a[--h->n];
  int i = 0;
  for (;;) {
    int l = 2 * i + 1, r = l + 1, m = i;
    if (l < h->n && xfer_less(&h->a[l], &h->a[m]))
      m = l;
    if (r < h->n && xfer_less(&h->a[r], &h->a[m]))
      m = r;
    if (m == i)
      break;
    lower_xfer t = h->a[i];
    h->a[i] = h->a[m];
    h->a[m] = t;
    i = m;
  }
  return top;
}

/* Ranks whose next compute action has its inputs, by that action's
 * simulated start (ties: lowest rank): each emitted action costs O(log p),
 * not a scan of every rank. */
typedef struct ready_heap {
  int *rank;
  double *key;
  int n;
} ready_heap;

static bool ready_less(const ready_heap *h, int i, int j) {
  return h->key[i] < h->key[j] || (h->key[i] == h->key[j] && h->rank[i] < h->rank[j]);
}

static void ready_swap(ready_heap *h, int i, int j) {
  int r = h->rank[i];
  double k = h->key[i];
  h->rank[i] = h->rank[j];
  h->key[i] = h->key[j];
  h->rank[j] = r;
  h->key[j] = k;
}

static void ready_push(ready_heap *h, int rank, double key) {
  int i = h->n++;
  h->rank[i] = rank;
  h->key[i] = key;
  while (i > 0 && ready_less(h, i, (i - 1) / 2)) {
    ready_swap(h, i, (i - 1) / 2);
    i = (i - 1) / 2;
  }
}

static int ready_pop(ready_heap *h) {
  int top = h->rank[0];
  ready_swap(h, 0, --h->n);
  for (int i = 0;;) {
    int l = 2 * i + 1, r = l + 1, m = i;
    if (l < h->n && ready_less(h, l, m))
      m = l;
    if (r < h->n && ready_less(h, r, m))
      m = r;
    if (m == i)
      break;
    ready_swap(h, i, m);
    i = m;
  }
  return top;
}

/* The walk over the simulated timeline: s's lists and their simulated
 * start/end times in, the lowered schedule out. f_sent / b_sent say per
 * (stage, microbatch) whether the transfer of that F / B output was
 * emitted; pending holds transfers whose producer ran, by producer end;
 * ready the ranks whose next compute action can be emitted. */
typedef struct lower_state {
  const zb_schedule *s;
  const zb_sim_result *sim;
  double t_comm;
  int S;
  unsigned char *f_sent, *b_sent;
  int *pos;       /* next compute action per rank */
  bool *in_ready; /* per rank: in ready */
  ready_heap ready;
  xfer_heap pending;
  recv_queue *recvs; /* per rank: receives whose send went out, not yet placed */
  long seq;
  zb_schedule *out;
} lower_state;

static void lower_state_init(lower_state *st, const zb_schedule *s, const zb_sim_result *sim, double t_comm) {
  *st = (lower_state){.s = s, .sim = sim, .t_comm = t_comm, .S = zb_schedule_stages(s)};
  size_t cells = (size_t)st->S * (size_t)s->m;
  st->f_sent = zb_calloc(cells, 1);
  st->b_sent = zb_calloc(cells, 1);
  st->pos = zb_calloc((size_t)s->p, sizeof(int));
  st->in_ready = zb_calloc((size_t)s->p, sizeof(bool));
  st->ready.rank = zb_malloc(sizeof(int) * (size_t)s->p);
  st->ready.key = zb_malloc(sizeof(double) * (size_t)s->p);
  st->recvs = zb_calloc((size_t)s->p, sizeof *st->recvs);
  st->out = zb_schedule_new(s->p, s->v, s->m, s->placement);
}

static void lower_state_free(lower_state *st) {
  for (int r = 0; r < st->s->p; r++)
    free(st->recvs[r].a);
  free(st->recvs);
  free(st->pending.a);
  free(st->pos);
  free(st->in_ready);
  free(st->ready.rank);
  free(st->ready.key);
  free(st->f_sent);
  free(st->b_sent);
}

/* Whether the remote inputs of compute action a on rank r were emitted. */
static bool lower_inputs_ready(const lower_state *st, int r, const zb_action *a) {
  const zb_schedule *s = st->s;
  if (a->op == ZB_OP_F && a->stage > 0 && zb_stage_rank(s, a->stage - 1) != r)
    return st->f_sent[(size_t)(a->stage - 1) * s->m + a->mb];
  if ((a->op == ZB_OP_B || a->op == ZB_OP_BW) && a->stage < st->S - 1 && zb_stage_rank(s, a->stage + 1) != r)
    return st->b_sent[(size_t)(a->stage + 1) * s->m + a->mb];
  return true;
}

/* Puts rank r into ready when its next compute action has its inputs. */
static void lower_try_ready(lower_state *st, int r) {
  const zb_schedule *s = st->s;
  if (st->in_ready[r] || st->pos[r] >= s->ranks[r].n ||
      !lower_inputs_ready(st, r, &s->ranks[r].actions[st->pos[r]]))
    return;
  st->in_ready[r] = true;
  ready_push(&st->ready, r, st->sim->start[r][st->pos[r]]);
}

/* Places rank r's queued receives that arrive by `by` (INFINITY: all),
 * oldest first: the queue is in transfer order, and with one T_comm for
 * every transfer that is also arrival order. */
static void lower_flush_recvs(lower_state *st, int r, double by) {
  recv_queue *q = &st->recvs[r];
  while (q->n > 0 && q->a[q->head].due <= by) {
    zb_schedule_push(st->out, r, q->a[q->head].recv);
    q->head++;
    q->n--;
  }
  if (q->n == 0)
    q->head = 0;
}

static void lower_queue_recv(lower_state *st, int r, zb_action recv, double due) {
  recv_queue *q = &st->recvs[r];
  if (q->head + q->n == q->cap) {
    if (q->head > 0)
      memmove(q->a, q->a + q->head, sizeof *q->a * (size_t)q->n);
    else
      q->a = zb_realloc(q->a, sizeof *q->a * (size_t)(q->cap = q->cap ? 2 * q->cap : 16));
    q->head = 0;
  }
  q->a[q->head + q->n++] = (pending_recv){.recv = recv, .due = due};
}

/* Emits the earliest pending transfer: the send on the producer's rank,
 * after every receive queued there (they come earlier in transfer order,
 * so each rank's comm actions keep that order, which makes the lists
 * deadlock-free: docs/schedules.md, Lowering), and queues the receive on
 * the consumer's rank, due when the tensor arrives. */
static void lower_emit_xfer(lower_state *st) {
  lower_xfer x = xfer_pop(&st->pending);
  lower_flush_recvs(st, x.from, INFINITY);
  zb_schedule_push(st->out, x.from, x.send);
  lower_queue_recv(st, x.to, x.recv, x.at + st->t_comm);
  size_t cell = (size_t)x.send.stage * st->s->m + x.send.mb;
  if (x.send.op == ZB_OP_SEND_F)
    st->f_sent[cell] = 1;
  else
    st->b_sent[cell] = 1;
  lower_try_ready(st, x.to);
}

/* Emits rank r's next compute action and, when its output goes to another
 * rank (F to the next stage, B/BW to the previous), queues that transfer. */
static void lower_emit_compute(lower_state *st, int r) {
  const zb_schedule *s = st->s;
  const zb_action *a = &s->ranks[r].actions[st->pos[r]];
  double end = st->sim->end[r][st->pos[r]];
  lower_flush_recvs(st, r, st->sim->start[r][st->pos[r]]); /* what has arrived by its start */
  st->pos[r]++;
  st->in_ready[r] = false;
  zb_schedule_push(st->out, r, *a);
  if (a->op == ZB_OP_F && a->stage + 1 < st->S && zb_stage_rank(s, a->stage + 1) != r) {
    int to = zb_stage_rank(s, a->stage + 1);
    lower_xfer x = {.at = end, .seq = st->seq++, .from = r, .to = to};
    x.send = (zb_action){.op = ZB_OP_SEND_F, .stage = a->stage, .mb = a->mb, .peer = to};
    x.recv = (zb_action){.op = ZB_OP_RECV_F, .stage = a->stage + 1, .mb = a->mb, .peer = r};
    xfer_push(&st->pending, x);
  } else if ((a->op == ZB_OP_B || a->op == ZB_OP_BW) && a->stage > 0 && zb_stage_rank(s, a->stage - 1) != r) {
    int to = zb_stage_rank(s, a->stage - 1);
    lower_xfer x = {.at = end, .seq = st->seq++, .from = r, .to = to};
    x.send = (zb_action){.op = ZB_OP_SEND_B, .stage = a->stage, .mb = a->mb, .peer = to};
    x.recv = (zb_action){.op = ZB_OP_RECV_B, .stage = a->stage - 1, .mb = a->mb, .peer = r};
    xfer_push(&st->pending, x);
  }
  lower_try_ready(st, r);
}

/* Comm actions that follow each other on a rank are posted as one group. */
static void lower_mark_rank_batches(zb_rank_list *l) {
  for (int i = 0; i + 1 < l->n; i++)
    l->actions[i].batch = zb_op_is_comm(l->actions[i].op) && zb_op_is_comm(l->actions[i + 1].op);
}

static void lower_mark_batches(zb_schedule *o) {
  for (int r = 0; r < o->p; r++)
    lower_mark_rank_batches(&o->ranks[r]);
}

/* Merges compute actions and transfers in simulated time order (a transfer
 * goes first on a tie); fails if some rank's list cannot be emitted. */
static zb_err lower_walk(const zb_schedule *s, const zb_sim_result *sim, double t_comm, zb_schedule **out,
                         zb_diag *diag) {
  lower_state st;
  lower_state_init(&st, s, sim, t_comm);
  for (int r = 0; r < s->p; r++)
    lower_try_ready(&st, r);
  for (;;) {
    bool have = st.ready.n > 0;
    double best_t = have ? st.ready.key[0] : INFINITY;
    if (st.pending.n > 0 && (!have || st.pending.a[0].at <= best_t))
      lower_emit_xfer(&st);
    else if (have)
      lower_emit_compute(&st, ready_pop(&st.ready));
    else
      break;
  }
  for (int r = 0; r < s->p; r++) /* receives after a rank's last compute action */
    lower_flush_recvs(&st, r, INFINITY);
  zb_err err = ZB_OK;
  for (int r = 0; r < s->p; r++)
    if (st.pos[r] < s->ranks[r].n) {
      err = zb_diag_set(diag, ZB_ERR_DEADLOCK, "lowering stuck at rank %d action %d", r, st.pos[r]);
      zb_schedule_free(st.out);
      st.out = NULL;
      break;
    }
  if (st.out)
    lower_mark_batches(st.out);
  *out = st.out;
  lower_state_free(&st);
  return err;
}

/* Whether every F, B and W of c takes time: the per-rank merge's premise. */
static bool lower_costs_positive(const zb_costs *c) {
  for (int st = 0; st < c->n_stages; st++)
    if (!(c->t_f[st] > 0 && c->t_b[st] > 0 && c->t_w[st] > 0))
      return false;
  return true;
}

/* Plans with at least this many compute actions are lowered through their
 * steady state: a short run lowered in full and its period repeated. */
#define LOWER_PERIODIC_ACTIONS 131072
/* Periods the short run keeps in every rank's stretch (zb_period_shrink). */
#define LOWER_KEEP_PERIODS 5

/* Whether lowered holds s's compute actions in s's order on every rank:
 * lowering's own promise, checked on what a repeated period gave. */
static bool lower_keeps_compute(const zb_schedule *s, const zb_schedule *lowered) {
  for (int r = 0; r < s->p; r++) {
    const zb_rank_list *in = &s->ranks[r], *out = &lowered->ranks[r];
    int i = 0;
    for (int k = 0; k < out->n; k++) {
      const zb_action *a = &out->actions[k];
      if (zb_op_is_comm(a->op))
        continue;
      const zb_action *b = &in->actions[i];
      if (i == in->n || a->op != b->op || a->stage != b->stage || a->mb != b->mb || a->overlap != b->overlap)
        return false;
      i++;
    }
    if (i != in->n)
      return false;
  }
  return true;
}

/* run (s with fewer periods of q microbatches) lowered in full and the
 * period of its lists repeated back to s->m: NULL unless run's timeline
 * repeats exactly and the result holds s's compute actions in order. */
static zb_schedule *lower_prolong(const zb_schedule *s, const zb_schedule *run, int q, const zb_costs *c,
                                  const zb_par *par) {
  zb_schedule *low = NULL, *out = NULL;
  zb_lower_merge *mg = NULL;
  if (zb_lower_merge_begin(run, c, par, &mg, NULL) == ZB_OK) {
    if (zb_period_times_repeat(run, q, zb_lower_merge_starts(mg)))
      low = zb_lower_merge_end(mg, NULL); /* and its simulation freed before the long lists exist */
    else
      zb_lower_merge_drop(mg);
  }
  if (low)
    out = zb_period_extend_par(low, s->m, q, par);
  if (out && !lower_keeps_compute(s, out)) {
    zb_schedule_free(out);
    out = NULL;
  }
  zb_schedule_free(low);
  return out;
}

/* s lowered through its steady state (zb_period.h): the run with most of
 * its periods taken out is simulated and merged, and the period of its
 * lowered lists repeated back to s->m. While the timeline repeats, so do
 * the transfers and where they fall between the compute actions, so the
 * lists are those the full merge gives (tests/unit/test_period.c), for a
 * fraction of the simulation and merge. Periods of 1 and 2 microbatches
 * are tried; interleaved schedules repeat only every p, and the short run
 * they keep (warm-up, cool-down and the lag between a rank's chunks, each
 * a round or more) saves less than the second pass costs. NULL when s
 * has no such steady state, a short run would not halve it, or its
 * lowering does not repeat (uneven costs can make the timeline's ties
 * fall differently from period to period). */
static zb_schedule *lower_periodic(const zb_schedule *s, const zb_costs *c, const zb_par *par) {
  for (int q = 1; q <= 2; q++) {
    zb_schedule *run = zb_period_shrink(s, q, LOWER_KEEP_PERIODS), *out = NULL;
    if (run && 2 * run->m <= s->m)
      out = lower_prolong(s, run, q, c, par);
    zb_schedule_free(run);
    if (run || out) /* a steady state of this period: the lowering's to keep, or none */
      return out;
  }
  return NULL;
}

/* s lowered: by the global walk, or merged rank by rank (through a steady
 * state when periodic allows and s has one); figures as in
 * zb_lower_par_figures. */
static zb_err lower_run(const zb_schedule *s, const zb_costs *c, bool global, bool periodic,
                        const zb_par *par, zb_schedule **out, zb_sim_result **figures, zb_diag *diag) {
  if (figures)
    *figures = NULL;
  if (zb_schedule_has_comm(s))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "schedule is already lowered (it has SEND/RECV actions)");
  zb_costs *unit = NULL;
  if (!c) {
    zb_rank_costs rc = zb_rank_costs_default();
    c = unit = zb_costs_from_rank_share(s->p, s->v, &rc, 0);
  }
  bool merge = !global && lower_costs_positive(c);
  if (merge && periodic && zb_lower_compute_actions(s) >= LOWER_PERIODIC_ACTIONS &&
      (*out = lower_periodic(s, c, par)) != NULL) {
    zb_costs_free(unit);
    return ZB_OK;
  }
  zb_err err = ZB_OK;
  zb_lower_merge *mg = NULL;
  if (merge && !(err = zb_lower_merge_begin(s, c, par, &mg, diag)))
    *out = zb_lower_merge_end(mg, figures);
  else if (!merge) {
    zb_sim_result *sim = NULL;
    if (!(err = zb_simulate(s, c, &sim, diag)))
      err = lower_walk(s, sim, c->t_comm, out, diag);
    zb_sim_result_free(sim);
  }
  zb_costs_free(unit);
  return err;
}

/* The gradient reduction, when c asks for it (zb_lower.h): each stage's
 * REDUCE_GRAD at the earliest point, unless the lists carried their own.
 * The compute plan's figures (when handed back) then no longer hold. */
static zb_err lower_reduce(const zb_costs *c, zb_err err, zb_schedule **out, zb_sim_result **figures) {
  if (err || !zb_costs_reduces(c))
    return err;
  if (!zb_schedule_has_reduce(*out))
    zb_reduce_insert(*out, ZB_REDUCE_EARLIEST);
  if (figures) {
    zb_sim_result_free(*figures);
    *figures = NULL;
  }
  return ZB_OK;
}

zb_err zb_lower(const zb_schedule *s, const zb_costs *c, zb_schedule **out, zb_diag *diag) {
  return lower_reduce(c, lower_run(s, c, false, true, NULL, out, NULL, diag), out, NULL);
}

zb_err zb_lower_par(const zb_schedule *s, const zb_costs *c, const zb_par *par, zb_schedule **out,
                    zb_diag *diag) {
  return lower_reduce(c, lower_run(s, c, false, true, par, out, NULL, diag), out, NULL);
}

zb_err zb_lower_par_run(const zb_schedule *s, const zb_schedule *run, int q, const zb_costs *c,
                        const zb_par *par, zb_schedule **out, zb_diag *diag) {
  return zb_lower_par_figures(s, run, q, c, par, out, NULL, diag);
}

zb_err zb_lower_par_figures(const zb_schedule *s, const zb_schedule *run, int q, const zb_costs *c,
                            const zb_par *par, zb_schedule **out, zb_sim_result **figures, zb_diag *diag) {
  if (figures)
    *figures = NULL;
  /* an s that is lowered already fails lower_keeps_compute, and then
   * lower_run refuses it: no scan for comm actions up front */
  bool fits = run && c && run->p == s->p && run->v == s->v && run->placement == s->placement &&
              lower_costs_positive(c);
  if (fits && (*out = lower_prolong(s, run, q, c, par)) != NULL)
    return lower_reduce(c, ZB_OK, out, figures);
  return lower_reduce(c, lower_run(s, c, false, true, par, out, figures, diag), out, figures);
}

zb_err zb_lower_full_par(const zb_schedule *s, const zb_costs *c, const zb_par *par, zb_schedule **out,
                         zb_diag *diag) {
  return lower_reduce(c, lower_run(s, c, false, false, par, out, NULL, diag), out, NULL);
}

zb_err zb_lower_global(const zb_schedule *s, const zb_costs *c, zb_schedule **out, zb_diag *diag) {
  return lower_reduce(c, lower_run(s, c, true, false, NULL, out, NULL, diag), out, NULL);
}
