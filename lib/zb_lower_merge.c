/* zb_lower_merge.c — lowering's per-rank merge (zb_lower_internal.h):
 * the global walk's lists (zb_lower.c), one rank at a time.
 *
 * The walk emits every event in one global order: by time, a
 * transfer before a compute action on a tie, transfers by (producer end,
 * emission order), compute actions by (start, rank); a transfer's send
 * goes in there, its receive once the tensor arrives or the receiving
 * rank's next send goes in, whichever is first. When every F, B and
 * W takes time, a producer starts strictly before its output can be used,
 * so the emission order of producers is their (start, rank) order, and a
 * rank's part of the global order is a merge of three sorted streams it
 * can compute alone: its own actions by start, its sends (its producers'
 * ends), and its receives (each neighbour's producers for it, in that
 * neighbour's list order). Merging rank by rank reads each list a few
 * times, front to back, instead of jumping between 2p streams in time
 * order, and gives the same lists (tests/unit/test_lower.c). */
#include "zb_lower_internal.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "zb_alloc.h"

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
  int cap, pieces, stages;
  /* per compute action of s, rank q's from dst[q]: 1 + the index in q's
   * feeders (feed) of the rank its output goes to (a rank has at most two
   * under loop or V placement, zb_schedule_peers), 0 when it stays or
   * goes nowhere, LOWER_DST_ELSE when it goes to a rank that is not a
   * peer (an action on a rank that does not host its stage) */
  uint8_t **dst;
  double *op_time; /* zb_costs_op_table of c's times, looked up for every transfer */
  zb_schedule *out;
  bool *kept; /* per rank: every receive arrives by the start of the compute action it precedes */
} lower_job;

#define LOWER_DST_ELSE 255

/* One sorted stream of rank r's transfers, read straight off the list of
 * the producing rank q: r's own sends (q == r) or its receives from
 * feeder q, in q's list order, which is their (producer end, producer
 * start) order. Its head is the action at i (i == n: the stream is dry),
 * with its producer's end and start. */
typedef struct xfer_stream {
  const zb_action *acts;
  const double *start;
  const uint8_t *dst; /* q's destinations (lower_job) */
  int n, i, q, r;
  uint8_t want; /* r's among q's feeders (1 + index); 0: any, r's own sends */
  double at, pstart;
} xfer_stream;

/* Moves s's head to the next producer at or after i whose output r
 * takes: a walk over q's destination bytes, not its actions. */
static void xfer_stream_seek(const lower_job *j, xfer_stream *x, int i) {
  if (x->want)
    while (i < x->n && x->dst[i] != x->want)
      i++;
  else
    while (i < x->n && x->dst[i] == 0)
      i++;
  if (i < x->n) {
    const zb_action a = x->acts[i];
    x->pstart = x->start[i];
    x->at = x->pstart + j->op_time[zb_costs_op_at((zb_op)a.op, a.stage, j->stages)];
  } else /* dry: after every head (xfer_stream_first) */
    x->at = x->pstart = INFINITY;
  x->i = i;
}

