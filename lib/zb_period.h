/* zb_period.h — a schedule's steady state, repeated more or fewer times
 * (docs/schedules.md, Planning at scale).
 *
 * Between warm-up and cool-down every rank of a pipeline schedule repeats
 * one period: the same actions in the same order, q microbatches on each
 * time (1 for most families, p for interleaved ones, whose chunks take
 * rounds of p). A schedule for m microbatches is then the one for fewer
 * with that period repeated more often. Each rank's list is cut inside
 * its periodic stretch and periods go in (or come out); what follows the
 * cut moves on (or back) by as many microbatches. Where in its stretch a
 * rank is cut does not matter: the periods are the stretch's own.
 *
 * A stretch counts when it spans three periods (two of more than two
 * microbatches: a round of p on every chunk), a period holds no (op,
 * stage, microbatch) twice when repeated, and some microbatch lies in
 * every rank's stretch for every (op, stage) it holds: the mark of the
 * steady state, as one rank alone may keep up a pattern of the warm-up.
 * Lists may hold compute and comm actions (lowered plans repeat too), not
 * markers. Both functions return NULL when s has no such steady state;
 * the caller owns what they return.
 */
#ifndef ZB_PERIOD_H
#define ZB_PERIOD_H

#include "zb_par.h"
#include "zb_schedule.h"

/* s with (m - s->m) / q more periods: m microbatches. NULL also when m is
 * below s->m or m - s->m is not a multiple of q. */
zb_schedule *zb_period_extend(const zb_schedule *s, int m, int q);

/* zb_period_extend copying the ranks' lists in shares over par's runner
 * (zb_par.h): the same lists. */
zb_schedule *zb_period_extend_par(const zb_schedule *s, int m, int q, const zb_par *par);

/* s with as many periods taken out as leave `keep` (at least three) in
 * every rank's stretch and in the steady state all ranks share: the
 * shortest run that zb_period_extend brings back to s->m microbatches.
 * NULL when not even one period can go. */
zb_schedule *zb_period_shrink(const zb_schedule *s, int q, int keep);

/* Whether s's simulated timeline (start[r][i]: rank r's action i) repeats
 * too: every action of every rank's stretch, its first period aside (the
 * way out of the warm-up) when it holds three, starts exactly the same
 * time after the one a period before it. Uneven costs that are not sums of
 * binary fractions rarely do, as rounding differs from period to period. */
bool zb_period_times_repeat(const zb_schedule *s, int q, double *const *start);

#endif
