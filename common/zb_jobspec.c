/* zb_jobspec.c — the job spec's defaults, derived fields and checks. The
 * checker reports a fault as data (zb_job_fault) so that a reader can put
 * the key's line in the message; zb_job_spec_check words it for callers
 * that fill a spec by hand or from the wire. Values out of range are
 * ZB_ERR_INVALID_ARG.
 */
#include "zb_jobspec.h"
#include "zb_names.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_arch.h"
#include "zb_jobspec_dp.h"
#include "zb_jobspec_fields.h"
#include "zb_plan.h"
#include "zb_utf8.h"

/* ---- the field vocabulary ---------------------------------------------- */

const char *const zb_job_keys[ZB_JK_COUNT] = {"name",
                                              "ranks",
                                              "microbatches",
                                              "schedule",
                                              "chunks",
                                              "mem_limit",
                                              "costs",
                                              "stage_costs",
                                              "iterations",
                                              "backend",
                                              "transport",
                                              "bytes_per_activation",
                                              "model",
                                              "precision",
                                              "trace_every",
                                              "adaptive",
                                              "wait_for_workers_s",
                                              "transfer_timeout_s",
                                              "data_parallel",
                                              "zero",
                                              "rank_order",
                                              "link_gbps",
                                              "link_latency_us",
                                              "torch_run"};
const char *const zb_adaptive_keys[ZB_AK_COUNT] = {"enabled", "min_gain", "check_every"};
const char *const zb_adaptive_fields[ZB_AK_COUNT] = {"adaptive.enabled", "adaptive.min_gain",
                                                     "adaptive.check_every"};
const char *const zb_cost_keys[ZB_CK_COUNT] = {"f", "b", "w", "comm", "mem", "reduce"};
const char *const zb_cost_fields[ZB_CK_COUNT] = {"costs.f",    "costs.b",   "costs.w",
                                                 "costs.comm", "costs.mem", "costs.reduce"};
const char *const zb_model_keys[ZB_MK_COUNT] = {
    "hidden",         "heads",    "layers",     "seq_len",
    "batch",          "seed",     "data",       "lr",
    "weight_decay",   "beta1",    "beta2",      "eps",
    "clip_norm",      "step",     "inject_nan", "checkpoint_every",
    "checkpoint_dir", "dump_dir", "dump_every", "architecture",
    "config",         "weights",  "order"};
const char *const zb_model_fields[ZB_MK_COUNT] = {
    "model.hidden",         "model.heads",    "model.layers",     "model.seq_len",
    "model.batch",          "model.seed",     "model.data",       "model.lr",
    "model.weight_decay",   "model.beta1",    "model.beta2",      "model.eps",
    "model.clip_norm",      "model.step",     "model.inject_nan", "model.checkpoint_every",
    "model.checkpoint_dir", "model.dump_dir", "model.dump_every", "model.architecture",
    "model.config",         "model.weights",  "model.order"};
const char *const zb_nan_keys[ZB_NK_COUNT] = {"iteration", "microbatch"};
const char *const zb_nan_fields[ZB_NK_COUNT] = {"model.inject_nan.iteration", "model.inject_nan.microbatch"};

const zb_int_limit zb_job_limits[ZB_JK_COUNT] = {
    [ZB_JK_RANKS] = {1, 1024},
    [ZB_JK_MICROBATCHES] = {1, 1000000},
    /* Not a documented limit: it keeps ranks * chunks well inside an int. */
    [ZB_JK_CHUNKS] = {0, 1024},
    [ZB_JK_ITERATIONS] = {1, 1000000},
    [ZB_JK_BYTES] = {0, 1073741824},
    [ZB_JK_TRACE_EVERY] = {0, 1000000},
    [ZB_JK_WAIT_WORKERS] = {0, 7 * 86400},
    [ZB_JK_TRANSFER_TIMEOUT] = {1, 86400},
    [ZB_JK_DATA_PARALLEL] = {1, ZB_DATA_PARALLEL_MAX},
    [ZB_JK_ZERO] = {0, 1},
};
/* The model's sizes: generous bounds; check_model_sizes adds the products'
 * limits. */
