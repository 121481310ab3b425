/* zb_yaml.h — a small toolkit for reading strict YAML documents (libyaml's
 * document API): load exactly one document, resolve mapping keys against a
 * fixed table, and read typed values. Every message names the key and the
 * 1-based line of the node it blames ("line 4: key 'ranks': expected an
 * integer >= 1, got 'four'"). Type errors are ZB_ERR_PARSE; values of the
 * right type but out of range are ZB_ERR_INVALID_ARG.
 *
 * Ownership: the caller owns the yaml_document_t that zb_yaml_load fills
 * and deletes it; nodes point into it. Nothing here does I/O beyond what
 * the caller hands in as text.
 */
#ifndef ZB_YAML_H
#define ZB_YAML_H

#include <stdbool.h>
#include <stddef.h>
#include <yaml.h>

#include "zb_err.h"

/* Loads exactly one document from text into *doc and points *root at its
 * top node (NULL for an empty document). On success the caller owns *doc
 * and deletes it; on failure nothing is left to delete. A second document
 * in the stream is an error: a file split by '---' is a mistake, not two
 * documents. */
zb_err zb_yaml_load(const char *text, size_t len, yaml_document_t *doc, yaml_node_t **root, zb_diag *diag);

/* What a walk needs to report: the document (to follow node ids) and the
 * caller's diag. */
typedef struct zb_yaml_walk {
  yaml_document_t *doc;
  zb_diag *diag;
} zb_yaml_walk;

/* ---- nodes ---- */
int zb_yaml_line(const yaml_node_t *n); /* 1-based */
yaml_node_t *zb_yaml_node_at(const zb_yaml_walk *w, int id);
const char *zb_yaml_text(const yaml_node_t *n); /* a scalar's value */
bool zb_yaml_is_plain(const yaml_node_t *n);    /* an unquoted scalar */
/* An unquoted empty value, '~' or 'null': YAML's null, which no field takes. */
bool zb_yaml_is_null(const yaml_node_t *n);
/* Describes a node for "got ..." (values cut at 40 characters so the
 * message fits zb_diag); returns buf or a constant. */
const char *zb_yaml_describe(const yaml_node_t *n, char *buf, size_t size);
/* The whole text is a finite decimal number (no hex, inf or nan). */
bool zb_yaml_parse_double(const char *t, double *out);

/* ---- typed values: on success *out is set, else diag names key ---- */

/* An integer key's bounds: below type_min the value has the wrong type (a
 * negative size: ZB_ERR_PARSE), outside [min, max] it is out of range
 * (ZB_ERR_INVALID_ARG). */
typedef struct zb_yaml_int_range {
  long long type_min, min, max;
} zb_yaml_int_range;

zb_err zb_yaml_get_int(const zb_yaml_walk *w, const yaml_node_t *n, const char *key,
                       const zb_yaml_int_range *r, long long *out);
/* As zb_yaml_get_int, for a range that lies inside int. */
zb_err zb_yaml_get_int32(const zb_yaml_walk *w, const yaml_node_t *n, const char *key,
                         const zb_yaml_int_range *r, int *out);
zb_err zb_yaml_get_number(const zb_yaml_walk *w, const yaml_node_t *n, const char *key, double *out);
/* A string value, quoted or not, into dst[size]; too long is a range error. */
zb_err zb_yaml_get_string(const zb_yaml_walk *w, const yaml_node_t *n, const char *key, char *dst,
                          size_t size);
/* A list of exactly three numbers ([T_F, T_B, T_W] or [M_F, M_B, M_W]). */
zb_err zb_yaml_get_triple(const zb_yaml_walk *w, const yaml_node_t *n, const char *key, double out[3]);

/* ---- mappings ---- */

/* "a, b, c" into buf (cut to size). */
void zb_yaml_join_names(const char *const *names, int n, char *buf, size_t size);
/* Resolves one mapping pair's key against names[0..n): refuses non-scalar,
 * unknown and repeated keys. seen[k] holds the line where key k was first
 * given (0: not yet). prefix is prepended in messages ("costs."). */
zb_err zb_yaml_map_key(const zb_yaml_walk *w, const yaml_node_t *key, const char *const *names, int n,
                       const char *prefix, int *seen, int *index);
/* The top node must be a mapping; what is expected goes into the message. */
/* ZB_OK when n is a mapping; else a parse error naming key and the keys
 * it takes ("line 4: key 'costs': expected a mapping with keys f, b, ..."). */
zb_err zb_yaml_want_mapping(const zb_yaml_walk *w, const yaml_node_t *n, const char *key,
                            const char *const *names, int count);
zb_err zb_yaml_want_root_mapping(const zb_yaml_walk *w, const yaml_node_t *root, const char *what);

#endif
