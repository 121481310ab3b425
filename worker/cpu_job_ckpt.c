/* cpu_job_ckpt.c — a cpu job's checkpoints (docs/model.md, Checkpoints and
 * resume): every hosted stage's weights and AdamW state after an
 * iteration, the previous one kept, and resume from the last iteration
 * every rank holds. Every file operation goes through cj->roots, beneath
 * the worker's --path-root when it has one (zb_roots.h). See cpu_job.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cpu_job.h"
#include "worker.h"
#include "zb_alloc.h"
#include "zb_beneath.h"
#include "zb_checkpoint.h"
#include "zb_file.h"
#include "zb_log.h"

/* DIR/JOB/rank<r>-stage<s>.ckpt, or with prev its previous version
 * (.ckpt.prev): each save keeps the one before, because ranks stopped
 * mid-iteration may have completed different iterations (at most one
 * apart), and a resume needs one iteration that every rank holds. With
 * ZeRO-1 every replica writes its own, rank<r>-stage<s>-shard<k>of<d>.ckpt:
 * the whole weights and its shard of the moments. */
static void ckpt_path(const cpu_job *cj, const char *job_id, int stage, bool prev, char *buf, size_t len) {
  char shard[32] = "";
  if (cj->zero)
    snprintf(shard, sizeof shard, "-shard%dof%d", cj->replica, cj->data_parallel);
  snprintf(buf, len, "%s/%s/rank%d-stage%d%s.ckpt%s", cj->ckpt_dir, job_id, cj->rank, stage, shard,
           prev ? ".prev" : "");
}

/* Whether this rank writes checkpoints: replica 0, whose bits every
 * replica shares (docs/model.md, Data parallelism), or with ZeRO-1 every
 * replica, each holding another shard of the optimizer state. */
static bool ckpt_writer(const cpu_job *cj) {
  return cj->replica == 0 || cj->zero;
}

/* The header and buffers of hosted stage i's checkpoint; sizes is an
 * allocated array the caller frees. */
static zb_ckpt ckpt_of(const cpu_job *cj, const char *job_id, int i, uint64_t **sizes) {
  zb_model_stage *st = zb_backend_cpu_stage(cj->be, i, NULL);
  int nt = zb_model_n_tensors(st);
  *sizes = zb_malloc(sizeof(uint64_t) * (size_t)(nt ? nt : 1));
  for (int t = 0; t < nt; t++)
    (*sizes)[t] = zb_model_tensor_at(st, t)->numel;
  zb_ckpt c = {.stage = cj->stages[i],
               .n_tensors = nt,
               .sizes = *sizes,
               .n = zb_model_n_params(st),
               .shard = cj->zero ? cj->replica : 0,
               .shards = cj->zero ? cj->data_parallel : 0,
               .n_moments = cj->shard_len[i]};
  snprintf(c.job_id, sizeof c.job_id, "%s", job_id);
  return c;
}

/* A cuda job steps on the device (zb_step_device.h): its weights and
 * moments come to the host views and optimizers, which the files are
 * written from, for a checkpoint only. zb_model_pull brings the gradients
 * too: one extra copy per checkpoint. */
zb_err cpu_job_pull_state(cpu_job *cj, zb_diag *diag) {
  zb_err err = ZB_OK;
  for (int i = 0; cj->dstep && !err && i < cj->n_stages; i++)
    err = zb_model_pull(zb_backend_cpu_stage(cj->be, i, NULL), diag);
  return err || !cj->dstep ? err : zb_step_device_pull_state(cj->dstep, diag);
}

void cpu_job_forget_checkpoints(const cpu_job *cj) {
  for (int i = 0; cj->ckpt_every > 0 && ckpt_writer(cj) && i < cj->n_stages; i++)
    for (int prev = 0; prev < 2; prev++) {
      char path[800];
      ckpt_path(cj, cj->job_id, cj->stages[i], prev, path, sizeof path);
      zb_roots_unlink(cj->roots, path);
    }
}

