/* zb_json.h — a strict RFC 8259 JSON reader into a tree, for the files zb
 * reads from Hugging Face checkpoints (config.json, a safetensors header,
 * model.safetensors.index.json; docs/model.md, Hugging Face files).
 *
 * Strict: one value with optional whitespace around it; no comments, no
 * trailing commas, no NaN or Infinity, no leading zeros; strings are
 * well-formed UTF-8 with no raw control characters, and their \u escapes
 * pair surrogates correctly. Duplicate keys in one object are refused
 * (a header with two entries of one tensor name is ambiguous), nesting is
 * limited to ZB_JSON_MAX_DEPTH, and a number whose magnitude overflows a
 * double is refused.
 *
 * Ownership: zb_json_parse returns one tree whose nodes, arrays and
 * strings all live in the tree's own arena; zb_json_free(root) releases
 * everything at once. Pointers into the tree (a node, its string, its
 * keys) stay valid until then. Only the root may be passed to
 * zb_json_free. No I/O, no globals: the parser reads only text[0..len).
 */
#ifndef ZB_JSON_H
#define ZB_JSON_H

#include <stddef.h>

#include "zb_err.h"

/* The deepest nesting of arrays and objects accepted: a top-level array
 * is depth 1. */
#define ZB_JSON_MAX_DEPTH 64

typedef enum zb_json_kind {
  ZB_JSON_NULL,
  ZB_JSON_BOOL,
  ZB_JSON_NUMBER,
  ZB_JSON_STRING,
  ZB_JSON_ARRAY,
  ZB_JSON_OBJECT
} zb_json_kind;

typedef struct zb_json zb_json;
struct zb_json {
  zb_json_kind kind;
  int boolean;       /* BOOL */
  double number;     /* NUMBER */
  int is_integer;    /* NUMBER written without fraction/exponent and within +-2^53 */
  long long integer; /* NUMBER when is_integer */
  char *string;      /* STRING: UTF-8, NUL-terminated (a \u0000 escape is refused) */
  size_t len;        /* STRING: bytes */
  size_t n;          /* ARRAY/OBJECT: element count */
  zb_json *items;    /* ARRAY elements / OBJECT values, in document order */
  char **keys;       /* OBJECT keys, parallel to items */
  size_t offset;     /* byte offset in the text where this value starts (for error messages) */
};

/* Parses text[0..len) (need not be NUL-terminated). Limits: nesting depth
 * 64; duplicate object keys refused; trailing garbage refused; invalid
 * UTF-8 and lone surrogates refused. On failure *out is NULL and diag
 * names the problem and the byte offset ("JSON at byte 12: ..."); the
 * error is ZB_ERR_PARSE. The caller owns *out: free with zb_json_free. */
zb_err zb_json_parse(const char *text, size_t len, zb_json **out, zb_diag *diag);
/* Frees a tree returned by zb_json_parse (its root only). NULL is a no-op. */
void zb_json_free(zb_json *j);
/* The value of key in object obj; NULL when obj is NULL, not an object,
 * or has no such key. Linear in the object's size. */
const zb_json *zb_json_get(const zb_json *obj, const char *key);
/* "null", "boolean", "number", "string", "array", "object". */
const char *zb_json_kind_name(zb_json_kind k);
/* The same with an article, for messages ("x is an array"): "null",
 * "a boolean", "a number", "a string", "an array", "an object". */
const char *zb_json_kind_phrase(zb_json_kind k);

#endif
