/* zb_config.c — job specs and the coordinator's config from YAML (libyaml's
 * document API). The document is loaded whole, then walked against fixed
 * key tables; every message carries the 1-based line of the node it blames.
 * Type errors (and negative sizes) are ZB_ERR_PARSE; values of the right
 * type but out of range are ZB_ERR_INVALID_ARG, the same split as
 * zb_job_spec_check, which shares the range tables below.
 */
#include "zb_config.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "zb_alloc.h"
#include "zb_log.h"
#include "zb_plan.h"

/* ---- limits shared by the parser and the checker ----------------------- */

/* An integer field: below type_min it is the wrong type (a negative size),
 * outside [min, max] it is out of range. */
typedef struct int_range {
  long long type_min, min, max;
} int_range;

static const int_range RANKS_RANGE = {1, 1, 1024};
static const int_range MICROBATCHES_RANGE = {1, 1, 1000000};
/* Not a documented limit: it keeps ranks * chunks well inside an int. */
static const int_range CHUNKS_RANGE = {0, 0, 1024};
static const int_range ITERATIONS_RANGE = {1, 1, 1000000};
static const int_range BYTES_RANGE = {0, 0, 1073741824};
static const int_range HEARTBEAT_RANGE = {0, 100, 600000};
static const int_range MAX_MESSAGE_RANGE = {0, 4096, 1073741824};
/* The model's sizes: generous bounds; check_model adds the products' limits. */
static const int_range HIDDEN_RANGE = {1, 1, 65536};
static const int_range HEADS_RANGE = {1, 1, 65536};
static const int_range LAYERS_RANGE = {1, 1, 100000};
static const int_range SEQ_LEN_RANGE = {1, 1, 1048576};
static const int_range BATCH_RANGE = {1, 1, 1048576};
static const int_range SEED_RANGE = {1, 1, 9223372036854775807LL};

typedef enum job_key {
  JK_NAME,
  JK_RANKS,
  JK_MICROBATCHES,
  JK_SCHEDULE,
  JK_CHUNKS,
  JK_MEM_LIMIT,
  JK_COSTS,
  JK_STAGE_COSTS,
  JK_ITERATIONS,
  JK_BACKEND,
  JK_TRANSPORT,
  JK_BYTES,
  JK_MODEL,
  JK_COUNT_
} job_key;

static const char *const job_keys[JK_COUNT_] = {
    "name",  "ranks",       "microbatches", "schedule", "chunks",    "mem_limit",
    "costs", "stage_costs", "iterations",   "backend",  "transport", "bytes_per_activation",
    "model"};
static const job_key job_required[] = {JK_NAME, JK_RANKS, JK_MICROBATCHES, JK_SCHEDULE};

typedef enum cost_key { CK_F, CK_B, CK_W, CK_COMM, CK_MEM, CK_COUNT_ } cost_key;
static const char *const cost_keys[CK_COUNT_] = {"f", "b", "w", "comm", "mem"};
static const char *const cost_fields[CK_COUNT_] = {"costs.f", "costs.b", "costs.w", "costs.comm",
                                                   "costs.mem"};

typedef enum model_key {
  MK_HIDDEN,
  MK_HEADS,
  MK_LAYERS,
  MK_SEQ_LEN,
  MK_BATCH,
  MK_SEED,
  MK_DATA,
  MK_LR,
  MK_WEIGHT_DECAY,
  MK_BETA1,
  MK_BETA2,
  MK_EPS,
  MK_CLIP_NORM,
  MK_STEP,
  MK_INJECT_NAN,
  MK_CHECKPOINT_EVERY,
  MK_CHECKPOINT_DIR,
  MK_DUMP_DIR,
  MK_DUMP_EVERY,
  MK_COUNT_
} model_key;
static const char *const model_keys[MK_COUNT_] = {
    "hidden",        "heads", "layers", "seq_len", "batch",     "seed", "data",       "lr",
    "weight_decay",  "beta1", "beta2",  "eps",     "clip_norm", "step", "inject_nan", "checkpoint_every",
    "checkpoint_dir", "dump_dir", "dump_every"};
static const char *const model_fields[MK_COUNT_] = {
    "model.hidden",        "model.heads", "model.layers",     "model.seq_len",
    "model.batch",         "model.seed",  "model.data",       "model.lr",
    "model.weight_decay",  "model.beta1", "model.beta2",      "model.eps",
    "model.clip_norm",     "model.step",  "model.inject_nan", "model.checkpoint_every",
    "model.checkpoint_dir", "model.dump_dir",   "model.dump_every"};
static const char *const step_modes[] = {ZB_STEP_POST_VALIDATED_NAME, ZB_STEP_SYNCHRONOUS_NAME};

typedef enum nan_key { NK_ITERATION, NK_MICROBATCH, NK_COUNT_ } nan_key;
static const char *const nan_keys[NK_COUNT_] = {"iteration", "microbatch"};
static const int_range NAN_INDEX_RANGE = {0, 0, 1000000};
static const int_range CHECKPOINT_EVERY_RANGE = {0, 0, 1000000};
static const int_range DUMP_EVERY_RANGE = {0, 0, 1000000};

typedef enum coord_key {
  CO_LISTEN,
  CO_METRICS_LISTEN,
  CO_DATA_DIR,
  CO_HEARTBEAT,
  CO_LOG_LEVEL,
  CO_MAX_MESSAGE,
  CO_COUNT_
} coord_key;
static const char *const coord_keys[CO_COUNT_] = {
    "listen", "metrics_listen", "data_dir", "heartbeat_timeout_ms", "log_level", "max_message_bytes"};

static const char *const backends[] = {"sim", "cpu", "cuda"};
static const char *const transports[] = {"tcp", "nccl"};

/* ---- defaults ---------------------------------------------------------- */

void zb_job_spec_default(zb_job_spec *s) {
  memset(s, 0, sizeof *s);
  s->costs =
      (zb_rank_costs){.t_f = 0.01, .t_b = 0.01, .t_w = 0.01, .t_comm = 0, .m_f = 1, .m_b = -0.5, .m_w = -0.5};
  s->iterations = 10;
  snprintf(s->backend, sizeof s->backend, "sim");
  snprintf(s->transport, sizeof s->transport, "tcp");
  s->bytes_per_activation = 65536;
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
}

long long zb_model_spec_bytes_per_activation(const zb_model_spec *m) {
  /* the ranges keep the product below 2^58: wire input may be any int */
  if (m->batch < BATCH_RANGE.min || m->batch > BATCH_RANGE.max || m->seq_len < SEQ_LEN_RANGE.min ||
      m->seq_len > SEQ_LEN_RANGE.max || m->hidden < HIDDEN_RANGE.min || m->hidden > HIDDEN_RANGE.max)
    return 0;
  return (long long)m->batch * m->seq_len * m->hidden * 4;
}