/* Saves every hosted stage after iteration `iteration` (the state now). */
zb_err cpu_job_save(cpu_job *cj, int iteration, zb_diag *diag) {
  if (cj->saved == iteration)
    return ZB_OK; /* the periodic save just wrote this state */
  /* replicas hold the same bits (docs/model.md, Data parallelism):
   * replica 0 writes the files, every replica resumes from them; with
   * ZeRO-1 each writes its own shard, no collective, so a stopping
   * replica saves alone */
  if (!ckpt_writer(cj))
    return ZB_OK;
  char dir[700];
  snprintf(dir, sizeof dir, "%s/%s", cj->ckpt_dir, cj->job_id);
  zb_err err = zb_file_mkdirs_in(cj->roots, "checkpoint", dir, diag);
  if (!err)
    err = cpu_job_pull_state(cj, diag);
  for (int i = 0; !err && i < cj->n_stages; i++) {
    uint64_t *sizes;
    zb_ckpt c = ckpt_of(cj, cj->job_id, i, &sizes);
    const float *m, *v;
    zb_adamw_state(cj->opt[i], &c.steps, &m, &v);
    c.iteration = iteration;
    /* zb_ckpt_save only reads the arrays */
    c.params = cj->params[i];
    c.m = (float *)m;
    c.v = (float *)v;
    char path[800], prev[800], tmp[820];
    ckpt_path(cj, cj->job_id, cj->stages[i], false, path, sizeof path);
    ckpt_path(cj, cj->job_id, cj->stages[i], true, prev, sizeof prev);
    /* the current file becomes .prev by a hard link renamed into place, so
     * at every moment the file itself is there, old or new */
    snprintf(tmp, sizeof tmp, "%s.tmp", prev);
    zb_roots_unlink(cj->roots, tmp);
    if (zb_roots_link(cj->roots, path, tmp) == 0) {
      if (zb_roots_rename(cj->roots, tmp, prev) != 0)
        err = zb_diag_set(diag, ZB_ERR_IO, "checkpoint '%s': cannot keep it as .prev: %s", path,
                          zb_beneath_strerror(errno));
    } else if (errno != ENOENT) {
      err = zb_diag_set(diag, ZB_ERR_IO, "checkpoint '%s': cannot link it to '%s': %s", path, tmp,
                        zb_beneath_strerror(errno));
    }
    if (!err)
      err = zb_ckpt_save(cj->roots, path, &c, diag);
    free(sizes);
  }
  if (!err && cj->replica == 0)
    err = cpu_job_save_hf(cj, iteration, diag);
  if (!err) {
    cj->saved = iteration;
    ZB_INFO("job %s rank %d: checkpoint after iteration %d in %s", cj->job_id, cj->rank, iteration, dir);
  }
  return err;
}

/* The iterations checkpointed for hosted stage i of job `from`: up to two
 * (the file and .prev), -1 where absent. A file that is there but is not a
 * valid checkpoint of this stage is an error naming it. */
static zb_err ckpt_candidates(cpu_job *cj, const char *from, int i, int32_t out[2], zb_diag *diag) {
  uint64_t *sizes;
  zb_ckpt c = ckpt_of(cj, from, i, &sizes);
  float *buf = zb_malloc(sizeof(float) * (c.n + 2 * cj->shard_len[i] + 1));
  c.params = buf;
  c.m = buf + c.n;
  c.v = buf + c.n + cj->shard_len[i];
  zb_err err = ZB_OK;
  for (int k = 0; k < 2 && !err; k++) {
    char path[800];
    ckpt_path(cj, from, cj->stages[i], k == 1, path, sizeof path);
    out[k] = -1;
    struct stat sb;
    if (zb_roots_stat(cj->roots, path, &sb) != 0 && errno == ENOENT)
      continue;
    if (!(err = zb_ckpt_load(cj->roots, path, &c, diag)))
      out[k] = c.iteration;
  }
  free(buf);
  free(sizes);
  return err;
}

