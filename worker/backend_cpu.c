/* backend_cpu.c — the model backends: the built-in model's F, B and W on
 * the stages a rank hosts, over a device (zb_device.h), with the
 * activations and gradients the transport carries kept in per-(kind,
 * stage, microbatch) slots (zb_backend.h, "cpu" and "cuda"). On the host
 * device ("cpu") submit runs the op's math and returns; on a CUDA device
 * ("cuda") it enqueues on the device's stream, sync waits, and ops are
 * timed with device events. With a host transport (tcp) a device backend
 * stages every message through host memory (docs/model.md, Backends). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cpu_internal.h"
#include "zb_alloc.h"
#include "zb_names.h"

static const zb_backend_ops cpu_ops, cuda_ops;

/* ---- ops ---------------------------------------------------------------- */

static cpu_stage *cpu_hosted(const cpu_backend *b, int stage) {
  if (stage < 0 || stage >= b->total || b->local[stage] < 0)
    return NULL;
  return &b->stages[b->local[stage]];
}

/* Prefixes a model error with the backend's name. */
static zb_err cpu_model_err(const cpu_backend *b, zb_err err, zb_diag *diag) {
  if (err && diag) {
    char inner[sizeof diag->msg];
    memcpy(inner, diag->msg, sizeof inner);
    zb_diag_set(diag, err, "%s backend: %s", cpu_name(b), inner);
  }
  return err;
}

/* Sum of the state bytes of every hosted stage but `except`. */
static int64_t cpu_state_others(const cpu_backend *b, const cpu_stage *except) {
  int64_t sum = 0;
  for (int i = 0; i < b->n; i++)
    if (&b->stages[i] != except) {
      zb_model_mem m;
      zb_model_mem_stats(b->stages[i].st, &m);
      sum += m.state_bytes;
    }
  return sum;
}

/* After an op on cs: the rank's bytes now and the highest they reached
 * during the op (only cs changed, so others + cs's own peak is exact). */
static void cpu_account(cpu_backend *b, const cpu_stage *cs) {
  zb_model_mem m;
  zb_model_mem_stats(cs->st, &m);
  int64_t others = cpu_state_others(b, cs);
  b->mem = others + m.state_bytes;
  if (others + m.peak_state_bytes > b->peak)
    b->peak = others + m.peak_state_bytes;
  if (b->peak > b->peak_ever)
    b->peak_ever = b->peak;
}

static zb_err cpu_forward(cpu_backend *b, cpu_stage *cs, int mb, zb_diag *diag) {
  int first = zb_model_stage_is_first(cs->st), last = zb_model_stage_is_last(cs->st), s = cs->index;
  const float *x = NULL;
  float *y = NULL;
  zb_err err = ZB_OK;
  cpu_grow(b, cs, mb);
  if (first || last)
    err = cpu_fill(b, s, mb, diag);
  if (!err && !first) {
    cpu_stage *prev = cpu_hosted(b, s - 1);
    char what[48];
    snprintf(what, sizeof what, prev ? "F of stage %d" : "RECV_F from stage %d", s - 1);
    err = prev ? cpu_input(b, prev, SLOT_SEND_F, mb, "F", s, what, &x, diag)
               : cpu_input(b, cs, SLOT_RECV_F, mb, "F", s, what, &x, diag);
  }
  if (err)
    return err;
  cpu_slot *out = NULL;
  if (!last && (err = cpu_slot_get(b, cs, SLOT_SEND_F, mb, &out, diag)))
    return err;
  y = out ? out->buf : NULL;
  int t;
  if ((err = cpu_time_start(b, ZB_OP_F, &t, diag)))
    return err;
  /* the loss stays on the device until zb_backend_cpu_loss: no host sync per microbatch */
  err =
      zb_model_forward_dev(cs->st, mb, first ? b->tok_ids : NULL, x, last ? b->tgt_ids : NULL, y, NULL, diag);
  if (!err)
    err = cpu_time_end(b, t, diag);
  if (err)
    return cpu_model_err(b, err, diag);
  if (out)
    out->epoch = b->epoch;
  if (last)
    b->loss_epoch[mb] = b->epoch;
  return ZB_OK;
}

