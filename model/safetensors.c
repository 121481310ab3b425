/* safetensors.c — reading a safetensors header (zb_safetensors.h): the
 * length prefix, the JSON, each tensor's record, and the check that the
 * records tile the data exactly. Pure: bytes in, a table out. The checks
 * follow the reference implementation's (docs/model.md, Safetensors): N at
 * most 100 MB, tensors sorted by data_offsets must start at 0 and follow
 * each other with no hole or overlap, each must span exactly its shape's
 * bytes, and the last must end where the file does. */
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_json.h"
#include "zb_safetensors.h"
#include "zb_strmap.h"

typedef struct st_internal {
  zb_json *doc; /* names and metadata point into it */
  zb_strmap by_name;
} st_internal;

static const struct {
  const char *name;
  int bits;
} st_dtypes[ZB_ST_DTYPE_COUNT] = {
    [ZB_ST_F32] = {"F32", 32},
    [ZB_ST_F16] = {"F16", 16},
    [ZB_ST_BF16] = {"BF16", 16},
    [ZB_ST_F64] = {"F64", 64},
    [ZB_ST_I64] = {"I64", 64},
    [ZB_ST_I32] = {"I32", 32},
    [ZB_ST_I16] = {"I16", 16},
    [ZB_ST_I8] = {"I8", 8},
    [ZB_ST_U64] = {"U64", 64},
    [ZB_ST_U32] = {"U32", 32},
    [ZB_ST_U16] = {"U16", 16},
    [ZB_ST_U8] = {"U8", 8},
    [ZB_ST_BOOL] = {"BOOL", 8},
    [ZB_ST_C64] = {"C64", 64},
    [ZB_ST_F8_E4M3] = {"F8_E4M3", 8},
    [ZB_ST_F8_E5M2] = {"F8_E5M2", 8},
    [ZB_ST_F8_E8M0] = {"F8_E8M0", 8},
    [ZB_ST_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8},
    [ZB_ST_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8},
    [ZB_ST_F6_E2M3] = {"F6_E2M3", 6},
    [ZB_ST_F6_E3M2] = {"F6_E3M2", 6},
    [ZB_ST_F4] = {"F4", 4},
};

const char *zb_st_dtype_name(zb_st_dtype d) {
  return (unsigned)d < ZB_ST_DTYPE_COUNT ? st_dtypes[d].name : "unknown";
}

int zb_st_dtype_bits(zb_st_dtype d) {
  return (unsigned)d < ZB_ST_DTYPE_COUNT ? st_dtypes[d].bits : 0;
}

zb_err zb_st_header_len(const uint8_t *bytes, size_t len, uint64_t file_len, uint64_t *n, zb_diag *diag) {
  if (len < 8 || file_len < 8)
    return zb_diag_set(diag, ZB_ERR_PARSE,
                       "safetensors: the file is %llu bytes, too short for the 8-byte header length",
                       (unsigned long long)(file_len < 8 ? file_len : len));
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = v << 8 | bytes[i];
  if (v > ZB_ST_MAX_HEADER)
    return zb_diag_set(diag, ZB_ERR_PARSE, "safetensors: header length %llu exceeds the limit of %u bytes",
                       (unsigned long long)v, ZB_ST_MAX_HEADER);
  if (v > file_len - 8)
    return zb_diag_set(diag, ZB_ERR_PARSE,
                       "safetensors: header length %llu runs past the end of the file (%llu bytes)",
                       (unsigned long long)v, (unsigned long long)file_len);
  *n = v;
  return ZB_OK;
}

/* A JSON value that is an integer >= 0 (the reader's sizes and offsets). */
static int st_uint(const zb_json *v, uint64_t *out) {
  if (!v || v->kind != ZB_JSON_NUMBER || !v->is_integer || v->integer < 0)
    return 0;
  *out = (uint64_t)v->integer;
  return 1;
}

static zb_err st_dtype(const char *name, const zb_json *e, zb_st_dtype *out, zb_diag *diag) {
  const zb_json *v = zb_json_get(e, "dtype");
  if (!v)
    return zb_diag_set(diag, ZB_ERR_PARSE, "safetensors: tensor \"%.100s\": missing dtype", name);
  if (v->kind != ZB_JSON_STRING)
    return zb_diag_set(diag, ZB_ERR_PARSE, "safetensors: tensor \"%.100s\": dtype is %s, not a string", name,
                       zb_json_kind_phrase(v->kind));
  for (int d = 0; d < ZB_ST_DTYPE_COUNT; d++)
    if (strcmp(v->string, st_dtypes[d].name) == 0) {
      *out = (zb_st_dtype)d;
      return ZB_OK;
    }
  return zb_diag_set(diag, ZB_ERR_PARSE, "safetensors: tensor \"%.100s\": unknown dtype \"%.40s\"", name,
                     v->string);
}

