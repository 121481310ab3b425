/* zb_lower_internal.h — lowering's per-rank merge (zb_lower_merge.c), as
 * zb_lower.c drives it: s simulated and the lowered lists sized, then
 * (when the caller keeps them) merged. The merge's premise is every F, B
 * and W of c taking time (zb_lower.c checks it). */
#ifndef ZB_LOWER_INTERNAL_H
#define ZB_LOWER_INTERNAL_H

#include "zb_par.h"
#include "zb_schedule.h"
#include "zb_sim.h"

typedef struct zb_lower_merge zb_lower_merge;

/* Simulates s under c (start times) while it sizes the lowered lists and
 * faults them in, on two pieces of par. Fails (*out NULL) with the
 * simulation's error and diag when s cannot be simulated. */
zb_err zb_lower_merge_begin(const zb_schedule *s, const zb_costs *c, const zb_par *par, zb_lower_merge **out,
                            zb_diag *diag);

/* s's simulated start times, start[r][i] for rank r's action i. */
double *const *zb_lower_merge_starts(const zb_lower_merge *m);

/* Merges every rank (in shares over par) and frees m: the lowered
 * schedule. figures (if not NULL) gets s's simulated figures when the
 * lowered plan's timeline is s's (zb_lower_par_figures), else NULL. */
zb_schedule *zb_lower_merge_end(zb_lower_merge *m, zb_sim_result **figures);

/* Frees m unmerged (NULL: nothing). */
void zb_lower_merge_drop(zb_lower_merge *m);

/* Compute actions of s, every rank's. */
static inline long zb_lower_compute_actions(const zb_schedule *s) {
  long n = 0;
  for (int r = 0; r < s->p; r++)
    n += s->ranks[r].n;
  return n;
}

#endif
