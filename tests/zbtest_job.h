/* zbtest_job.h — a schedule ready for tests that run it, as a worker gets
 * it: planned by libzb's pipeline (zb_planner_run), then every rank's
 * Assignment encoded, packed, unpacked and decoded (zb_assignment.h), so
 * the executor and cpu backend tests run exactly what a worker runs,
 * transport groups included. zbt_job_make checks that the decoded lists
 * equal the planned ones.
 *
 * Ownership: zbt_job_make fills a caller-owned zbt_job; zbt_job_free frees
 * what it holds (also after a failed make). */
#ifndef ZBTEST_JOB_H
#define ZBTEST_JOB_H

#include <stdbool.h>

#include "zb_planner.h"

typedef struct zbt_job {
  zb_family f;
  int p, v, m, S; /* ranks, chunks (the family's default), microbatches, stages */
  zb_placement placement;
  zb_costs *costs;      /* as planned (every stage) */
  zb_schedule *lowered; /* every rank's list as decoded from its Assignment */
  zb_sim_result *sim;   /* the planner's simulation */
} zbt_job;

/* Plans family f at (p, m) with rank costs rc (NULL: zb_rank_costs_default)
 * and round-trips every rank's Assignment. False when the family refuses
 * the shape (quietly) or a step fails (printed to stderr). */
bool zbt_job_make(zb_family f, int p, int m, const zb_rank_costs *rc, zbt_job *j);
void zbt_job_free(zbt_job *j);

/* The stages rank r hosts under j's placement, ascending, into stages
 * (room for j->v); returns how many. */
int zbt_job_stages(const zbt_job *j, int r, int *stages);

#endif
