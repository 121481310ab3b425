/* zb_timeline.c — summaries of measured timelines (zb_timeline.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_timeline.h"

static zb_err check_rank(const zb_tl_rank *rk, int r, zb_diag *diag) {
  if (rk->n < 0 || (rk->n > 0 && !rk->ops))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "timeline of rank %d: %d ops", r, rk->n);
  for (int i = 0; i < rk->n; i++) {
    const zb_tl_op *o = &rk->ops[i];
    if (!isfinite(o->start) || !isfinite(o->end) || o->end < o->start)
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                         "timeline of rank %d, op %d (%s s%d mb%d): ends at %g before %g", r, i,
                         zb_op_name(o->op), o->stage, o->mb, o->end, o->start);
  }
  return ZB_OK;
}

/* One rank's compute sums; its compute span in *first, *last (NAN without
 * one) and the end of its last reduction in *reduced (NAN without one). */
static void sum_rank(const zb_tl_rank *rk, zb_tl_summary *s, int r, double *first, double *last,
                     double *reduced) {
  *first = NAN;
  *last = NAN;
  *reduced = NAN;
  for (int i = 0; i < rk->n; i++) {
    const zb_tl_op *o = &rk->ops[i];
    double d = o->end - o->start;
    if (zb_op_is_compute(o->op)) {
      s->compute[r] += d;
      s->compute_ops[r]++;
      if (isnan(*first) || o->start < *first)
        *first = o->start;
      if (isnan(*last) || o->end > *last)
        *last = o->end;
    } else if (o->op == ZB_OP_REDUCE_GRAD) {
      s->reduce[r] += d;
      s->reduce_ops[r]++;
      if (isnan(*reduced) || o->end > *reduced)
        *reduced = o->end;
    } else {
      s->groups[r]++;
    }
  }
}

/* Seconds of one rank's transport groups and reductions inside [start,
 * end] (a RECV posted before the first compute op waits outside the
 * span). */
static double comm_in_span(const zb_tl_rank *rk, double start, double end) {
  double sum = 0;
  for (int i = 0; i < rk->n; i++) {
    const zb_tl_op *o = &rk->ops[i];
    double a = o->start > start ? o->start : start, b = o->end < end ? o->end : end;
    if (!zb_op_is_compute(o->op) && b > a)
      sum += b - a;
  }
  return sum;
}

zb_err zb_timeline_summarize(const zb_tl_rank *ranks, int p, zb_tl_summary *out, zb_diag *diag) {
  memset(out, 0, sizeof *out);
  if (p < 1 || !ranks)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "timelines of %d ranks", p);
  for (int r = 0; r < p; r++) {
    zb_err err = check_rank(&ranks[r], r, diag);
    if (err)
      return err;
  }
  out->p = p;
  out->compute = zb_calloc((size_t)p, sizeof(double));
  out->comm = zb_calloc((size_t)p, sizeof(double));
  out->idle = zb_calloc((size_t)p, sizeof(double));
  out->compute_ops = zb_calloc((size_t)p, sizeof(int));
  out->groups = zb_calloc((size_t)p, sizeof(int));
  out->reduce = zb_calloc((size_t)p, sizeof(double));
  out->reduce_ops = zb_calloc((size_t)p, sizeof(int));
  double start = NAN, end = NAN, busy_sum = 0, busy_max = 0;
  for (int r = 0; r < p; r++) {
    double first, last, reduced;
    sum_rank(&ranks[r], out, r, &first, &last, &reduced);
    if (!isnan(first)) {
      /* the iteration ends when the last reduction does (the simulator's
       * makespan); a rank's own span, the paper's, stays compute only */
      double ends = !isnan(reduced) && reduced > last ? reduced : last;
      start = isnan(start) || first < start ? first : start;
      end = isnan(end) || ends > end ? ends : end;
      if (last - first > out->max_span)
        out->max_span = last - first;
    }
    busy_sum += out->compute[r];
    if (out->compute[r] > busy_max)
      busy_max = out->compute[r];
  }
  if (isnan(start))
    return ZB_OK;
  out->start = start;
  out->end = end;
  out->span = end - start;
  for (int r = 0; r < p; r++) {
    out->comm[r] = comm_in_span(&ranks[r], start, end);
    double idle = out->span - out->compute[r] - out->comm[r];
    out->idle[r] = idle > 0 ? idle : 0;
  }
  out->bubble_ratio = out->span > 0 ? 1.0 - busy_sum / (p * out->span) : 0;
  out->bubble_ratio_paper = out->max_span > 0 ? (out->max_span - busy_max) / out->max_span : 0;
  return ZB_OK;
}

