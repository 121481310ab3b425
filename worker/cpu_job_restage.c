/* cpu_job_restage.c — a plan update that moves stages between ranks
 * (docs/model.md, Schedule updates move stages): the job's weights and
 * AdamW moments go, tensor by tensor, from the rank that hosted them under
 * the old plan to the rank that hosts them under the new one, over the
 * job's transport, at the iteration boundary where the update applies.
 *
 * Every rank knows both partitions, so each works out alone what it sends
 * and receives: a tensor's old home from its global name
 * (zb_model_tensor_stage, or zb_arch_tensor_stage for a job with an
 * architecture, whose tensors have Hugging Face names), its new one from
 * the stage being built. Both
 * ends of a pair walk the tensors in the model's global order, which keeps
 * their messages in the same order (the transport's per-peer order), and
 * the whole exchange is one transport group, so it cannot deadlock. A
 * message is one tensor's weights, first and second moments (3 x numel
 * floats), tagged F with stage -3 - (new stage) and a hash of the tensor's
 * name as microbatch, so the tcp transport's tag check catches two ranks
 * that disagree about the partition. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_job.h"
#include "zb_alloc.h"
#include "zb_clock.h"
#include "zb_log.h"

/* One tensor's move: sent from this rank, received into it, or copied
 * locally (from == to == this rank). */
typedef struct restage_move {
  int from, to;               /* ranks */
  int old_index, new_index;   /* hosted stage indices here (-1: not here) */
  const zb_model_tensor *src; /* in the old stage (sent or copied) */
  const zb_model_tensor *dst; /* in the new stage (received or copied) */
  zb_tag tag;
  float *buf; /* 3 x numel: weights, first and second moments */
} restage_move;

typedef struct restage {
  restage_move *moves;
  int n;
  int64_t bytes_sent, bytes_received;
} restage;

static int32_t name_hash(const char *name) {
  uint32_t h = 2166136261u; /* FNV-1a */
  for (const char *p = name; *p; p++)
    h = (h ^ (uint8_t)*p) * 16777619u;
  return (int32_t)(h & 0x7fffffff);
}

/* The rank and global stage that hold tensor `name` under job j's
 * partition (its p x v stages and placement). */
static zb_err tensor_home(const cpu_job *j, const char *name, int *rank, int *stage, zb_diag *diag) {
  zb_err err = j->has_arch ? zb_arch_tensor_stage(&j->arch, j->p * j->v, name, stage, NULL)
                           : zb_model_tensor_stage(j->model.layers, j->p * j->v, name, stage);
  if (err != ZB_OK)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "plan update: tensor %s is not one of the model's", name);
  *rank = zb_placement_rank(j->placement, j->p, j->v, *stage);
  return ZB_OK;
}

static int hosted_index(const cpu_job *cj, int stage) {
  for (int i = 0; i < cj->n_stages; i++)
    if (cj->stages[i] == stage)
      return i;
  return -1;
}

static restage_move *add_move(restage *r) {
  r->moves = zb_realloc(r->moves, sizeof *r->moves * (size_t)(r->n + 1));
  restage_move *mv = &r->moves[r->n++];
  *mv = (restage_move){.old_index = -1, .new_index = -1};
  return mv;
}

/* What leaves this rank: every tensor of its old stages whose new home is
 * another rank, in the model's global order. */
static zb_err plan_sends(const cpu_job *cj, const cpu_job *nj, restage *r, zb_diag *diag) {
  for (int i = 0; i < cj->n_stages; i++) {
    zb_model_stage *st = zb_backend_cpu_stage(cj->be, i, NULL);
    for (int k = 0; k < zb_model_n_tensors(st); k++) {
      const zb_model_tensor *t = zb_model_tensor_at(st, k);
      int to = -1, stage = -1;
      zb_err err = tensor_home(nj, t->name, &to, &stage, diag);
      if (err)
        return err;
      if (to == cj->rank)
        continue; /* a local copy: plan_receives has it */
      restage_move *mv = add_move(r);
      mv->from = cj->rank;
      mv->to = to;
      mv->old_index = i;
      mv->src = t;
      mv->tag = (zb_tag){.kind = ZB_OP_F, .stage = -3 - stage, .mb = name_hash(t->name)};
    }
  }
  return ZB_OK;
}

/* What this rank's new stages need: from another rank (received) or from
 * its own old stages (copied), in the model's global order. */