const zb_int_limit zb_model_limits[ZB_MK_COUNT] = {
    [ZB_MK_HIDDEN] = {1, 65536},
    [ZB_MK_HEADS] = {1, 65536},
    [ZB_MK_LAYERS] = {1, 100000},
    [ZB_MK_SEQ_LEN] = {1, 1048576},
    [ZB_MK_BATCH] = {1, 1048576},
    [ZB_MK_SEED] = {1, 9223372036854775807LL},
    [ZB_MK_CHECKPOINT_EVERY] = {0, 1000000},
    [ZB_MK_DUMP_EVERY] = {0, 1000000},
};
const zb_int_limit zb_nan_index_limit = {0, 1000000};

static const char *const step_modes[] = {ZB_STEP_POST_VALIDATED_NAME, ZB_STEP_SYNCHRONOUS_NAME};
static const char *const transports[] = {"tcp", "nccl", ZB_TRANSPORT_TORCH};
static const char *const precisions[] = {ZB_PRECISION_FP32_NAME, "tf32", "bf16"};

static bool in_limit(long long v, const zb_int_limit *l) {
  return v >= l->min && v <= l->max;
}

/* ---- defaults and derived fields --------------------------------------- */

void zb_job_spec_default(zb_job_spec *s) {
  memset(s, 0, sizeof *s);
  s->costs =
      (zb_rank_costs){.t_f = 0.01, .t_b = 0.01, .t_w = 0.01, .t_comm = 0, .m_f = 1, .m_b = -0.5, .m_w = -0.5};
  s->iterations = 10;
  snprintf(s->backend, sizeof s->backend, "%s", ZB_BACKEND_SIM);
  snprintf(s->transport, sizeof s->transport, "tcp");
  snprintf(s->precision, sizeof s->precision, "%s", ZB_PRECISION_FP32_NAME);
  s->bytes_per_activation = 65536;
  s->trace_every = 10;
  s->wait_for_workers_s = 600;
  s->transfer_timeout_s = ZB_TRANSFER_TIMEOUT_DEFAULT_S;
  s->adaptive = (zb_adaptive_spec){.enabled = -1, .min_gain = 0.02, .check_every = 1};
  s->data_parallel = 1;
  snprintf(s->rank_order, sizeof s->rank_order, "%s", ZB_RANK_ORDER_PIPELINES);
  s->link_gbps = ZB_LINK_GBPS_DEFAULT;
  s->link_latency_us = ZB_LINK_LATENCY_US_DEFAULT;
  s->model = (zb_model_spec){.hidden = 64,
                             .heads = 4,
                             .layers = 0,
                             .seq_len = 64,
                             .batch = 4,
                             .seed = 1,
                             .lr = 3e-3,
                             .weight_decay = 0.01,
                             .beta1 = 0.9,
                             .beta2 = 0.95,
                             .eps = 1e-8,
                             .clip_norm = 1.0};
  snprintf(s->model.step, sizeof s->model.step, "%s", ZB_STEP_POST_VALIDATED_NAME);
  snprintf(s->model.data, sizeof s->model.data, "%s", ZB_MODEL_DEFAULT_DATA);
  snprintf(s->model.architecture, sizeof s->model.architecture, "builtin");
  snprintf(s->model.order, sizeof s->model.order, "%s", ZB_DATA_ORDER_RANDOM_NAME);
}

long long zb_model_spec_bytes_per_activation(const zb_model_spec *m) {
  /* the ranges keep the product below 2^58: wire input may be any int */
  if (!in_limit(m->batch, &zb_model_limits[ZB_MK_BATCH]) ||
      !in_limit(m->seq_len, &zb_model_limits[ZB_MK_SEQ_LEN]) ||
      !in_limit(m->hidden, &zb_model_limits[ZB_MK_HIDDEN]))
    return 0;
  return (long long)m->batch * m->seq_len * m->hidden * 4;
}

/* bf16 storage halves what a rank sends (docs/model.md, Mixed precision) */
static int element_bytes(const zb_job_spec *s) {
  return memchr(s->precision, '\0', sizeof s->precision) && strcmp(s->precision, "bf16") == 0 ? 2 : 4;
}

