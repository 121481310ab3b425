/* cpu_job_arch.c — what a job with an architecture (gpt2, llama) adds to
 * a cpu or cuda job on one rank (docs/model.md, Jobs with an
 * architecture): the architecture parsed again from the config text the
 * assignment carries, the llm.c token shards its end stages sample
 * (train/zb_tokens.h, drawn by seed, iteration, microbatch and sequence,
 * so the first and the last stage see the same batch), and the weights of
 * its stages read from a Hugging Face checkpoint (zb_arch_weights.h),
 * each rank reading only its own stages' tensors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_job.h"
#include "zb_alloc.h"
#include "zb_arch_weights.h"
#include "zb_safetensors.h"

/* zb_cpu_ids_fn over the job's shards (ud: the cpu_job). */
static zb_err arch_fill(void *ud, int64_t iteration, int mb, int batch, int seq_len, int32_t *tokens,
                        int32_t *targets, zb_diag *diag) {
  const cpu_job *cj = ud;
  (void)seq_len; /* the dataset's windows are the model's seq_len */
  if (strcmp(cj->model.order, ZB_DATA_ORDER_SEQUENTIAL_NAME) == 0)
    return zb_tokens_fill_in_order(cj->tokens, (iteration * cj->microbatches + mb) * batch, batch, tokens,
                                   targets, diag);
  return zb_tokens_fill(cj->tokens, (uint64_t)cj->model.seed, iteration, mb, batch, tokens, targets, diag);
}

zb_err cpu_job_arch_open(cpu_job *cj, bool ends, zb_cpu_data *data, zb_diag *diag) {
  const zb_model_spec *ms = &cj->model;
  zb_err err = zb_model_spec_arch(ms, &cj->arch, diag);
  if (err)
    return err;
  cj->has_arch = true;
  /* the shards and the checkpoint are opened by path, not beneath a root:
   * a worker confined to --path-root refuses them rather than reach out */
  if (zb_roots_on(cj->roots))
    return zb_diag_set(diag, ZB_ERR_UNSUPPORTED,
                       "model.data: architecture %s reads token shards%s by path, not beneath this "
                       "worker's --path-root yet; run it on a worker without --path-root",
                       ms->architecture, ms->weights[0] ? " and model.weights" : "");
  if (!ends)
    return ZB_OK;
  if ((err = zb_tokens_open(ZB_TOKENS_SHARDS, ms->data, ms->seq_len, cj->arch.vocab, &cj->tokens, diag)))
    return err;
  *data = (zb_cpu_data){.fill_ids = arch_fill, .ud = cj};
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
  zb_err err = zb_st_checkpoint_open(dir, &ck, diag);
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
