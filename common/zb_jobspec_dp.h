/* zb_jobspec_dp.h — a job's data parallelism: d replicas of one p-rank
 * plan (docs/formats.md, Data parallelism). The team's conventions, in one
 * place so that the coordinator, the worker and zbctl agree:
 *   - global rank g = replica * p + r, r the pipeline rank (the plan's
 *     rank, 0..p-1), replica 0..d-1; every replica runs the same plan on
 *     its own microbatches (the global batch is d x m microbatches);
 *   - the stage group of pipeline rank r is {r, p + r, ..., (d-1)p + r}:
 *     the ranks whose gradients are averaged once per iteration;
 *   - T_reduce, a stage's share of that averaging, is costs.reduce as the
 *     user gives it, or for a job that trains a model with d > 1 a ring
 *     all-reduce of the stage's fp32 gradients over the link the spec
 *     names: 2(d-1)/d x bytes / bandwidth + 2(d-1) x latency.
 * Pure functions of the spec; no I/O, nothing owned.
 */
#ifndef ZB_JOBSPEC_DP_H
#define ZB_JOBSPEC_DP_H

#include "zb_jobspec.h"

/* data_parallel's own ceiling; d x ranks must also stay within the
 * service's rank limit (the ranks key's maximum, 1024). */
#define ZB_DATA_PARALLEL_MAX 1024
#define ZB_LINK_GBPS_DEFAULT 100.0
#define ZB_LINK_LATENCY_US_DEFAULT 10.0

/* The job's ranks over all replicas: data_parallel x ranks (a spec that
 * passed zb_job_spec_check keeps it within the rank limit). */
int zb_job_spec_world(const zb_job_spec *s);
/* The replica and the pipeline rank of global rank g of a p-rank plan. */
static inline int zb_dp_replica(int g, int p) {
  return g / p;
}
static inline int zb_dp_pipeline_rank(int g, int p) {
  return g % p;
}
static inline int zb_dp_global(int replica, int r, int p) {
  return replica * p + r;
}

/* Seconds a ring all-reduce of bytes over d ranks takes on a link of gbps
 * Gbit/s and latency_us per hop: 2(d-1)/d x bytes / bandwidth + 2(d-1) x
 * latency; 0 when d <= 1. */
double zb_ring_allreduce_seconds(int d, double bytes, double gbps, double latency_us);

/* The fp32 gradient bytes of stage `stage` of n_stages of the job's model
 * (its parameters x 4), from the architecture's tensors; -1 when the
 * model does not resolve. */
double zb_job_spec_stage_grad_bytes(const zb_job_spec *s, int stage, int n_stages);

/* Whether T_reduce is derived per stage from the model and the link
 * rather than taken from costs.reduce: a job that trains a model, with
 * data_parallel > 1 and costs.reduce left 0. */
bool zb_job_spec_derives_reduce(const zb_job_spec *s);

/* Fills t_reduce[0..n_stages-1] with each stage's derived T_reduce
 * (zb_job_spec_derives_reduce must hold). ZB_ERR_INVALID_ARG when the
 * model does not resolve. */
zb_err zb_job_spec_reduce_times(const zb_job_spec *s, int n_stages, double *t_reduce, zb_diag *diag);

#endif
