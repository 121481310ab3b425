/* zb_jobspec_dp.c — data parallelism's checks and the derived T_reduce
 * (zb_jobspec_dp.h). */
#include "zb_jobspec_dp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_arch.h"
#include "zb_jobspec_fields.h"

int zb_job_spec_world(const zb_job_spec *s) {
  long long n = (long long)s->data_parallel * s->ranks;
  return n > 0 && n <= zb_job_limits[ZB_JK_RANKS].max ? (int)n : s->ranks;
}

double zb_ring_allreduce_seconds(int d, double bytes, double gbps, double latency_us) {
  if (d <= 1)
    return 0;
  double bytes_per_s = gbps * 1e9 / 8;
  return 2.0 * (d - 1) / d * bytes / bytes_per_s + 2.0 * (d - 1) * latency_us * 1e-6;
}

double zb_job_spec_stage_grad_bytes(const zb_job_spec *s, int stage, int n_stages) {
  zb_arch a;
  int n = 0;
  if (zb_model_spec_arch(&s->model, &a, NULL) != ZB_OK ||
      zb_arch_stage_tensors(&a, stage, n_stages, NULL, 0, &n, NULL) != ZB_OK)
    return -1;
  zb_arch_tensor *t = zb_calloc((size_t)(n > 0 ? n : 1), sizeof *t);
  double params = 0;
  if (zb_arch_stage_tensors(&a, stage, n_stages, t, n, &n, NULL) == ZB_OK)
    for (int i = 0; i < n; i++)
      params += (double)t[i].rows * t[i].cols;
  else
    params = -0.25;
  free(t);
  return params * 4;
}

bool zb_job_spec_derives_reduce(const zb_job_spec *s) {
  return zb_job_spec_trains_model(s) && s->data_parallel > 1 && s->costs.t_reduce == 0;
}

zb_err zb_job_spec_reduce_times(const zb_job_spec *s, int n_stages, double *t_reduce, zb_diag *diag) {
  for (int k = 0; k < n_stages; k++) {
    double bytes = zb_job_spec_stage_grad_bytes(s, k, n_stages);
    if (bytes < 0)
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                         "costs.reduce: the model does not resolve, so stage %d's gradient bytes are unknown",
                         k);
    t_reduce[k] = zb_ring_allreduce_seconds(s->data_parallel, bytes, s->link_gbps, s->link_latency_us);
  }
  return ZB_OK;
}

static zb_err check_link(const zb_job_spec *s, zb_job_fault *f) {
  if (!isfinite(s->link_gbps) || s->link_gbps <= 0)
    return zb_job_fault_set(f, ZB_JK_LINK_GBPS, -1, "link_gbps",
                            "must be a finite number > 0 (Gbit/s), got %g", s->link_gbps);
  if (!isfinite(s->link_latency_us) || s->link_latency_us < 0)
    return zb_job_fault_set(f, ZB_JK_LINK_LATENCY, -1, "link_latency_us",
                            "must be a finite number >= 0 (microseconds), got %g", s->link_latency_us);
  return ZB_OK;
}

zb_err zb_job_spec_check_dp(const zb_job_spec *s, zb_job_fault *f) {
  const zb_int_limit *l = &zb_job_limits[ZB_JK_DATA_PARALLEL];
  long long limit = zb_job_limits[ZB_JK_RANKS].max;
  if (s->data_parallel < l->min || s->data_parallel > l->max)
    return zb_job_fault_set(f, ZB_JK_DATA_PARALLEL, -1, "data_parallel",
                            "must be between %lld and %lld, got %d", l->min, l->max, s->data_parallel);
  if ((long long)s->data_parallel * s->ranks > limit)
    return zb_job_fault_set(f, ZB_JK_DATA_PARALLEL, -1, "data_parallel",
                            "%d replicas x %d ranks = %lld ranks, over the limit of %lld", s->data_parallel,
                            s->ranks, (long long)s->data_parallel * s->ranks, limit);
  if (s->zero != 0 && s->zero != 1)
    return zb_job_fault_set(f, ZB_JK_ZERO, -1, "zero", "must be 0 or 1 (ZeRO-1 optimizer sharding), got %d",
                            s->zero);
  if (s->zero && !zb_job_spec_trains_model(s))
    return zb_job_fault_set(f, ZB_JK_ZERO, -1, "zero",
                            "1 shards optimizer state, which only a job that trains a model has (backend cpu "
                            "or cuda); backend is '%.15s'",
                            s->backend);
  if (s->zero && s->data_parallel < 2)
    return zb_job_fault_set(
        f, ZB_JK_ZERO, -1, "zero",
        "1 shards the optimizer state over a stage's replicas and needs data_parallel > 1");
  if (!memchr(s->rank_order, '\0', sizeof s->rank_order) ||
      (strcmp(s->rank_order, ZB_RANK_ORDER_PIPELINES) && strcmp(s->rank_order, ZB_RANK_ORDER_STAGES)))
    return zb_job_fault_set(f, ZB_JK_RANK_ORDER, -1, "rank_order", "must be one of %s, %s, got '%.15s'",
                            ZB_RANK_ORDER_PIPELINES, ZB_RANK_ORDER_STAGES, s->rank_order);
  if (s->costs.t_reduce > 0 && s->data_parallel < 2) /* one replica has nothing to average */
    return zb_job_fault_set(f, ZB_JK_COSTS, -1, "costs.reduce",
                            "is the gradient reduction across replicas and needs data_parallel > 1 (got %g "
                            "with data_parallel 1)",
                            s->costs.t_reduce);
  return check_link(s, f);
}