long long zb_job_spec_bytes_per_activation(const zb_job_spec *s) {
  return zb_model_spec_bytes_per_activation(&s->model) / 4 * element_bytes(s);
}

static bool backend_is(const zb_job_spec *s, const char *name) {
  return memchr(s->backend, '\0', sizeof s->backend) && strcmp(s->backend, name) == 0;
}

bool zb_job_spec_trains_model(const zb_job_spec *s) {
  return memchr(s->backend, '\0', sizeof s->backend) && zb_backend_runs_model(s->backend);
}

void zb_job_spec_derive(zb_job_spec *s, bool bytes_given) {
  if (!zb_job_spec_trains_model(s))
    return;
  zb_family fam;
  zb_arch a;
  if (zb_model_spec_has_arch(&s->model)) {
    /* the config gives the sizes; one that does not parse is the checker's */
    if (zb_model_spec_arch(&s->model, &a, NULL) == ZB_OK) {
      s->model.hidden = s->model.hidden ? s->model.hidden : a.hidden;
      s->model.heads = s->model.heads ? s->model.heads : a.heads;
      s->model.layers = s->model.layers ? s->model.layers : a.layers;
    }
  } else if (s->model.layers == 0 && memchr(s->schedule, '\0', sizeof s->schedule) &&
             zb_family_parse(s->schedule, &fam, NULL) == ZB_OK && s->ranks >= 1 &&
             s->ranks <= zb_job_limits[ZB_JK_RANKS].max && s->chunks >= 0 &&
             s->chunks <= zb_job_limits[ZB_JK_CHUNKS].max) {
    long long layers = (long long)s->ranks * (s->chunks ? s->chunks : zb_family_default_chunks(fam));
    if (layers <= zb_model_limits[ZB_MK_LAYERS].max)
      s->model.layers = (int)layers;
  }
  long long bytes = zb_job_spec_bytes_per_activation(s);
  /* one too large is left for check_model, which names the model's keys */
  if (!bytes_given && bytes > 0 && bytes <= zb_job_limits[ZB_JK_BYTES].max)
    s->bytes_per_activation = bytes;
}

void zb_job_spec_free(zb_job_spec *s) {
  if (!s)
    return;
  free(s->stage_costs);
  s->stage_costs = NULL;
  s->n_stage_costs = 0;
}

/* ---- checks ------------------------------------------------------------ */

zb_err zb_job_fault_set(zb_job_fault *f, zb_job_key key, int sub, const char *field, const char *fmt, ...) {
  f->key = key;
  f->sub = sub;
  snprintf(f->field, sizeof f->field, "%s", field);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->reason, sizeof f->reason, fmt, ap);
  va_end(ap);
  return ZB_ERR_INVALID_ARG;
}

static zb_err check_int(zb_job_fault *f, zb_job_key key, long long v) {
  const zb_int_limit *r = &zb_job_limits[key];
  if (!in_limit(v, r))
    return zb_job_fault_set(f, key, -1, zb_job_keys[key], "must be between %lld and %lld, got %lld", r->min,
                            r->max, v);
  return ZB_OK;
}

/* A fixed char array holds a NUL-terminated string (wire input may not). */
static bool terminated(const char *s, size_t size) {
  return memchr(s, '\0', size) != NULL;
}

static bool one_of(const char *s, const char *const *names, int n) {
  for (int k = 0; k < n; k++)
    if (!strcmp(s, names[k]))
      return true;
  return false;
}

static zb_err check_name(const zb_job_spec *s, zb_job_fault *f) {
  size_t len = terminated(s->name, sizeof s->name) ? strlen(s->name) : sizeof s->name;
  bool ok = len >= 1 && len <= 63;
  for (size_t i = 0; ok && i < len; i++) {
    char c = s->name[i];
    ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-';
  }
  if (!ok)
    return zb_job_fault_set(f, ZB_JK_NAME, -1, "name",
                            "must be 1..63 characters of [A-Za-z0-9._-], got '%.*s'",
                            (int)(len > 40 ? 40 : len), s->name);
  return ZB_OK;
}

