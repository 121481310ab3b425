/* zb_reduce.h — the gradient reduction of data × pipeline parallelism as
 * actions in a rank's list (docs/schedules.md, Gradient reduction).
 *
 * With d replicas of a p-rank pipeline, each stage's weight gradients are
 * averaged across its d replicas once per iteration, before the optimizer
 * step. A stage's REDUCE_GRAD may start once the stage's last W (or BW)
 * on its rank has run; the rank's WAIT_REDUCE_GRAD holds the step until
 * every reduction issued before it is done. zb_costs.t_reduce[stage] is
 * what one takes (0 everywhere: one replica, no reduction actions).
 *
 * Every REDUCE_GRAD has mb -1 and peer -1. WAIT_REDUCE_GRAD carries the
 * stage of the last REDUCE_GRAD before it on its rank: a rank's
 * reductions run in list order on one stream, so waiting for that one
 * waits for all of them (PyTorch's lists wait for each stage's reduction
 * by name the same way).
 *
 * Ownership: the functions edit the schedule they are given in place; a
 * list that lay in the schedule's block moves to its own allocation
 * (zb_schedule.h). Pure: no I/O, no globals.
 */
#ifndef ZB_REDUCE_H
#define ZB_REDUCE_H

#include <stdbool.h>

#include "zb_schedule.h"

/* Where each stage's REDUCE_GRAD goes. */
typedef enum zb_reduce_at {
  /* right after the stage's last W (or BW) on its rank: the earliest
   * point, where the rest of the rank's compute can hide it */
  ZB_REDUCE_EARLIEST = 0,
  /* every REDUCE_GRAD at the end of the list, after all its actions (in
   * the order of their stages' last W): the naive baseline, nothing left
   * to hide them behind */
  ZB_REDUCE_AT_END = 1,
} zb_reduce_at;

/* Whether c asks for reductions: some stage's t_reduce is above 0. */
bool zb_costs_reduces(const zb_costs *c);

/* Whether any rank's list holds a REDUCE_GRAD or WAIT_REDUCE_GRAD. */
bool zb_schedule_has_reduce(const zb_schedule *s);

/* Removes every REDUCE_GRAD and WAIT_REDUCE_GRAD from s's lists. */
void zb_reduce_strip(zb_schedule *s);

/* Gives every rank of s (compute-only or lowered) one REDUCE_GRAD per
 * stage it hosts, placed as `at` says, and one WAIT_REDUCE_GRAD as its
 * list's last action; reduction actions s held before are removed first.
 * A stage without any W or BW on its rank (a list missing them, which the
 * validator refuses) is reduced at the end of the list. */
void zb_reduce_insert(zb_schedule *s, zb_reduce_at at);

#endif
