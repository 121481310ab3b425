/* cpu_job.c — a cpu job's training state on one rank; see cpu_job.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_job.h"
#include "zb_alloc.h"
#include "zb_dump.h"
#include "zb_file.h"
#include "zb_log.h"
#include "zb_step_chain.h"

/* The stages rank hosts under the assignment's plan, ascending; returns
 * how many (an allocated array in *out). */
static int hosted_stages(const zb_schedule *sched, int rank, int **out) {
  int S = sched->p * sched->v, n = 0;
  *out = zb_malloc(sizeof(int) * (size_t)S);
  for (int s = 0; s < S; s++)
    if (zb_placement_rank(sched->placement, sched->p, sched->v, s) == rank)
      (*out)[n++] = s;
  return n;
}

/* What the job keeps of its assignment: ids, checkpoint and dump
 * settings, the stages this rank hosts. */
static zb_err cpu_job_settings(cpu_job *cj, const zb_assignment *a, const atomic_bool *stop, zb_diag *diag) {
  const zb_model_spec *ms = &a->model;
  snprintf(cj->job_id, sizeof cj->job_id, "%s", a->job_id);
  cj->ckpt_every = ms->checkpoint_every;
  snprintf(cj->ckpt_dir, sizeof cj->ckpt_dir, "%s", ms->checkpoint_dir);
  snprintf(cj->resume_from, sizeof cj->resume_from, "%s", ms->resume_from);
  if (ms->dump_dir[0]) {
    snprintf(cj->dump_dir, sizeof cj->dump_dir, "%s/%s", ms->dump_dir, a->job_id);
    zb_err err = zb_file_mkdirs_in(cj->roots, "dump", cj->dump_dir, diag);
    if (err)
      return err;
  }
  cj->dump_every = ms->dump_every > 0 ? ms->dump_every : 1;
  cj->iterations = a->iterations;
  cj->model = *ms;
  cj->completed = cj->saved = -1;
  cj->hf_kept[0] = cj->hf_kept[1] = -1;
  cj->stop = stop;
  cj->rank = a->rank;
  cj->nranks = a->ranks;
  cj->peer_base = a->replica * a->ranks;
  cj->replica = a->replica;
  cj->data_parallel = a->data_parallel > 1 ? a->data_parallel : 1;
  cj->zero = a->zero && cj->data_parallel > 1;
  cj->n_stages = hosted_stages(a->sched, a->rank, &cj->stages);
  cj->total_stages = a->sched->p * a->sched->v;
  cj->microbatches = a->sched->m;
  cj->reduced = zb_calloc((size_t)(cj->n_stages ? cj->n_stages : 1), sizeof *cj->reduced);
  cj->unscaled = zb_calloc((size_t)(cj->n_stages ? cj->n_stages : 1), sizeof *cj->unscaled);
  cj->placement = a->sched->placement;
  cj->p = a->sched->p;
  cj->v = a->sched->v;
  return ZB_OK;
}

/* The text, when this rank hosts the first or the last stage, and the
 * backend over the model (loss_scale 1/m, so the accumulated gradients
 * are those of the mean loss over the iteration's microbatches). */
