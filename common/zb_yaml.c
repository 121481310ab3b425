/* zb_yaml.c — strict YAML reading on libyaml's document API: the document
 * is loaded whole, then walked by the callers against fixed key tables;
 * every message carries the 1-based line of the node it blames.
 */
#include "zb_yaml.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- loading ----------------------------------------------------------- */

int zb_yaml_line(const yaml_node_t *n) {
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

/* Job specs and configs are small and shallow. libyaml's loader takes time
 * quadratic in the nesting depth (16 s at 100,000 levels), so the depth is
 * checked on the event stream first, which stops at the first level too
 * many; a syntax error there is left to the loader to report. */
#define ZB_YAML_MAX_BYTES (1 << 20)
#define ZB_YAML_MAX_DEPTH 64

static zb_err yaml_check_shape(const char *text, size_t len, zb_diag *diag) {
  if (len > ZB_YAML_MAX_BYTES)
    return zb_diag_set(diag, ZB_ERR_PARSE, "YAML text of %zu bytes: at most %d", len, ZB_YAML_MAX_BYTES);
  yaml_parser_t p;
  if (!yaml_parser_initialize(&p))
    return zb_diag_set(diag, ZB_ERR_PARSE, "YAML parser ran out of memory");
  yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
  zb_err err = ZB_OK;
  for (int depth = 0, done = 0; !done && !err;) {
    yaml_event_t ev;
    if (!yaml_parser_parse(&p, &ev))
      break;
    if (ev.type == YAML_MAPPING_START_EVENT || ev.type == YAML_SEQUENCE_START_EVENT) {
      if (++depth > ZB_YAML_MAX_DEPTH)
        err = zb_diag_set(diag, ZB_ERR_PARSE, "line %d: nested deeper than %d levels",
                          (int)ev.start_mark.line + 1, ZB_YAML_MAX_DEPTH);
    } else if (ev.type == YAML_MAPPING_END_EVENT || ev.type == YAML_SEQUENCE_END_EVENT) {
      depth--;
    }
    done = ev.type == YAML_STREAM_END_EVENT;
    yaml_event_delete(&ev);
  }
  yaml_parser_delete(&p);
  return err;
}

zb_err zb_yaml_load(const char *text, size_t len, yaml_document_t *doc, yaml_node_t **root, zb_diag *diag) {
  yaml_parser_t parser;
  yaml_document_t extra;
  bool have_doc = false, have_extra = false;
  zb_err err = ZB_OK;
  if (!text) {
    text = "";
    len = 0;
  }
  if ((err = yaml_check_shape(text, len, diag)))
    return err;
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
                      zb_yaml_line(second));
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

/* ---- nodes ------------------------------------------------------------- */

yaml_node_t *zb_yaml_node_at(const zb_yaml_walk *w, int id) {
  return yaml_document_get_node(w->doc, id);
}

const char *zb_yaml_text(const yaml_node_t *n) {
  return (const char *)n->data.scalar.value;
}

bool zb_yaml_is_plain(const yaml_node_t *n) {
  return n->type == YAML_SCALAR_NODE && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
}

bool zb_yaml_is_null(const yaml_node_t *n) {
  if (!zb_yaml_is_plain(n))
    return false;
  const char *t = zb_yaml_text(n);
  return !*t || !strcmp(t, "~") || !strcmp(t, "null") || !strcmp(t, "Null") || !strcmp(t, "NULL");
}

const char *zb_yaml_describe(const yaml_node_t *n, char *buf, size_t size) {
  if (n->type == YAML_MAPPING_NODE)
    return "a mapping";
  if (n->type == YAML_SEQUENCE_NODE)
    return "a list";
  if (zb_yaml_is_null(n))
    return "an empty value";
  const char *t = zb_yaml_text(n);
  const char *more = strlen(t) > 40 ? "..." : "";
  snprintf(buf, size, "%s'%.40s%s'", zb_yaml_is_plain(n) ? "" : "the quoted string ", t, more);
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

/* The character set keeps out what strtod also accepts but YAML does not
 * mean as a number (hex, inf, nan). */
bool zb_yaml_parse_double(const char *t, double *out) {
  if (!*t || strspn(t, "+-.0123456789eE") != strlen(t))
    return false;
  char *end;
  *out = strtod(t, &end);
  return end != t && !*end && isfinite(*out);
}

/* ---- typed values ------------------------------------------------------ */

zb_err zb_yaml_get_int(const zb_yaml_walk *w, const yaml_node_t *n, const char *key,
                       const zb_yaml_int_range *r, long long *out) {
  char buf[64];
  long long v = 0;
  if (!zb_yaml_is_plain(n) || !parse_ll(zb_yaml_text(n), &v) || v < r->type_min)
    return zb_diag_set(w->diag, ZB_ERR_PARSE, "line %d: key '%s': expected an integer >= %lld, got %s",
                       zb_yaml_line(n), key, r->type_min, zb_yaml_describe(n, buf, sizeof buf));
  if (v < r->min || v > r->max)
    return zb_diag_set(w->diag, ZB_ERR_INVALID_ARG,
                       "line %d: key '%s': must be between %lld and %lld, got %s", zb_yaml_line(n), key,
                       r->min, r->max, zb_yaml_describe(n, buf, sizeof buf));
  *out = v;
  return ZB_OK;
}

zb_err zb_yaml_get_int32(const zb_yaml_walk *w, const yaml_node_t *n, const char *key,
                         const zb_yaml_int_range *r, int *out) {
  long long v = 0; /* gcc -O3 cannot see that get_int sets it on success */
  zb_err err = zb_yaml_get_int(w, n, key, r, &v);
  if (!err)
    *out = (int)v; /* the caller's range lies inside int */
  return err;
}

zb_err zb_yaml_get_number(const zb_yaml_walk *w, const yaml_node_t *n, const char *key, double *out) {
  char buf[64];
  if (!zb_yaml_is_plain(n) || !zb_yaml_parse_double(zb_yaml_text(n), out))
    return zb_diag_set(w->diag, ZB_ERR_PARSE, "line %d: key '%s': expected a number, got %s", zb_yaml_line(n),
                       key, zb_yaml_describe(n, buf, sizeof buf));
  return ZB_OK;
}

zb_err zb_yaml_get_string(const zb_yaml_walk *w, const yaml_node_t *n, const char *key, char *dst,
                          size_t size) {
  char buf[64];
  if (n->type != YAML_SCALAR_NODE || zb_yaml_is_null(n))
    return zb_diag_set(w->diag, ZB_ERR_PARSE, "line %d: key '%s': expected a string, got %s", zb_yaml_line(n),
                       key, zb_yaml_describe(n, buf, sizeof buf));
  size_t len = n->data.scalar.length;
  if (strlen(zb_yaml_text(n)) != len)
    return zb_diag_set(w->diag, ZB_ERR_PARSE, "line %d: key '%s': contains a NUL character", zb_yaml_line(n),
                       key);
  if (len >= size)
    return zb_diag_set(w->diag, ZB_ERR_INVALID_ARG,
                       "line %d: key '%s': must be at most %zu characters, got %zu", zb_yaml_line(n), key,
                       size - 1, len);
  memcpy(dst, zb_yaml_text(n), len + 1);
  return ZB_OK;
}

zb_err zb_yaml_get_triple(const zb_yaml_walk *w, const yaml_node_t *n, const char *key, double out[3]) {
  char buf[64], item_key[48];
  if (n->type != YAML_SEQUENCE_NODE)
    return zb_diag_set(w->diag, ZB_ERR_PARSE, "line %d: key '%s': expected a list of 3 numbers, got %s",
                       zb_yaml_line(n), key, zb_yaml_describe(n, buf, sizeof buf));
  long count = (long)(n->data.sequence.items.top - n->data.sequence.items.start);
  if (count != 3)
    return zb_diag_set(w->diag, ZB_ERR_PARSE,
                       "line %d: key '%s': expected a list of 3 numbers, got %ld item%s", zb_yaml_line(n),
                       key, count, count == 1 ? "" : "s");
  for (int k = 0; k < 3; k++) {
    snprintf(item_key, sizeof item_key, "%s[%d]", key, k);
    zb_err err =
        zb_yaml_get_number(w, zb_yaml_node_at(w, n->data.sequence.items.start[k]), item_key, &out[k]);
    if (err)
      return err;
  }
  return ZB_OK;
}

/* ---- mappings ---------------------------------------------------------- */

void zb_yaml_join_names(const char *const *names, int n, char *buf, size_t size) {
  size_t used = 0;
  buf[0] = '\0';
  for (int k = 0; k < n && used < size; k++)
    used += (size_t)snprintf(buf + used, size - used, "%s%s", k ? ", " : "", names[k]);
}

zb_err zb_yaml_map_key(const zb_yaml_walk *w, const yaml_node_t *key, const char *const *names, int n,
                       const char *prefix, int *seen, int *index) {
  char buf[64], known[256];
  if (key->type != YAML_SCALAR_NODE)
    return zb_diag_set(w->diag, ZB_ERR_PARSE, "line %d: expected a key name, got %s", zb_yaml_line(key),
                       zb_yaml_describe(key, buf, sizeof buf));
  const char *name = zb_yaml_text(key);
  for (int k = 0; k < n; k++)
    if (!strcmp(name, names[k])) {
      if (seen[k])
        return zb_diag_set(w->diag, ZB_ERR_PARSE, "line %d: key '%s%s' given twice (first on line %d)",
                           zb_yaml_line(key), prefix, name, seen[k]);
      seen[k] = zb_yaml_line(key);
      *index = k;
      return ZB_OK;
    }
  zb_yaml_join_names(names, n, known, sizeof known);
  return zb_diag_set(w->diag, ZB_ERR_PARSE, "line %d: unknown key '%s%.40s' (known: %s)", zb_yaml_line(key),
                     prefix, name, known);
}

zb_err zb_yaml_want_mapping(const zb_yaml_walk *w, const yaml_node_t *n, const char *key,
                            const char *const *names, int count) {
  char buf[64], known[256];
  if (n->type == YAML_MAPPING_NODE)
    return ZB_OK;
  zb_yaml_join_names(names, count, known, sizeof known);
  return zb_diag_set(w->diag, ZB_ERR_PARSE, "line %d: key '%s': expected a mapping with keys %s, got %s",
                     zb_yaml_line(n), key, known, zb_yaml_describe(n, buf, sizeof buf));
}

zb_err zb_yaml_want_root_mapping(const zb_yaml_walk *w, const yaml_node_t *root, const char *what) {
  char buf[64];
  if (root->type != YAML_MAPPING_NODE)
    return zb_diag_set(w->diag, ZB_ERR_PARSE, "line %d: expected %s, got %s", zb_yaml_line(root), what,
                       zb_yaml_describe(root, buf, sizeof buf));
  return ZB_OK;
}