/* B of (cs, mb): reads the output gradient, writes dx to the SEND_B slot. */
static zb_err cpu_backward_b(cpu_backend *b, cpu_stage *cs, int mb, const char *op, zb_diag *diag) {
  int first = zb_model_stage_is_first(cs->st), last = zb_model_stage_is_last(cs->st), s = cs->index;
  const float *dy = NULL;
  zb_err err = ZB_OK;
  if (!last) {
    cpu_stage *next = cpu_hosted(b, s + 1);
    char what[48];
    snprintf(what, sizeof what, next ? "B of stage %d" : "RECV_B from stage %d", s + 1);
    err = next ? cpu_input(b, next, SLOT_SEND_B, mb, op, s, what, &dy, diag)
               : cpu_input(b, cs, SLOT_RECV_B, mb, op, s, what, &dy, diag);
    if (err)
      return err;
  }
  cpu_slot *out = NULL;
  if (!first && (err = cpu_slot_get(b, cs, SLOT_SEND_B, mb, &out, diag)))
    return err;
  int t;
  if ((err = cpu_time_start(b, ZB_OP_B, &t, diag)))
    return err;
  err = zb_model_backward_b_dev(cs->st, mb, dy, out ? out->buf : NULL, diag);
  if (!err)
    err = cpu_time_end(b, t, diag);
  if (err)
    return cpu_model_err(b, err, diag);
  if (out)
    out->epoch = b->epoch;
  return ZB_OK;
}

static zb_err cpu_backward_w(cpu_backend *b, cpu_stage *cs, int mb, zb_diag *diag) {
  int t;
  zb_err err = cpu_time_start(b, ZB_OP_W, &t, diag);
  if (err)
    return err;
  err = zb_model_backward_w(cs->st, mb, diag);
  if (!err)
    err = cpu_time_end(b, t, diag);
  return cpu_model_err(b, err, diag);
}

static zb_err cpu_submit(void *self, zb_op op, int stage, int mb, zb_diag *diag) {
  cpu_backend *b = self;
  if (!zb_op_is_compute(op))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "%s backend: %s is not a compute op", cpu_name(b),
                       zb_op_name(op));
  cpu_stage *cs = cpu_hosted(b, stage);
  if (!cs || mb < 0)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "%s backend: %s of stage %d mb %d: rank %d does not host it",
                       cpu_name(b), zb_op_name(op), stage, mb, b->rank);
  if (b->stop && atomic_load(b->stop))
    return zb_diag_set(diag, ZB_ERR_IO, "stopped (stop flag raised) before a compute op");
  zb_model_reset_peak(cs->st); /* so cpu_account sees this op's own high-water mark */
  zb_err err;
  switch (op) {
  case ZB_OP_F: err = cpu_forward(b, cs, mb, diag); break;
  case ZB_OP_B: err = cpu_backward_b(b, cs, mb, "B", diag); break;
  case ZB_OP_W: err = cpu_backward_w(b, cs, mb, diag); break;
  default: /* BW: the model's fused op is B then W; calling them apart times each */
    err = cpu_backward_b(b, cs, mb, "BW", diag);
    if (!err)
      err = cpu_backward_w(b, cs, mb, diag);
  }
  cpu_account(b, cs);
  return err;
}

static zb_err cpu_sync(void *self, zb_diag *diag) {
  cpu_backend *b = self;
  return dev_sync(b->dev, diag);
}

/* The slot kind that comm action `comm` of stage cs uses, or -1 (the first
 * stage receives no activation, the last sends none, ...). */
static int cpu_comm_kind(const cpu_stage *cs, zb_op comm) {
  int first = zb_model_stage_is_first(cs->st), last = zb_model_stage_is_last(cs->st);
  switch (comm) {
  case ZB_OP_SEND_F: return last ? -1 : SLOT_SEND_F;
  case ZB_OP_RECV_F: return first ? -1 : SLOT_RECV_F;
  case ZB_OP_SEND_B: return first ? -1 : SLOT_SEND_B;
  case ZB_OP_RECV_B: return last ? -1 : SLOT_RECV_B;
  default: return -2;
  }
}

/* A SEND's bytes as the transport reads them: the slot itself, or (when
 * staging) its host copy, made now and waited for. */
static zb_err cpu_send_view(cpu_backend *b, cpu_slot *s, void **out, zb_diag *diag) {
  if (!b->staging) {
    *out = s->buf;
    return ZB_OK;
  }
  zb_err err = dev_copy(b->dev, s->host, s->buf, b->act_bytes, ZB_COPY_D2H, diag);
  if (!err)
    err = dev_sync(b->dev, diag);
  *out = s->host;
  return err;
}