static zb_err cpu_job_backend(cpu_job *cj, const zb_assignment *a, zb_diag *diag) {
  const zb_model_spec *ms = &cj->model;
  bool first = false;
  for (int i = 0; i < cj->n_stages; i++) {
    first |= cj->stages[i] == 0;
    cj->last |= cj->stages[i] == cj->total_stages - 1;
  }
  zb_err err;
  zb_cpu_data data = {0};
  if (zb_model_spec_has_arch(ms)) {
    if ((err = cpu_job_arch_open(cj, first || cj->last, &data, diag)))
      return err;
  } else if (first || cj->last) {
    if ((err = zb_file_slurp_in(cj->roots, "model.data", ms->data, &cj->text, &cj->text_len, diag)))
      return err;
    if (cj->text_len < (size_t)ms->seq_len + 1)
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                         "model.data: '%s' has %zu bytes; seq_len %d needs at least %d", ms->data,
                         cj->text_len, ms->seq_len, ms->seq_len + 1);
    cj->source = zb_malloc(sizeof *cj->source);
    /* replica k reads the global batch's microbatches k*m .. k*m+m-1 */
    *cj->source = (zb_cpu_text){.text = cj->text,
                                .len = cj->text_len,
                                .seed = (uint64_t)ms->seed,
                                .first_mb = cj->replica * cj->microbatches};
    data = (zb_cpu_data){zb_backend_cpu_text_fill, cj->source, NULL};
  }
  zb_cpu_backend_config bc = {
      .rank = a->rank,
      .stages = cj->stages,
      .n_stages = cj->n_stages,
      .total_stages = cj->total_stages,
      .model = {.hidden = ms->hidden,
                .heads = ms->heads,
                .layers = ms->layers,
                .seq_len = ms->seq_len,
                .batch = ms->batch,
                .seed = (uint64_t)ms->seed,
                .loss_scale = 1.0f / (float)cj->microbatches,
                .arch = cj->has_arch ? &cj->arch : NULL,
                /* bf16 storage under `precision: bf16` (docs/model.md, Mixed precision) */
                .bf16 = cj->device && strcmp(a->precision, "bf16") == 0},
      .data = data,
      .device = cj->device,
      .host_transport = cj->host_transport,
      .stop = cj->stop,
      .inject_nan = {ms->inject_nan, ms->nan_iteration, ms->nan_microbatch},
  };
  if ((err = zb_backend_cpu_new(&bc, &cj->be, diag)))
    return err;
  return cj->has_arch ? cpu_job_arch_weights(cj, diag) : ZB_OK;
}

/* A cuda job's stepper: the device target over the stages' device
 * weights and gradients (docs/model.md, Optimizer and step). Its moments
 * and backups are fixed device bytes, allocated before the first
 * iteration, whose fresh stats interval leaves them out of the peak. */
static zb_err cpu_job_device_stepper(cpu_job *cj, zb_step_mode mode, zb_diag *diag) {
  float **dp = zb_calloc((size_t)(cj->n_stages ? cj->n_stages : 1), sizeof *dp);
  const float **dg = zb_calloc((size_t)(cj->n_stages ? cj->n_stages : 1), sizeof *dg);
  for (int i = 0; i < cj->n_stages; i++) {
    zb_model_stage *st = zb_backend_cpu_stage(cj->be, i, NULL);
    dp[i] = zb_model_device_params(st);
    dg[i] = zb_model_device_grads(st);
  }
  zb_err err = zb_step_device_new(cj->device, cj->n_stages, cj->opt, dp, dg, mode == ZB_STEP_POST_VALIDATED,
                                  &cj->dstep, diag);
  free(dp);
  free(dg);
  if (err)
    return err;
  zb_step_target t = zb_step_device_target(cj->dstep);
  return zb_stepper_new_target(&t, cj->model.clip_norm, mode, &cj->stepper, diag);
}

/* Hosted stage i's AdamW over its shard (the whole stage without
 * ZeRO-1): decay the matrices (weights, embeddings), not the vectors
 * (biases, LayerNorm gains and shifts), the usual AdamW grouping, element
 * by element where a shard cuts a tensor. */
static zb_err cpu_job_optimizer(cpu_job *cj, int i, const zb_adamw_config *oc, zb_diag *diag) {
  zb_model_stage *st = zb_backend_cpu_stage(cj->be, i, NULL);
  zb_err err = zb_adamw_new(oc, cj->shard_len[i], &cj->opt[i], diag);
  if (err)
    return err;
  const float *base = zb_model_params(st);
  for (int t = 0; t < zb_model_n_tensors(st); t++) {
    const zb_model_tensor *tt = zb_model_tensor_at(st, t);
    if (tt->rows == 1)
      zb_adamw_set_decay_in_shard(cj->opt[i], cj->shard_off[i], (size_t)(tt->param - base), tt->numel, false);
  }
  return ZB_OK;
}

/* One AdamW per hosted stage and the stepper over them; *params counts
 * the parameters here. */