/* Schedule known and the shape accepted. A shape refused with the given
 * chunks but accepted with the family's default blames 'chunks'. */
static zb_err check_schedule(const zb_job_spec *s, zb_job_fault *f, int *v) {
  zb_diag d = {{0}};
  zb_family fam;
  if (!terminated(s->schedule, sizeof s->schedule))
    return zb_job_fault_set(f, ZB_JK_SCHEDULE, -1, "schedule", "is not a terminated string");
  if (zb_family_parse(s->schedule, &fam, &d))
    return zb_job_fault_set(f, ZB_JK_SCHEDULE, -1, "schedule", "%s", d.msg);
  zb_err err = check_int(f, ZB_JK_CHUNKS, s->chunks);
  if (err)
    return err;
  int dv = zb_family_default_chunks(fam);
  *v = s->chunks ? s->chunks : dv;
  if (zb_plan_check_shape(fam, s->ranks, *v, s->microbatches, &d)) {
    bool chunks_wrong = s->chunks && !zb_plan_check_shape(fam, s->ranks, dv, s->microbatches, NULL);
    return zb_job_fault_set(f, chunks_wrong ? ZB_JK_CHUNKS : ZB_JK_SCHEDULE, -1,
                            chunks_wrong ? "chunks" : "schedule", "%s", d.msg);
  }
  return ZB_OK;
}

/* Times named field by field; memory deltas through zb_costs_check on a
 * one-stage cost model, so the rule stays libzb's. */
static zb_err check_costs(const zb_job_spec *s, zb_job_fault *f) {
  const double t[ZB_CK_COUNT] = {[ZB_CK_F] = s->costs.t_f,
                                 [ZB_CK_B] = s->costs.t_b,
                                 [ZB_CK_W] = s->costs.t_w,
                                 [ZB_CK_COMM] = s->costs.t_comm,
                                 [ZB_CK_REDUCE] = s->costs.t_reduce};
  for (int k = 0; k < ZB_CK_COUNT; k++)
    if (k != ZB_CK_MEM && (!isfinite(t[k]) || t[k] < 0))
      return zb_job_fault_set(f, ZB_JK_COSTS, k, zb_cost_fields[k], "must be a finite number >= 0, got %g",
                              t[k]);
  zb_costs *c = zb_costs_from_rank_share(1, 1, &s->costs, 0);
  zb_diag d = {{0}};
  zb_err err = zb_costs_check(c, &d);
  zb_costs_free(c);
  if (err)
    return zb_job_fault_set(f, ZB_JK_COSTS, ZB_CK_MEM, "costs.mem", "%s", d.msg);
  return ZB_OK;
}

static zb_err check_stage_costs(const zb_job_spec *s, int v, zb_job_fault *f) {
  if (s->n_stage_costs == 0)
    return ZB_OK;
  int want = s->ranks * v;
  if (s->n_stage_costs < 0 || !s->stage_costs || s->n_stage_costs != want)
    return zb_job_fault_set(f, ZB_JK_STAGE_COSTS, -1, "stage_costs",
                            "expected %d rows of [T_F, T_B, T_W] (ranks x chunks = %d x %d), got %d", want,
                            s->ranks, v, s->n_stage_costs);
  for (int i = 0; i < s->n_stage_costs; i++)
    for (int k = 0; k < 3; k++) {
      double x = s->stage_costs[i][k];
      if (!isfinite(x) || x < 0) {
        char field[32];
        snprintf(field, sizeof field, "stage_costs[%d]", i);
        return zb_job_fault_set(f, ZB_JK_STAGE_COSTS, i, field, "%s must be a finite number >= 0, got %g",
                                k == 0   ? "T_F"
                                : k == 1 ? "T_B"
                                         : "T_W",
                                x);
      }
    }
  return ZB_OK;
}

static zb_err check_model_int(zb_job_fault *f, zb_model_key k, long long v) {
  const zb_int_limit *r = &zb_model_limits[k];
  if (!in_limit(v, r))
    return zb_job_fault_set(f, ZB_JK_MODEL, k, zb_model_fields[k], "must be between %lld and %lld, got %lld",
                            r->min, r->max, v);
  return ZB_OK;
}

