/* sim_reduce.h — a sim job's REDUCE_GRAD, the executor's reduce hook
 * (zb_executor.h) when data_parallel > 1 (docs/schedules.md, Gradient
 * reduction). The stage's replicas meet in a real ring all-reduce of a
 * small buffer over the job's transport (zb_collective.h), so a sim job's
 * replicas stay in step as a model job's do and the data plane carries
 * the collective's frames; then the sim backend holds the rank until the
 * stage's T_reduce has passed since the hook began. The sim keeps no
 * gradients: the bytes are a token, the time is the cost model's.
 *
 * Ownership: everything is borrowed; the transport and backend must
 * outlive the executor that calls the hook. Blocks on the transport.
 *
 * Results: zb_err from lib/zb_err.h; the ring's and the backend's pass
 * through. */
#ifndef ZB_SIM_REDUCE_H
#define ZB_SIM_REDUCE_H

#include "zb_backend.h"
#include "zb_transport.h"

typedef struct sim_reduce {
  zb_transport *tr; /* spans data_parallel x ranks; global rank replica * ranks + rank */
  zb_backend *sim;  /* the plan's sim backend */
  int rank, ranks;  /* pipeline rank and p */
  int replica, data_parallel;
} sim_reduce;

/* REDUCE_GRAD(stage) of iteration on this rank (ud: a sim_reduce). */
zb_err sim_reduce_stage(void *ud, int stage, int iteration, zb_diag *diag);

#endif
