/* zb_jobspec_yaml.c — a job spec from YAML text (zb_yaml.h): the document
 * is walked against the key tables of zb_jobspec_fields.h, then the spec
 * goes through the checker, whose fault is reported at the line of the key
 * it blames. Type errors (and negative sizes) are ZB_ERR_PARSE; values of
 * the right type but out of range are ZB_ERR_INVALID_ARG, the same split
 * as zb_job_spec_check, which shares the limits.
 */
#include "zb_jobspec_yaml.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_jobspec_fields.h"
#include "zb_yaml.h"

static const zb_job_key job_required[] = {ZB_JK_NAME, ZB_JK_RANKS, ZB_JK_MICROBATCHES, ZB_JK_SCHEDULE};

/* A job spec's integers: every limit's min is also its type's (below it is
 * a wrong type, as a negative size or a count of 0 is). */
static zb_err get_int(const zb_yaml_walk *w, const yaml_node_t *n, const char *key, const zb_int_limit *l,
                      long long *out) {
  zb_yaml_int_range r = {l->min, l->min, l->max};
  return zb_yaml_get_int(w, n, key, &r, out);
}

static zb_err get_int32(const zb_yaml_walk *w, const yaml_node_t *n, const char *key, const zb_int_limit *l,
                        int *out) {
  zb_yaml_int_range r = {l->min, l->min, l->max};
  return zb_yaml_get_int32(w, n, key, &r, out);
}

/* Where the parser found each key (0: absent), so that a fault found later
 * by the checker can be reported at its line. These double as zb_yaml_map_key's
 * duplicate detection. */
typedef struct job_lines {
  int root;
  int key[ZB_JK_COUNT];
  int cost[ZB_CK_COUNT];
  int model[ZB_MK_COUNT];
  const yaml_node_t *stage_rows; /* the stage_costs list, NULL if absent */
  const zb_jobspec_files *files; /* the caller's reader of model.config; NULL: none */
} job_lines;

/* mem_limit: 'Np' (N > 0, times ranks once the document is read) or a
 * plain number > 0. */
static zb_err job_mem_limit(const zb_yaml_walk *w, const yaml_node_t *n, zb_job_spec *s, double *per_rank) {
  char buf[64], num[64];
  double x = 0;
  bool ok = false;
  if (zb_yaml_is_plain(n)) {
    const char *t = zb_yaml_text(n);
    size_t len = strlen(t);
    if (len >= 2 && len < sizeof num && t[len - 1] == 'p') {
      memcpy(num, t, len - 1);
      num[len - 1] = '\0';
      ok = zb_yaml_parse_double(num, &x) && x > 0;
      *per_rank = x;
    } else {
      ok = zb_yaml_parse_double(t, &x) && x > 0;
      s->mem_limit = x;
    }
  }
  if (!ok)
    return zb_diag_set(w->diag, ZB_ERR_PARSE,
                       "line %d: key 'mem_limit': expected a number > 0 or 'Np' (N times ranks), got %s",
                       zb_yaml_line(n), zb_yaml_describe(n, buf, sizeof buf));
  return ZB_OK;
}

static zb_err job_costs(const zb_yaml_walk *w, const yaml_node_t *n, zb_rank_costs *c, job_lines *lines) {
  zb_err merr = zb_yaml_want_mapping(w, n, "costs", zb_cost_keys, ZB_CK_COUNT);
  if (merr)
    return merr;
  double *times[ZB_CK_COUNT] = {[ZB_CK_F] = &c->t_f,
                                [ZB_CK_B] = &c->t_b,
                                [ZB_CK_W] = &c->t_w,
                                [ZB_CK_COMM] = &c->t_comm,
                                [ZB_CK_REDUCE] = &c->t_reduce};
  for (const yaml_node_pair_t *pair = n->data.mapping.pairs.start; pair < n->data.mapping.pairs.top; pair++) {
    int k = -1; /* set by map_key on success; gcc -O2 cannot see that */
    zb_err err = zb_yaml_map_key(w, zb_yaml_node_at(w, pair->key), zb_cost_keys, ZB_CK_COUNT, "costs.",
                                 lines->cost, &k);
    if (err)
      return err;
    const yaml_node_t *value = zb_yaml_node_at(w, pair->value);
    if (k == ZB_CK_MEM) {
      double mem[3];
      if ((err = zb_yaml_get_triple(w, value, "costs.mem", mem)))
        return err;
      c->m_f = mem[0];
      c->m_b = mem[1];
      c->m_w = mem[2];
    } else if ((err = zb_yaml_get_number(w, value, zb_cost_fields[k], times[k]))) {
      return err;
    }
  }
  return ZB_OK;
}