/* A double in [lo, hi) (hi_open) or [lo, inf) (hi = INFINITY); lo itself
 * excluded when lo_open. */
static zb_err check_model_real(zb_job_fault *f, zb_model_key k, double v, double lo, bool lo_open,
                               double hi) {
  bool ok = isfinite(v) && (lo_open ? v > lo : v >= lo) && (isinf(hi) || v < hi);
  if (ok)
    return ZB_OK;
  if (isinf(hi))
    return zb_job_fault_set(f, ZB_JK_MODEL, k, zb_model_fields[k], "must be a finite number %s %g, got %g",
                            lo_open ? ">" : ">=", lo, v);
  return zb_job_fault_set(f, ZB_JK_MODEL, k, zb_model_fields[k], "must be in [%g, %g), got %g", lo, hi, v);
}

/* The sizes: their ranges, zb_model_stage_new's own rules (heads divide
 * hidden; the matrix products' dimensions fit an int) and one activation
 * within what a message may carry. */
static zb_err check_model_sizes(const zb_model_spec *m, zb_job_fault *f) {
  zb_err err;
  if ((err = check_model_int(f, ZB_MK_HIDDEN, m->hidden)) ||
      (err = check_model_int(f, ZB_MK_HEADS, m->heads)) ||
      (err = check_model_int(f, ZB_MK_LAYERS, m->layers)) ||
      (err = check_model_int(f, ZB_MK_SEQ_LEN, m->seq_len)) ||
      (err = check_model_int(f, ZB_MK_BATCH, m->batch)) || (err = check_model_int(f, ZB_MK_SEED, m->seed)))
    return err;
  if (!zb_model_spec_has_arch(m) && m->hidden % m->heads != 0) /* a config may set head_dim */
    return zb_job_fault_set(f, ZB_JK_MODEL, ZB_MK_HEADS, "model.heads",
                            "must divide model.hidden (%d), got %d", m->hidden, m->heads);
  long long tokens = (long long)m->batch * m->seq_len;
  if (tokens * 4 * m->hidden > INT_MAX || (long long)m->seq_len * m->seq_len > INT_MAX)
    return zb_job_fault_set(
        f, ZB_JK_MODEL, -1, "model",
        "too large: batch x seq_len x 4 x hidden = %lld and seq_len^2 = %lld must fit an int "
        "(the matrix products' dimensions)",
        tokens * 4 * m->hidden, (long long)m->seq_len * m->seq_len);
  long long bytes = zb_model_spec_bytes_per_activation(m);
  if (bytes > zb_job_limits[ZB_JK_BYTES].max)
    return zb_job_fault_set(
        f, ZB_JK_MODEL, -1, "model",
        "one activation is %lld bytes (batch %d x seq_len %d x hidden %d x 4), over the %lld "
        "bytes a message may carry",
        bytes, m->batch, m->seq_len, m->hidden, zb_job_limits[ZB_JK_BYTES].max);
  return ZB_OK;
}

/* What training reads: the data path, the optimizer's settings, the step
 * mode and the NaN test hook (held to the job's shape). */