/* The iterations every hosted stage of this rank holds a checkpoint of
 * (two candidates, -1: none). */
static zb_err resume_candidates(cpu_job *cj, int32_t cand[2], zb_diag *diag) {
  cand[0] = cand[1] = -1;
  for (int i = 0; i < cj->n_stages; i++) {
    int32_t got[2];
    zb_err err = ckpt_candidates(cj, cj->resume_from, i, got, diag);
    if (err)
      return err;
    if (i == 0) {
      cand[0] = got[0];
      cand[1] = got[1];
      continue;
    }
    for (int q = 0; q < 2; q++)
      if (cand[q] != got[0] && cand[q] != got[1])
        cand[q] = -1;
  }
  return ZB_OK;
}

/* The ranks agree along the chain 0 -> p-1 and back: mine (the two
 * candidates and whether some rank failed to read) is intersected on the
 * way up and replaced by the last rank's on the way down. */
static zb_err resume_agree(cpu_job *cj, zb_transport *tr, int32_t mine[3], zb_diag *diag) {
  int32_t msg[3];
  zb_tag up = {.kind = ZB_OP_F, .stage = -2, .mb = 0}, down = {.kind = ZB_OP_B, .stage = -2, .mb = 0};
  zb_err err = ZB_OK;
  if (cj->rank > 0 &&
      !(err = zb_transport_recv(tr, cj->peer_base + cj->rank - 1, up, msg, sizeof msg, diag))) {
    for (int q = 0; q < 2; q++)
      if (mine[q] != msg[0] && mine[q] != msg[1])
        mine[q] = -1;
    mine[2] |= msg[2];
  }
  if (!err && cj->rank < cj->nranks - 1 &&
      !(err = zb_transport_send(tr, cj->peer_base + cj->rank + 1, up, mine, 3 * sizeof *mine, diag)) &&
      !(err = zb_transport_recv(tr, cj->peer_base + cj->rank + 1, down, msg, sizeof msg, diag)))
    memcpy(mine, msg, sizeof msg);
  if (!err && cj->rank > 0)
    err = zb_transport_send(tr, cj->peer_base + cj->rank - 1, down, mine, 3 * sizeof *mine, diag);
  return err;
}

/* With ZeRO-1 each replica read its own files: after the chain the stage
 * group's members (one per replica) all-gather their replica's three
 * int32 (moved as float bits, never added) and intersect them in member
 * order, so every rank of every replica holds the same answer. */
static zb_err resume_agree_replicas(cpu_job *cj, zb_transport *tr, int32_t mine[3], zb_diag *diag) {
  if (!cj->zero)
    return ZB_OK;
  int d = cj->data_parallel;
  int32_t *all = zb_calloc((size_t)d * 3, sizeof *all);
  int *ranks = zb_malloc(sizeof(int) * (size_t)d);
  memcpy(all + 3 * cj->replica, mine, 3 * sizeof *mine);
  float *buf = zb_malloc(sizeof(float) * 3 * (size_t)d);
  memcpy(buf, all, sizeof(float) * 3 * (size_t)d);
  /* kind REDUCE_GRAD, stage -2: no stage's collective and not the chain's F/B */
  zb_ring ring = cpu_job_ring(cj, tr, -2, 0, ranks);
  zb_err err = zb_ring_all_gather(&ring, buf, 3 * (size_t)d, diag);
  if (!err) {
    memcpy(all, buf, sizeof(float) * 3 * (size_t)d);
    for (int k = 0; k < d; k++) {
      const int32_t *o = all + 3 * k;
      for (int q = 0; q < 2; q++)
        if (mine[q] != o[0] && mine[q] != o[1])
          mine[q] = -1;
      mine[2] |= o[2];
    }
  }
  free(buf);
  free(ranks);
  free(all);
  return err;
}

