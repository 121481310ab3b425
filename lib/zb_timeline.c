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

/* One rank's sums; its compute span in *first, *last (NAN without one). */
static void sum_rank(const zb_tl_rank *rk, zb_tl_summary *s, int r, double *first, double *last) {
  *first = NAN;
  *last = NAN;
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
    } else {
      s->comm[r] += d;
      s->groups[r]++;
    }
  }
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
  double start = NAN, end = NAN, busy_sum = 0, busy_max = 0;
  for (int r = 0; r < p; r++) {
    double first, last;
    sum_rank(&ranks[r], out, r, &first, &last);
    if (!isnan(first)) {
      start = isnan(start) || first < start ? first : start;
      end = isnan(end) || last > end ? last : end;
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