static bool is_cpu(const zb_job_spec *s) {
  return memchr(s->backend, '\0', sizeof s->backend) && strcmp(s->backend, "cpu") == 0;
}

void zb_job_spec_derive(zb_job_spec *s, bool bytes_given) {
  if (!is_cpu(s))
    return;
  zb_family fam;
  if (s->model.layers == 0 && memchr(s->schedule, '\0', sizeof s->schedule) &&
      zb_family_parse(s->schedule, &fam, NULL) == ZB_OK && s->ranks >= 1 && s->ranks <= RANKS_RANGE.max &&
      s->chunks >= 0 && s->chunks <= CHUNKS_RANGE.max) {
    long long layers = (long long)s->ranks * (s->chunks ? s->chunks : zb_family_default_chunks(fam));
    if (layers <= LAYERS_RANGE.max)
      s->model.layers = (int)layers;
  }
  long long bytes = zb_model_spec_bytes_per_activation(&s->model);
  /* one too large is left for check_model, which names the model's keys */
  if (!bytes_given && bytes > 0 && bytes <= BYTES_RANGE.max)
    s->bytes_per_activation = bytes;
}

void zb_job_spec_free(zb_job_spec *s) {
  if (!s)
    return;
  free(s->stage_costs);
  s->stage_costs = NULL;
  s->n_stage_costs = 0;
}

void zb_coord_config_default(zb_coord_config *c) {
  memset(c, 0, sizeof *c);
  snprintf(c->listen, sizeof c->listen, "127.0.0.1:7070");
  snprintf(c->metrics_listen, sizeof c->metrics_listen, "127.0.0.1:9464");
  snprintf(c->data_dir, sizeof c->data_dir, "/var/lib/zb");
  c->heartbeat_timeout_ms = 5000;
  snprintf(c->log_level, sizeof c->log_level, "info");
  c->max_message_bytes = 16777216;
}

/* ---- loading ----------------------------------------------------------- */

static int node_line(const yaml_node_t *n) {
  return (int)n->start_mark.line + 1;
}

/* Line of byte `offset` (reader errors carry an offset, not a mark). */
static int offset_line(const char *text, size_t len, size_t offset) {
  int line = 1;
  for (size_t i = 0; i < offset && i < len; i++)
    line += text[i] == '\n';
  return line;
}

static zb_err syntax_error(const yaml_parser_t *p, const char *text, size_t len, zb_diag *diag) {
  const char *problem = p->problem ? p->problem : "malformed YAML";
  switch (p->error) {
  case YAML_MEMORY_ERROR: return zb_diag_set(diag, ZB_ERR_PARSE, "YAML parser ran out of memory");
  case YAML_READER_ERROR:
    return zb_diag_set(diag, ZB_ERR_PARSE, "line %d: invalid input: %s",
                       offset_line(text, len, p->problem_offset), problem);
  default:
    if (p->context)
      return zb_diag_set(diag, ZB_ERR_PARSE, "line %d: YAML syntax error: %s (%s on line %d)",
                         (int)p->problem_mark.line + 1, problem, p->context, (int)p->context_mark.line + 1);
    return zb_diag_set(diag, ZB_ERR_PARSE, "line %d: YAML syntax error: %s", (int)p->problem_mark.line + 1,
                       problem);
  }
}

/* Loads exactly one document from text into *doc and points *root at its
 * top node (NULL for an empty document). On success the caller owns *doc
 * and deletes it; on failure nothing is left to delete. A second document
 * in the stream is an error: a spec split by '---' is a mistake, not two
 * specs. */
static zb_err doc_load(const char *text, size_t len, yaml_document_t *doc, yaml_node_t **root,
                       zb_diag *diag) {
  yaml_parser_t parser;
  yaml_document_t extra;
  bool have_doc = false, have_extra = false;
  zb_err err = ZB_OK;
  if (!text) {
    text = "";
    len = 0;
  }
  if (!yaml_parser_initialize(&parser))
    return zb_diag_set(diag, ZB_ERR_PARSE, "YAML parser ran out of memory");
  yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
  if (!yaml_parser_load(&parser, doc)) {
    err = syntax_error(&parser, text, len, diag);
    goto cleanup;
  }
  have_doc = true;
  if (!yaml_parser_load(&parser, &extra)) {
    err = syntax_error(&parser, text, len, diag);
    goto cleanup;
  }
  have_extra = true;
  yaml_node_t *second = yaml_document_get_root_node(&extra);
  if (second) {
    err = zb_diag_set(diag, ZB_ERR_PARSE, "line %d: expected one YAML document, found a second one",
                      node_line(second));
    goto cleanup;
  }
  *root = yaml_document_get_root_node(doc);
cleanup:
  if (have_extra)
    yaml_document_delete(&extra);
  if (err && have_doc)
    yaml_document_delete(doc);
  yaml_parser_delete(&parser);
  return err;
}

/* ---- typed values ------------------------------------------------------ */

/* What a walk needs to report: the document (to follow node ids) and the
 * caller's diag. */
typedef struct walk {
  yaml_document_t *doc;
  zb_diag *diag;
} walk;

static const char *scalar_text(const yaml_node_t *n) {
  return (const char *)n->data.scalar.value;
}

static bool is_plain(const yaml_node_t *n) {
  return n->type == YAML_SCALAR_NODE && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
}

/* An unquoted empty value, '~' or 'null': YAML's null, which no field takes. */
static bool is_null(const yaml_node_t *n) {
  if (!is_plain(n))
    return false;
  const char *t = scalar_text(n);
  return !*t || !strcmp(t, "~") || !strcmp(t, "null") || !strcmp(t, "Null") || !strcmp(t, "NULL");
}

/* Describes a node for "got ..." (values cut at 40 characters so the
 * message fits zb_diag). */
static const char *describe(const yaml_node_t *n, char *buf, size_t size) {
  if (n->type == YAML_MAPPING_NODE)
    return "a mapping";
  if (n->type == YAML_SEQUENCE_NODE)
    return "a list";
  if (is_null(n))
    return "an empty value";
  const char *t = scalar_text(n);
  const char *more = strlen(t) > 40 ? "..." : "";
  snprintf(buf, size, "%s'%.40s%s'", is_plain(n) ? "" : "the quoted string ", t, more);
  return buf;
}

/* The whole text is a decimal integer (strtoll clamps on overflow, which
 * the caller's range check then refuses). */
static bool parse_ll(const char *t, long long *out) {
  if (!*t || strspn(t, "+-0123456789") != strlen(t))
    return false;
  char *end;
  *out = strtoll(t, &end, 10);
  return end != t && !*end;
}