void zb_tl_summary_free(zb_tl_summary *s) {
  if (!s)
    return;
  free(s->compute);
  free(s->comm);
  free(s->idle);
  free(s->compute_ops);
  free(s->groups);
  free(s->reduce);
  free(s->reduce_ops);
  memset(s, 0, sizeof *s);
}

bool zb_clock_offset_add(zb_clock_offset *c, double t1, double t2, double t3, double t4) {
  double delay = (t4 - t1) - (t3 - t2);
  if (!isfinite(t1) || !isfinite(t2) || !isfinite(t3) || !isfinite(t4) || t4 < t1 || t3 < t2 || delay < 0)
    return false;
  c->offset[c->next] = ((t2 - t1) + (t3 - t4)) / 2;
  c->delay[c->next] = delay;
  c->next = (c->next + 1) % ZB_CLOCK_SAMPLES;
  if (c->n < ZB_CLOCK_SAMPLES)
    c->n++;
  return true;
}

bool zb_clock_offset_get(const zb_clock_offset *c, double *offset, double *delay) {
  if (c->n == 0)
    return false;
  int best = 0;
  for (int i = 1; i < c->n; i++)
    if (c->delay[i] < c->delay[best])
      best = i;
  *offset = c->offset[best];
  *delay = c->delay[best];
  return true;
}

/* ---- costs ---- */

typedef struct tl_acc {
  double *sum_f, *sum_b, *sum_w;
  int *n_f, *n_b, *n_w;
} tl_acc;

static void acc_op(tl_acc *a, const zb_costs *prior, const zb_tl_op *o) {
  double d = o->end - o->start;
  int s = o->stage;
  if (o->op == ZB_OP_F) {
    a->sum_f[s] += d;
    a->n_f[s]++;
  } else if (o->op == ZB_OP_B) {
    a->sum_b[s] += d;
    a->n_b[s]++;
  } else if (o->op == ZB_OP_W) {
    a->sum_w[s] += d;
    a->n_w[s]++;
  } else if (o->op == ZB_OP_BW) {
    double tb = prior->t_b[s], tw = prior->t_w[s], share = tb + tw > 0 ? tb / (tb + tw) : 1.0;
    a->sum_b[s] += d * share;
    a->n_b[s]++;
    a->sum_w[s] += d * (1 - share);
    a->n_w[s]++;
  }
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

/* Producers' ends and ranks by (stage, mb): F outputs and B/BW outputs. */
typedef struct tl_ends {
  int n_stages, m;
  double *f_end, *b_end;
  int *f_rank, *b_rank;
} tl_ends;

static void ends_fill(const zb_tl_rank *ranks, int p, tl_ends *e) {
  size_t n = (size_t)e->n_stages * (size_t)e->m;
  e->f_end = zb_malloc(sizeof(double) * n);
  e->b_end = zb_malloc(sizeof(double) * n);
  e->f_rank = zb_malloc(sizeof(int) * n);
  e->b_rank = zb_malloc(sizeof(int) * n);
  for (size_t i = 0; i < n; i++) {
    e->f_end[i] = e->b_end[i] = NAN;
    e->f_rank[i] = e->b_rank[i] = -1;
  }
  for (int r = 0; r < p; r++)
    for (int i = 0; i < ranks[r].n; i++) {
      const zb_tl_op *o = &ranks[r].ops[i];
      size_t k = (size_t)o->stage * (size_t)e->m + (size_t)o->mb;
      if (o->op == ZB_OP_F) {
        e->f_end[k] = o->end;
        e->f_rank[k] = r;
      } else if (o->op == ZB_OP_B || o->op == ZB_OP_BW) {
        e->b_end[k] = o->end;
        e->b_rank[k] = r;
      }
    }
}

/* Latency samples: inputs from another rank that a rank waited for. */
static int comm_samples(const zb_tl_rank *ranks, int p, const tl_ends *e, double *out) {
  int n = 0;
  for (int r = 0; r < p; r++) {
    double prev_end = NAN;
    for (int i = 0; i < ranks[r].n; i++) {
      const zb_tl_op *o = &ranks[r].ops[i];
      if (!zb_op_is_compute(o->op))
        continue;
      int ps = o->op == ZB_OP_F ? o->stage - 1 : o->op == ZB_OP_W ? -1 : o->stage + 1;
      if (ps >= 0 && ps < e->n_stages) {
        size_t k = (size_t)ps * (size_t)e->m + (size_t)o->mb;
        double pe = o->op == ZB_OP_F ? e->f_end[k] : e->b_end[k];
        int pr = o->op == ZB_OP_F ? e->f_rank[k] : e->b_rank[k];
        if (pr >= 0 && pr != r && !isnan(pe) && (isnan(prev_end) || prev_end < pe))
          out[n++] = o->start > pe ? o->start - pe : 0;
      }
      prev_end = o->end;
    }
  }
  return n;
}

zb_err zb_timeline_reduce_times(const zb_tl_rank *ranks, int n, int n_stages, double *t_reduce,
                                zb_diag *diag) {
  if (n_stages < 1)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "reduction times of %d stages", n_stages);
  for (int s = 0; s < n_stages; s++)
    t_reduce[s] = NAN;
  for (int r = 0; r < n; r++)
    for (int i = 0; i < ranks[r].n; i++) {
      const zb_tl_op *o = &ranks[r].ops[i];
      if (o->op != ZB_OP_REDUCE_GRAD)
        continue;
      if (o->stage < 0 || o->stage >= n_stages)
        return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                           "timeline of rank %d, op %d: REDUCE_GRAD of stage %d (%d stages)", r, i, o->stage,
                           n_stages);
      double d = o->end - o->start;
      if (isnan(t_reduce[o->stage]) || d < t_reduce[o->stage])
        t_reduce[o->stage] = d;
    }
  return ZB_OK;
}

