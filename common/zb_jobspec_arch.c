/* zb_jobspec_arch.c — the job spec's model architecture (docs/model.md,
 * Jobs with an architecture): model.architecture names it, model.config
 * carries the Hugging Face config.json that gives its sizes, and these
 * checks refuse at submit what the workers would refuse later (an
 * unsupported config key, a mismatched model_type, sizes given twice).
 * Pure: the config's text travels in the spec.
 */
#include <stdio.h>
#include <string.h>

#include "zb_arch.h"
#include "zb_arch_hf.h"
#include "zb_jobspec.h"
#include "zb_jobspec_fields.h"

static bool terminated(const char *s, size_t size) {
  return memchr(s, '\0', size) != NULL;
}

bool zb_model_spec_has_arch(const zb_model_spec *m) {
  return terminated(m->architecture, sizeof m->architecture) && m->architecture[0] &&
         strcmp(m->architecture, "builtin") != 0;
}

zb_err zb_model_spec_arch(const zb_model_spec *m, zb_arch *out, zb_diag *diag) {
  zb_arch_kind kind = ZB_ARCH_BUILTIN;
  zb_diag d = {{0}};
  if (!terminated(m->architecture, sizeof m->architecture))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "model.architecture: not a terminated string");
  if (m->architecture[0] && zb_arch_kind_parse(m->architecture, &kind, &d))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "model.architecture: %s", d.msg);
  if (kind == ZB_ARCH_BUILTIN) {
    *out = zb_arch_builtin(0, m->hidden, m->heads, m->layers, m->seq_len);
    return ZB_OK;
  }
  if (!terminated(m->config_json, sizeof m->config_json) || !m->config_json[0])
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "model.config: architecture %s needs a Hugging Face config.json (model.config: PATH)",
                       m->architecture);
  zb_err err = zb_arch_from_hf_text(m->config_json, strlen(m->config_json), out, NULL, 0, &d);
  if (err)
    return zb_diag_set(diag, err, "model.config: %s", d.msg);
  if (out->kind != kind)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "model.config: its model_type is %s but model.architecture is %s",
                       zb_arch_kind_name(out->kind), m->architecture);
  return ZB_OK;
}

bool zb_model_data_is_shards(const char *data) {
  const char *slash = strrchr(data, '/'), *leaf = slash ? slash + 1 : data;
  size_t n = strlen(leaf);
  return n >= 4 && strcmp(leaf + n - 4, ".bin") == 0;
}

/* model.data with an architecture: token shards (a .bin glob), or one
 * text file of byte tokens, which needs a vocabulary of all 256 bytes. */
static zb_err check_arch_data(const zb_model_spec *m, const zb_arch *a, zb_job_fault *f) {
  if (zb_model_data_is_shards(m->data))
    return ZB_OK;
  if (strpbrk(m->data, "*?["))
    return zb_job_fault_set(f, ZB_JK_MODEL, ZB_MK_DATA, "model.data",
                            "'%.200s' is a pattern but not of token shards (file names ending in .bin); "
                            "a text file for byte tokens is one path",
                            m->data);
  if (a->vocab < 256)
    return zb_job_fault_set(f, ZB_JK_MODEL, ZB_MK_DATA, "model.data",
                            "'%.200s' is a text file read as byte tokens (0..255), but model.config's "
                            "vocab_size is %d; give at least 256, or token shards (*.bin)",
                            m->data, a->vocab);
  return ZB_OK;
}

/* hidden, heads and layers come from the config: a value the spec gives
 * must be the config's (0 is filled in by zb_job_spec_derive). */
static zb_err check_sizes_given(const zb_model_spec *m, const zb_arch *a, zb_job_fault *f) {
  const int given[3] = {m->hidden, m->heads, m->layers}, cfg[3] = {a->hidden, a->heads, a->layers};
  const zb_model_key keys[3] = {ZB_MK_HIDDEN, ZB_MK_HEADS, ZB_MK_LAYERS};
  for (int k = 0; k < 3; k++)
    if (given[k] != cfg[k])
      return zb_job_fault_set(f, ZB_JK_MODEL, keys[k], zb_model_fields[keys[k]],
                              "is given by model.config (%d) with architecture %s; leave it out, got %d",
                              cfg[k], m->architecture, given[k]);
  return ZB_OK;
}