/* shape -> t->ndim, t->shape, t->numel, checked for overflow. */
static zb_err st_shape(const char *name, const zb_json *e, zb_st_tensor *t, zb_diag *diag) {
  const zb_json *v = zb_json_get(e, "shape");
  if (!v)
    return zb_diag_set(diag, ZB_ERR_PARSE, "safetensors: tensor \"%.100s\": missing shape", name);
  if (v->kind != ZB_JSON_ARRAY)
    return zb_diag_set(diag, ZB_ERR_PARSE, "safetensors: tensor \"%.100s\": shape is %s, not an array", name,
                       zb_json_kind_phrase(v->kind));
  if (v->n > ZB_ST_MAX_DIMS)
    return zb_diag_set(diag, ZB_ERR_PARSE, "safetensors: tensor \"%.100s\": %zu dimensions, more than %d",
                       name, v->n, ZB_ST_MAX_DIMS);
  t->ndim = (int)v->n;
  t->numel = 1;
  for (size_t i = 0; i < v->n; i++) {
    if (!st_uint(&v->items[i], &t->shape[i]))
      return zb_diag_set(diag, ZB_ERR_PARSE,
                         "safetensors: tensor \"%.100s\": shape[%zu] is not a non-negative integer", name, i);
    if (__builtin_mul_overflow(t->numel, t->shape[i], &t->numel))
      return zb_diag_set(diag, ZB_ERR_PARSE, "safetensors: tensor \"%.100s\": shape overflows 64 bits", name);
  }
  return ZB_OK;
}

/* data_offsets -> t->offset (begin, relative for now) and t->nbytes. */
static zb_err st_offsets(const char *name, const zb_json *e, zb_st_tensor *t, zb_diag *diag) {
  const zb_json *v = zb_json_get(e, "data_offsets");
  if (!v)
    return zb_diag_set(diag, ZB_ERR_PARSE, "safetensors: tensor \"%.100s\": missing data_offsets", name);
  uint64_t b, end;
  if (v->kind != ZB_JSON_ARRAY || v->n != 2 || !st_uint(&v->items[0], &b) || !st_uint(&v->items[1], &end))
    return zb_diag_set(
        diag, ZB_ERR_PARSE,
        "safetensors: tensor \"%.100s\": data_offsets is not [begin, end] of non-negative integers", name);
  if (end < b)
    return zb_diag_set(diag, ZB_ERR_PARSE,
                       "safetensors: tensor \"%.100s\": data_offsets [%llu, %llu] end before they begin",
                       name, (unsigned long long)b, (unsigned long long)end);
  t->offset = b;
  t->nbytes = end - b;
  return ZB_OK;
}

static zb_err st_tensor(const char *name, const zb_json *e, zb_st_tensor *t, zb_diag *diag) {
  t->name = name;
  if (e->kind != ZB_JSON_OBJECT)
    return zb_diag_set(diag, ZB_ERR_PARSE, "safetensors: tensor \"%.100s\": %s, not an object", name,
                       zb_json_kind_phrase(e->kind));
  zb_err err = st_dtype(name, e, &t->dtype, diag);
  if (err == ZB_OK)
    err = st_shape(name, e, t, diag);
  if (err == ZB_OK)
    err = st_offsets(name, e, t, diag);
  if (err != ZB_OK)
    return err;
  uint64_t bits;
  if (__builtin_mul_overflow(t->numel, (uint64_t)st_dtypes[t->dtype].bits, &bits))
    return zb_diag_set(diag, ZB_ERR_PARSE, "safetensors: tensor \"%.100s\": size overflows 64 bits", name);
  if (bits % 8)
    return zb_diag_set(diag, ZB_ERR_PARSE,
                       "safetensors: tensor \"%.100s\": %llu %s elements are not whole bytes", name,
                       (unsigned long long)t->numel, st_dtypes[t->dtype].name);
  if (bits / 8 != t->nbytes)
    return zb_diag_set(diag, ZB_ERR_PARSE,
                       "safetensors: tensor \"%.100s\": shape of %llu %s elements needs %llu bytes but "
                       "data_offsets span %llu",
                       name, (unsigned long long)t->numel, st_dtypes[t->dtype].name,
                       (unsigned long long)(bits / 8), (unsigned long long)t->nbytes);
  return ZB_OK;
}

static zb_err st_metadata(zb_st_table *t, const zb_json *m, zb_diag *diag) {
  if (m->kind == ZB_JSON_NULL) /* the reference reads null as no metadata */
    return ZB_OK;
  if (m->kind != ZB_JSON_OBJECT)
    return zb_diag_set(diag, ZB_ERR_PARSE, "safetensors: __metadata__ is %s, not an object",
                       zb_json_kind_phrase(m->kind));
  t->meta_keys = zb_calloc(m->n + 1, sizeof *t->meta_keys);
  t->meta_values = zb_calloc(m->n + 1, sizeof *t->meta_values);
  for (size_t i = 0; i < m->n; i++) {
    if (m->items[i].kind != ZB_JSON_STRING)
      return zb_diag_set(diag, ZB_ERR_PARSE, "safetensors: __metadata__ \"%.100s\" is %s, not a string",
                         m->keys[i], zb_json_kind_phrase(m->items[i].kind));
    t->meta_keys[i] = m->keys[i];
    t->meta_values[i] = m->items[i].string;
  }
  t->n_meta = m->n;
  return ZB_OK;
}

