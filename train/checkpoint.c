/* checkpoint.c — see zb_checkpoint.h. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_checkpoint.h"
#include "zb_file.h"

static const char magic[8] = {'Z', 'B', 'C', 'K', 'P', 'T', 0, 1};

/* How many floats m and v hold each: the whole stage's, or a shard's. */
static size_t moments_of(const zb_ckpt *c) {
  return c->shards > 0 ? c->n_moments : c->n;
}

typedef struct ckpt_head {
  char magic[8];
  uint32_t version, shards; /* shards: 0, the whole optimizer state */
  char job_id[64];
  int32_t stage, iteration;
  int64_t steps;
  uint32_t n_tensors, shard;
} ckpt_head;

zb_err zb_ckpt_save(const zb_roots *roots, const char *path, const zb_ckpt *c, zb_diag *diag) {
  zb_file_writer w;
  zb_err err = zb_file_begin_in(&w, roots, "checkpoint", path, diag);
  if (err)
    return err;
  ckpt_head h;
  memset(&h, 0, sizeof h);
  memcpy(h.magic, magic, sizeof magic);
  h.version = ZB_CKPT_VERSION;
  snprintf(h.job_id, sizeof h.job_id, "%s", c->job_id);
  h.stage = c->stage;
  h.iteration = c->iteration;
  h.steps = c->steps;
  h.n_tensors = (uint32_t)c->n_tensors;
  h.shards = c->shards > 0 ? (uint32_t)c->shards : 0;
  h.shard = c->shards > 0 ? (uint32_t)c->shard : 0;
  size_t mbytes = moments_of(c) * sizeof(float);
  zb_file_write(&w, &h, sizeof h);
  zb_file_write(&w, c->sizes, sizeof(uint64_t) * (size_t)c->n_tensors);
  zb_file_write(&w, c->params, c->n * sizeof(float));
  zb_file_write(&w, c->m, mbytes);
  zb_file_write(&w, c->v, mbytes);
  return zb_file_commit(&w, diag);
}

zb_err zb_ckpt_load(const zb_roots *roots, const char *path, zb_ckpt *c, zb_diag *diag) {
  zb_file_reader r;
  zb_err err = zb_file_open_in(&r, roots, "checkpoint", path, diag);
  if (err)
    return err;
  uint64_t *sizes = NULL;
  ckpt_head h;
  if (!zb_file_read(&r, &h, sizeof h) || memcmp(h.magic, magic, sizeof magic) != 0) {
    err = zb_diag_set(diag, ZB_ERR_PARSE, "checkpoint '%s': not a zb checkpoint (bad magic)", path);
    goto out;
  }
  if (h.version != ZB_CKPT_VERSION) {
    err = zb_diag_set(diag, ZB_ERR_PARSE, "checkpoint '%s': version %u, this worker reads %d", path,
                      h.version, ZB_CKPT_VERSION);
    goto out;
  }
  h.job_id[sizeof h.job_id - 1] = 0;
  if (strcmp(h.job_id, c->job_id) != 0 || h.stage != c->stage) {
    err = zb_diag_set(diag, ZB_ERR_PARSE, "checkpoint '%s': holds job %s stage %d, expected job %s stage %d",
                      path, h.job_id, h.stage, c->job_id, c->stage);
    goto out;
  }
  if (h.n_tensors != (uint32_t)c->n_tensors || h.iteration < 0 || h.steps < 0) {
    err = zb_diag_set(diag, ZB_ERR_PARSE,
                      "checkpoint '%s': %u tensors, iteration %d, %lld steps; the model has %d tensors", path,
                      h.n_tensors, h.iteration, (long long)h.steps, c->n_tensors);
    goto out;
  }
  uint32_t want_shards = c->shards > 0 ? (uint32_t)c->shards : 0;
  if (h.shards != want_shards || (want_shards && h.shard != (uint32_t)c->shard)) {
    /* a ZeRO-1 job's moments are split by its data_parallel: another d
     * (or zero: 0) cannot take them (docs/model.md, Data parallelism) */
    err = zb_diag_set(diag, ZB_ERR_PARSE,
                      "checkpoint '%s': holds optimizer shard %u of %u (0 of 0: whole), expected %d of %d",
                      path, h.shard, h.shards, want_shards ? c->shard : 0, (int)want_shards);
    goto out;
  }
  sizes = zb_malloc(sizeof(uint64_t) * (h.n_tensors ? h.n_tensors : 1));
  if (!zb_file_read(&r, sizes, sizeof(uint64_t) * h.n_tensors)) {
    err = zb_diag_set(diag, ZB_ERR_PARSE, "checkpoint '%s': truncated in the tensor sizes", path);
    goto out;
  }
  for (uint32_t t = 0; t < h.n_tensors; t++)
    if (sizes[t] != c->sizes[t]) {
      err = zb_diag_set(diag, ZB_ERR_PARSE, "checkpoint '%s': tensor %u has %llu elements, the model's %llu",
                        path, t, (unsigned long long)sizes[t], (unsigned long long)c->sizes[t]);
      goto out;
    }
  size_t mbytes = moments_of(c) * sizeof(float);
  if (!zb_file_read(&r, c->params, c->n * sizeof(float)) || !zb_file_read(&r, c->m, mbytes) ||
      !zb_file_read(&r, c->v, mbytes)) {
    err = zb_diag_set(diag, ZB_ERR_PARSE, "checkpoint '%s': truncated (expected %zu parameters)", path, c->n);
    goto out;
  }
  if (!zb_file_check_end(&r)) {
    err = zb_diag_set(diag, ZB_ERR_PARSE, "checkpoint '%s': corrupt (checksum mismatch or trailing bytes)",
                      path);
    goto out;
  }
  c->iteration = h.iteration;
  c->steps = h.steps;
out:
  free(sizes);
  zb_file_close(&r);
  return err;
}