/* stage_costs: a non-empty list of [T_F, T_B, T_W] rows. The rows go into
 * s at once so that the caller's cleanup frees them on any later error. */
static zb_err job_stage_costs(const zb_yaml_walk *w, const yaml_node_t *n, zb_job_spec *s) {
  char buf[64], key[48];
  long count =
      n->type == YAML_SEQUENCE_NODE ? (long)(n->data.sequence.items.top - n->data.sequence.items.start) : 0;
  if (count == 0)
    return zb_diag_set(
        w->diag, ZB_ERR_PARSE,
        "line %d: key 'stage_costs': expected a non-empty list of [T_F, T_B, T_W] rows, got %s",
        zb_yaml_line(n),
        n->type == YAML_SEQUENCE_NODE ? "an empty list" : zb_yaml_describe(n, buf, sizeof buf));
  s->stage_costs = zb_calloc((size_t)count, sizeof *s->stage_costs);
  s->n_stage_costs = (int)count; /* bounded by the input's size */
  for (int i = 0; i < s->n_stage_costs; i++) {
    snprintf(key, sizeof key, "stage_costs[%d]", i);
    zb_err err =
        zb_yaml_get_triple(w, zb_yaml_node_at(w, n->data.sequence.items.start[i]), key, s->stage_costs[i]);
    if (err)
      return err;
  }
  return ZB_OK;
}

/* model.inject_nan: a mapping {iteration, microbatch}, each defaulting to
 * 0; ranges against the job's shape are the checker's. */
static zb_err model_inject_nan(const zb_yaml_walk *w, const yaml_node_t *n, zb_model_spec *m) {
  zb_err merr = zb_yaml_want_mapping(w, n, "model.inject_nan", zb_nan_keys, ZB_NK_COUNT);
  if (merr)
    return merr;
  m->inject_nan = true;
  m->nan_iteration = m->nan_microbatch = 0;
  int seen[ZB_NK_COUNT] = {0};
  int *dst[ZB_NK_COUNT] = {&m->nan_iteration, &m->nan_microbatch};
  for (const yaml_node_pair_t *pair = n->data.mapping.pairs.start; pair < n->data.mapping.pairs.top; pair++) {
    int k = -1;
    zb_err err = zb_yaml_map_key(w, zb_yaml_node_at(w, pair->key), zb_nan_keys, ZB_NK_COUNT,
                                 "model.inject_nan.", seen, &k);
    if (!err)
      err = get_int32(w, zb_yaml_node_at(w, pair->value), zb_nan_fields[k], &zb_nan_index_limit, dst[k]);
    if (err)
      return err;
  }
  return ZB_OK;
}

/* adaptive: a mapping {enabled: true|false, min_gain, check_every}; ranges
 * are the checker's. */
static zb_err job_adaptive(const zb_yaml_walk *w, const yaml_node_t *n, zb_adaptive_spec *a) {
  zb_err err = zb_yaml_want_mapping(w, n, "adaptive", zb_adaptive_keys, ZB_AK_COUNT);
  int seen[ZB_AK_COUNT] = {0};
  static const zb_int_limit every = {1, 1000000};
  for (const yaml_node_pair_t *pair = n->data.mapping.pairs.start; !err && pair < n->data.mapping.pairs.top;
       pair++) {
    int k = -1;
    err = zb_yaml_map_key(w, zb_yaml_node_at(w, pair->key), zb_adaptive_keys, ZB_AK_COUNT, "adaptive.", seen,
                          &k);
    const yaml_node_t *v = zb_yaml_node_at(w, pair->value);
    char word[8] = "";
    if (err) {
      break;
    } else if (k == ZB_AK_ENABLED) {
      if (!(err = zb_yaml_get_string(w, v, "adaptive.enabled", word, sizeof word)) && strcmp(word, "true") &&
          strcmp(word, "false"))
        err = zb_diag_set(w->diag, ZB_ERR_PARSE,
                          "line %d: key 'adaptive.enabled': expected true or false, got '%s'",
                          zb_yaml_line(v), word);
      a->enabled = strcmp(word, "true") == 0;
    } else if (k == ZB_AK_MIN_GAIN) {
      err = zb_yaml_get_number(w, v, "adaptive.min_gain", &a->min_gain);
    } else {
      err = get_int32(w, v, "adaptive.check_every", &every, &a->check_every);
    }
  }
  return err;
}

/* model.config: the file's text through the caller's reader (this module
 * does no I/O); the checker parses it. */
