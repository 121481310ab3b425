/* sim_reduce.c — a sim job's REDUCE_GRAD (sim_reduce.h). */
#include "sim_reduce.h"

#include <stdlib.h>

#include "zb_alloc.h"
#include "zb_clock.h"
#include "zb_collective.h"

/* floats of the token each member sends: enough that every member owns
 * a non-empty shard in any group the job spec allows */
#define SIM_REDUCE_FLOATS 64

zb_err sim_reduce_stage(void *ud, int stage, int iteration, zb_diag *diag) {
  const sim_reduce *r = ud;
  int64_t since = zb_clock_ns();
  if (r->data_parallel > 1) {
    int d = r->data_parallel;
    int *ranks = zb_malloc(sizeof(int) * (size_t)d);
    for (int k = 0; k < d; k++)
      ranks[k] = k * r->ranks + r->rank;
    float token[SIM_REDUCE_FLOATS];
    for (int k = 0; k < SIM_REDUCE_FLOATS; k++)
      token[k] = (float)(r->replica + 1);
    /* the tag's seq as a cpu job's (cpu_job_reduce.c): 2 per iteration */
    zb_ring ring = {.tr = r->tr,
                    .size = d,
                    .index = r->replica,
                    .ranks = ranks,
                    .stage = stage,
                    .seq = (int32_t)(((int64_t)iteration * 2) % INT32_MAX)};
    zb_err err = zb_ring_all_reduce(&ring, token, SIM_REDUCE_FLOATS, diag);
    free(ranks);
    if (err)
      return err;
    /* every member holds 1 + 2 + ... + d: a member that reduced another's
     * stage or iteration would not (the tags make that an error first) */
    if (token[0] != (float)(d * (d + 1) / 2))
      return zb_diag_set(diag, ZB_ERR_INVALID_SCHEDULE,
                         "REDUCE_GRAD of stage %d: the replicas' sum is %g, not %d", stage, (double)token[0],
                         d * (d + 1) / 2);
  }
  return zb_backend_sim_hold(r->sim, since, stage, diag);
}