static zb_err plan_receives(const cpu_job *cj, const cpu_job *nj, restage *r, zb_diag *diag) {
  for (int i = 0; i < nj->n_stages; i++) {
    zb_model_stage *st = zb_backend_cpu_stage(nj->be, i, NULL);
    for (int k = 0; k < zb_model_n_tensors(st); k++) {
      const zb_model_tensor *t = zb_model_tensor_at(st, k);
      int from = -1, stage = -1;
      zb_err err = tensor_home(cj, t->name, &from, &stage, diag);
      if (err)
        return err;
      restage_move *mv = add_move(r);
      mv->from = from;
      mv->to = cj->rank;
      mv->new_index = i;
      mv->dst = t;
      mv->tag = (zb_tag){.kind = ZB_OP_F, .stage = -3 - nj->stages[i], .mb = name_hash(t->name)};
      if (from == cj->rank) {
        mv->old_index = hosted_index(cj, stage);
        mv->src = mv->old_index < 0
                      ? NULL
                      : zb_model_find_tensor(zb_backend_cpu_stage(cj->be, mv->old_index, NULL), t->name);
        if (!mv->src)
          return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "plan update: rank %d should hold %s and does not",
                             cj->rank, t->name);
      }
    }
  }
  return ZB_OK;
}

/* Packs a tensor's weights and moments (old stage index i) into dst. */
static void pack_state(const cpu_job *cj, int i, const zb_model_tensor *t, float *dst) {
  int64_t steps;
  const float *m, *v;
  zb_adamw_state(cj->opt[i], &steps, &m, &v);
  size_t off = (size_t)(t->param - zb_model_params(zb_backend_cpu_stage(cj->be, i, NULL)));
  memcpy(dst, t->param, sizeof(float) * t->numel);
  memcpy(dst + t->numel, m + off, sizeof(float) * t->numel);
  memcpy(dst + 2 * t->numel, v + off, sizeof(float) * t->numel);
}

/* Connects to every rank a move involves (additive), then moves every
 * tensor in one transport group. Moves stay within this replica: the
 * plan's rank q is transport rank peer_base + q (docs/formats.md, Data
 * parallelism), and every replica moves its own copy alike. */
static zb_err restage_exchange(const cpu_job *cj, const zb_assignment *a, zb_transport *tr, restage *r,
                               zb_diag *diag) {
  int world = zb_assignment_world(a), base = cj->peer_base;
  bool *peers = zb_calloc((size_t)world, sizeof(bool));
  const char **addrs = zb_calloc((size_t)world, sizeof(char *));
  zb_err err = ZB_OK;
  for (int k = 0; k < r->n; k++)
    peers[base + (r->moves[k].from == cj->rank ? r->moves[k].to : r->moves[k].from)] = true;
  peers[base + cj->rank] = false;
  for (int q = 0; q < world && !err; q++)
    if (peers[q] && !(addrs[q] = zb_assignment_peer(a, q)) && strcmp(zb_transport_name(tr), "tcp") == 0)
      err = zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                        "plan update: no data address for rank %d, which holds "
                        "or takes stages of this rank's",
                        q);
  if (!err)
    err = zb_transport_connect(tr, addrs, peers, 30, diag);
  free(addrs);
  free(peers);
  zb_transport_group_start(tr);
  for (int k = 0; k < r->n && !err; k++) {
    restage_move *mv = &r->moves[k];
    const zb_model_tensor *t = mv->src ? mv->src : mv->dst;
    mv->buf = zb_malloc(sizeof(float) * 3 * t->numel);
    size_t len = sizeof(float) * 3 * t->numel;
    if (mv->from == cj->rank)
      pack_state(cj, mv->old_index, mv->src, mv->buf);
    if (mv->from == cj->rank && mv->to != cj->rank) {
      err = zb_transport_send(tr, base + mv->to, mv->tag, mv->buf, len, diag);
      r->bytes_sent += (int64_t)len;
    } else if (mv->from != cj->rank) {
      err = zb_transport_recv(tr, base + mv->from, mv->tag, mv->buf, len, diag);
      r->bytes_received += (int64_t)len;
    }
  }
  zb_diag gdiag = {{0}};
  zb_err gerr = zb_transport_group_end(tr, &gdiag);
  if (!err && gerr)
    err = zb_diag_set(diag, gerr, "plan update: moving stages: %s", gdiag.msg);
  return err;
}

/* Puts what arrived (or was copied) into nj's stages and optimizers: the
 * weights into each stage, the moments through zb_adamw_set_state with the
 * job's step count, then to the device where there is one. */
