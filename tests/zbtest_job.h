/* zbtest_job.h — a schedule ready for tests that run it: planned by libzb,
 * lowered to point-to-point sends and receives, and simulated, with the
 * costs it was planned with. The executor and cpu backend tests run its
 * per-rank lists on ranks as threads.
 *
 * Ownership: zbt_job_make fills a caller-owned zbt_job; zbt_job_free frees
 * what it holds (also after a failed make). */
#ifndef ZBTEST_JOB_H
#define ZBTEST_JOB_H

#include <stdbool.h>

#include "zb_lower.h"
#include "zb_plan.h"
#include "zb_sim.h"

typedef struct zbt_job {
  zb_family f;
  int p, v, m, S; /* ranks, chunks (the family's default), microbatches, stages */
  zb_placement placement;
  zb_costs *costs;
  zb_schedule *lowered;
  zb_sim_result *sim;
} zbt_job;

/* Plans family f at (p, m) with rank costs rc (NULL: zb_rank_costs_default),
 * lowers and simulates it. False when the family refuses the shape
 * (quietly) or a step fails (printed to stderr). */
bool zbt_job_make(zb_family f, int p, int m, const zb_rank_costs *rc, zbt_job *j);
void zbt_job_free(zbt_job *j);

/* The stages rank r hosts under j's placement, ascending, into stages
 * (room for j->v); returns how many. */
int zbt_job_stages(const zbt_job *j, int r, int *stages);

#endif