/* Loads iteration k's checkpoint (the file or its .prev) into every
 * hosted stage, weights and AdamW state. */
static zb_err resume_load(cpu_job *cj, int k, zb_diag *diag) {
  zb_err err = ZB_OK;
  for (int i = 0; i < cj->n_stages && !err; i++) {
    uint64_t *sizes;
    zb_ckpt c = ckpt_of(cj, cj->resume_from, i, &sizes);
    size_t k_m = cj->shard_len[i];
    float *mv = zb_malloc(sizeof(float) * 2 * (k_m ? k_m : 1));
    c.params = cj->params[i];
    c.m = mv;
    c.v = mv + k_m;
    char path[800];
    ckpt_path(cj, cj->resume_from, cj->stages[i], false, path, sizeof path);
    if (!(err = zb_ckpt_load(cj->roots, path, &c, diag)) && c.iteration != k) {
      ckpt_path(cj, cj->resume_from, cj->stages[i], true, path, sizeof path);
      err = zb_ckpt_load(cj->roots, path, &c, diag);
    }
    if (!err && c.iteration != k)
      err =
          zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                      "checkpoint '%s': iteration %d, expected %d (changed under us?)", path, c.iteration, k);
    if (!err)
      err = zb_adamw_set_state(cj->opt[i], c.steps, c.m, c.v, k_m, diag);
    if (!err) /* the weights were read into the host view; a device needs them too */
      err = zb_model_push_params(zb_backend_cpu_stage(cj->be, i, NULL), diag);
    free(mv);
    free(sizes);
  }
  if (!err && cj->dstep) /* a device step keeps the moments there too */
    err = zb_step_device_push_state(cj->dstep, diag);
  return err;
}

/* Loads job cj->resume_from's checkpoint into every hosted stage: the
 * last iteration that every stage of every rank holds. The ranks agree on
 * it along the chain 0 -> p-1 and back (like the optimizer's check), each
 * sending the iterations it could load (two int32, -1: none), intersected
 * on the way up; a rank that cannot read its files sends none, so all
 * fail together and it reports why. *k: the iteration loaded. */
zb_err cpu_job_resume(cpu_job *cj, zb_transport *tr, int *k, zb_diag *diag) {
  int32_t cand[2];
  zb_err err = resume_candidates(cj, cand, diag);
  /* a rank that cannot read its files sends none, so all fail together */
  int32_t mine[3] = {err ? -1 : cand[0], err ? -1 : cand[1], err ? 1 : 0};
  zb_diag tdiag = {{0}};
  zb_err terr = resume_agree(cj, tr, mine, &tdiag);
  if (!terr)
    terr = resume_agree_replicas(cj, tr, mine, &tdiag);
  if (err)
    return err;
  if (terr)
    return zb_diag_set(diag, terr, "resume from job %s: %s", cj->resume_from, tdiag.msg);
  if (mine[2]) {
    /* another rank cannot read its files and reports why; the job fails
     * with the first error, so give that one (naming the file) a head
     * start: the coordinator then releases this rank, which stops quietly */
    for (int t = 0; t < 20 && !atomic_load(cj->stop); t++)
      worker_sleep_ms(100);
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "resume from job %s: another rank cannot read its checkpoint", cj->resume_from);
  }
  *k = mine[0] > mine[1] ? mine[0] : mine[1];
  if (*k < 0)
    return zb_diag_set(
        diag, ZB_ERR_INVALID_ARG,
        "resume from job %s: no iteration is checkpointed by every rank under %s/%s (or a rank "
        "could not read its files; see its error)",
        cj->resume_from, cj->ckpt_dir, cj->resume_from);
  err = resume_load(cj, *k, diag);
  if (!err) {
    cj->completed = cj->saved = -1;
    ZB_INFO("job %s rank %d: resumed from job %s's checkpoint after iteration %d", cj->job_id, cj->rank,
            cj->resume_from, *k);
  }
  cj->resume_from[0] = 0;
  return err;
}
