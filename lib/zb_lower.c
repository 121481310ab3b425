/* zb_lower.c — see zb_lower.h. Two forms of one pass: the global walk
 * over the simulated timeline (the definition) and the per-rank merge
 * that gives the same lists when every op takes time (the fast path). */
#include "zb_lower.h"

#include <math.h>
#include <stdlib.h>

#include "zb_alloc.h"
#include "zb_period.h"
#include "zb_sim.h"

/* A pending transfer: the output of a producer op that another rank needs. */
typedef struct lower_xfer {
  double at; /* producer end */
  long seq;  /* emission order, for deterministic ties */
  zb_action send, recv;
  int from, to;
} lower_xfer;

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
  int S;
  unsigned char *f_sent, *b_sent;
  int *pos;       /* next compute action per rank */
  bool *in_ready; /* per rank: in ready */
  ready_heap ready;
  xfer_heap pending;
  long seq;
  zb_schedule *out;
} lower_state;

static void lower_state_init(lower_state *st, const zb_schedule *s, const zb_sim_result *sim) {
  *st = (lower_state){.s = s, .sim = sim, .S = zb_schedule_stages(s)};
  size_t cells = (size_t)st->S * (size_t)s->m;
  st->f_sent = zb_calloc(cells, 1);
  st->b_sent = zb_calloc(cells, 1);
  st->pos = zb_calloc((size_t)s->p, sizeof(int));
  st->in_ready = zb_calloc((size_t)s->p, sizeof(bool));
  st->ready.rank = zb_malloc(sizeof(int) * (size_t)s->p);
  st->ready.key = zb_malloc(sizeof(double) * (size_t)s->p);
  st->out = zb_schedule_new(s->p, s->v, s->m, s->placement);
}