static zb_err check_model_training(const zb_job_spec *s, zb_job_fault *f) {
  const zb_model_spec *m = &s->model;
  size_t data_len = terminated(m->data, sizeof m->data) ? strlen(m->data) : sizeof m->data;
  if (data_len == 0 || data_len == sizeof m->data)
    return zb_job_fault_set(f, ZB_JK_MODEL, ZB_MK_DATA, "model.data", "must be a path of 1..%zu characters",
                            sizeof m->data - 1);
  if (m->data[zb_utf8_prefix(m->data)] != '\0')
    return zb_job_fault_set(f, ZB_JK_MODEL, ZB_MK_DATA, "model.data", "is not valid UTF-8");
  zb_err err;
  if ((err = check_model_real(f, ZB_MK_LR, m->lr, 0, true, INFINITY)) ||
      (err = check_model_real(f, ZB_MK_WEIGHT_DECAY, m->weight_decay, 0, false, INFINITY)) ||
      (err = check_model_real(f, ZB_MK_BETA1, m->beta1, 0, false, 1)) ||
      (err = check_model_real(f, ZB_MK_BETA2, m->beta2, 0, false, 1)) ||
      (err = check_model_real(f, ZB_MK_EPS, m->eps, 0, true, INFINITY)) ||
      (err = check_model_real(f, ZB_MK_CLIP_NORM, m->clip_norm, 0, false, INFINITY)))
    return err;
  if (!terminated(m->step, sizeof m->step) || !one_of(m->step, step_modes, 2))
    return zb_job_fault_set(f, ZB_JK_MODEL, ZB_MK_STEP, "model.step", "must be one of %s, %s, got '%.23s'",
                            ZB_STEP_POST_VALIDATED_NAME, ZB_STEP_SYNCHRONOUS_NAME, m->step);
  if (m->inject_nan && (m->nan_iteration < 0 || m->nan_iteration >= s->iterations))
    return zb_job_fault_set(f, ZB_JK_MODEL, ZB_MK_INJECT_NAN, zb_nan_fields[ZB_NK_ITERATION],
                            "must be between 0 and iterations - 1 (%d), got %d", s->iterations - 1,
                            m->nan_iteration);
  if (m->inject_nan && (m->nan_microbatch < 0 || m->nan_microbatch >= s->microbatches))
    return zb_job_fault_set(f, ZB_JK_MODEL, ZB_MK_INJECT_NAN, zb_nan_fields[ZB_NK_MICROBATCH],
                            "must be between 0 and microbatches - 1 (%d), got %d", s->microbatches - 1,
                            m->nan_microbatch);
  return ZB_OK;
}

/* Where the workers write (checkpoints, gradient dumps) and what the
 * coordinator set to resume from. */
static zb_err check_model_dirs(const zb_model_spec *m, zb_job_fault *f) {
  long long every_max = zb_model_limits[ZB_MK_CHECKPOINT_EVERY].max;
  if (m->checkpoint_every < 0 || m->checkpoint_every > every_max)
    return zb_job_fault_set(f, ZB_JK_MODEL, ZB_MK_CHECKPOINT_EVERY, "model.checkpoint_every",
                            "must be between 0 and %lld, got %d", every_max, m->checkpoint_every);
  if (!terminated(m->checkpoint_dir, sizeof m->checkpoint_dir) ||
      m->checkpoint_dir[zb_utf8_prefix(m->checkpoint_dir)] != '\0')
    return zb_job_fault_set(f, ZB_JK_MODEL, ZB_MK_CHECKPOINT_DIR, "model.checkpoint_dir",
                            "must be a valid UTF-8 path of at most %zu characters",
                            sizeof m->checkpoint_dir - 1);
  /* every worker writes there and a resumed job's ranks may run on other
   * hosts: a path relative to some worker's working directory would
   * scatter the files, so only an absolute one (a shared file system) */
  if ((m->checkpoint_every > 0 || m->checkpoint_dir[0]) && m->checkpoint_dir[0] != '/')
    return zb_job_fault_set(f, ZB_JK_MODEL, ZB_MK_CHECKPOINT_DIR, "model.checkpoint_dir",
                            "must be an absolute path (a directory every worker can write, shared on a "
                            "multi-host cluster) when model.checkpoint_every > 0, got '%.200s'",
                            m->checkpoint_dir);
  if (!terminated(m->dump_dir, sizeof m->dump_dir) || m->dump_dir[zb_utf8_prefix(m->dump_dir)] != '\0')
    return zb_job_fault_set(f, ZB_JK_MODEL, ZB_MK_DUMP_DIR, "model.dump_dir",
                            "must be a valid UTF-8 path of at most %zu characters", sizeof m->dump_dir - 1);
  if (m->dump_dir[0] && m->dump_dir[0] != '/') /* as checkpoint_dir: every worker writes there */
    return zb_job_fault_set(f, ZB_JK_MODEL, ZB_MK_DUMP_DIR, "model.dump_dir",
                            "must be an absolute path (a directory every worker can write), got '%.200s'",
                            m->dump_dir);
  long long dump_max = zb_model_limits[ZB_MK_DUMP_EVERY].max;
  if (m->dump_every < 0 || m->dump_every > dump_max)
    return zb_job_fault_set(f, ZB_JK_MODEL, ZB_MK_DUMP_EVERY, "model.dump_every",
                            "must be between 0 and %lld, got %d", dump_max, m->dump_every);
  if (m->dump_every > 0 && !m->dump_dir[0])
    return zb_job_fault_set(f, ZB_JK_MODEL, ZB_MK_DUMP_EVERY, "model.dump_every",
                            "needs model.dump_dir (where to write)");
  if (!terminated(m->resume_from, sizeof m->resume_from))
    return zb_job_fault_set(f, ZB_JK_MODEL, -1, "model.resume_from_job_id", "too long");
  return ZB_OK;
}