static zb_err model_config(const zb_yaml_walk *w, const yaml_node_t *v, zb_model_spec *m,
                           const job_lines *l) {
  char path[512];
  zb_err err = zb_yaml_get_string(w, v, "model.config", path, sizeof path);
  if (err)
    return err;
  if (!l->files || !l->files->read)
    return zb_diag_set(w->diag, ZB_ERR_INVALID_ARG,
                       "line %d: key 'model.config': this reader does not read files (zbctl submit does)",
                       zb_yaml_line(v));
  zb_diag d = {{0}};
  if ((err = l->files->read(l->files->ud, path, m->config_json, sizeof m->config_json, &d)))
    return zb_diag_set(w->diag, err, "line %d: key 'model.config': %s", zb_yaml_line(v), d.msg);
  return ZB_OK;
}

/* The keys that name an architecture: architecture, config, weights. */
static zb_err model_arch_key(const zb_yaml_walk *w, int k, const yaml_node_t *v, zb_model_spec *m,
                             const job_lines *l) {
  if (k == ZB_MK_ARCHITECTURE)
    return zb_yaml_get_string(w, v, "model.architecture", m->architecture, sizeof m->architecture);
  if (k == ZB_MK_CONFIG)
    return model_config(w, v, m, l);
  return zb_yaml_get_string(w, v, "model.weights", m->weights, sizeof m->weights);
}

/* With an architecture the config gives hidden, heads and layers: those
 * left out are 0 for zb_job_spec_derive to fill, not the builtin's
 * defaults. */
static void model_arch_sizes(zb_model_spec *m, const job_lines *l) {
  if (!zb_model_spec_has_arch(m))
    return;
  if (!l->model[ZB_MK_HIDDEN])
    m->hidden = 0;
  if (!l->model[ZB_MK_HEADS])
    m->heads = 0;
  if (!l->model[ZB_MK_LAYERS])
    m->layers = 0;
}

/* model: a mapping of zb_model_keys; sizes are checked as integers here and
 * against their ranges (with the other rules) by the checker. */
static zb_err job_model(const zb_yaml_walk *w, const yaml_node_t *n, zb_job_spec *s, job_lines *lines) {
  zb_err merr = zb_yaml_want_mapping(w, n, "model", zb_model_keys, ZB_MK_COUNT);
  if (merr)
    return merr;
  s->has_model = true;
  zb_model_spec *m = &s->model;
  int *ints[] = {[ZB_MK_HIDDEN] = &m->hidden,
                 [ZB_MK_HEADS] = &m->heads,
                 [ZB_MK_LAYERS] = &m->layers,
                 [ZB_MK_SEQ_LEN] = &m->seq_len,
                 [ZB_MK_BATCH] = &m->batch};
  double *reals[ZB_MK_COUNT] = {
      [ZB_MK_CLIP_NORM] = &m->clip_norm, [ZB_MK_LR] = &m->lr,       [ZB_MK_WEIGHT_DECAY] = &m->weight_decay,
      [ZB_MK_BETA1] = &m->beta1,         [ZB_MK_BETA2] = &m->beta2, [ZB_MK_EPS] = &m->eps};
  for (const yaml_node_pair_t *pair = n->data.mapping.pairs.start; pair < n->data.mapping.pairs.top; pair++) {
    int k = -1; /* set by map_key on success; gcc -O2 cannot see that */
    zb_err err = zb_yaml_map_key(w, zb_yaml_node_at(w, pair->key), zb_model_keys, ZB_MK_COUNT, "model.",
                                 lines->model, &k);
    if (err)
      return err;
    const yaml_node_t *value = zb_yaml_node_at(w, pair->value);
    if (k <= ZB_MK_BATCH)
      err = get_int32(w, value, zb_model_fields[k], &zb_model_limits[k], ints[k]);
    else if (k == ZB_MK_SEED)
      err = get_int(w, value, "model.seed", &zb_model_limits[ZB_MK_SEED], &m->seed);
    else if (k == ZB_MK_DATA)
      err = zb_yaml_get_string(w, value, "model.data", m->data, sizeof m->data);
    else if (k == ZB_MK_STEP)
      err = zb_yaml_get_string(w, value, "model.step", m->step, sizeof m->step);
    else if (k == ZB_MK_INJECT_NAN)
      err = model_inject_nan(w, value, m);
    else if (k == ZB_MK_CHECKPOINT_EVERY)
      err = get_int32(w, value, "model.checkpoint_every", &zb_model_limits[ZB_MK_CHECKPOINT_EVERY],
                      &m->checkpoint_every);
    else if (k == ZB_MK_CHECKPOINT_DIR)
      err = zb_yaml_get_string(w, value, "model.checkpoint_dir", m->checkpoint_dir, sizeof m->checkpoint_dir);
    else if (k == ZB_MK_DUMP_DIR)
      err = zb_yaml_get_string(w, value, "model.dump_dir", m->dump_dir, sizeof m->dump_dir);
    else if (k == ZB_MK_DUMP_EVERY)
      err = get_int32(w, value, "model.dump_every", &zb_model_limits[ZB_MK_DUMP_EVERY], &m->dump_every);
    else if (k == ZB_MK_ORDER)
      err = zb_yaml_get_string(w, value, "model.order", m->order, sizeof m->order);
    else if (k >= ZB_MK_ARCHITECTURE)
      err = model_arch_key(w, k, value, m, lines);
    else
      err = zb_yaml_get_number(w, value, zb_model_fields[k], reals[k]);
    if (err)
      return err;
  }
  model_arch_sizes(m, lines);
  return ZB_OK;
}

