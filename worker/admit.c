/* admit.c — whether this worker can hold an assignment (docs/operations.md,
 * Workers): before a plan allocates anything, the bytes its rank needs
 * here, against the memory the worker advertised. More fails the rank
 * naming both figures, so the job says why instead of the worker
 * aborting in an allocation or being killed by the kernel's OOM killer
 * (after which the job said only that its Attach stream closed).
 *
 * What is counted, a lower bound: for a cpu or cuda job, the model state
 * of the stages the rank hosts (fp32 parameters, gradients and the two
 * AdamW moments, 16 bytes a parameter, and 4 more for the copy a dumping
 * job keeps from before the step) plus the activations the plan keeps
 * live at its peak (the plan's own accounting, the executor's
 * peak_memory, in units of one activation) times bytes_per_activation;
 * for a sim job, the send and receive buffers it allocates. A cuda job
 * adds what its device takes beside the model (docs/operations.md,
 * Admission): the cuBLAS workspace and the caching allocator's rounding
 * (a block rounded up to its size class: a twelfth more on average, less
 * than a quarter at worst). A cuda job is judged by the GPU's free memory
 * at the worker's start, the others by the host's; a worker that
 * advertises none (0) is not judged. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "worker.h"
#include "zb_alloc.h"
#include "zb_arch.h"
#include "zb_names.h"
#ifdef ZB_WITH_CPU_BACKEND
#include "zb_model.h"
#endif

/* Parameters of stage s of n of an architecture's model: its tensors'
 * sizes (zb_arch_stage_tensors); -1 when it cannot tell (a bad config,
 * which the job refuses when it builds its stages). */
static double arch_stage_params(const zb_model_spec *m, int s, int n) {
  zb_arch a;
  int count = 0;
  if (zb_model_spec_arch(m, &a, NULL) || zb_arch_stage_tensors(&a, s, n, NULL, 0, &count, NULL))
    return -1;
  zb_arch_tensor *ts = zb_calloc((size_t)(count ? count : 1), sizeof *ts);
  double sum = 0;
  if (zb_arch_stage_tensors(&a, s, n, ts, count, &count, NULL) == ZB_OK)
    for (int i = 0; i < count; i++)
      sum += (double)ts[i].rows * ts[i].cols;
  free(ts);
  return sum;
}

/* Parameters of stage s of n (the layout of model/model_stage.c: the
 * embeddings on the first, the final LayerNorm and head on the last). */
static double stage_params(const zb_model_spec *m, int s, int n) {
  if (zb_model_spec_has_arch(m)) {
    double p = arch_stage_params(m, s, n);
    return p > 0 ? p : 0;
  }
  int first = 0, count = 0;
#ifdef ZB_WITH_CPU_BACKEND
  if (zb_model_layer_range(m->layers, n, s, &first, &count) != ZB_OK)
    count = m->layers;
#else
  count = m->layers; /* such a worker refuses the job anyway */
#endif
  double h = m->hidden, vocab = 256;
  return count * (12 * h * h + 13 * h) + (s == 0 ? (vocab + m->seq_len) * h : 0) +
         (s == n - 1 ? 2 * h + vocab * h : 0);
}

/* The plan's peak of live activations on the rank, in units of one: the
 * running sum of the compute ops' memory deltas over the rank's M_F. */
static double plan_live_activations(const zb_assignment *a) {
  const zb_rank_list *l = &a->sched->ranks[a->rank];
  bool *seen = zb_calloc((size_t)a->costs->n_stages, sizeof(bool));
  double mem = 0, peak = 0, mf = 0;
  for (int i = 0; i < l->n; i++) {
    const zb_action *x = &l->actions[i];
    if (!zb_op_is_compute(x->op))
      continue;
    mem += zb_costs_mem(a->costs, x->op, x->stage);
    peak = mem > peak ? mem : peak;
    if (!seen[x->stage])
      mf += a->costs->m_f[x->stage];
    seen[x->stage] = true;
  }
  free(seen);
  return mf > 0 ? peak / mf : peak;
}

void worker_assignment_need(const zb_assignment *a, worker_need *out) {
  double bpa = (double)a->bytes_per_activation;
  *out = (worker_need){0};
  if (!a->has_model) { /* sim: one send and one receive buffer */
    out->live = 2;
    out->activations = 2 * bpa;
    return;
  }
  int S = a->sched->p * a->sched->v;
  for (int s = 0; s < S; s++)
    if (zb_placement_rank(a->sched->placement, a->sched->p, a->sched->v, s) == a->rank)
      out->state += (a->model.dump_dir[0] ? 20 : 16) * stage_params(&a->model, s, S);
  out->live = plan_live_activations(a);
  out->activations = out->live * bpa;
}

/* The mean rounding of the cuda device's size classes (four per power of
 * two: a block is rounded up by less than a quarter, a twelfth of it on
 * average over sizes spread evenly; model/device_cuda_alloc.c). */
#define CUDA_ROUNDING (1.0 / 12.0)

zb_err worker_admit(const worker *w, const zb_assignment *a, zb_diag *diag) {
  bool cuda = zb_backend_needs_gpu(a->backend);
  long long has = cuda ? w->gpu_memory_bytes : w->memory_bytes;
  worker_need n;
  worker_assignment_need(a, &n);
  double need = n.state + n.activations;
  double ws = cuda ? (double)w->gpu_workspace_bytes : 0, rounding = cuda ? need * CUDA_ROUNDING : 0;
  need += ws + rounding;
  if (has <= 0 || need <= (double)has)
    return ZB_OK;
  if (cuda)
    return zb_diag_set(diag, ZB_ERR_INFEASIBLE,
                       "rank %d on worker %s needs %.0f bytes, it has %lld (the GPU's free memory it "
                       "advertised): model state %.0f, activations %.1f x bytes_per_activation %lld, cuBLAS "
                       "workspace %.0f, allocator rounding %.0f",
                       a->rank, w->id, need, has, n.state, n.live, a->bytes_per_activation, ws, rounding);
  return zb_diag_set(
      diag, ZB_ERR_INFEASIBLE,
      "rank %d on worker %s needs %.0f bytes, it has %lld (the host memory it advertised): model "
      "state %.0f, activations %.1f x bytes_per_activation %lld",
      a->rank, w->id, need, has, n.state, n.live, a->bytes_per_activation);
}