static zb_err cpu_job_optimizers(cpu_job *cj, size_t *params, zb_diag *diag) {
  const zb_model_spec *ms = &cj->model;
  zb_adamw_config oc = {
      .lr = ms->lr, .weight_decay = ms->weight_decay, .beta1 = ms->beta1, .beta2 = ms->beta2, .eps = ms->eps};
  cj->opt = zb_calloc((size_t)cj->n_stages, sizeof *cj->opt);
  cj->params = zb_calloc((size_t)cj->n_stages, sizeof *cj->params);
  cj->grads = zb_calloc((size_t)cj->n_stages, sizeof *cj->grads);
  cj->before = zb_calloc((size_t)cj->n_stages, sizeof *cj->before);
  zb_err err;
  *params = 0;
  for (int i = 0; i < cj->n_stages; i++) {
    zb_model_stage *st = zb_backend_cpu_stage(cj->be, i, NULL);
    cj->params[i] = zb_model_params(st);
    cj->grads[i] = zb_model_grads(st);
    if (cj->dump_dir[0])
      cj->before[i] = zb_malloc(sizeof(float) * (zb_model_n_params(st) ? zb_model_n_params(st) : 1));
    *params += zb_model_n_params(st);
  }
  cpu_job_zero_layout(cj);
  for (int i = 0; i < cj->n_stages; i++)
    if ((err = cpu_job_optimizer(cj, i, &oc, diag)))
      return err;
  zb_step_mode mode =
      strcmp(ms->step, ZB_STEP_SYNCHRONOUS_NAME) == 0 ? ZB_STEP_SYNCHRONOUS : ZB_STEP_POST_VALIDATED;
  err = cj->device ? cpu_job_device_stepper(cj, mode, diag)
                   : zb_stepper_new(cj->n_stages, cj->opt, ms->clip_norm, mode, &cj->stepper, diag);
  return err ? err : cpu_job_tied_count_once(cj, diag);
}

zb_err cpu_job_open(cpu_job *cj, const zb_assignment *a, const atomic_bool *stop, zb_diag *diag) {
  if (!a->has_model)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "assignment: a %s job without a model", a->backend);
  if (a->zero && a->data_parallel > 1 && cj->device)
    return zb_diag_set(diag, ZB_ERR_UNSUPPORTED, "zero: 1 on a cuda job is not built yet (cpu jobs shard)");
  size_t params = 0;
  zb_err err;
  if ((err = cpu_job_settings(cj, a, stop, diag)) || (err = cpu_job_backend(cj, a, diag)) ||
      (err = cpu_job_optimizers(cj, &params, diag)))
    return err;
  const zb_model_spec *ms = &cj->model;
  char list[128] = "";
  for (int i = 0; i < cj->n_stages; i++) {
    size_t len = strlen(list);
    snprintf(list + len, sizeof list - len, "%s%d", i ? "," : "", cj->stages[i]);
  }
  ZB_INFO(
      "job %s rank %d: %s model h=%d heads=%d layers=%d seq_len=%d batch=%d; stages %s of %d, %zu "
      "parameters here; AdamW lr %g, clip_norm %g, %s step; optimizer state %zu bytes (zero %d, replica %d "
      "of %d)",
      a->job_id, a->rank, a->backend, ms->hidden, ms->heads, ms->layers, ms->seq_len, ms->batch, list,
      cj->total_stages, params, ms->lr, ms->clip_norm, ms->step, cpu_job_optimizer_bytes(cj), cj->zero,
      cj->replica, cj->data_parallel);
  return ZB_OK;
}

/* Whether iteration is one the job dumps: 0, every, 2*every, ... and the last. */
static bool cpu_job_dumps(const cpu_job *cj, int iteration) {
  return cj->dump_dir[0] && (iteration % cj->dump_every == 0 || iteration == cj->iterations - 1);
}