/* The data-parallel keys; their ranges and rules are the checker's
 * (zb_jobspec_dp.c), except that data_parallel below 1 is a wrong type. */
static zb_err job_dp_value(const zb_yaml_walk *w, zb_job_key k, const yaml_node_t *v, zb_job_spec *s) {
  static const zb_int_limit count = {1, 1 << 30}, flag = {0, 1 << 30};
  switch (k) {
  case ZB_JK_DATA_PARALLEL: return get_int32(w, v, "data_parallel", &count, &s->data_parallel);
  case ZB_JK_ZERO: return get_int32(w, v, "zero", &flag, &s->zero);
  case ZB_JK_RANK_ORDER: return zb_yaml_get_string(w, v, "rank_order", s->rank_order, sizeof s->rank_order);
  case ZB_JK_LINK_GBPS: return zb_yaml_get_number(w, v, "link_gbps", &s->link_gbps);
  case ZB_JK_LINK_LATENCY: return zb_yaml_get_number(w, v, "link_latency_us", &s->link_latency_us);
  case ZB_JK_TORCH_RUN: return zb_yaml_get_string(w, v, "torch_run", s->torch_run, sizeof s->torch_run);
  default: return ZB_ERR_PARSE;
  }
}

static zb_err job_value(const zb_yaml_walk *w, zb_job_key k, const yaml_node_t *v, zb_job_spec *s,
                        job_lines *lines, double *per_rank) {
  long long bytes;
  zb_err err;
  switch (k) {
  case ZB_JK_NAME: return zb_yaml_get_string(w, v, "name", s->name, sizeof s->name);
  case ZB_JK_RANKS: return get_int32(w, v, "ranks", &zb_job_limits[ZB_JK_RANKS], &s->ranks);
  case ZB_JK_MICROBATCHES:
    return get_int32(w, v, "microbatches", &zb_job_limits[ZB_JK_MICROBATCHES], &s->microbatches);
  case ZB_JK_SCHEDULE: return zb_yaml_get_string(w, v, "schedule", s->schedule, sizeof s->schedule);
  case ZB_JK_CHUNKS: return get_int32(w, v, "chunks", &zb_job_limits[ZB_JK_CHUNKS], &s->chunks);
  case ZB_JK_MEM_LIMIT: return job_mem_limit(w, v, s, per_rank);
  case ZB_JK_COSTS: return job_costs(w, v, &s->costs, lines);
  case ZB_JK_STAGE_COSTS: lines->stage_rows = v; return job_stage_costs(w, v, s);
  case ZB_JK_ITERATIONS:
    return get_int32(w, v, "iterations", &zb_job_limits[ZB_JK_ITERATIONS], &s->iterations);
  case ZB_JK_BACKEND: return zb_yaml_get_string(w, v, "backend", s->backend, sizeof s->backend);
  case ZB_JK_TRANSPORT: return zb_yaml_get_string(w, v, "transport", s->transport, sizeof s->transport);
  case ZB_JK_BYTES:
    if ((err = get_int(w, v, "bytes_per_activation", &zb_job_limits[ZB_JK_BYTES], &bytes)))
      return err;
    s->bytes_per_activation = bytes;
    return ZB_OK;
  case ZB_JK_MODEL: return job_model(w, v, s, lines);
  case ZB_JK_PRECISION: return zb_yaml_get_string(w, v, "precision", s->precision, sizeof s->precision);
  case ZB_JK_TRACE_EVERY:
    return get_int32(w, v, "trace_every", &zb_job_limits[ZB_JK_TRACE_EVERY], &s->trace_every);
  case ZB_JK_ADAPTIVE: return job_adaptive(w, v, &s->adaptive);
  case ZB_JK_WAIT_WORKERS:
    return get_int32(w, v, "wait_for_workers_s", &zb_job_limits[ZB_JK_WAIT_WORKERS], &s->wait_for_workers_s);
  case ZB_JK_TRANSFER_TIMEOUT:
    return get_int32(w, v, "transfer_timeout_s", &zb_job_limits[ZB_JK_TRANSFER_TIMEOUT],
                     &s->transfer_timeout_s);
  case ZB_JK_COUNT: break;
  default: return job_dp_value(w, k, v, s);
  }
  return ZB_ERR_PARSE;
}