static zb_err cpu_buffer(void *self, zb_op comm, int stage, int mb, size_t len, void **out, zb_diag *diag) {
  cpu_backend *b = self;
  if (len != b->act_bytes)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "%s backend: bytes_per_activation is %zu but one activation of this model is %zu "
                       "bytes (batch %d x seq_len %d x hidden %d x 4); set the job's bytes_per_activation "
                       "to %zu",
                       cpu_name(b), len, b->act_bytes, b->model.batch, b->model.seq_len, b->model.hidden,
                       b->act_bytes);
  cpu_stage *cs = cpu_hosted(b, stage);
  if (!cs || mb < 0)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "%s backend: %s of stage %d mb %d: rank %d does not host it",
                       cpu_name(b), zb_op_name(comm), stage, mb, b->rank);
  int kind = cpu_comm_kind(cs, comm);
  if (kind == -2)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "%s backend: %s has no buffer", cpu_name(b),
                       zb_op_name(comm));
  if (kind < 0)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "%s backend: %s of stage %d: the %s stage has no such message", cpu_name(b),
                       zb_op_name(comm), stage, zb_model_stage_is_first(cs->st) ? "first" : "last");
  cpu_slot *s;
  zb_err err = cpu_slot_get(b, cs, kind, mb, &s, diag);
  if (err)
    return err;
  if (kind == SLOT_SEND_F || kind == SLOT_SEND_B) {
    if (s->epoch != b->epoch) /* sending what this iteration has not computed */
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                         "%s backend: %s of stage %d mb %d before its %s has run in this iteration",
                         cpu_name(b), zb_op_name(comm), stage, mb, kind == SLOT_SEND_F ? "F" : "B");
    return cpu_send_view(b, s, out, diag);
  }
  s->epoch = b->epoch; /* the transport fills it before the group ends */
  s->staged_in = b->staging;
  *out = b->staging ? (void *)s->host : (void *)s->buf;
  return ZB_OK;
}

/* A device backend's peak from its allocator: the bytes above what is not
 * microbatch state (the model keeps no cache of its own there), then a new
 * interval. The cpu backend reports the model's count, which its own cache
 * would otherwise blur. */
static int64_t cpu_device_peak(cpu_backend *b) {
  zb_device_mem m;
  b->dev->ops->mem(b->dev->self, &m);
  int64_t peak = m.peak - b->dev_base > b->dev_peak ? m.peak - b->dev_base : b->dev_peak;
  b->dev->ops->reset_peak(b->dev->self);
  b->dev_base = m.current - b->mem;
  b->dev_peak = 0;
  return peak;
}

void cpu_device_slot_alloc(cpu_backend *b, size_t bytes, bool done) {
  if (!b->cuda)
    return;
  if (!done) { /* the stretch before the slot: its states' peak */
    zb_device_mem m;
    b->dev->ops->mem(b->dev->self, &m);
    if (m.peak - b->dev_base > b->dev_peak)
      b->dev_peak = m.peak - b->dev_base;
    return;
  }
  b->dev->ops->reset_peak(b->dev->self);
  b->dev_base += (int64_t)bytes;
}

static void cpu_take_stats(void *self, zb_backend_stats *out) {
  cpu_backend *b = self;
  cpu_time_collect(b);
  *out = b->acc;
  out->mem_bytes = b->mem;
  out->peak_bytes = b->cuda ? cpu_device_peak(b) : b->peak;
  int64_t syncs = b->dev->ops->host_syncs(b->dev->self);
  out->host_syncs = syncs - b->syncs_base;
  b->syncs_base = syncs;
  out->device_peak = out->device_used = -1;
  if (b->cuda) {
    zb_device_mem m;
    b->dev->ops->mem(b->dev->self, &m);
    out->device_peak = m.held_peak;
    out->device_used = m.device_used;
  }
  memset(&b->acc, 0, sizeof b->acc);
  b->peak = b->mem;
}

static void cpu_free(void *self) {
  cpu_backend *b = self;
  for (int i = 0; i < b->n; i++) {
    cpu_stage *cs = &b->stages[i];
    zb_model_stage_free(cs->st);
    for (int k = 0; k < SLOT_KINDS; k++) {
      for (int mb = 0; mb < cs->cap; mb++) {
        if (cs->slots[k][mb].buf)
          dev_release(b->dev, cs->slots[k][mb].buf);
        free(cs->slots[k][mb].host);
      }
      free(cs->slots[k]);
    }
  }
  cpu_time_free(b);
  if (b->own_dev)
    zb_device_free(b->dev);
  free(b->stages);
  free(b->local);
  free(b->tokens);
  free(b->targets);
  free(b->tok_ids);
  free(b->tgt_ids);
  free(b->losses);
  free(b->loss_epoch);
  free(b);
}

static const zb_backend_ops cpu_ops = {
    .name = ZB_BACKEND_CPU,
    .submit = cpu_submit,
    .sync = cpu_sync,
    .buffer = cpu_buffer,
    .take_stats = cpu_take_stats,
    .free = cpu_free,
};

