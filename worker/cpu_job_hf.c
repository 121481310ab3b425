/* cpu_job_hf.c — an architecture job's model as a Hugging Face directory
 * (docs/model.md, Checkpoints as Hugging Face directories). With every
 * checkpoint of a gpt2 or llama job, DIR/JOB_ID/model-it<k>/ receives the
 * weights after iteration k in transformers' names and layout: one shard
 * per stage (model-<s+1>-of-<S>.safetensors, written by the rank that
 * hosts stage s), and from the rank of stage 0 the job's config.json (its
 * text as submitted) and model.safetensors.index.json. Once every rank
 * has written, transformers loads the directory with from_pretrained, and
 * a job's model.weights reads it back. A rank keeps its files of the two
 * newest saves and removes the older ones. See cpu_job.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_job.h"
#include "zb_alloc.h"
#include "zb_arch_weights.h"
#include "zb_file.h"

static void model_dir(const cpu_job *cj, int iteration, char *buf, size_t len) {
  snprintf(buf, len, "%s/%s/model-it%d", cj->ckpt_dir, cj->job_id, iteration);
}

static bool hosts_first(const cpu_job *cj) {
  return cj->n_stages > 0 && cj->stages[0] == 0;
}

/* Hosted stage i's shard into dir (nothing for a stage without tensors). */
static zb_err write_shard(cpu_job *cj, int i, const char *dir, zb_diag *diag) {
  zb_model_stage *st = zb_backend_cpu_stage(cj->be, i, NULL);
  int n = zb_model_n_tensors(st);
  if (n == 0)
    return ZB_OK;
  zb_arch_tensor *ts = zb_calloc((size_t)n, sizeof *ts);
  const float **src = zb_calloc((size_t)n, sizeof *src);
  zb_st_entry *entries = zb_calloc((size_t)n, sizeof *entries);
  float **owned = NULL;
  size_t k = 0, len = 0;
  uint8_t *img = NULL;
  zb_err err = zb_arch_stage_tensors(&cj->arch, cj->stages[i], cj->total_stages, ts, n, &n, diag);
  for (int t = 0; !err && t < n; t++)
    src[t] = zb_model_tensor_at(st, t)->param;
  if (!err)
    err = zb_arch_hf_entries(ts, n, src, entries, &k, &owned, diag);
  if (!err && k > 0 && !(err = zb_st_build(entries, k, &img, &len, diag))) {
    char name[64], path[800];
    zb_arch_shard_name(cj->stages[i], cj->total_stages, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    err = zb_file_write_atomic_in(cj->roots, "model", path, img, len, diag);
  }
  free(img);
  zb_arch_entries_free(owned, n);
  free(entries);
  free(src);
  free(ts);
  return err;
}

/* config.json and the index, from the rank of stage 0. */
static zb_err write_meta(cpu_job *cj, const char *dir, zb_diag *diag) {
  char path[800];
  snprintf(path, sizeof path, "%s/config.json", dir);
  const char *cfg = cj->model.config_json;
  zb_err err = zb_file_write_atomic_in(cj->roots, "model", path, cfg, strlen(cfg), diag);
  zb_buf index = {0};
  if (!err)
    err = zb_arch_hf_index(&cj->arch, cj->total_stages, &index, diag);
  if (!err) {
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    err = zb_file_write_atomic_in(cj->roots, "model", path, index.data, index.len, diag);
  }
  zb_buf_free(&index);
  return err;
}

/* Removes this rank's files of the save after `iteration`, and its
 * directory once empty (the last rank to clean up removes it). */
static void forget(const cpu_job *cj, int iteration) {
  char dir[700], path[800], name[64];
  model_dir(cj, iteration, dir, sizeof dir);
  for (int i = 0; i < cj->n_stages; i++) {
    zb_arch_shard_name(cj->stages[i], cj->total_stages, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    zb_roots_unlink(cj->roots, path);
  }
  if (hosts_first(cj)) {
    snprintf(path, sizeof path, "%s/config.json", dir);
    zb_roots_unlink(cj->roots, path);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    zb_roots_unlink(cj->roots, path);
  }
  zb_roots_rmdir(cj->roots, dir); /* ENOTEMPTY while another rank's files remain */
}

zb_err cpu_job_save_hf(cpu_job *cj, int iteration, zb_diag *diag) {
  if (!cj->has_arch || cj->hf_kept[0] == iteration)
    return ZB_OK;
  char dir[700];
  model_dir(cj, iteration, dir, sizeof dir);
  zb_err err = zb_file_mkdirs_in(cj->roots, "model", dir, diag);
  for (int i = 0; !err && i < cj->n_stages; i++)
    err = write_shard(cj, i, dir, diag);
  if (!err && hosts_first(cj))
    err = write_meta(cj, dir, diag);
  if (err)
    return err;
  if (cj->hf_kept[1] >= 0)
    forget(cj, cj->hf_kept[1]);
  cj->hf_kept[1] = cj->hf_kept[0];
  cj->hf_kept[0] = iteration;
  return ZB_OK;
}