/* Line to blame for a checker fault: the key's line, the costs sub-key's or
 * the stage_costs row's when the fault names one. */
static int fault_line(const zb_yaml_walk *w, const job_lines *lines, const zb_job_fault *f) {
  if (f->key == ZB_JK_COSTS && f->sub >= 0 && lines->cost[f->sub])
    return lines->cost[f->sub];
  if (f->key == ZB_JK_MODEL && f->sub >= 0 && lines->model[f->sub])
    return lines->model[f->sub];
  if (f->key == ZB_JK_STAGE_COSTS && f->sub >= 0 && lines->stage_rows)
    return zb_yaml_line(zb_yaml_node_at(w, lines->stage_rows->data.sequence.items.start[f->sub]));
  return lines->key[f->key] ? lines->key[f->key] : lines->root;
}

static zb_err job_walk(const zb_yaml_walk *w, const yaml_node_t *root, const zb_jobspec_files *files,
                       zb_job_spec *s) {
  char known[160];
  job_lines lines = {.root = zb_yaml_line(root), .files = files};
  double per_rank = 0;
  /* the required keys and the first few others: all of them would crowd
   * the message's room */
  zb_yaml_join_names(zb_job_keys, ZB_JK_ITERATIONS + 1, known, sizeof known);
  char what[200];
  snprintf(what, sizeof what, "a mapping of keys (%s, ...)", known);
  zb_err err = zb_yaml_want_root_mapping(w, root, what);
  if (err)
    return err;
  for (const yaml_node_pair_t *pair = root->data.mapping.pairs.start; pair < root->data.mapping.pairs.top;
       pair++) {
    int k = -1; /* set by map_key on success; gcc -O2 cannot see that */
    if ((err =
             zb_yaml_map_key(w, zb_yaml_node_at(w, pair->key), zb_job_keys, ZB_JK_COUNT, "", lines.key, &k)))
      return err;
    const yaml_node_t *value = zb_yaml_node_at(w, pair->value);
    if ((err = job_value(w, (zb_job_key)k, value, s, &lines, &per_rank)))
      return err;
  }
  for (size_t i = 0; i < sizeof job_required / sizeof job_required[0]; i++)
    if (!lines.key[job_required[i]])
      return zb_diag_set(w->diag, ZB_ERR_PARSE, "line %d: missing required key '%s'", lines.root,
                         zb_job_keys[job_required[i]]);
  /* 'Np' is resolved here because ranks may follow mem_limit in the file. */
  if (per_rank > 0)
    s->mem_limit = per_rank * s->ranks;
  zb_job_spec_derive(s, lines.key[ZB_JK_BYTES] != 0);
  zb_job_fault f;
  if ((err = zb_job_spec_find_fault(s, &f)))
    return zb_diag_set(w->diag, err, "line %d: key '%s': %s", fault_line(w, &lines, &f), f.field, f.reason);
  return ZB_OK;
}

zb_err zb_job_spec_parse(const char *yaml, size_t len, zb_job_spec *out, zb_diag *diag) {
  return zb_job_spec_parse_files(yaml, len, NULL, out, diag);
}

zb_err zb_job_spec_parse_files(const char *yaml, size_t len, const zb_jobspec_files *files, zb_job_spec *out,
                               zb_diag *diag) {
  zb_job_spec s;
  yaml_document_t doc;
  yaml_node_t *root = NULL;
  zb_job_spec_default(&s);
  zb_err err = zb_yaml_load(yaml, len, &doc, &root, diag);
  if (!err) {
    zb_yaml_walk w = {&doc, diag};
    err =
        root ? job_walk(&w, root, files, &s)
             : zb_diag_set(diag, ZB_ERR_PARSE,
                           "line 1: empty document: a job spec needs name, ranks, microbatches and schedule");
    yaml_document_delete(&doc);
  }
  /* The spec is built aside so that *out is touched once, either way. */
  if (err) {
    zb_job_spec_free(&s);
    zb_job_spec_default(out);
  } else {
    *out = s;
  }
  return err;
}