/* What zb_timeline_costs learns from: compute ops and transport groups
 * (a REDUCE_GRAD is priced apart; WAIT_* markers carry nothing). */
static bool costs_op(const zb_tl_op *o) {
  return zb_op_is_compute(o->op) || zb_op_is_comm(o->op);
}

zb_err zb_timeline_costs(const zb_tl_rank *ranks, int p, const zb_costs *prior, zb_tl_costs *out,
                         zb_diag *diag) {
  memset(out, 0, sizeof *out);
  int S = prior->n_stages, m = 1, total = 0;
  for (int r = 0; r < p; r++)
    for (int i = 0; i < ranks[r].n; i++) {
      const zb_tl_op *o = &ranks[r].ops[i];
      if (!costs_op(o))
        continue;
      if (o->stage < 0 || o->stage >= S || o->mb < 0)
        return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "timeline of rank %d, op %d: stage %d mb %d (%d stages)",
                           r, i, o->stage, o->mb, S);
      m = o->mb + 1 > m ? o->mb + 1 : m;
      total++;
    }
  out->n_stages = S;
  out->t_reduce = zb_malloc(sizeof(double) * (size_t)(S > 0 ? S : 1));
  zb_err err = S > 0 ? zb_timeline_reduce_times(ranks, p, S, out->t_reduce, diag) : ZB_OK;
  if (err)
    return err;
  out->t_f = zb_malloc(sizeof(double) * (size_t)S);
  out->t_b = zb_malloc(sizeof(double) * (size_t)S);
  out->t_w = zb_malloc(sizeof(double) * (size_t)S);
  tl_acc a = {zb_calloc((size_t)S, sizeof(double)), zb_calloc((size_t)S, sizeof(double)),
              zb_calloc((size_t)S, sizeof(double)), zb_calloc((size_t)S, sizeof(int)),
              zb_calloc((size_t)S, sizeof(int)),    zb_calloc((size_t)S, sizeof(int))};
  for (int r = 0; r < p; r++)
    for (int i = 0; i < ranks[r].n; i++)
      acc_op(&a, prior, &ranks[r].ops[i]);
  for (int s = 0; s < S; s++) {
    out->t_f[s] = a.n_f[s] ? a.sum_f[s] / a.n_f[s] : NAN;
    out->t_b[s] = a.n_b[s] ? a.sum_b[s] / a.n_b[s] : NAN;
    out->t_w[s] = a.n_w[s] ? a.sum_w[s] / a.n_w[s] : NAN;
  }
  tl_ends e = {.n_stages = S, .m = m};
  ends_fill(ranks, p, &e);
  double *samples = zb_malloc(sizeof(double) * (size_t)(total + 1));
  out->comm_samples = comm_samples(ranks, p, &e, samples);
  qsort(samples, (size_t)out->comm_samples, sizeof(double), cmp_double);
  out->t_comm = out->comm_samples ? samples[out->comm_samples / 2] : NAN;
  void *bufs[] = {a.sum_f, a.sum_b, a.sum_w,  a.n_f,    a.n_b,  a.n_w,
                  e.f_end, e.b_end, e.f_rank, e.b_rank, samples};
  for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++)
    free(bufs[k]);
  return ZB_OK;
}

void zb_tl_costs_free(zb_tl_costs *c) {
  if (!c)
    return;
  free(c->t_f);
  free(c->t_b);
  free(c->t_w);
  free(c->t_reduce);
  memset(c, 0, sizeof *c);
}