/* What runs with an architecture: its data, its order and its sequence
 * length. */
static zb_err check_arch_job(const zb_model_spec *m, const zb_arch *a, zb_job_fault *f) {
  if (!terminated(m->order, sizeof m->order) || (strcmp(m->order, ZB_DATA_ORDER_RANDOM_NAME) != 0 &&
                                                 strcmp(m->order, ZB_DATA_ORDER_SEQUENTIAL_NAME) != 0))
    return zb_job_fault_set(f, ZB_JK_MODEL, ZB_MK_ORDER, "model.order", "must be one of %s, %s, got '%.15s'",
                            ZB_DATA_ORDER_RANDOM_NAME, ZB_DATA_ORDER_SEQUENTIAL_NAME, m->order);
  zb_err err = check_arch_data(m, a, f);
  if (err)
    return err;
  if (m->seq_len > a->max_positions)
    return zb_job_fault_set(f, ZB_JK_MODEL, ZB_MK_SEQ_LEN, "model.seq_len",
                            "must be at most the config's %d positions, got %d", a->max_positions,
                            m->seq_len);
  return ZB_OK;
}

zb_err zb_job_spec_check_arch(const zb_job_spec *s, zb_job_fault *f) {
  const zb_model_spec *m = &s->model;
  zb_diag d = {{0}};
  zb_arch_kind kind = ZB_ARCH_BUILTIN;
  if (!terminated(m->architecture, sizeof m->architecture) ||
      (m->architecture[0] && zb_arch_kind_parse(m->architecture, &kind, &d))) /* "": builtin */
    return zb_job_fault_set(f, ZB_JK_MODEL, ZB_MK_ARCHITECTURE, "model.architecture",
                            "must be one of builtin, gpt2, llama, got '%.15s'", m->architecture);
  bool has_config = !terminated(m->config_json, sizeof m->config_json) || m->config_json[0];
  bool has_weights = !terminated(m->weights, sizeof m->weights) || m->weights[0];
  if (kind == ZB_ARCH_BUILTIN && (has_config || has_weights))
    return zb_job_fault_set(f, ZB_JK_MODEL, has_config ? ZB_MK_CONFIG : ZB_MK_WEIGHTS,
                            has_config ? "model.config" : "model.weights",
                            "needs model.architecture gpt2 or llama (the builtin model takes its sizes from "
                            "the spec and starts from its seed)");
  bool sequential =
      !terminated(m->order, sizeof m->order) || strcmp(m->order, ZB_DATA_ORDER_RANDOM_NAME) != 0;
  if (kind == ZB_ARCH_BUILTIN && sequential)
    return zb_job_fault_set(f, ZB_JK_MODEL, ZB_MK_ORDER, "model.order",
                            "reading in order needs model.architecture gpt2 or llama (the builtin model "
                            "draws windows by its seed)");
  if (kind == ZB_ARCH_BUILTIN)
    return ZB_OK;
  if (!terminated(m->weights, sizeof m->weights))
    return zb_job_fault_set(f, ZB_JK_MODEL, ZB_MK_WEIGHTS, "model.weights",
                            "must be a path of at most %zu characters", sizeof m->weights - 1);
  zb_arch a;
  zb_err err = zb_model_spec_arch(m, &a, &d);
  if (err) {
    /* the message starts "model.config: "; the fault names the field itself */
    const char *why = strncmp(d.msg, "model.config: ", 14) == 0 ? d.msg + 14 : d.msg;
    return zb_job_fault_set(f, ZB_JK_MODEL, ZB_MK_CONFIG, "model.config", "%s", why);
  }
  if ((err = check_sizes_given(m, &a, f)))
    return err;
  return check_arch_job(m, &a, f);
}