/* The whole text is a finite decimal number; the character set keeps out
 * what strtod also accepts but YAML does not mean as a number (hex, inf,
 * nan). */
static bool parse_double(const char *t, double *out) {
  if (!*t || strspn(t, "+-.0123456789eE") != strlen(t))
    return false;
  char *end;
  *out = strtod(t, &end);
  return end != t && !*end && isfinite(*out);
}

static zb_err get_int(const walk *w, const yaml_node_t *n, const char *key, const int_range *r,
                      long long *out) {
  char buf[64];
  long long v = 0;
  if (!is_plain(n) || !parse_ll(scalar_text(n), &v) || v < r->type_min)
    return zb_diag_set(w->diag, ZB_ERR_PARSE, "line %d: key '%s': expected an integer >= %lld, got %s",
                       node_line(n), key, r->type_min, describe(n, buf, sizeof buf));
  if (v < r->min || v > r->max)
    return zb_diag_set(w->diag, ZB_ERR_INVALID_ARG,
                       "line %d: key '%s': must be between %lld and %lld, got %s", node_line(n), key, r->min,
                       r->max, describe(n, buf, sizeof buf));
  *out = v;
  return ZB_OK;
}

static zb_err get_int32(const walk *w, const yaml_node_t *n, const char *key, const int_range *r, int *out) {
  long long v;
  zb_err err = get_int(w, n, key, r, &v);
  if (!err)
    *out = (int)v; /* every int range lies inside int */
  return err;
}

static zb_err get_number(const walk *w, const yaml_node_t *n, const char *key, double *out) {
  char buf[64];
  if (!is_plain(n) || !parse_double(scalar_text(n), out))
    return zb_diag_set(w->diag, ZB_ERR_PARSE, "line %d: key '%s': expected a number, got %s", node_line(n),
                       key, describe(n, buf, sizeof buf));
  return ZB_OK;
}

/* A string value, quoted or not; too long for its field is a range error. */
static zb_err get_string(const walk *w, const yaml_node_t *n, const char *key, char *dst, size_t size) {
  char buf[64];
  if (n->type != YAML_SCALAR_NODE || is_null(n))
    return zb_diag_set(w->diag, ZB_ERR_PARSE, "line %d: key '%s': expected a string, got %s", node_line(n),
                       key, describe(n, buf, sizeof buf));
  size_t len = n->data.scalar.length;
  if (strlen(scalar_text(n)) != len)
    return zb_diag_set(w->diag, ZB_ERR_PARSE, "line %d: key '%s': contains a NUL character", node_line(n),
                       key);
  if (len >= size)
    return zb_diag_set(w->diag, ZB_ERR_INVALID_ARG,
                       "line %d: key '%s': must be at most %zu characters, got %zu", node_line(n), key,
                       size - 1, len);
  memcpy(dst, scalar_text(n), len + 1);
  return ZB_OK;
}

/* A list of exactly three numbers ([T_F, T_B, T_W] or [M_F, M_B, M_W]). */
static zb_err get_triple(const walk *w, const yaml_node_t *n, const char *key, double out[3]) {
  char buf[64], item_key[48];
  if (n->type != YAML_SEQUENCE_NODE)
    return zb_diag_set(w->diag, ZB_ERR_PARSE, "line %d: key '%s': expected a list of 3 numbers, got %s",
                       node_line(n), key, describe(n, buf, sizeof buf));
  long count = (long)(n->data.sequence.items.top - n->data.sequence.items.start);
  if (count != 3)
    return zb_diag_set(w->diag, ZB_ERR_PARSE,
                       "line %d: key '%s': expected a list of 3 numbers, got %ld item%s", node_line(n), key,
                       count, count == 1 ? "" : "s");
  for (int k = 0; k < 3; k++) {
    snprintf(item_key, sizeof item_key, "%s[%d]", key, k);
    zb_err err =
        get_number(w, yaml_document_get_node(w->doc, n->data.sequence.items.start[k]), item_key, &out[k]);
    if (err)
      return err;
  }
  return ZB_OK;
}

/* ---- mappings ---------------------------------------------------------- */

static void join_names(const char *const *names, int n, char *buf, size_t size) {
  size_t used = 0;
  buf[0] = '\0';
  for (int k = 0; k < n && used < size; k++)
    used += (size_t)snprintf(buf + used, size - used, "%s%s", k ? ", " : "", names[k]);
}

/* Resolves one mapping pair's key against names[0..n): refuses non-scalar,
 * unknown and repeated keys. seen[k] holds the line where key k was first
 * given (0: not yet). prefix is prepended in messages ("costs."). */
static zb_err map_key(const walk *w, const yaml_node_t *key, const char *const *names, int n,
                      const char *prefix, int *seen, int *index) {
  char buf[64], known[256];
  if (key->type != YAML_SCALAR_NODE)
    return zb_diag_set(w->diag, ZB_ERR_PARSE, "line %d: expected a key name, got %s", node_line(key),
                       describe(key, buf, sizeof buf));
  const char *name = scalar_text(key);
  for (int k = 0; k < n; k++)
    if (!strcmp(name, names[k])) {
      if (seen[k])
        return zb_diag_set(w->diag, ZB_ERR_PARSE, "line %d: key '%s%s' given twice (first on line %d)",
                           node_line(key), prefix, name, seen[k]);
      seen[k] = node_line(key);
      *index = k;
      return ZB_OK;
    }
  join_names(names, n, known, sizeof known);
  return zb_diag_set(w->diag, ZB_ERR_PARSE, "line %d: unknown key '%s%.40s' (known: %s)", node_line(key),
                     prefix, name, known);
}

/* The top node must be a mapping; what is expected goes into the message. */
static zb_err want_root_mapping(const walk *w, const yaml_node_t *root, const char *what) {
  char buf[64];
  if (root->type != YAML_MAPPING_NODE)
    return zb_diag_set(w->diag, ZB_ERR_PARSE, "line %d: expected %s, got %s", node_line(root), what,
                       describe(root, buf, sizeof buf));
  return ZB_OK;
}

static yaml_node_t *node_at(const walk *w, int id) {
  return yaml_document_get_node(w->doc, id);
}

/* ---- job spec ---------------------------------------------------------- */

/* Where the parser found each key (0: absent), so that a fault found later
 * by the checker can be reported at its line. These double as map_key's
 * duplicate detection. */
typedef struct job_lines {
  int root;
  int key[JK_COUNT_];
  int cost[CK_COUNT_];
  int model[MK_COUNT_];
  const yaml_node_t *stage_rows; /* the stage_costs list, NULL if absent */
} job_lines;

/* A fault found by job_check: the field as YAML and proto name it, which
 * key (and costs sub-key or stage_costs row, else -1) to blame, and why. */