/* The same backend over a CUDA device: the model's ops are enqueued on its
 * stream, so submit returns early and sync waits. */
static const zb_backend_ops cuda_ops = {
    .name = ZB_BACKEND_CUDA,
    .submit = cpu_submit,
    .sync = cpu_sync,
    .buffer = cpu_buffer,
    .take_stats = cpu_take_stats,
    .free = cpu_free,
};

/* ---- construction and getters ------------------------------------------- */

size_t zb_backend_cpu_bytes_per_activation(const zb_model_config *model) {
  if (model->batch <= 0 || model->seq_len <= 0 || model->hidden <= 0)
    return 0;
  return (size_t)model->batch * (size_t)model->seq_len * (size_t)model->hidden *
         (model->bf16 ? sizeof(uint16_t) : sizeof(float));
}

static zb_err cpu_check(const zb_cpu_backend_config *cfg, zb_diag *diag) {
  if (cfg->total_stages < 1 || cfg->n_stages < 1 || !cfg->stages)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "cpu backend: rank %d: %d of %d stages; it needs at least one", cfg->rank,
                       cfg->n_stages, cfg->total_stages);
  bool ends = false;
  for (int i = 0; i < cfg->n_stages; i++) {
    int s = cfg->stages[i];
    if (s < 0 || s >= cfg->total_stages)
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "cpu backend: rank %d: stage %d is not in 0..%d",
                         cfg->rank, s, cfg->total_stages - 1);
    for (int j = 0; j < i; j++)
      if (cfg->stages[j] == s)
        return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "cpu backend: rank %d: stage %d is listed twice",
                           cfg->rank, s);
    ends |= s == 0 || s == cfg->total_stages - 1;
  }
  if (ends && !cfg->data.fill && !cfg->data.fill_ids)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "cpu backend: rank %d hosts the first or the last stage but has no data source",
                       cfg->rank);
  if (zb_backend_cpu_bytes_per_activation(&cfg->model) == 0)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "cpu backend: model batch %d, seq_len %d, hidden %d",
                       cfg->model.batch, cfg->model.seq_len, cfg->model.hidden);
  return ZB_OK;
}

/* The backend's device: the caller's (borrowed), or a host device of its own. */
static zb_err cpu_device(cpu_backend *b, const zb_cpu_backend_config *cfg, zb_diag *diag) {
  if (cfg->device) {
    b->dev = cfg->device;
    b->cuda = strcmp(cfg->device->ops->name, ZB_DEVICE_HOST) != 0;
    b->staging = b->cuda && cfg->host_transport;
    return ZB_OK;
  }
  b->own_dev = true;
  return zb_device_host_new(&b->dev, diag);
}

static int cpu_cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

zb_err zb_backend_cpu_new(const zb_cpu_backend_config *cfg, zb_backend **out, zb_diag *diag) {
  zb_err err = cpu_check(cfg, diag);
  if (err)
    return err;
  if (cfg->threads > 0)
    zb_model_set_threads(cfg->threads);
  int *order = zb_malloc(sizeof(int) * (size_t)cfg->n_stages);
  memcpy(order, cfg->stages, sizeof(int) * (size_t)cfg->n_stages);
  qsort(order, (size_t)cfg->n_stages, sizeof(int), cpu_cmp_int);

  cpu_backend *b = zb_calloc(1, sizeof *b);
  b->rank = cfg->rank;
  b->total = cfg->total_stages;
  b->data = cfg->data;
  b->stop = cfg->stop;
  b->nan_on = cfg->inject_nan.on;
  b->nan_iteration = cfg->inject_nan.iteration;
  b->nan_mb = cfg->inject_nan.mb;
  b->stages = zb_calloc((size_t)cfg->n_stages, sizeof *b->stages);
  b->local = zb_malloc(sizeof(int) * (size_t)b->total);
  for (int s = 0; s < b->total; s++)
    b->local[s] = -1;
  if ((err = cpu_device(b, cfg, diag)))
    goto fail;
  zb_model_config mc = cfg->model;
  mc.device = b->dev;
  for (int i = 0; i < cfg->n_stages; i++) {
    cpu_stage *cs = &b->stages[i];
    cs->index = order[i];
    err = zb_model_stage_new(&mc, cs->index, b->total, &cs->st, diag);
    if (err) {
      err = cpu_model_err(b, err, diag);
      goto fail;
    }
    b->n++;
    b->local[cs->index] = i;
  }
  b->model = *zb_model_stage_config(b->stages[0].st); /* defaults filled in */
  b->act_numel = zb_model_act_numel(b->stages[0].st);
  b->act_bytes = zb_model_act_bytes(b->stages[0].st); /* halved under bf16 storage */
  size_t nt = (size_t)b->model.batch * (size_t)b->model.seq_len;
  b->tokens = zb_malloc(nt);
  b->targets = zb_malloc(nt);
  b->tok_ids = zb_malloc(nt * sizeof *b->tok_ids);
  b->tgt_ids = zb_malloc(nt * sizeof *b->tgt_ids);
  b->epoch = 1;
  if (b->cuda) { /* what is not microbatch state: parameters, gradients, workspace */
    zb_device_mem m;
    b->dev->ops->mem(b->dev->self, &m);
    b->dev_base = m.current;
    b->dev->ops->reset_peak(b->dev->self);
  }
  free(order);
  zb_backend *h = zb_calloc(1, sizeof *h);
  h->ops = b->cuda ? &cuda_ops : &cpu_ops;
  h->self = b;
  *out = h;
  return ZB_OK;
fail:
  free(order);
  cpu_free(b);
  return err;
}