/* The model of a cpu or cuda job, and that only such a job has one. The
 * coordinator cannot build the model (it has no BLAS), so the model's and
 * optimizer's rules are mirrored here, where both ends check. */
static zb_err check_model(const zb_job_spec *s, zb_job_fault *f) {
  const zb_model_spec *m = &s->model;
  if (!zb_job_spec_trains_model(s)) {
    if (s->has_model)
      return zb_job_fault_set(f, ZB_JK_MODEL, -1, "model",
                              "only a cpu or cuda job trains a model; backend is '%.15s'", s->backend);
    return ZB_OK;
  }
  zb_err err;
  if ((err = zb_job_spec_check_arch(s, f)) || (err = check_model_sizes(m, f)) ||
      (err = check_model_training(s, f)) || (err = check_model_dirs(m, f)))
    return err;
  long long bytes = zb_job_spec_bytes_per_activation(s);
  if (s->bytes_per_activation != bytes)
    return zb_job_fault_set(
        f, ZB_JK_BYTES, -1, "bytes_per_activation",
        "%lld conflicts with the model's %lld bytes per activation (batch %d x seq_len %d x "
        "hidden %d x %d, precision %s); leave it out to derive it",
        s->bytes_per_activation, bytes, m->batch, m->seq_len, m->hidden, element_bytes(s),
        element_bytes(s) == 2 ? "bf16" : "fp32 or tf32");
  return ZB_OK;
}

static zb_err check_adaptive(const zb_job_spec *s, zb_job_fault *f) {
  const zb_adaptive_spec *a = &s->adaptive;
  if (a->enabled < -1 || a->enabled > 1)
    return zb_job_fault_set(f, ZB_JK_ADAPTIVE, ZB_AK_ENABLED, "adaptive.enabled",
                            "must be true or false (on the wire: mode DEFAULT, ON or OFF)");
  if (!isfinite(a->min_gain) || a->min_gain < 0 || a->min_gain >= 1)
    return zb_job_fault_set(f, ZB_JK_ADAPTIVE, ZB_AK_MIN_GAIN, "adaptive.min_gain",
                            "must be in [0, 1), got %g", a->min_gain);
  if (a->check_every < 1 || a->check_every > 1000000)
    return zb_job_fault_set(f, ZB_JK_ADAPTIVE, ZB_AK_CHECK_EVERY, "adaptive.check_every",
                            "must be between 1 and 1000000, got %d", a->check_every);
  return ZB_OK;
}

bool zb_job_spec_adaptive(const zb_job_spec *s) {
  return s->adaptive.enabled == 1 || (s->adaptive.enabled == -1 && strcmp(s->schedule, "zb-auto") == 0);
}

/* What only the cuda backend has: NCCL, and GEMM precisions below fp32
 * (the host computes fp32 whatever is asked: accepting tf32 there would
 * claim a speed-up that never happens). */
