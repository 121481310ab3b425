/* cpu_job_arch.c — what a job with an architecture (gpt2, llama) adds to
 * a cpu or cuda job on one rank (docs/model.md, Jobs with an
 * architecture): the architecture parsed again from the config text the
 * assignment carries, the data its end stages sample — llm.c token
 * shards, or the bytes of one text file (zb_model_data_is_shards) —
 * (train/zb_tokens.h, drawn by seed, iteration, microbatch and sequence,
 * so the first and the last stage see the same batch), and the weights of
 * its stages read from a Hugging Face checkpoint (zb_arch_weights.h),
 * each rank reading only its own stages' tensors. On a worker with
 * --path-root the data and the checkpoint are opened beneath its root,
 * following no symbolic link (zb_roots.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_job.h"
#include "zb_alloc.h"
#include "zb_arch_weights.h"
#include "zb_safetensors.h"

/* What arch_fill reads (cpu_job.fill): not the cpu_job itself, which a
 * plan update copies out of a stack frame (cpu_job_update) while the
 * backend keeps this address. */
struct cpu_arch_fill {
  const zb_tokens *tokens; /* the cpu_job's */
  uint64_t seed;
  int microbatches; /* of the global batch: data_parallel x m */
  int first_mb;     /* the global batch's index of this replica's microbatch 0: replica x m */
  bool sequential;
};

/* zb_cpu_ids_fn over the job's data (ud: its cpu_arch_fill). Replica k's
 * microbatch mb is the global batch's microbatch k x m + mb, so d replicas
 * read what one pipeline of d x m microbatches would (docs/model.md, Data
 * parallelism). */
static zb_err arch_fill(void *ud, int64_t iteration, int mb, int batch, int seq_len, int32_t *tokens,
                        int32_t *targets, zb_diag *diag) {
  const struct cpu_arch_fill *f = ud;
  (void)seq_len; /* the dataset's windows are the model's seq_len */
  int gmb = f->first_mb + mb;
  if (f->sequential)
    return zb_tokens_fill_in_order(f->tokens, (iteration * f->microbatches + gmb) * batch, batch, tokens,
                                   targets, diag);
  return zb_tokens_fill(f->tokens, f->seed, iteration, gmb, batch, tokens, targets, diag);
}

zb_err cpu_job_arch_open(cpu_job *cj, bool ends, zb_cpu_data *data, zb_diag *diag) {
  const zb_model_spec *ms = &cj->model;
  zb_err err = zb_model_spec_arch(ms, &cj->arch, diag);
  if (err)
    return err;
  cj->has_arch = true;
  if (!ends)
    return ZB_OK;
  zb_tokens_kind kind = zb_model_data_is_shards(ms->data) ? ZB_TOKENS_SHARDS : ZB_TOKENS_TEXT_BYTES;
  err = zb_tokens_open_in(cj->roots, kind, ms->data, ms->seq_len, cj->arch.vocab, &cj->tokens, diag);
  if (err && diag) {
    char inner[sizeof diag->msg];
    snprintf(inner, sizeof inner, "%s", diag->msg);
    zb_diag_set(diag, err, "model.data: %s", inner);
  }
  if (err)
    return err;
  cj->fill = zb_calloc(1, sizeof *cj->fill);
  *cj->fill = (struct cpu_arch_fill){.tokens = cj->tokens,
                                     .seed = (uint64_t)ms->seed,
                                     .microbatches = cj->data_parallel * cj->microbatches,
                                     .first_mb = cj->replica * cj->microbatches,
                                     .sequential = strcmp(ms->order, ZB_DATA_ORDER_SEQUENTIAL_NAME) == 0};
  *data = (zb_cpu_data){.fill_ids = arch_fill, .ud = cj->fill};
  return ZB_OK;
}

/* One hosted stage's tensors from the checkpoint into its host mirror,
 * then onto its device. */
static zb_err arch_stage_weights(cpu_job *cj, int i, zb_st_checkpoint *ck, zb_diag *diag) {
  int stage = 0, n = 0;
  zb_model_stage *st = zb_backend_cpu_stage(cj->be, i, &stage);
  zb_err err = zb_arch_stage_tensors(&cj->arch, stage, cj->total_stages, NULL, 0, &n, diag);
  if (err)
    return err;
  if (n != zb_model_n_tensors(st))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "model.weights: stage %d holds %d tensors, its architecture %d", stage,
                       zb_model_n_tensors(st), n);
  zb_arch_tensor *ts = zb_calloc((size_t)(n ? n : 1), sizeof *ts);
  float **dst = zb_calloc((size_t)(n ? n : 1), sizeof *dst);
  err = zb_arch_stage_tensors(&cj->arch, stage, cj->total_stages, ts, n, &n, diag);
  for (int t = 0; !err && t < n; t++)
    dst[t] = zb_model_tensor_at(st, t)->param;
  if (!err)
    err = zb_arch_read_tensors(ts, n, ck, dst, diag);
  if (!err)
    err = zb_model_push_params(st, diag);
  free(ts);
  free(dst);
  return err;
}

zb_err cpu_job_arch_weights(cpu_job *cj, zb_diag *diag) {
  const char *dir = cj->model.weights;
  if (!dir[0])
    return ZB_OK; /* seeded initialisation, as the backend made it */
  zb_st_checkpoint *ck = NULL;
  zb_err err = zb_st_checkpoint_open_in(cj->roots, dir, &ck, diag);
  for (int i = 0; !err && i < cj->n_stages; i++)
    err = arch_stage_weights(cj, i, ck, diag);
  zb_st_checkpoint_close(ck);
  if (err && diag) {
    char inner[sizeof diag->msg];
    snprintf(inner, sizeof inner, "%s", diag->msg);
    zb_diag_set(diag, err, "model.weights '%.200s': %s", dir, inner);
  }
  return err;
}
