/* zb_sim_internal.h — what the simulator's two modes share (zb_sim.c, the
 * blocking run; zb_sim_device.c, the device-ordered one): the cost check,
 * a result's allocation, and the figures made from its per-rank sums.
 * Not for callers outside lib/zb_sim*.c.
 */
#ifndef ZB_SIM_INTERNAL_H
#define ZB_SIM_INTERNAL_H

#include <stdbool.h>

#include "zb_sim.h"

/* ZB_ERR_INVALID_ARG unless c describes s's stages. */
zb_err zb_sim_check_costs(const zb_schedule *s, const zb_costs *c, zb_diag *diag);
/* A zeroed result for s (caller frees): figures, and with times both
 * times of every action (their blocks not cleared). */
zb_sim_result *zb_sim_result_alloc(const zb_schedule *s, bool times);
/* From r's makespan, max_span, busy and peak_memory: its bubble ratios
 * and peak_memory_units. */
void zb_sim_fill_figures(const zb_schedule *s, const zb_costs *c, zb_sim_result *r);

/* zb_simulate_figures of lists without comm actions, each rank's
 * reductions on a stream of their own (the device-ordered executor). */
zb_err zb_sim_async_reduce(const zb_schedule *s, const zb_costs *c, bool times, zb_sim_result **out,
                           zb_diag *diag);

/* A rank's reduction stream, as both modes keep it: busy over [*lo, *hi]
 * as far as compute that has not started yet can see (its reductions run
 * back to back, so what is still ahead of the compute stream is one
 * stretch). Issues one of time t when the compute stream reaches at and
 * returns its start. */
static inline double zb_sim_reduce_issue(double at, double t, double *lo, double *hi) {
  if (*hi <= at)
    *lo = at;
  double start = *hi > at ? *hi : at;
  *hi = start + t;
  return start;
}

/* How much of compute op [start, end] the reduction stretch [lo, hi]
 * covers: the reduction time it hides. */
static inline double zb_sim_reduce_overlap(double start, double end, double lo, double hi) {
  double a = start > lo ? start : lo, b = end < hi ? end : hi;
  return b > a ? b - a : 0;
}

/* t_reduce of a REDUCE_GRAD's stage; 0 out of range (the validator's to
 * report). */
static inline double zb_sim_reduce_time(const zb_costs *c, const zb_action *a) {
  return c->t_reduce && zb_in(a->stage, c->n_stages) ? c->t_reduce[a->stage] : 0;
}

#endif