/* Writes every hosted stage's dump of iteration (after its step). */
static zb_err cpu_job_dump(cpu_job *cj, int iteration, const zb_step_result *step, double loss,
                           zb_diag *diag) {
  const zb_model_spec *ms = &cj->model;
  zb_err err = ZB_OK;
  for (int i = 0; !err && i < cj->n_stages; i++) {
    zb_model_stage *st = zb_backend_cpu_stage(cj->be, i, NULL);
    const zb_model_config *mc = zb_model_stage_config(st);
    int nt = zb_model_n_tensors(st);
    zb_dump_tensor *tensors = zb_calloc((size_t)(nt ? nt : 1), sizeof *tensors);
    for (int t = 0; t < nt; t++) {
      const zb_model_tensor *tt = zb_model_tensor_at(st, t);
      /* the dump format keeps 47 bytes of a name: the builtin model's fit */
      if (snprintf(tensors[t].name, sizeof tensors[t].name, "%s", tt->name) >= (int)sizeof tensors[t].name)
        err = zb_diag_set(diag, ZB_ERR_UNSUPPORTED,
                          "dump: tensor name %s is longer than the format's 47 bytes", tt->name);
      tensors[t].rows = tt->rows;
      tensors[t].cols = tt->cols;
    }
    bool last = cj->stages[i] == cj->total_stages - 1;
    zb_dump d = {.iteration = iteration,
                 .stage = cj->stages[i],
                 .n_stages = cj->total_stages,
                 .rank = cj->rank,
                 .microbatches = cj->microbatches,
                 .vocab = mc->vocab,
                 .hidden = ms->hidden,
                 .heads = ms->heads,
                 .layers = ms->layers,
                 .seq_len = ms->seq_len,
                 .batch = ms->batch,
                 .seed = (uint64_t)ms->seed,
                 .flags = (last ? ZB_DUMP_HAS_LOSS : 0) | (step->clipped ? ZB_DUMP_CLIPPED : 0) |
                          (step->skipped ? ZB_DUMP_SKIPPED : 0) | (cj->has_arch ? ZB_DUMP_ARCH : 0),
                 .loss = last ? loss : 0,
                 .grad_norm = step->grad_norm,
                 .n_tensors = nt,
                 .tensors = tensors,
                 .n = zb_model_n_params(st),
                 .before = cj->before[i],
                 .grads = cj->grads[i],
                 .after = cj->params[i]};
    snprintf(d.job_id, sizeof d.job_id, "%s", cj->job_id);
    snprintf(d.data, sizeof d.data, "%s", ms->data);
    d.replica = cj->replica;
    d.data_parallel = cj->data_parallel;
    char name[64], path[800];
    zb_dump_name(iteration, cj->stages[i], cj->replica, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", cj->dump_dir, name);
    err = zb_dump_save(cj->roots, path, &d, diag);
    free(tensors);
  }
  return err;
}

/* After an iteration's W ops: the step on every hosted stage, checked
 * globally (zb_step.h; the reduction runs along the ranks over tr), then
 * the loss when this rank has the last stage. */
/* A cuda job's step, on the device: nothing comes to the host but the
 * check's partial, except on a dump iteration, which needs the weights
 * before and after the step and the gradients in the host views. */
static zb_err cpu_job_step_device(cpu_job *cj, zb_step_chain *chain, bool dump, zb_step_result *step,
                                  zb_diag *diag) {
  zb_err err = ZB_OK;
  for (int i = 0; !err && dump && i < cj->n_stages; i++) {
    zb_model_stage *st = zb_backend_cpu_stage(cj->be, i, NULL);
    if (!(err = zb_model_pull(st, diag)))
      memcpy(cj->before[i], cj->params[i], sizeof(float) * zb_model_n_params(st));
  }
  if (!err)
    err = zb_stepper_run(cj->stepper, zb_step_reduce_chain, chain, step, diag);
  /* bf16 storage: the step (or its rollback) changed the fp32 masters */
  for (int i = 0; !err && i < cj->n_stages; i++)
    err = zb_model_refresh_compute(zb_backend_cpu_stage(cj->be, i, NULL), diag);
  for (int i = 0; !err && dump && i < cj->n_stages; i++)
    err = zb_model_pull(zb_backend_cpu_stage(cj->be, i, NULL), diag);
  return err;
}

/* A cpu job's step, on the host view of the weights, which is the host
 * device's memory: pull and push are no-ops there (docs/model.md,
 * Optimizer and step). With ZeRO-1 the step covers this replica's shards
 * (pview, gview), then the replicas' shards are all-gathered. */
static zb_err cpu_job_step_host(cpu_job *cj, zb_step_chain *chain, bool dump, zb_step_result *step,
                                zb_diag *diag) {
  cpu_job_check check = {.cj = cj, .chain = chain};
  zb_err err = ZB_OK;
  for (int i = 0; !err && i < cj->n_stages; i++)
    err = zb_model_pull(zb_backend_cpu_stage(cj->be, i, NULL), diag);
  for (int i = 0; !err && dump && i < cj->n_stages; i++)
    memcpy(cj->before[i], cj->params[i],
           sizeof(float) * zb_model_n_params(zb_backend_cpu_stage(cj->be, i, NULL)));
  if (!err)
    err = zb_stepper_step(cj->stepper, cj->pview, (const float *const *)cj->gview, cpu_job_zero_check, &check,
                          step, diag);
  if (!err)
    err = cpu_job_zero_gather(cj, chain->tr, chain->iteration, dump, diag);
  for (int i = 0; !err && i < cj->n_stages; i++)
    err = zb_model_push_params(zb_backend_cpu_stage(cj->be, i, NULL), diag);
  return err;
}

zb_err cpu_job_step(cpu_job *cj, zb_transport *tr, int iteration, bool *has_loss, double *loss,
                    zb_step_result *step, zb_diag *diag) {
  zb_step_chain chain = {
      .tr = tr, .rank = cj->rank, .nranks = cj->nranks, .iteration = iteration, .peer_base = cj->peer_base};
  bool dump = cpu_job_dumps(cj, iteration);
  /* replicas step only gradients reduced over the global batch */
  zb_err err = cpu_job_reduce_rest(cj, tr, iteration, diag);
  if (!err)
    err = cpu_job_tie_grads(cj, tr, iteration, diag);
  if (err)
    return err;
  if (cj->dstep)
    err = cpu_job_step_device(cj, &chain, dump, step, diag);
  else
    err = cpu_job_step_host(cj, &chain, dump, step, diag);
  if (err)
    return err;
  *has_loss = false;
  if (cj->last) {
    int count = 0;
    err = zb_backend_cpu_loss(cj->be, loss, &count, diag);
    cj->torn = err || count != cj->microbatches; /* stepped, yet the iteration fails */
    if (err)
      return err;
    if (count != cj->microbatches)
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "cpu job: the loss of %d microbatches, expected %d", count,
                         cj->microbatches);
    *has_loss = true;
  }
  if (dump && (err = cpu_job_dump(cj, iteration, step, *has_loss ? *loss : 0, diag)))
    cj->torn = true;
  return err;
}

bool cpu_job_same_stages(const cpu_job *cj, const zb_schedule *sched, int rank) {
  int *stages;
  int n = hosted_stages(sched, rank, &stages);
  bool same = n == cj->n_stages && sched->p * sched->v == cj->total_stages && sched->m == cj->microbatches &&
              memcmp(stages, cj->stages, sizeof(int) * (size_t)n) == 0;
  free(stages);
  return same;
}

void cpu_job_close(cpu_job *cj) {
  zb_stepper_free(cj->stepper);
  zb_step_device_free(cj->dstep); /* before the backend: its device outlives both */
  for (int i = 0; cj->before && i < cj->n_stages; i++)
    free(cj->before[i]);
  free(cj->before);
  free(cj->params);
  free(cj->grads);
  cpu_job_zero_free(cj);
  for (int i = 0; cj->opt && i < cj->n_stages; i++)
    zb_adamw_free(cj->opt[i]);
  free(cj->opt);
  zb_backend_free(cj->be);
  free(cj->stages);
  free(cj->reduced);
  free(cj->unscaled);
  free(cj->text);
  free(cj->source);
  zb_tokens_free(cj->tokens);
  free(cj->fill);
  memset(cj, 0, sizeof *cj);
}