static void xfer_stream_open(const lower_job *j, xfer_stream *x, int q, int r) {
  uint8_t want = 0;
  for (int k = 0; k < j->nfeed[q] && q != r; k++)
    if (j->feed[q * j->cap + k] == r)
      want = (uint8_t)(k + 1);
  *x = (xfer_stream){.acts = j->s->ranks[q].actions,
                     .start = j->sim->start[q],
                     .dst = j->dst[q],
                     .n = j->s->ranks[q].n,
                     .q = q,
                     .r = r,
                     .want = want};
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

/* The stream whose head goes first (xfer_stream_before); NULL when all
 * are dry. A dry stream's head is at infinity, so it comes first only
 * when all are dry. */
static xfer_stream *xfer_stream_first(xfer_stream *x, int streams) {
  xfer_stream *best = &x[0];
  for (int k = 1; k < streams; k++)
    if (xfer_stream_before(&x[k], best))
      best = &x[k];
  return best->i < best->n ? best : NULL;
}

/* Appends to l the SEND (own stream) or RECV that x's head is for rank
 * x->r, in one batch with l's last action when that is a transfer too
 * (after_xfer: the input lists hold no comm actions, so only this
 * appends them). Written field by field: an action built whole on the
 * stack and copied costs a stalled reload of its narrow fields for every
 * one. */
static void lower_append_xfer(const lower_job *j, const xfer_stream *x, zb_rank_list *l, bool after_xfer) {
  const zb_action *a = &x->acts[x->i];
  bool fwd = a->op == ZB_OP_F, own = x->q == x->r;
  zb_op op = own ? (fwd ? ZB_OP_SEND_F : ZB_OP_SEND_B) : (fwd ? ZB_OP_RECV_F : ZB_OP_RECV_B);
  if (after_xfer)
    l->actions[l->n - 1].batch = true;
  zb_action *o = &l->actions[l->n++];
  o->stage = own ? a->stage : a->stage + (fwd ? 1 : -1);
  o->mb = a->mb;
  uint8_t d = x->dst[x->i];
  o->peer = !own                  ? x->q
            : d == LOWER_DST_ELSE ? lower_out_rank(j->stage_rank, zb_schedule_stages(j->s), x->q, a)
                                  : j->feed[x->q * j->cap + d - 1];
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
  const double t_comm = j->c->t_comm;
  bool kept = true, after_xfer = false;
  xfer_stream *best = xfer_stream_first(x, streams);
  for (int i = 0;;) {
    /* A send is due at its producer's end; a receive when its tensor
     * arrives, or sooner when a send of r's that comes later in transfer
     * order (r's own stream's head, as best is the first) is due: each
     * rank's comm actions stay in transfer order. */
    double due = best && best->q != r && x[0].at > best->at + t_comm ? best->at + t_comm : x[0].at;
    if (best && (i == in->n || due <= start[i])) {
      if (best->q != r) /* a receive: does the rank wait for it longer than s's timeline does? */
        kept = kept && i < in->n && best->at + t_comm <= start[i];
      lower_append_xfer(j, best, l, after_xfer);
      after_xfer = true;
      xfer_stream_seek(j, best, best->i + 1);
      best = xfer_stream_first(x, streams);
    } else if (i < in->n) { /* the streams stay as they were, and so does the first */
      lower_append_compute(l, &in->actions[i++]);
      after_xfer = false;
    } else
      break;
  }
  j->kept[r] = kept;
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

/* Every compute action's destination byte (j->dst), and room in j->out
 * for every rank's lowered list: its actions and the transfers it takes
 * part in. */
static void lower_room(lower_job *j) {
  const zb_schedule *s = j->s;
  int S = zb_schedule_stages(s);
  int *n = zb_calloc((size_t)s->p, sizeof(int));
  j->dst = zb_malloc(sizeof *j->dst * (size_t)s->p);
  j->dst[0] = zb_malloc_large((size_t)zb_lower_compute_actions(s) + 1);
  for (int q = 0; q < s->p; q++) {
    if (q > 0)
      j->dst[q] = j->dst[q - 1] + s->ranks[q - 1].n;
    const int *feed = j->feed + (size_t)q * j->cap;
    for (int i = 0; i < s->ranks[q].n; i++) {
      int to = lower_out_rank(j->stage_rank, S, q, &s->ranks[q].actions[i]), k = 0;
      while (to >= 0 && k < j->nfeed[q] && feed[k] != to)
        k++;
      j->dst[q][i] = (uint8_t)(to < 0 ? 0 : k < j->nfeed[q] ? k + 1 : LOWER_DST_ELSE);
      if (to < 0)
        continue;
      n[q]++;
      n[to]++;
    }
  }
  for (int q = 0; q < s->p; q++)
    n[q] += s->ranks[q].n;
  zb_schedule_reserve_all(j->out, n);
  free(n);
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
  zb_schedule_peers(s, cap, feed, nfeed); /* the ranks whose producers feed each */
  int pieces = zb_par_width(par);
  if (pieces > p)
    pieces = p;
  if (zb_lower_compute_actions(s) < (long)pieces * LOWER_PIECE_ACTIONS)
    pieces = 1;
  *j = (lower_job){.s = s,
                   .c = c,
                   .stage_rank = stage_rank,
                   .feed = feed,
                   .nfeed = nfeed,
                   .cap = cap,
                   .pieces = pieces,
                   .stages = c->n_stages, /* op_time's layout */
                   .op_time = zb_costs_op_table(c, false),
                   .out = zb_schedule_new(s->p, s->v, s->m, s->placement),
                   .kept = zb_malloc(sizeof(bool) * (size_t)p)};
  lower_room(j);
}

static void lower_job_free(lower_job *j) {
  if (j->dst)
    free(j->dst[0]);
  free(j->dst);
  free(j->op_time);
  free((int *)j->feed);
  free((int *)j->nfeed);
  free((int *)j->stage_rank);
  free(j->kept);
}

/* The simulation of s and lower_prepare at once: one is a single pass,
 * and the other's lists, a few hundred megabytes at scale, are faulted in
 * beside it rather than by the merge that fills them. */
struct zb_lower_merge {
  const zb_schedule *s;
  const zb_costs *c;
  const zb_par *par;
  lower_job job;
  zb_sim_result *sim;
  zb_err err;
  zb_diag diag;
};

static void lower_start_piece(void *arg, int k) {
  zb_lower_merge *ls = arg;
  if (k == 0) {
    ls->err = zb_simulate_into(ls->s, ls->c, ls->sim, &ls->diag);
    return;
  }
  bool beside = zb_par_width(ls->par) > 1; /* alone, faulting ahead would only move the faults */
  if (beside)                              /* the start times the simulation is writing, ahead of it */
    zb_sim_result_populate(ls->sim, ls->s);
  lower_prepare(&ls->job, ls->s, ls->c, ls->par);
  const zb_schedule *o = ls->job.out;
  if (!beside || o->p == 0)
    return;
  /* short of the simulation's scratch, which is freed before the merge
   * (the plan's peak memory stays the merge's), that much less of each
   * piece's ranks: the merge's pieces fault in alike */
  size_t scratch = zb_sim_scratch_bytes(ls->s) / (size_t)ls->job.pieces;
  for (int piece = 0; piece < ls->job.pieces; piece++) {
    const zb_rank_list *first = &o->ranks[zb_par_share(o->p, piece, ls->job.pieces)];
    const zb_rank_list *last = &o->ranks[zb_par_share(o->p, piece + 1, ls->job.pieces) - 1];
    size_t bytes = sizeof *o->block * (size_t)(last->actions + last->cap - first->actions);
    if (bytes > scratch)
      zb_prefault(first->actions, bytes - scratch);
  }
}

zb_err zb_lower_merge_begin(const zb_schedule *s, const zb_costs *c, const zb_par *par, zb_lower_merge **out,
                            zb_diag *diag) {
  zb_lower_merge *ls = zb_calloc(1, sizeof *ls);
  *ls = (zb_lower_merge){.s = s, .c = c, .par = par, .sim = zb_sim_result_new_starts(s)};
  zb_par_run(par, lower_start_piece, ls, 2);
  zb_err err = ls->err;
  if (err) {
    if (diag)
      *diag = ls->diag;
    zb_lower_merge_drop(ls);
    ls = NULL;
  }
  *out = ls;
  return err;
}

double *const *zb_lower_merge_starts(const zb_lower_merge *ls) {
  return ls->sim->start;
}

zb_schedule *zb_lower_merge_end(zb_lower_merge *ls, zb_sim_result **figures) {
  lower_job *j = &ls->job;
  j->sim = ls->sim;
  zb_par_run(ls->par, lower_piece, j, j->pieces);
  bool kept = true;
  for (int r = 0; r < ls->s->p; r++)
    kept = kept && j->kept[r];
  zb_schedule *out = j->out;
  j->out = NULL;
  if (figures && kept) { /* s's figures, without its per-action times */
    *figures = ls->sim;
    free(ls->sim->start[0]);
    free(ls->sim->start);
    ls->sim->start = NULL;
    ls->sim = NULL;
  } else if (figures)
    *figures = NULL;
  zb_lower_merge_drop(ls);
  return out;
}

void zb_lower_merge_drop(zb_lower_merge *ls) {
  if (!ls)
    return;
  lower_job_free(&ls->job);
  zb_schedule_free(ls->job.out);
  zb_sim_result_free(ls->sim);
  free(ls);
}