static zb_err restage_unpack(const cpu_job *cj, cpu_job *nj, const restage *r, zb_diag *diag) {
  int64_t steps = 0;
  const float *m0, *v0;
  if (cj->n_stages > 0)
    zb_adamw_state(cj->opt[0], &steps, &m0, &v0); /* every stage steps together */
  zb_err err = ZB_OK;
  for (int i = 0; i < nj->n_stages && !err; i++) {
    zb_model_stage *st = zb_backend_cpu_stage(nj->be, i, NULL);
    size_t n = zb_model_n_params(st);
    float *mv = zb_calloc(2 * (n ? n : 1), sizeof(float));
    for (int k = 0; k < r->n; k++) {
      const restage_move *x = &r->moves[k];
      if (x->new_index != i)
        continue;
      size_t numel = x->dst->numel, off = (size_t)(x->dst->param - zb_model_params(st));
      memcpy(x->dst->param, x->buf, sizeof(float) * numel);
      memcpy(mv + off, x->buf + numel, sizeof(float) * numel);
      memcpy(mv + n + off, x->buf + 2 * numel, sizeof(float) * numel);
    }
    err = zb_adamw_set_state(nj->opt[i], steps, mv, mv + n, n, diag);
    if (!err)
      err = zb_model_push_params(st, diag);
    free(mv);
  }
  if (!err && nj->dstep)
    err = zb_step_device_push_state(nj->dstep, diag);
  return err;
}

static void restage_free(restage *r) {
  for (int k = 0; k < r->n; k++)
    free(r->moves[k].buf);
  free(r->moves);
}

static void stage_list(const cpu_job *cj, char *buf, size_t len) {
  buf[0] = 0;
  for (int i = 0; i < cj->n_stages; i++) {
    size_t used = strlen(buf);
    snprintf(buf + used, len - used, "%s%d", i ? "," : "", cj->stages[i]);
  }
}

/* Builds the state of a's partition in *nj and moves every tensor into it. */
static zb_err restage_into(cpu_job *cj, cpu_job *nj, const zb_assignment *a, zb_transport *tr, restage *r,
                           zb_diag *diag) {
  nj->device = cj->device;
  nj->host_transport = cj->host_transport;
  nj->roots = cj->roots;
  zb_err err = cpu_job_pull_state(cj, diag);
  if (!err)
    err = cpu_job_open(nj, a, cj->stop, diag);
  /* a tied head's copy has its embedding's name but a second home, which
   * the one-home walk below cannot pair up: every rank refuses alike */
  if (!err && cj->has_arch && cj->arch.tied && (cj->total_stages > 1 || nj->total_stages > 1))
    err = zb_diag_set(diag, ZB_ERR_UNSUPPORTED,
                      "plan update: architecture %s's tied head over several stages cannot move to "
                      "another placement yet",
                      cj->model.architecture);
  if (!err)
    err = plan_sends(cj, nj, r, diag);
  if (!err)
    err = plan_receives(cj, nj, r, diag);
  if (!err)
    err = restage_exchange(cj, a, tr, r, diag);
  if (!err)
    err = restage_unpack(cj, nj, r, diag);
  return err;
}

zb_err cpu_job_update(cpu_job *cj, const zb_assignment *a, zb_transport *tr, zb_diag *diag) {
  if (cpu_job_same_stages(cj, a->sched, a->rank))
    return ZB_OK;
  if (cj->zero) /* each replica holds a shard of every tensor's moments, not a whole tensor to move */
    return zb_diag_set(
        diag, ZB_ERR_UNSUPPORTED,
        "plan update: moving stages of a zero: 1 job (sharded optimizer state) is not built yet");
  double t0 = zb_clock_s();
  cpu_job nj = {0};
  restage r = {0};
  zb_err err = restage_into(cj, &nj, a, tr, &r, diag);
  restage_free(&r);
  if (err) {
    cpu_job_close(&nj);
    return err;
  }
  char was[128], now[128];
  stage_list(cj, was, sizeof was);
  stage_list(&nj, now, sizeof now);
  ZB_INFO("job %s rank %d: stages %s of %d -> %s of %d: sent %.3f MiB, received %.3f MiB in %.1f ms",
          cj->job_id, cj->rank, was, cj->total_stages, now, nj.total_stages, (double)r.bytes_sent / (1 << 20),
          (double)r.bytes_received / (1 << 20), 1e3 * (zb_clock_s() - t0));
  nj.completed = cj->completed;
  nj.torn = cj->torn;
  nj.resume_from[0] = 0; /* a resumed job loaded its checkpoint on its first plan */
  /* the old partition's checkpoints cannot load into the new one */
  cpu_job_forget_checkpoints(cj);
  cpu_job_close(cj);
  *cj = nj;
  if (cj->ckpt_every > 0 && cj->completed >= 0)
    return cpu_job_save(cj, cj->completed, diag);
  return ZB_OK;
}