/* b's state when it is a model backend (cpu or cuda), else NULL. */
static cpu_backend *cpu_of(const zb_backend *b) {
  return b && (b->ops == &cpu_ops || b->ops == &cuda_ops) ? b->self : NULL;
}

zb_err zb_backend_cpu_begin_iteration(zb_backend *h, int64_t iteration, zb_diag *diag) {
  cpu_backend *b = cpu_of(h);
  if (!b)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "begin_iteration: not a cpu backend");
  for (int i = 0; i < b->n; i++) {
    zb_model_drop_states(b->stages[i].st);
    zb_model_zero_grads(b->stages[i].st);
    zb_model_inject_nan(b->stages[i].st, b->nan_on && iteration == b->nan_iteration ? b->nan_mb : -1);
  }
  b->iteration = iteration;
  b->epoch++; /* every slot and loss of the previous iteration becomes stale */
  b->mem = 0;
  return ZB_OK;
}

zb_err zb_backend_cpu_loss(zb_backend *h, double *mean, int *count, zb_diag *diag) {
  cpu_backend *b = cpu_of(h);
  if (!b)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "loss: not a cpu backend");
  cpu_stage *last = cpu_hosted(b, b->total - 1);
  if (!last)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "loss: rank %d does not host the last stage (%d)", b->rank,
                       b->total - 1);
  int read = 0; /* the slots up to the last microbatch of this iteration, in one copy */
  for (int mb = 0; mb < b->loss_cap; mb++)
    if (b->loss_epoch[mb] == b->epoch)
      read = mb + 1;
  zb_err err = zb_model_losses(last->st, read, b->losses, diag);
  if (err)
    return cpu_model_err(b, err, diag);
  double sum = 0;
  int n = 0;
  for (int mb = 0; mb < b->loss_cap; mb++) /* microbatch order: the same sum for every schedule */
    if (b->loss_epoch[mb] == b->epoch) {
      sum += (double)b->losses[mb];
      n++;
    }
  *mean = n ? sum / n : NAN;
  if (count)
    *count = n;
  return ZB_OK;
}

int zb_backend_cpu_n_stages(const zb_backend *h) {
  const cpu_backend *b = cpu_of(h);
  return b ? b->n : 0;
}

zb_model_stage *zb_backend_cpu_stage(zb_backend *h, int i, int *stage) {
  cpu_backend *b = cpu_of(h);
  if (!b || i < 0 || i >= b->n)
    return NULL;
  if (stage)
    *stage = b->stages[i].index;
  return b->stages[i].st;
}

zb_model_stage *zb_backend_cpu_find_stage(zb_backend *h, int stage) {
  cpu_backend *b = cpu_of(h);
  cpu_stage *cs = b ? cpu_hosted(b, stage) : NULL;
  return cs ? cs->st : NULL;
}

zb_err zb_backend_cpu_mem(const zb_backend *h, zb_cpu_backend_mem *out, zb_diag *diag) {
  const cpu_backend *b = cpu_of(h);
  if (!b)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "mem: not a cpu backend");
  memset(out, 0, sizeof *out);
  for (int i = 0; i < b->n; i++) {
    zb_model_mem m;
    zb_model_mem_stats(b->stages[i].st, &m);
    out->state_bytes += m.state_bytes;
    out->param_bytes += m.param_bytes;
    out->workspace_bytes += m.workspace_bytes;
  }
  out->peak_state_bytes = b->peak_ever;
  out->slot_bytes = b->slot_bytes;
  return ZB_OK;
}