typedef struct job_fault {
  job_key key;
  int sub;
  char field[32];
  char reason[256];
} job_fault;

static zb_err fault_set(job_fault *f, job_key key, int sub, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static zb_err fault_set(job_fault *f, job_key key, int sub, const char *field, const char *fmt, ...) {
  f->key = key;
  f->sub = sub;
  snprintf(f->field, sizeof f->field, "%s", field);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->reason, sizeof f->reason, fmt, ap);
  va_end(ap);
  return ZB_ERR_INVALID_ARG;
}

static zb_err check_int(job_fault *f, job_key key, long long v, const int_range *r) {
  if (v < r->min || v > r->max)
    return fault_set(f, key, -1, job_keys[key], "must be between %lld and %lld, got %lld", r->min, r->max, v);
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

static zb_err check_name(const zb_job_spec *s, job_fault *f) {
  size_t len = terminated(s->name, sizeof s->name) ? strlen(s->name) : sizeof s->name;
  bool ok = len >= 1 && len <= 63;
  for (size_t i = 0; ok && i < len; i++) {
    char c = s->name[i];
    ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-';
  }
  if (!ok)
    return fault_set(f, JK_NAME, -1, "name", "must be 1..63 characters of [A-Za-z0-9._-], got '%.*s'",
                     (int)(len > 40 ? 40 : len), s->name);
  return ZB_OK;
}

/* Schedule known and the shape accepted. A shape refused with the given
 * chunks but accepted with the family's default blames 'chunks'. */
static zb_err check_schedule(const zb_job_spec *s, job_fault *f, int *v) {
  zb_diag d = {{0}};
  zb_family fam;
  if (!terminated(s->schedule, sizeof s->schedule))
    return fault_set(f, JK_SCHEDULE, -1, "schedule", "is not a terminated string");
  if (zb_family_parse(s->schedule, &fam, &d))
    return fault_set(f, JK_SCHEDULE, -1, "schedule", "%s", d.msg);
  zb_err err = check_int(f, JK_CHUNKS, s->chunks, &CHUNKS_RANGE);
  if (err)
    return err;
  int dv = zb_family_default_chunks(fam);
  *v = s->chunks ? s->chunks : dv;
  if (zb_plan_check_shape(fam, s->ranks, *v, s->microbatches, &d)) {
    bool chunks_wrong = s->chunks && !zb_plan_check_shape(fam, s->ranks, dv, s->microbatches, NULL);
    return fault_set(f, chunks_wrong ? JK_CHUNKS : JK_SCHEDULE, -1, chunks_wrong ? "chunks" : "schedule",
                     "%s", d.msg);
  }
  return ZB_OK;
}

/* Times named field by field; memory deltas through zb_costs_check on a
 * one-stage cost model, so the rule stays libzb's. */
static zb_err check_costs(const zb_job_spec *s, job_fault *f) {
  const double t[4] = {s->costs.t_f, s->costs.t_b, s->costs.t_w, s->costs.t_comm};
  for (int k = 0; k < 4; k++)
    if (!isfinite(t[k]) || t[k] < 0)
      return fault_set(f, JK_COSTS, k, cost_fields[k], "must be a finite number >= 0, got %g", t[k]);
  zb_costs *c = zb_costs_from_rank_share(1, 1, &s->costs, 0);
  zb_diag d = {{0}};
  zb_err err = zb_costs_check(c, &d);
  zb_costs_free(c);
  if (err)
    return fault_set(f, JK_COSTS, CK_MEM, "costs.mem", "%s", d.msg);
  return ZB_OK;
}

static zb_err check_stage_costs(const zb_job_spec *s, int v, job_fault *f) {
  if (s->n_stage_costs == 0)
    return ZB_OK;
  int want = s->ranks * v;
  if (s->n_stage_costs < 0 || !s->stage_costs || s->n_stage_costs != want)
    return fault_set(f, JK_STAGE_COSTS, -1, "stage_costs",
                     "expected %d rows of [T_F, T_B, T_W] (ranks x chunks = %d x %d), got %d", want, s->ranks,
                     v, s->n_stage_costs);
  for (int i = 0; i < s->n_stage_costs; i++)
    for (int k = 0; k < 3; k++) {
      double x = s->stage_costs[i][k];
      if (!isfinite(x) || x < 0) {
        char field[32];
        snprintf(field, sizeof field, "stage_costs[%d]", i);
        return fault_set(f, JK_STAGE_COSTS, i, field, "%s must be a finite number >= 0, got %g",
                         k == 0   ? "T_F"
                         : k == 1 ? "T_B"
                                  : "T_W",
                         x);
      }
    }
  return ZB_OK;
}

size_t zb_utf8_prefix(const char *str) {
  const unsigned char *s = (const unsigned char *)str;
  size_t k = 0;
  while (s[k]) {
    unsigned c = s[k];
    int n = c < 0x80                 ? 0
            : c >= 0xc2 && c <= 0xdf ? 1
            : (c & 0xf0) == 0xe0     ? 2
            : c >= 0xf0 && c <= 0xf4 ? 3
                                     : -1;
    if (n < 0)
      break;
    /* the second byte's range excludes overlong forms, surrogates and
     * code points past U+10FFFF */
    unsigned lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80, hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
    int i = 1;
    for (; i <= n; i++, lo = 0x80, hi = 0xbf)
      if (s[k + (size_t)i] < lo || s[k + (size_t)i] > hi)
        break;
    if (i <= n)
      break;
    k += (size_t)n + 1;
  }
  return k;
}

static zb_err check_model_int(job_fault *f, model_key k, long long v, const int_range *r) {
  if (v < r->min || v > r->max)
    return fault_set(f, JK_MODEL, k, model_fields[k], "must be between %lld and %lld, got %lld", r->min,
                     r->max, v);
  return ZB_OK;
}

/* A double in [lo, hi) (hi_open) or [lo, inf) (hi = INFINITY); lo itself
 * excluded when lo_open. */
static zb_err check_model_real(job_fault *f, model_key k, double v, double lo, bool lo_open, double hi) {
  bool ok = isfinite(v) && (lo_open ? v > lo : v >= lo) && (isinf(hi) || v < hi);
  if (ok)
    return ZB_OK;
  if (isinf(hi))
    return fault_set(f, JK_MODEL, k, model_fields[k], "must be a finite number %s %g, got %g",
                     lo_open ? ">" : ">=", lo, v);
  return fault_set(f, JK_MODEL, k, model_fields[k], "must be in [%g, %g), got %g", lo, hi, v);
}

/* The model of a cpu job: the ranges above, zb_model_stage_new's own rules
 * (heads divide hidden; the matrix products' dimensions fit an int), and
 * the optimizer's. The coordinator cannot build the model (it has no
 * BLAS), so the rules are mirrored here, where both ends check. */
static zb_err check_model(const zb_job_spec *s, job_fault *f) {
  const zb_model_spec *m = &s->model;
  if (!is_cpu(s)) {
    if (s->has_model)
      return fault_set(f, JK_MODEL, -1, "model", "only a cpu job trains a model; backend is '%.15s'",
                       s->backend);
    return ZB_OK;
  }
  zb_err err;
  if ((err = check_model_int(f, MK_HIDDEN, m->hidden, &HIDDEN_RANGE)) ||
      (err = check_model_int(f, MK_HEADS, m->heads, &HEADS_RANGE)) ||
      (err = check_model_int(f, MK_LAYERS, m->layers, &LAYERS_RANGE)) ||
      (err = check_model_int(f, MK_SEQ_LEN, m->seq_len, &SEQ_LEN_RANGE)) ||
      (err = check_model_int(f, MK_BATCH, m->batch, &BATCH_RANGE)) ||
      (err = check_model_int(f, MK_SEED, m->seed, &SEED_RANGE)))
    return err;
  if (m->hidden % m->heads != 0)
    return fault_set(f, JK_MODEL, MK_HEADS, "model.heads", "must divide model.hidden (%d), got %d", m->hidden,
                     m->heads);
  long long tokens = (long long)m->batch * m->seq_len;
  if (tokens * 4 * m->hidden > INT_MAX || (long long)m->seq_len * m->seq_len > INT_MAX)
    return fault_set(f, JK_MODEL, -1, "model",
                     "too large: batch x seq_len x 4 x hidden = %lld and seq_len^2 = %lld must fit an int "
                     "(the matrix products' dimensions)",
                     tokens * 4 * m->hidden, (long long)m->seq_len * m->seq_len);
  long long bytes = zb_model_spec_bytes_per_activation(m);
  if (bytes > BYTES_RANGE.max)
    return fault_set(f, JK_MODEL, -1, "model",
                     "one activation is %lld bytes (batch %d x seq_len %d x hidden %d x 4), over the %lld "
                     "bytes a message may carry",
                     bytes, m->batch, m->seq_len, m->hidden, BYTES_RANGE.max);
  size_t data_len = terminated(m->data, sizeof m->data) ? strlen(m->data) : sizeof m->data;
  if (data_len == 0 || data_len == sizeof m->data)
    return fault_set(f, JK_MODEL, MK_DATA, "model.data", "must be a path of 1..%zu characters",
                     sizeof m->data - 1);
  if (m->data[zb_utf8_prefix(m->data)] != '\0')
    return fault_set(f, JK_MODEL, MK_DATA, "model.data", "is not valid UTF-8");
  if ((err = check_model_real(f, MK_LR, m->lr, 0, true, INFINITY)) ||
      (err = check_model_real(f, MK_WEIGHT_DECAY, m->weight_decay, 0, false, INFINITY)) ||
      (err = check_model_real(f, MK_BETA1, m->beta1, 0, false, 1)) ||
      (err = check_model_real(f, MK_BETA2, m->beta2, 0, false, 1)) ||
      (err = check_model_real(f, MK_EPS, m->eps, 0, true, INFINITY)) ||
      (err = check_model_real(f, MK_CLIP_NORM, m->clip_norm, 0, false, INFINITY)))
    return err;
  if (!terminated(m->step, sizeof m->step) || !one_of(m->step, step_modes, 2))
    return fault_set(f, JK_MODEL, MK_STEP, "model.step", "must be one of %s, %s, got '%.23s'",
                     ZB_STEP_POST_VALIDATED_NAME, ZB_STEP_SYNCHRONOUS_NAME, m->step);
  if (m->inject_nan && (m->nan_iteration < 0 || m->nan_iteration >= s->iterations))
    return fault_set(f, JK_MODEL, MK_INJECT_NAN, "model.inject_nan.iteration",
                     "must be between 0 and iterations - 1 (%d), got %d", s->iterations - 1,
                     m->nan_iteration);
  if (m->inject_nan && (m->nan_microbatch < 0 || m->nan_microbatch >= s->microbatches))
    return fault_set(f, JK_MODEL, MK_INJECT_NAN, "model.inject_nan.microbatch",
                     "must be between 0 and microbatches - 1 (%d), got %d", s->microbatches - 1,
                     m->nan_microbatch);
  if (m->checkpoint_every < 0 || m->checkpoint_every > CHECKPOINT_EVERY_RANGE.max)
    return fault_set(f, JK_MODEL, MK_CHECKPOINT_EVERY, "model.checkpoint_every",
                     "must be between 0 and %lld, got %d", CHECKPOINT_EVERY_RANGE.max, m->checkpoint_every);
  if (!terminated(m->checkpoint_dir, sizeof m->checkpoint_dir) ||
      m->checkpoint_dir[zb_utf8_prefix(m->checkpoint_dir)] != '\0')
    return fault_set(f, JK_MODEL, MK_CHECKPOINT_DIR, "model.checkpoint_dir",
                     "must be a valid UTF-8 path of at most %zu characters", sizeof m->checkpoint_dir - 1);
  /* every worker writes there and a resumed job's ranks may run on other
   * hosts: a path relative to some worker's working directory would
   * scatter the files, so only an absolute one (a shared file system) */
  if ((m->checkpoint_every > 0 || m->checkpoint_dir[0]) && m->checkpoint_dir[0] != '/')
    return fault_set(f, JK_MODEL, MK_CHECKPOINT_DIR, "model.checkpoint_dir",
                     "must be an absolute path (a directory every worker can write, shared on a "
                     "multi-host cluster) when model.checkpoint_every > 0, got '%.200s'",
                     m->checkpoint_dir);
  if (!terminated(m->dump_dir, sizeof m->dump_dir) || m->dump_dir[zb_utf8_prefix(m->dump_dir)] != '\0')
    return fault_set(f, JK_MODEL, MK_DUMP_DIR, "model.dump_dir",
                     "must be a valid UTF-8 path of at most %zu characters", sizeof m->dump_dir - 1);
  if (m->dump_dir[0] && m->dump_dir[0] != '/') /* as checkpoint_dir: every worker writes there */
    return fault_set(f, JK_MODEL, MK_DUMP_DIR, "model.dump_dir",
                     "must be an absolute path (a directory every worker can write), got '%.200s'", m->dump_dir);
  if (m->dump_every < 0 || m->dump_every > DUMP_EVERY_RANGE.max)
    return fault_set(f, JK_MODEL, MK_DUMP_EVERY, "model.dump_every", "must be between 0 and %lld, got %d",
                     DUMP_EVERY_RANGE.max, m->dump_every);
  if (m->dump_every > 0 && !m->dump_dir[0])
    return fault_set(f, JK_MODEL, MK_DUMP_EVERY, "model.dump_every", "needs model.dump_dir (where to write)");
  if (!terminated(m->resume_from, sizeof m->resume_from))
    return fault_set(f, JK_MODEL, -1, "model.resume_from_job_id", "too long");
  if (s->bytes_per_activation != bytes)
    return fault_set(f, JK_BYTES, -1, "bytes_per_activation",
                     "%lld conflicts with the cpu model's %lld bytes per activation (batch %d x seq_len %d x "
                     "hidden %d x 4); leave it out to derive it",
                     s->bytes_per_activation, bytes, m->batch, m->seq_len, m->hidden);
  return ZB_OK;
}

/* The whole of zb_job_spec_check, reporting the fault as data. */
static zb_err job_check(const zb_job_spec *s, job_fault *f) {
  zb_err err;
  int v = 0;
  if ((err = check_name(s, f)) || (err = check_int(f, JK_RANKS, s->ranks, &RANKS_RANGE)) ||
      (err = check_int(f, JK_MICROBATCHES, s->microbatches, &MICROBATCHES_RANGE)) ||
      (err = check_schedule(s, f, &v)))
    return err;
  if (!isfinite(s->mem_limit) || s->mem_limit < 0)
    return fault_set(f, JK_MEM_LIMIT, -1, "mem_limit", "must be a finite number >= 0 (0: default), got %g",
                     s->mem_limit);
  if ((err = check_costs(s, f)) || (err = check_stage_costs(s, v, f)) ||
      (err = check_int(f, JK_ITERATIONS, s->iterations, &ITERATIONS_RANGE)) ||
      (err = check_int(f, JK_BYTES, s->bytes_per_activation, &BYTES_RANGE)))
    return err;
  if (!terminated(s->backend, sizeof s->backend) || !one_of(s->backend, backends, 3))
    return fault_set(f, JK_BACKEND, -1, "backend", "must be one of sim, cpu, cuda, got '%.15s'", s->backend);
  if (!terminated(s->transport, sizeof s->transport) || !one_of(s->transport, transports, 2))
    return fault_set(f, JK_TRANSPORT, -1, "transport", "must be one of tcp, nccl, got '%.15s'", s->transport);
  return check_model(s, f);
}

zb_err zb_job_spec_check(const zb_job_spec *s, zb_diag *diag) {
  job_fault f;
  zb_err err = job_check(s, &f);
  if (err)
    zb_diag_set(diag, err, "field '%s': %s", f.field, f.reason);
  return err;
}

/* mem_limit: 'Np' (N > 0, times ranks once the document is read) or a
 * plain number > 0. */
static zb_err job_mem_limit(const walk *w, const yaml_node_t *n, zb_job_spec *s, double *per_rank) {
  char buf[64], num[64];
  double x = 0;
  bool ok = false;
  if (is_plain(n)) {
    const char *t = scalar_text(n);
    size_t len = strlen(t);
    if (len >= 2 && len < sizeof num && t[len - 1] == 'p') {
      memcpy(num, t, len - 1);
      num[len - 1] = '\0';
      ok = parse_double(num, &x) && x > 0;
      *per_rank = x;
    } else {
      ok = parse_double(t, &x) && x > 0;
      s->mem_limit = x;
    }
  }
  if (!ok)
    return zb_diag_set(w->diag, ZB_ERR_PARSE,
                       "line %d: key 'mem_limit': expected a number > 0 or 'Np' (N times ranks), got %s",
                       node_line(n), describe(n, buf, sizeof buf));
  return ZB_OK;
}

static zb_err job_costs(const walk *w, const yaml_node_t *n, zb_rank_costs *c, job_lines *lines) {
  char buf[64], known[64];
  if (n->type != YAML_MAPPING_NODE) {
    join_names(cost_keys, CK_COUNT_, known, sizeof known);
    return zb_diag_set(w->diag, ZB_ERR_PARSE, "line %d: key 'costs': expected a mapping with keys %s, got %s",
                       node_line(n), known, describe(n, buf, sizeof buf));
  }
  double *times[4] = {&c->t_f, &c->t_b, &c->t_w, &c->t_comm};
  for (const yaml_node_pair_t *pair = n->data.mapping.pairs.start; pair < n->data.mapping.pairs.top; pair++) {
    int k = -1; /* set by map_key on success; gcc -O2 cannot see that */
    zb_err err = map_key(w, node_at(w, pair->key), cost_keys, CK_COUNT_, "costs.", lines->cost, &k);
    if (err)
      return err;
    const yaml_node_t *value = node_at(w, pair->value);
    if (k == CK_MEM) {
      double mem[3];
      if ((err = get_triple(w, value, "costs.mem", mem)))
        return err;
      c->m_f = mem[0];
      c->m_b = mem[1];
      c->m_w = mem[2];
    } else if ((err = get_number(w, value, cost_fields[k], times[k]))) {
      return err;
    }
  }
  return ZB_OK;
}

/* stage_costs: a non-empty list of [T_F, T_B, T_W] rows. The rows go into
 * s at once so that the caller's cleanup frees them on any later error. */
static zb_err job_stage_costs(const walk *w, const yaml_node_t *n, zb_job_spec *s) {
  char buf[64], key[48];
  long count =
      n->type == YAML_SEQUENCE_NODE ? (long)(n->data.sequence.items.top - n->data.sequence.items.start) : 0;
  if (count == 0)
    return zb_diag_set(
        w->diag, ZB_ERR_PARSE,
        "line %d: key 'stage_costs': expected a non-empty list of [T_F, T_B, T_W] rows, got %s", node_line(n),
        n->type == YAML_SEQUENCE_NODE ? "an empty list" : describe(n, buf, sizeof buf));
  s->stage_costs = zb_calloc((size_t)count, sizeof *s->stage_costs);
  s->n_stage_costs = (int)count; /* bounded by the input's size */
  for (int i = 0; i < s->n_stage_costs; i++) {
    snprintf(key, sizeof key, "stage_costs[%d]", i);
    zb_err err = get_triple(w, node_at(w, n->data.sequence.items.start[i]), key, s->stage_costs[i]);
    if (err)
      return err;
  }
  return ZB_OK;
}

/* model.inject_nan: a mapping {iteration, microbatch}, each defaulting to
 * 0; ranges against the job's shape are check_model's. */
static zb_err model_inject_nan(const walk *w, const yaml_node_t *n, zb_model_spec *m) {
  char buf[64], known[64];
  if (n->type != YAML_MAPPING_NODE) {
    join_names(nan_keys, NK_COUNT_, known, sizeof known);
    return zb_diag_set(w->diag, ZB_ERR_PARSE,
                       "line %d: key 'model.inject_nan': expected a mapping with keys %s, got %s",
                       node_line(n), known, describe(n, buf, sizeof buf));
  }
  m->inject_nan = true;
  m->nan_iteration = m->nan_microbatch = 0;
  int seen[NK_COUNT_] = {0};
  int *dst[NK_COUNT_] = {&m->nan_iteration, &m->nan_microbatch};
  static const char *const fields[NK_COUNT_] = {"model.inject_nan.iteration", "model.inject_nan.microbatch"};
  for (const yaml_node_pair_t *pair = n->data.mapping.pairs.start; pair < n->data.mapping.pairs.top; pair++) {
    int k = -1;
    zb_err err = map_key(w, node_at(w, pair->key), nan_keys, NK_COUNT_, "model.inject_nan.", seen, &k);
    if (!err)
      err = get_int32(w, node_at(w, pair->value), fields[k], &NAN_INDEX_RANGE, dst[k]);
    if (err)
      return err;
  }
  return ZB_OK;
}

/* model: a mapping of model_keys; sizes are checked as integers here and
 * against their ranges (with the other rules) by check_model. */
static zb_err job_model(const walk *w, const yaml_node_t *n, zb_job_spec *s, job_lines *lines) {
  char buf[64], known[256];
  if (n->type != YAML_MAPPING_NODE) {
    join_names(model_keys, MK_COUNT_, known, sizeof known);
    return zb_diag_set(w->diag, ZB_ERR_PARSE, "line %d: key 'model': expected a mapping with keys %s, got %s",
                       node_line(n), known, describe(n, buf, sizeof buf));
  }
  s->has_model = true;
  zb_model_spec *m = &s->model;
  int *ints[] = {[MK_HIDDEN] = &m->hidden,
                 [MK_HEADS] = &m->heads,
                 [MK_LAYERS] = &m->layers,
                 [MK_SEQ_LEN] = &m->seq_len,
                 [MK_BATCH] = &m->batch};
  const int_range *ranges[] = {[MK_HIDDEN] = &HIDDEN_RANGE,
                               [MK_HEADS] = &HEADS_RANGE,
                               [MK_LAYERS] = &LAYERS_RANGE,
                               [MK_SEQ_LEN] = &SEQ_LEN_RANGE,
                               [MK_BATCH] = &BATCH_RANGE};
  double *reals[MK_COUNT_] = {
      [MK_CLIP_NORM] = &m->clip_norm, [MK_LR] = &m->lr,       [MK_WEIGHT_DECAY] = &m->weight_decay,
      [MK_BETA1] = &m->beta1,         [MK_BETA2] = &m->beta2, [MK_EPS] = &m->eps};
  for (const yaml_node_pair_t *pair = n->data.mapping.pairs.start; pair < n->data.mapping.pairs.top; pair++) {
    int k = -1; /* set by map_key on success; gcc -O2 cannot see that */
    zb_err err = map_key(w, node_at(w, pair->key), model_keys, MK_COUNT_, "model.", lines->model, &k);
    if (err)
      return err;
    const yaml_node_t *value = node_at(w, pair->value);
    if (k <= MK_BATCH)
      err = get_int32(w, value, model_fields[k], ranges[k], ints[k]);
    else if (k == MK_SEED)
      err = get_int(w, value, "model.seed", &SEED_RANGE, &m->seed);
    else if (k == MK_DATA)
      err = get_string(w, value, "model.data", m->data, sizeof m->data);
    else if (k == MK_STEP)
      err = get_string(w, value, "model.step", m->step, sizeof m->step);
    else if (k == MK_INJECT_NAN)
      err = model_inject_nan(w, value, m);
    else if (k == MK_CHECKPOINT_EVERY)
      err = get_int32(w, value, "model.checkpoint_every", &CHECKPOINT_EVERY_RANGE, &m->checkpoint_every);
    else if (k == MK_CHECKPOINT_DIR)
      err = get_string(w, value, "model.checkpoint_dir", m->checkpoint_dir, sizeof m->checkpoint_dir);
    else if (k == MK_DUMP_DIR)
      err = get_string(w, value, "model.dump_dir", m->dump_dir, sizeof m->dump_dir);
    else if (k == MK_DUMP_EVERY)
      err = get_int32(w, value, "model.dump_every", &DUMP_EVERY_RANGE, &m->dump_every);
    else
      err = get_number(w, value, model_fields[k], reals[k]);
    if (err)
      return err;
  }
  return ZB_OK;
}

static zb_err job_value(const walk *w, job_key k, const yaml_node_t *v, zb_job_spec *s, job_lines *lines,
                        double *per_rank) {
  long long bytes;
  zb_err err;
  switch (k) {
  case JK_NAME: return get_string(w, v, "name", s->name, sizeof s->name);
  case JK_RANKS: return get_int32(w, v, "ranks", &RANKS_RANGE, &s->ranks);
  case JK_MICROBATCHES: return get_int32(w, v, "microbatches", &MICROBATCHES_RANGE, &s->microbatches);
  case JK_SCHEDULE: return get_string(w, v, "schedule", s->schedule, sizeof s->schedule);
  case JK_CHUNKS: return get_int32(w, v, "chunks", &CHUNKS_RANGE, &s->chunks);
  case JK_MEM_LIMIT: return job_mem_limit(w, v, s, per_rank);
  case JK_COSTS: return job_costs(w, v, &s->costs, lines);
  case JK_STAGE_COSTS: lines->stage_rows = v; return job_stage_costs(w, v, s);
  case JK_ITERATIONS: return get_int32(w, v, "iterations", &ITERATIONS_RANGE, &s->iterations);
  case JK_BACKEND: return get_string(w, v, "backend", s->backend, sizeof s->backend);
  case JK_TRANSPORT: return get_string(w, v, "transport", s->transport, sizeof s->transport);
  case JK_BYTES:
    if ((err = get_int(w, v, "bytes_per_activation", &BYTES_RANGE, &bytes)))
      return err;
    s->bytes_per_activation = bytes;
    return ZB_OK;
  case JK_MODEL: return job_model(w, v, s, lines);
  case JK_COUNT_: break;
  }
  return ZB_ERR_PARSE;
}

/* Line to blame for a checker fault: the key's line, the costs sub-key's or
 * the stage_costs row's when the fault names one. */
static int fault_line(const walk *w, const job_lines *lines, const job_fault *f) {
  if (f->key == JK_COSTS && f->sub >= 0 && lines->cost[f->sub])
    return lines->cost[f->sub];
  if (f->key == JK_MODEL && f->sub >= 0 && lines->model[f->sub])
    return lines->model[f->sub];
  if (f->key == JK_STAGE_COSTS && f->sub >= 0 && lines->stage_rows)
    return node_line(node_at(w, lines->stage_rows->data.sequence.items.start[f->sub]));
  return lines->key[f->key] ? lines->key[f->key] : lines->root;
}

static zb_err job_walk(const walk *w, const yaml_node_t *root, zb_job_spec *s) {
  char known[160];
  job_lines lines = {.root = node_line(root)};
  double per_rank = 0;
  join_names(job_keys, JK_COUNT_, known, sizeof known);
  char what[200];
  snprintf(what, sizeof what, "a mapping of keys (%s)", known);
  zb_err err = want_root_mapping(w, root, what);
  if (err)
    return err;
  for (const yaml_node_pair_t *pair = root->data.mapping.pairs.start; pair < root->data.mapping.pairs.top;
       pair++) {
    int k = -1; /* set by map_key on success; gcc -O2 cannot see that */
    if ((err = map_key(w, node_at(w, pair->key), job_keys, JK_COUNT_, "", lines.key, &k)))
      return err;
    const yaml_node_t *value = node_at(w, pair->value);
    if ((err = job_value(w, (job_key)k, value, s, &lines, &per_rank)))
      return err;
  }
  for (size_t i = 0; i < sizeof job_required / sizeof job_required[0]; i++)
    if (!lines.key[job_required[i]])
      return zb_diag_set(w->diag, ZB_ERR_PARSE, "line %d: missing required key '%s'", lines.root,
                         job_keys[job_required[i]]);
  /* 'Np' is resolved here because ranks may follow mem_limit in the file. */
  if (per_rank > 0)
    s->mem_limit = per_rank * s->ranks;
  zb_job_spec_derive(s, lines.key[JK_BYTES] != 0);
  job_fault f;
  if ((err = job_check(s, &f)))
    return zb_diag_set(w->diag, err, "line %d: key '%s': %s", fault_line(w, &lines, &f), f.field, f.reason);
  return ZB_OK;
}

zb_err zb_job_spec_parse(const char *yaml, size_t len, zb_job_spec *out, zb_diag *diag) {
  zb_job_spec s;
  yaml_document_t doc;
  yaml_node_t *root = NULL;
  zb_job_spec_default(&s);
  zb_err err = doc_load(yaml, len, &doc, &root, diag);
  if (!err) {
    walk w = {&doc, diag};
    err =
        root ? job_walk(&w, root, &s)
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

/* ---- coordinator config ------------------------------------------------ */

/* "host:port" with a non-empty host ("[v6]" bracketed) and a decimal port
 * 0..65535. */
static bool address_ok(const char *a) {
  const char *colon = strrchr(a, ':');
  if (!colon || colon == a)
    return false;
  size_t host_len = (size_t)(colon - a);
  if (a[0] == '[') {
    if (host_len < 3 || colon[-1] != ']')
      return false;
  } else if (memchr(a, ':', host_len)) {
    return false; /* an unbracketed IPv6 address is ambiguous */
  }
  for (const char *c = a; c < colon; c++)
    if (*c == ' ' || *c == '\t' || *c == '/')
      return false;
  const char *port = colon + 1;
  size_t digits = strspn(port, "0123456789");
  return digits >= 1 && digits <= 5 && !port[digits] && atol(port) <= 65535;
}

static zb_err coord_value(const walk *w, coord_key k, const yaml_node_t *v, zb_coord_config *c) {
  char buf[64];
  long long x;
  zb_err err;
  switch (k) {
  case CO_LISTEN:
  case CO_METRICS_LISTEN: {
    char *dst = k == CO_LISTEN ? c->listen : c->metrics_listen;
    if ((err = get_string(w, v, coord_keys[k], dst, sizeof c->listen)))
      return err;
    if (!address_ok(dst))
      return zb_diag_set(w->diag, ZB_ERR_INVALID_ARG,
                         "line %d: key '%s': expected host:port with a port 0..65535, got %s", node_line(v),
                         coord_keys[k], describe(v, buf, sizeof buf));
    return ZB_OK;
  }
  case CO_DATA_DIR:
    if ((err = get_string(w, v, "data_dir", c->data_dir, sizeof c->data_dir)))
      return err;
    if (!c->data_dir[0])
      return zb_diag_set(w->diag, ZB_ERR_INVALID_ARG, "line %d: key 'data_dir': must not be empty",
                         node_line(v));
    return ZB_OK;
  case CO_HEARTBEAT:
    if ((err = get_int(w, v, "heartbeat_timeout_ms", &HEARTBEAT_RANGE, &x)))
      return err;
    c->heartbeat_timeout_ms = (int)x;
    return ZB_OK;
  case CO_LOG_LEVEL:
    /* Checked before copying: an unknown level reads better as "not a level"
     * than as too long for the field. get_string reports the wrong types. */
    if (v->type != YAML_SCALAR_NODE || is_null(v) || zb_log_level_parse(scalar_text(v)) >= 0)
      return get_string(w, v, "log_level", c->log_level, sizeof c->log_level);
    return zb_diag_set(w->diag, ZB_ERR_INVALID_ARG,
                       "line %d: key 'log_level': must be one of debug, info, warn, error, got %s",
                       node_line(v), describe(v, buf, sizeof buf));
  case CO_MAX_MESSAGE:
    if ((err = get_int(w, v, "max_message_bytes", &MAX_MESSAGE_RANGE, &x)))
      return err;
    c->max_message_bytes = x;
    return ZB_OK;
  case CO_COUNT_: break;
  }
  return ZB_ERR_PARSE;
}

/* An empty document (say, every line commented out) changes nothing: all
 * keys are optional, so it is a valid config. */
zb_err zb_coord_config_parse(const char *yaml, size_t len, zb_coord_config *out, zb_diag *diag) {
  zb_coord_config c = *out; /* parsed aside: *out changes only on success */
  yaml_document_t doc;
  yaml_node_t *root = NULL;
  char known[160], what[200];
  int seen[CO_COUNT_] = {0};
  zb_err err = doc_load(yaml, len, &doc, &root, diag);
  if (err)
    return err;
  walk w = {&doc, diag};
  if (!root)
    goto cleanup;
  join_names(coord_keys, CO_COUNT_, known, sizeof known);
  snprintf(what, sizeof what, "a mapping of keys (%s)", known);
  if ((err = want_root_mapping(&w, root, what)))
    goto cleanup;
  for (const yaml_node_pair_t *pair = root->data.mapping.pairs.start; pair < root->data.mapping.pairs.top;
       pair++) {
    int k = -1; /* set by map_key on success; gcc -O2 cannot see that */
    if ((err = map_key(&w, node_at(&w, pair->key), coord_keys, CO_COUNT_, "", seen, &k)) ||
        (err = coord_value(&w, (coord_key)k, node_at(&w, pair->value), &c)))
      goto cleanup;
  }
  *out = c;
cleanup:
  yaml_document_delete(&doc);
  return err;
}
