/* json.c — zb_json_parse (zb_json.h): a recursive-descent RFC 8259
 * parser. Every node, array and string of a tree is carved from one arena
 * of chunks that the root owns, so zb_json_free is a walk of the chunk
 * list. While an array or object is open its children wait on a value
 * stack shared by all levels; at the closing bracket they are copied into
 * the arena in one piece. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_json.h"
#include "zb_strmap.h"

typedef struct json_chunk {
  struct json_chunk *next;
  size_t used, cap; /* in units of max_align_t */
  max_align_t data[];
} json_chunk;

/* The root as returned: the tree's first node, then its arena. */
typedef struct json_doc {
  zb_json root;
  json_chunk *chunks;
} json_doc;

typedef struct parser {
  const char *s;
  size_t len, pos;
  int depth;
  json_chunk *chunks;
  zb_json *vals; /* children of the open arrays and objects */
  size_t nvals, capvals;
  char **keys; /* keys of the open objects */
  size_t nkeys, capkeys;
  zb_diag *diag;
} parser;

#define JSON_CHUNK_UNITS 4096 /* 64 KiB on x86-64 */

static void *arena_alloc(parser *p, size_t bytes) {
  size_t units = bytes / sizeof(max_align_t) + 1;
  json_chunk *c = p->chunks;
  if (!c || c->cap - c->used < units) {
    size_t cap = units > JSON_CHUNK_UNITS ? units : JSON_CHUNK_UNITS;
    c = zb_malloc(sizeof *c + cap * sizeof(max_align_t));
    c->cap = cap;
    c->used = 0;
    c->next = p->chunks;
    p->chunks = c;
  }
  void *r = &c->data[c->used];
  c->used += units;
  return r;
}

static void free_chunks(json_chunk *c) {
  while (c) {
    json_chunk *next = c->next;
    free(c);
    c = next;
  }
}

static zb_err fail(parser *p, size_t at, const char *what) {
  return zb_diag_set(p->diag, ZB_ERR_PARSE, "JSON at byte %zu: %s", at, what);
}

/* "unexpected character 'x'" or "... byte 0xNN", then where. */
static zb_err fail_char(parser *p, const char *where) {
  unsigned char c = (unsigned char)p->s[p->pos];
  if (c > 0x20 && c < 0x7f)
    return zb_diag_set(p->diag, ZB_ERR_PARSE, "JSON at byte %zu: unexpected character '%c' %s", p->pos, c,
                       where);
  return zb_diag_set(p->diag, ZB_ERR_PARSE, "JSON at byte %zu: unexpected byte 0x%02x %s", p->pos, c, where);
}

static void skip_ws(parser *p) {
  while (p->pos < p->len) {
    char c = p->s[p->pos];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
      return;
    p->pos++;
  }
}

static int hex_digit(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* Four hex digits at p->pos (after "\u"). */
static zb_err read_hex4(parser *p, unsigned *out) {
  if (p->len - p->pos < 4)
    return fail(p, p->len, "unexpected end of text in a \\u escape");
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    int d = hex_digit(p->s[p->pos + i]);
    if (d < 0)
      return fail(p, p->pos + i, "invalid \\u escape: expected four hex digits");
    v = v * 16 + (unsigned)d;
  }
  p->pos += 4;
  *out = v;
  return ZB_OK;
}