static int st_by_offset(const void *a, const void *b) {
  const zb_st_tensor *x = a, *y = b;
  if (x->offset != y->offset)
    return x->offset < y->offset ? -1 : 1;
  if (x->nbytes != y->nbytes)
    return x->nbytes < y->nbytes ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* The sorted tensors must tile data_len bytes; then offsets become
 * absolute (data_start + begin). */
static zb_err st_cover(zb_st_table *t, uint64_t data_start, uint64_t data_len, zb_diag *diag) {
  uint64_t at = 0;
  for (size_t i = 0; i < t->n; i++) {
    zb_st_tensor *x = &t->tensors[i];
    if (x->offset > at)
      return zb_diag_set(
          diag, ZB_ERR_PARSE,
          "safetensors: hole in the data: bytes [%llu, %llu) before tensor \"%.100s\" belong to "
          "no tensor",
          (unsigned long long)at, (unsigned long long)x->offset, x->name);
    if (x->offset < at)
      return zb_diag_set(diag, ZB_ERR_PARSE,
                         "safetensors: tensor \"%.100s\" (data_offsets from %llu) overlaps tensor \"%.100s\"",
                         x->name, (unsigned long long)x->offset, t->tensors[i - 1].name);
    at = x->offset + x->nbytes; /* no overflow: both are below 2^53 */
  }
  if (at != data_len)
    return zb_diag_set(
        diag, ZB_ERR_PARSE,
        "safetensors: the tensors cover %llu bytes of data but the file holds %llu after the header",
        (unsigned long long)at, (unsigned long long)data_len);
  for (size_t i = 0; i < t->n; i++)
    t->tensors[i].offset += data_start;
  return ZB_OK;
}

/* The tensors and metadata of the parsed header root. */
static zb_err st_fill(zb_st_table *t, const zb_json *root, zb_diag *diag) {
  const zb_json *meta = zb_json_get(root, "__metadata__");
  t->tensors = zb_calloc(root->n + 1, sizeof *t->tensors);
  zb_err err = meta ? st_metadata(t, meta, diag) : ZB_OK;
  for (size_t i = 0; i < root->n && err == ZB_OK; i++)
    if (&root->items[i] != meta)
      err = st_tensor(root->keys[i], &root->items[i], &t->tensors[t->n++], diag);
  if (err != ZB_OK)
    return err;
  qsort(t->tensors, t->n, sizeof *t->tensors, st_by_offset);
  err = st_cover(t, 8 + t->header_len, t->file_len - 8 - t->header_len, diag);
  if (err != ZB_OK)
    return err;
  st_internal *in = t->internal_;
  for (size_t i = 0; i < t->n; i++)
    zb_strmap_put(&in->by_name, t->tensors[i].name, &t->tensors[i]);
  return ZB_OK;
}

zb_err zb_st_parse_header(const uint8_t *prefix, size_t prefix_len, uint64_t file_len, zb_st_table **out,
                          zb_diag *diag) {
  *out = NULL;
  uint64_t n = 0;
  zb_err err = zb_st_header_len(prefix, prefix_len, file_len, &n, diag);
  if (err != ZB_OK)
    return err;
  if (prefix_len - 8 < n)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "safetensors: %zu header bytes given, the header needs %llu",
                       prefix_len - 8, (unsigned long long)n);
  const char *h = (const char *)prefix + 8;
  if (n == 0 || h[0] != '{')
    return zb_diag_set(diag, ZB_ERR_PARSE,
                       "safetensors: the header is not a JSON object (it must start with '{')");
  zb_json *doc;
  zb_diag jd = {{0}};
  if ((err = zb_json_parse(h, (size_t)n, &doc, &jd)) != ZB_OK)
    return zb_diag_set(diag, err, "safetensors header: %s", jd.msg);
  zb_st_table *t = zb_calloc(1, sizeof *t);
  st_internal *in = zb_calloc(1, sizeof *in);
  in->doc = doc;
  t->internal_ = in;
  t->header_len = n;
  t->file_len = file_len;
  if ((err = st_fill(t, doc, diag)) != ZB_OK) {
    zb_st_table_free(t);
    return err;
  }
  *out = t;
  return ZB_OK;
}

zb_err zb_st_parse(const uint8_t *bytes, size_t len, zb_st_table **out, zb_diag *diag) {
  return zb_st_parse_header(bytes, len, len, out, diag);
}

void zb_st_table_free(zb_st_table *t) {
  if (!t)
    return;
  st_internal *in = t->internal_;
  zb_strmap_free(&in->by_name);
  zb_json_free(in->doc);
  free(in);
  free(t->tensors);
  free(t->meta_keys);
  free(t->meta_values);
  free(t);
}

const zb_st_tensor *zb_st_find(const zb_st_table *t, const char *name) {
  if (!t || !name)
    return NULL;
  return zb_strmap_get(&((const st_internal *)t->internal_)->by_name, name);
}

const char *zb_st_meta(const zb_st_table *t, const char *key) {
  for (size_t i = 0; t && i < t->n_meta; i++)
    if (strcmp(t->meta_keys[i], key) == 0)
      return t->meta_values[i];
  return NULL;
}