static void lower_state_free(lower_state *st) {
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

/* Emits the earliest pending transfer: the send on the producer's rank and
 * the matching receive on the consumer's, at one global step. */
static void lower_emit_xfer(lower_state *st) {
  lower_xfer x = xfer_pop(&st->pending);
  zb_schedule_push(st->out, x.from, x.send);
  zb_schedule_push(st->out, x.to, x.recv);
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
static zb_err lower_walk(const zb_schedule *s, const zb_sim_result *sim, zb_schedule **out, zb_diag *diag) {
  lower_state st;
  lower_state_init(&st, s, sim);
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

/* ---- the per-rank merge: the same order, one rank at a time ----
 *
 * The walk above emits every event in one global order: by time, a
 * transfer before a compute action on a tie, transfers by (producer end,
 * emission order), compute actions by (start, rank). When every F, B and
 * W takes time, a producer starts strictly before its output can be used,
 * so the emission order of producers is their (start, rank) order, and a
 * rank's part of the global order is a merge of three sorted streams it
 * can compute alone: its own actions by start, its sends (its producers'
 * ends), and its receives (each neighbour's producers for it, in that
 * neighbour's list order). Merging rank by rank reads each list a few
 * times, front to back, instead of jumping between 2p streams in time
 * order, and gives the same lists (tests/unit/test_lower.c). */

/* Where the output of action a on rank r goes: the consuming rank, or -1
 * when it stays on r (or a produces nothing another stage takes). */
static int lower_out_rank(const int *stage_rank, int S, int r, const zb_action *a) {
  int to = -1;
  if (a->op == ZB_OP_F && a->stage + 1 < S)
    to = stage_rank[a->stage + 1];
  else if ((a->op == ZB_OP_B || a->op == ZB_OP_BW) && a->stage > 0)
    to = stage_rank[a->stage - 1];
  return to == r ? -1 : to;
}

/* What every piece of the per-rank merge reads, and where it writes (each
 * piece its own ranks' lists of out). sim has start times only: an op's
 * end is its start plus its cost under c, as the simulation sums it. */
typedef struct lower_job {
  const zb_schedule *s;
  const zb_sim_result *sim;
  const zb_costs *c;
  const int *stage_rank, *feed, *nfeed;
  int cap, pieces;
  zb_schedule *out;
} lower_job;

/* One sorted stream of rank r's transfers, read straight off the list of
 * the producing rank q: r's own sends (q == r) or its receives from
 * feeder q, in q's list order, which is their (producer end, producer
 * start) order. Its head is the action at i (i == n: the stream is dry),
 * with its producer's end and start. */
typedef struct xfer_stream {
  const zb_action *acts;
  const double *start;
  int n, i, q, r;
  double at, pstart;
} xfer_stream;

/* Moves s's head to the next producer at or after i whose output r takes. */
static void xfer_stream_seek(const lower_job *j, xfer_stream *x, int i) {
  int S = zb_schedule_stages(j->s);
  for (; i < x->n; i++) {
    const zb_action *a = &x->acts[i];
    int to = lower_out_rank(j->stage_rank, S, x->q, a);
    if (to >= 0 && (x->q == x->r || to == x->r)) {
      x->pstart = x->start[i];
      x->at = x->pstart + zb_costs_time(j->c, (zb_op)a->op, a->stage);
      break;
    }
  }
  x->i = i;
}

static void xfer_stream_open(const lower_job *j, xfer_stream *x, int q, int r) {
  *x = (xfer_stream){
      .acts = j->s->ranks[q].actions, .start = j->sim->start[q], .n = j->s->ranks[q].n, .q = q, .r = r};
  xfer_stream_seek(j, x, 0);
}

/* Whether x's head goes before y's: the walk's order of transfers, by
 * producer end, then emission order (producer start, then rank). */
static bool xfer_stream_before(const xfer_stream *x, const xfer_stream *y) {
  if (x->at != y->at)
    return x->at < y->at;
  if (x->pstart != y->pstart)
    return x->pstart < y->pstart;
  return x->q < y->q;
}

/* Starts a batch at l's last action when it and the next one are comm. */
static void lower_batch_prev(zb_rank_list *l, zb_op next) {
  if (l->n > 0 && zb_op_is_comm(next) && zb_op_is_comm(l->actions[l->n - 1].op))
    l->actions[l->n - 1].batch = true;
}

/* Appends to l the SEND (own stream) or RECV that x's head is for rank
 * x->r. Written field by field: an action built whole on the stack and
 * copied costs a stalled reload of its narrow fields for every one. */
static void lower_append_xfer(const lower_job *j, const xfer_stream *x, zb_rank_list *l) {
  const zb_action *a = &x->acts[x->i];
  bool fwd = a->op == ZB_OP_F, own = x->q == x->r;
  zb_op op = own ? (fwd ? ZB_OP_SEND_F : ZB_OP_SEND_B) : (fwd ? ZB_OP_RECV_F : ZB_OP_RECV_B);
  lower_batch_prev(l, op);
  zb_action *o = &l->actions[l->n++];
  o->stage = own ? a->stage : a->stage + (fwd ? 1 : -1);
  o->mb = a->mb;
  o->peer = own ? lower_out_rank(j->stage_rank, zb_schedule_stages(j->s), x->q, a) : x->q;
  o->op = (uint8_t)op;
  o->batch = false;
  o->overlap = false;
}

/* Appends compute action a to l (its batch flag cleared: comm only). */
static void lower_append_compute(zb_rank_list *l, const zb_action *a) {
  zb_action *o = &l->actions[l->n++];
  *o = *a;
  o->batch = false;
}

/* Per rank, the ranks whose producers feed it (hosts of the stages next
 * to its own, itself left out): feed[r * cap ...], nfeed[r] of them. */
static void lower_feeders(const zb_schedule *s, const int *stage_rank, int cap, int *feed, int *nfeed) {
  int S = zb_schedule_stages(s);
  for (int st = 0; st < S; st++)
    for (int t = st - 1; t <= st + 1; t += 2) {
      int r = stage_rank[st];
      if (t < 0 || t >= S || stage_rank[t] == r)
        continue;
      bool seen = false;
      for (int k = 0; k < nfeed[r] && !seen; k++)
        seen = feed[r * cap + k] == stage_rank[t];
      if (!seen)
        feed[r * cap + nfeed[r]++] = stage_rank[t];
    }
}

/* Rank r's lowered list: its own actions by start merged with its
 * transfers, which are its sends and the receives from each feeder, each
 * a sorted stream (a transfer first on a tie). x: 1 + cap streams. */
static void lower_rank(const lower_job *j, int r, xfer_stream *x) {
  const int *feed = j->feed + (size_t)r * j->cap;
  int streams = 1 + j->nfeed[r];
  xfer_stream_open(j, &x[0], r, r);
  for (int k = 0; k < j->nfeed[r]; k++)
    xfer_stream_open(j, &x[1 + k], feed[k], r);
  const zb_rank_list *in = &j->s->ranks[r];
  const double *start = j->sim->start[r];
  zb_rank_list *l = &j->out->ranks[r]; /* room for in->n and every transfer (lower_room) */
  for (int i = 0;;) {
    xfer_stream *best = NULL;
    for (int k = 0; k < streams; k++)
      if (x[k].i < x[k].n && (!best || xfer_stream_before(&x[k], best)))
        best = &x[k];
    if (best && (i == in->n || best->at <= start[i])) {
      lower_append_xfer(j, best, l);
      xfer_stream_seek(j, best, best->i + 1);
    } else if (i < in->n)
      lower_append_compute(l, &in->actions[i++]);
    else
      return;
  }
}

/* Piece k: a contiguous share of the ranks. */
static void lower_piece(void *arg, int k) {
  const lower_job *j = arg;
  int r0 = zb_par_share(j->s->p, k, j->pieces), r1 = zb_par_share(j->s->p, k + 1, j->pieces);
  xfer_stream *x = zb_malloc(sizeof *x * (size_t)(1 + j->cap));
  for (int r = r0; r < r1; r++)
    lower_rank(j, r, x);
  free(x);
}

/* Room in out for every rank's lowered list: its actions and the
 * transfers it takes part in. */
static void lower_room(const zb_schedule *s, const int *stage_rank, zb_schedule *out) {
  int S = zb_schedule_stages(s);
  int *n = zb_calloc((size_t)s->p, sizeof(int));
  for (int q = 0; q < s->p; q++)
    for (int i = 0; i < s->ranks[q].n; i++) {
      int to = lower_out_rank(stage_rank, S, q, &s->ranks[q].actions[i]);
      if (to < 0)
        continue;
      n[q]++;
      n[to]++;
    }
  for (int q = 0; q < s->p; q++)
    n[q] += s->ranks[q].n;
  zb_schedule_reserve_all(out, n);
  free(n);
}

static long lower_compute_actions(const zb_schedule *s) {
  long n = 0;
  for (int r = 0; r < s->p; r++)
    n += s->ranks[r].n;
  return n;
}

/* Actions per piece below which splitting the merge is not worth a thread. */
#define LOWER_PIECE_ACTIONS 200000

/* Everything the merge needs but the simulation: the ranks' feeders, the
 * pieces, and out with every list's room. */
static void lower_prepare(lower_job *j, const zb_schedule *s, const zb_costs *c, const zb_par *par) {
  int p = s->p, S = zb_schedule_stages(s), cap = 2 * s->v;
  int *stage_rank = zb_malloc(sizeof(int) * (size_t)S);
  for (int st = 0; st < S; st++)
    stage_rank[st] = zb_stage_rank(s, st);
  int *feed = zb_malloc(sizeof(int) * (size_t)p * (size_t)cap), *nfeed = zb_calloc((size_t)p, sizeof(int));
  lower_feeders(s, stage_rank, cap, feed, nfeed);
  int pieces = zb_par_width(par);
  if (pieces > p)
    pieces = p;
  if (lower_compute_actions(s) < (long)pieces * LOWER_PIECE_ACTIONS)
    pieces = 1;
  *j = (lower_job){.s = s,
                   .c = c,
                   .stage_rank = stage_rank,
                   .feed = feed,
                   .nfeed = nfeed,
                   .cap = cap,
                   .pieces = pieces,
                   .out = zb_schedule_new(s->p, s->v, s->m, s->placement)};
  lower_room(s, stage_rank, j->out);
}

static void lower_job_free(lower_job *j) {
  free((int *)j->feed);
  free((int *)j->nfeed);
  free((int *)j->stage_rank);
}

/* The merge of s into j->out (lower_prepare's), from sim's start times. */
static zb_schedule *lower_merge(lower_job *j, const zb_par *par, const zb_sim_result *sim) {
  j->sim = sim;
  zb_par_run(par, lower_piece, j, j->pieces);
  lower_job_free(j);
  return j->out;
}

/* The simulation of s and lower_prepare at once: one is a single pass,
 * and the other's lists, a few hundred megabytes at scale, are faulted in
 * beside it rather than by the merge that fills them. */
typedef struct lower_start {
  const zb_schedule *s;
  const zb_costs *c;
  const zb_par *par;
  lower_job job;
  zb_sim_result *sim;
  zb_err err;
  zb_diag diag;
} lower_start;

static void lower_start_piece(void *arg, int k) {
  lower_start *ls = arg;
  if (k == 0) {
    ls->err = zb_simulate_starts(ls->s, ls->c, &ls->sim, &ls->diag);
    return;
  }
  lower_prepare(&ls->job, ls->s, ls->c, ls->par);
  const zb_schedule *o = ls->job.out;
  if (zb_par_width(ls->par) == 1 || o->p == 0)
    return; /* alone, it would only move the faults */
  /* short of the simulation's scratch, which is freed before the merge:
   * the plan's peak memory stays the merge's */
  const zb_rank_list *last = &o->ranks[o->p - 1];
  size_t bytes = sizeof *o->block * (size_t)(last->actions + last->cap - o->block);
  size_t scratch = zb_sim_scratch_bytes(ls->s);
  if (bytes > scratch)
    zb_prefault(o->block, bytes - scratch);
}

/* Runs ls's two pieces for s; on failure (s cannot be simulated) frees
 * what they made and returns the simulation's error, with diag. */
static zb_err lower_start_run(lower_start *ls, const zb_schedule *s, const zb_costs *c, const zb_par *par,
                              zb_diag *diag) {
  *ls = (lower_start){.s = s, .c = c, .par = par};
  zb_par_run(par, lower_start_piece, ls, 2);
  if (!ls->err)
    return ZB_OK;
  lower_job_free(&ls->job);
  zb_schedule_free(ls->job.out);
  zb_sim_result_free(ls->sim);
  if (diag)
    *diag = ls->diag;
  return ls->err;
}

/* s simulated and merged rank by rank into *out. */
static zb_err lower_by_rank(const zb_schedule *s, const zb_costs *c, const zb_par *par, zb_schedule **out,
                            zb_diag *diag) {
  lower_start ls;
  zb_err err = lower_start_run(&ls, s, c, par, diag);
  if (err)
    return err;
  *out = lower_merge(&ls.job, par, ls.sim);
  zb_sim_result_free(ls.sim);
  return ZB_OK;
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
  lower_start ls;
  if (lower_start_run(&ls, run, c, par, NULL) == ZB_OK) {
    if (zb_period_times_repeat(run, q, ls.sim->start))
      low = lower_merge(&ls.job, par, ls.sim);
    else {
      lower_job_free(&ls.job);
      zb_schedule_free(ls.job.out);
    }
    zb_sim_result_free(ls.sim); /* before the long lists exist: the plan's peak memory */
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

static zb_err lower_run(const zb_schedule *s, const zb_costs *c, bool global, bool periodic,
                        const zb_par *par, zb_schedule **out, zb_diag *diag) {
  if (zb_schedule_has_comm(s))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "schedule is already lowered (it has SEND/RECV actions)");
  zb_costs *unit = NULL;
  if (!c) {
    zb_rank_costs rc = zb_rank_costs_default();
    c = unit = zb_costs_from_rank_share(s->p, s->v, &rc, 0);
  }
  bool merge = !global && lower_costs_positive(c);
  if (merge && periodic && lower_compute_actions(s) >= LOWER_PERIODIC_ACTIONS &&
      (*out = lower_periodic(s, c, par)) != NULL) {
    zb_costs_free(unit);
    return ZB_OK;
  }
  zb_err err = ZB_OK;
  if (merge)
    err = lower_by_rank(s, c, par, out, diag);
  else {
    zb_sim_result *sim = NULL;
    if (!(err = zb_simulate(s, c, &sim, diag)))
      err = lower_walk(s, sim, out, diag);
    zb_sim_result_free(sim);
  }
  zb_costs_free(unit);
  return err;
}

zb_err zb_lower(const zb_schedule *s, const zb_costs *c, zb_schedule **out, zb_diag *diag) {
  return lower_run(s, c, false, true, NULL, out, diag);
}

zb_err zb_lower_par(const zb_schedule *s, const zb_costs *c, const zb_par *par, zb_schedule **out,
                    zb_diag *diag) {
  return lower_run(s, c, false, true, par, out, diag);
}

zb_err zb_lower_par_run(const zb_schedule *s, const zb_schedule *run, int q, const zb_costs *c,
                        const zb_par *par, zb_schedule **out, zb_diag *diag) {
  /* an s that is lowered already fails lower_keeps_compute, and then
   * zb_lower_par refuses it: no scan for comm actions up front */
  bool fits = run && c && run->p == s->p && run->v == s->v && run->placement == s->placement &&
              lower_costs_positive(c);
  if (fits && (*out = lower_prolong(s, run, q, c, par)) != NULL)
    return ZB_OK;
  return zb_lower_par(s, c, par, out, diag);
}

zb_err zb_lower_full_par(const zb_schedule *s, const zb_costs *c, const zb_par *par, zb_schedule **out,
                         zb_diag *diag) {
  return lower_run(s, c, false, false, par, out, diag);
}

zb_err zb_lower_global(const zb_schedule *s, const zb_costs *c, zb_schedule **out, zb_diag *diag) {
  return lower_run(s, c, true, false, NULL, out, diag);
}