static size_t put_utf8(char *o, unsigned cp) {
  if (cp < 0x80) {
    o[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (char)(0xc0 | (cp >> 6));
    o[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (char)(0xe0 | (cp >> 12));
    o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
  }
  o[0] = (char)(0xf0 | (cp >> 18));
  o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
  o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
  o[3] = (char)(0x80 | (cp & 0x3f));
  return 4;
}

/* A \uXXXX escape (p->pos after the 'u'), with its low surrogate when it
 * is a high one; appends UTF-8 to o. */
static zb_err read_u_escape(parser *p, char *o, size_t *olen) {
  size_t at = p->pos - 2;
  unsigned cp;
  zb_err err = read_hex4(p, &cp);
  if (err != ZB_OK)
    return err;
  if (cp >= 0xdc00 && cp <= 0xdfff)
    return fail(p, at, "lone low surrogate in a \\u escape");
  if (cp >= 0xd800 && cp <= 0xdbff) {
    if (p->len - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
      return fail(p, at, "lone high surrogate in a \\u escape (no \\u low surrogate follows)");
    p->pos += 2;
    unsigned lo;
    if ((err = read_hex4(p, &lo)) != ZB_OK)
      return err;
    if (lo < 0xdc00 || lo > 0xdfff)
      return fail(p, at, "lone high surrogate in a \\u escape (the next escape is not a low surrogate)");
    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
  }
  if (cp == 0)
    return fail(p, at, "\\u0000 in a string is not allowed");
  *olen += put_utf8(o + *olen, cp);
  return ZB_OK;
}

/* The length of the well-formed UTF-8 sequence at s[0..n) (RFC 3629: no
 * overlong forms, no surrogates, nothing past U+10FFFF), 0 when it is not. */
static size_t utf8_len(const unsigned char *s, size_t n) {
  unsigned char c = s[0];
  size_t k;
  unsigned char lo = 0x80, hi = 0xbf;
  if (c >= 0xc2 && c <= 0xdf)
    k = 2;
  else if (c >= 0xe0 && c <= 0xef) {
    k = 3;
    lo = c == 0xe0 ? 0xa0 : 0x80;
    hi = c == 0xed ? 0x9f : 0xbf;
  } else if (c >= 0xf0 && c <= 0xf4) {
    k = 4;
    lo = c == 0xf0 ? 0x90 : 0x80;
    hi = c == 0xf4 ? 0x8f : 0xbf;
  } else
    return 0;
  if (n < k || s[1] < lo || s[1] > hi)
    return 0;
  for (size_t i = 2; i < k; i++)
    if (s[i] < 0x80 || s[i] > 0xbf)
      return 0;
  return k;
}

static zb_err read_escape(parser *p, char *o, size_t *olen) {
  if (p->pos + 1 >= p->len)
    return fail(p, p->len, "unexpected end of text in a string escape");
  char e = p->s[p->pos + 1];
  static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
  const char *hit = e ? strchr(from, e) : NULL;
  if (hit) {
    o[(*olen)++] = to[hit - from];
    p->pos += 2;
    return ZB_OK;
  }
  if (e == 'u') {
    p->pos += 2;
    return read_u_escape(p, o, olen);
  }
  unsigned char c = (unsigned char)e;
  if (c > 0x20 && c < 0x7f)
    return zb_diag_set(p->diag, ZB_ERR_PARSE, "JSON at byte %zu: invalid escape '\\%c' in a string", p->pos,
                       c);
  return zb_diag_set(p->diag, ZB_ERR_PARSE, "JSON at byte %zu: invalid escape (byte 0x%02x after '\\')",
                     p->pos, c);
}

/* A string at p->pos (its opening quote), decoded into the arena. The
 * decoded form is never longer than the quoted one. */
static zb_err parse_string(parser *p, char **out, size_t *outlen) {
  size_t start = p->pos++;
  size_t end = p->pos;
  while (end < p->len && p->s[end] != '"')
    end += p->s[end] == '\\' ? 2 : 1;
  size_t cap = (end < p->len ? end : p->len) - start;
  char *o = arena_alloc(p, cap + 1);
  size_t n = 0;
  for (;;) {
    if (p->pos >= p->len)
      return fail(p, p->len, "unexpected end of text in a string");
    unsigned char c = (unsigned char)p->s[p->pos];
    if (c == '"')
      break;
    zb_err err = ZB_OK;
    if (c == '\\')
      err = read_escape(p, o, &n);
    else if (c < 0x20)
      return zb_diag_set(p->diag, ZB_ERR_PARSE,
                         "JSON at byte %zu: control character 0x%02x in a string (it must be escaped)",
                         p->pos, c);
    else if (c < 0x80)
      o[n++] = (char)c, p->pos++;
    else {
      size_t k = utf8_len((const unsigned char *)p->s + p->pos, p->len - p->pos);
      if (!k)
        return fail(p, p->pos, "invalid UTF-8 in a string");
      memcpy(o + n, p->s + p->pos, k);
      n += k;
      p->pos += k;
    }
    if (err != ZB_OK)
      return err;
  }
  p->pos++;
  o[n] = '\0';
  *out = o;
  *outlen = n;
  return ZB_OK;
}

static size_t skip_digits(parser *p) {
  size_t n = 0;
  while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9')
    p->pos++, n++;
  return n;
}

/* Checks the RFC 8259 number grammar; *plain: no fraction, no exponent. */
static zb_err scan_number(parser *p, bool *plain) {
  size_t start = p->pos;
  if (p->s[p->pos] == '-')
    p->pos++;
  if (p->pos >= p->len)
    return fail(p, p->len, "unexpected end of text in a number");
  if (p->s[p->pos] == '0' && p->pos + 1 < p->len && p->s[p->pos + 1] >= '0' && p->s[p->pos + 1] <= '9')
    return fail(p, start, "leading zero in a number");
  if (!skip_digits(p))
    return fail(p, start, "a number needs digits after '-'");
  *plain = true;
  if (p->pos < p->len && p->s[p->pos] == '.') {
    p->pos++;
    *plain = false;
    if (!skip_digits(p))
      return fail(p, p->pos, "a number needs digits after '.'");
  }
  if (p->pos < p->len && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
    p->pos++;
    *plain = false;
    if (p->pos < p->len && (p->s[p->pos] == '+' || p->s[p->pos] == '-'))
      p->pos++;
    if (!skip_digits(p))
      return fail(p, p->pos, "a number needs digits in its exponent");
  }
  return ZB_OK;
}

static zb_err parse_number(parser *p, zb_json *v) {
  size_t start = p->pos;
  bool plain;
  zb_err err = scan_number(p, &plain);
  if (err != ZB_OK)
    return err;
  /* strtod needs a terminated copy; the grammar above leaves nothing a
   * locale could read differently except '.', so numbers go through the
   * C locale's form only when the process has not changed it (zb never
   * calls setlocale). */
  size_t n = p->pos - start;
  char small[64];
  char *buf = n < sizeof small ? small : zb_malloc(n + 1);
  memcpy(buf, p->s + start, n);
  buf[n] = '\0';
  errno = 0;
  v->number = strtod(buf, NULL);
  bool overflow = errno == ERANGE && (v->number > 1.0 || v->number < -1.0);
  v->kind = ZB_JSON_NUMBER;
  if (plain) {
    errno = 0;
    long long i = strtoll(buf, NULL, 10);
    if (errno == 0 && i >= -(1LL << 53) && i <= (1LL << 53)) {
      v->is_integer = 1;
      v->integer = i;
    }
  }
  if (buf != small)
    free(buf);
  if (overflow)
    return fail(p, start, "number out of range of a double");
  return ZB_OK;
}

static zb_err parse_value(parser *p, zb_json *v);

static void push_val(parser *p, const zb_json *v) {
  if (p->nvals == p->capvals) {
    p->capvals = p->capvals ? 2 * p->capvals : 64;
    p->vals = zb_realloc(p->vals, p->capvals * sizeof *p->vals);
  }
  p->vals[p->nvals++] = *v;
}

static void push_key(parser *p, char *k) {
  if (p->nkeys == p->capkeys) {
    p->capkeys = p->capkeys ? 2 * p->capkeys : 64;
    p->keys = zb_realloc(p->keys, p->capkeys * sizeof *p->keys);
  }
  p->keys[p->nkeys++] = k;
}

/* Moves the children pushed since base into the arena as v's items. */
static void close_container(parser *p, zb_json *v, size_t base, size_t kbase) {
  v->n = p->nvals - base;
  if (v->n) {
    v->items = arena_alloc(p, v->n * sizeof *v->items);
    memcpy(v->items, p->vals + base, v->n * sizeof *v->items);
  }
  if (v->kind == ZB_JSON_OBJECT && v->n) {
    v->keys = arena_alloc(p, v->n * sizeof *v->keys);
    memcpy(v->keys, p->keys + kbase, v->n * sizeof *v->keys);
  }
  p->nvals = base;
  p->nkeys = kbase;
}

/* After a member: ',' then more, or the closing bracket. *done at the end. */
static zb_err after_member(parser *p, char close, const char *what, bool *done) {
  skip_ws(p);
  if (p->pos >= p->len)
    return zb_diag_set(p->diag, ZB_ERR_PARSE, "JSON at byte %zu: unexpected end of text in an %s", p->len,
                       what);
  if (p->s[p->pos] == close) {
    p->pos++;
    *done = true;
    return ZB_OK;
  }
  if (p->s[p->pos] != ',')
    return fail_char(p, close == ']' ? "in an array (expected ',' or ']')"
                                     : "in an object (expected ',' or '}')");
  size_t comma = p->pos++;
  skip_ws(p);
  if (p->pos < p->len && p->s[p->pos] == close)
    return zb_diag_set(p->diag, ZB_ERR_PARSE, "JSON at byte %zu: trailing comma in an %s", comma, what);
  *done = false;
  return ZB_OK;
}

static zb_err parse_array(parser *p, zb_json *v) {
  size_t base = p->nvals;
  v->kind = ZB_JSON_ARRAY;
  p->pos++;
  skip_ws(p);
  bool done = p->pos < p->len && p->s[p->pos] == ']';
  if (done)
    p->pos++;
  while (!done) {
    zb_json item;
    zb_err err = parse_value(p, &item);
    if (err == ZB_OK) {
      push_val(p, &item);
      err = after_member(p, ']', "array", &done);
    }
    if (err != ZB_OK)
      return err;
  }
  close_container(p, v, base, p->nkeys);
  return ZB_OK;
}

/* One "key": value member of an object; seen catches duplicates. */
static zb_err parse_member(parser *p, zb_strmap *seen) {
  skip_ws(p);
  if (p->pos >= p->len)
    return fail(p, p->len, "unexpected end of text in an object");
  if (p->s[p->pos] != '"')
    return fail_char(p, "in an object (expected a key string)");
  size_t at = p->pos, klen;
  char *key;
  zb_err err = parse_string(p, &key, &klen);
  if (err != ZB_OK)
    return err;
  if (zb_strmap_get(seen, key))
    return zb_diag_set(p->diag, ZB_ERR_PARSE, "JSON at byte %zu: duplicate key \"%.120s\"", at, key);
  zb_strmap_put(seen, key, key);
  skip_ws(p);
  if (p->pos >= p->len)
    return fail(p, p->len, "unexpected end of text in an object");
  if (p->s[p->pos] != ':')
    return fail_char(p, "after an object key (expected ':')");
  p->pos++;
  zb_json val;
  if ((err = parse_value(p, &val)) != ZB_OK)
    return err;
  push_key(p, key);
  push_val(p, &val);
  return ZB_OK;
}

static zb_err parse_object(parser *p, zb_json *v) {
  size_t base = p->nvals, kbase = p->nkeys;
  zb_strmap seen = ZB_STRMAP_INIT;
  v->kind = ZB_JSON_OBJECT;
  p->pos++;
  skip_ws(p);
  bool done = p->pos < p->len && p->s[p->pos] == '}';
  if (done)
    p->pos++;
  zb_err err = ZB_OK;
  while (!done && err == ZB_OK) {
    err = parse_member(p, &seen);
    if (err == ZB_OK)
      err = after_member(p, '}', "object", &done);
  }
  zb_strmap_free(&seen);
  if (err == ZB_OK)
    close_container(p, v, base, kbase);
  return err;
}

static zb_err parse_literal(parser *p, const char *word) {
  size_t n = strlen(word);
  size_t have = p->len - p->pos < n ? p->len - p->pos : n;
  if (memcmp(p->s + p->pos, word, have) == 0 && have < n)
    return fail(p, p->len, "unexpected end of text in a literal");
  if (have < n || memcmp(p->s + p->pos, word, n) != 0)
    return fail_char(p, "where a value should start");
  p->pos += n;
  return ZB_OK;
}

static zb_err parse_value(parser *p, zb_json *v) {
  memset(v, 0, sizeof *v);
  skip_ws(p);
  v->offset = p->pos;
  if (p->pos >= p->len)
    return fail(p, p->len, "unexpected end of text where a value should start");
  char c = p->s[p->pos];
  zb_err err;
  if (c == '[' || c == '{') {
    if (p->depth == ZB_JSON_MAX_DEPTH)
      return zb_diag_set(p->diag, ZB_ERR_PARSE, "JSON at byte %zu: nesting deeper than %d levels", p->pos,
                         ZB_JSON_MAX_DEPTH);
    p->depth++;
    err = c == '[' ? parse_array(p, v) : parse_object(p, v);
    p->depth--;
    return err;
  }
  if (c == '"') {
    v->kind = ZB_JSON_STRING;
    return parse_string(p, &v->string, &v->len);
  }
  if (c == '-' || (c >= '0' && c <= '9'))
    return parse_number(p, v);
  if (c == 't' || c == 'f') {
    v->kind = ZB_JSON_BOOL;
    v->boolean = c == 't';
    return parse_literal(p, c == 't' ? "true" : "false");
  }
  v->kind = ZB_JSON_NULL;
  return parse_literal(p, "null");
}

zb_err zb_json_parse(const char *text, size_t len, zb_json **out, zb_diag *diag) {
  *out = NULL;
  if (!text && len)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "JSON: no text");
  parser p = {.s = text, .len = len, .diag = diag};
  zb_json root;
  zb_err err = parse_value(&p, &root);
  if (err == ZB_OK) {
    skip_ws(&p);
    if (p.pos < p.len)
      err = fail_char(&p, "after the document (trailing characters)");
  }
  free(p.vals);
  free(p.keys);
  if (err != ZB_OK) {
    free_chunks(p.chunks);
    return err;
  }
  json_doc *d = zb_malloc(sizeof *d);
  d->root = root;
  d->chunks = p.chunks;
  *out = &d->root;
  return ZB_OK;
}

void zb_json_free(zb_json *j) {
  if (!j)
    return;
  json_doc *d = (json_doc *)j; /* the root is a json_doc's first member */
  free_chunks(d->chunks);
  free(d);
}

const zb_json *zb_json_get(const zb_json *obj, const char *key) {
  if (!obj || obj->kind != ZB_JSON_OBJECT || !key)
    return NULL;
  for (size_t i = 0; i < obj->n; i++)
    if (strcmp(obj->keys[i], key) == 0)
      return &obj->items[i];
  return NULL;
}

const char *zb_json_kind_name(zb_json_kind k) {
  switch (k) {
  case ZB_JSON_NULL: return "null";
  case ZB_JSON_BOOL: return "boolean";
  case ZB_JSON_NUMBER: return "number";
  case ZB_JSON_STRING: return "string";
  case ZB_JSON_ARRAY: return "array";
  case ZB_JSON_OBJECT: return "object";
  }
  return "unknown";
}

const char *zb_json_kind_phrase(zb_json_kind k) {
  switch (k) {
  case ZB_JSON_NULL: return "null";
  case ZB_JSON_BOOL: return "a boolean";
  case ZB_JSON_NUMBER: return "a number";
  case ZB_JSON_STRING: return "a string";
  case ZB_JSON_ARRAY: return "an array";
  case ZB_JSON_OBJECT: return "an object";
  }
  return "unknown";
}