static zb_err check_device(const zb_job_spec *s, zb_job_fault *f) {
  bool cuda = backend_is(s, ZB_BACKEND_CUDA);
  if (!cuda && strcmp(s->transport, "nccl") == 0)
    return zb_job_fault_set(f, ZB_JK_TRANSPORT, -1, "transport",
                            "nccl moves GPU memory and needs backend cuda; backend is '%.15s' (use tcp)",
                            s->backend);
  if (!terminated(s->precision, sizeof s->precision) || !one_of(s->precision, precisions, 3))
    return zb_job_fault_set(f, ZB_JK_PRECISION, -1, "precision",
                            "must be one of fp32, tf32, bf16, got '%.7s'", s->precision);
  if (!cuda && strcmp(s->precision, ZB_PRECISION_FP32_NAME) != 0)
    return zb_job_fault_set(f, ZB_JK_PRECISION, -1, "precision",
                            "%s needs backend cuda (tensor cores); backend '%.15s' computes fp32 only",
                            s->precision, s->backend);
  return ZB_OK;
}

zb_err zb_job_spec_find_fault(const zb_job_spec *s, zb_job_fault *f) {
  zb_err err;
  int v = 0;
  if ((err = check_name(s, f)) || (err = check_int(f, ZB_JK_RANKS, s->ranks)) ||
      (err = check_int(f, ZB_JK_MICROBATCHES, s->microbatches)) || (err = check_schedule(s, f, &v)))
    return err;
  if (!isfinite(s->mem_limit) || s->mem_limit < 0)
    return zb_job_fault_set(f, ZB_JK_MEM_LIMIT, -1, "mem_limit",
                            "must be a finite number >= 0 (0: default), got %g", s->mem_limit);
  if ((err = check_costs(s, f)) || (err = check_stage_costs(s, v, f)) ||
      (err = check_int(f, ZB_JK_ITERATIONS, s->iterations)) ||
      (err = check_int(f, ZB_JK_BYTES, s->bytes_per_activation)) ||
      (err = check_int(f, ZB_JK_TRACE_EVERY, s->trace_every)) ||
      (err = check_int(f, ZB_JK_WAIT_WORKERS, s->wait_for_workers_s)) ||
      (err = check_int(f, ZB_JK_TRANSFER_TIMEOUT, s->transfer_timeout_s)))
    return err;
  if (!terminated(s->backend, sizeof s->backend) || !one_of(s->backend, zb_backend_names, 4))
    return zb_job_fault_set(f, ZB_JK_BACKEND, -1, "backend",
                            "must be one of sim, cpu, cuda, torch, got '%.15s'", s->backend);
  if (!terminated(s->transport, sizeof s->transport) || !one_of(s->transport, transports, 3))
    return zb_job_fault_set(f, ZB_JK_TRANSPORT, -1, "transport",
                            "must be one of tcp, nccl, torch, got '%.15s'", s->transport);
  if ((err = zb_job_spec_check_torch(s, f)) || (err = check_device(s, f)) || (err = check_adaptive(s, f)) ||
      (err = check_model(s, f)))
    return err;
  return zb_job_spec_check_dp(s, f);
}

zb_err zb_model_spec_check_sizes(const zb_model_spec *m, const char *prefix, zb_diag *diag) {
  zb_job_fault f;
  zb_err err = check_model_sizes(m, &f);
  if (err)
    zb_diag_set(diag, err, "%s%s: %s", prefix, f.field, f.reason);
  return err;
}

zb_err zb_job_spec_check(const zb_job_spec *s, zb_diag *diag) {
  zb_job_fault f;
  zb_err err = zb_job_spec_find_fault(s, &f);
  if (err)
    zb_diag_set(diag, err, "field '%s': %s", f.field, f.reason);
  return err;
}

double zb_model_spec_params(const zb_model_spec *m) {
  double h = m->hidden, vocab = 256;
  return vocab * h + (double)m->seq_len * h + (double)m->layers * (12 * h * h + 13 * h) + 2 * h + vocab * h;
}

double zb_job_spec_rank_state_bytes(const zb_job_spec *s) {
  double params = zb_model_spec_params(&s->model);
  zb_arch a;
  if (zb_model_spec_has_arch(&s->model) && zb_model_spec_arch(&s->model, &a, NULL) == ZB_OK)
    params = (double)zb_arch_param_count(&a);
  return s->ranks > 0 ? 16 * params / s->ranks : 0;
}
