/* safetensors_build.c — zb_st_build (zb_safetensors.h): an fp32 safetensors
 * file image laid out as the reference writer lays out an all-F32 set
 * (docs/model.md, Safetensors): "__metadata__" first, then the tensors
 * sorted by name with consecutive data_offsets, the header compact JSON
 * padded with spaces to a multiple of 8, then the data little-endian. */
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_buf.h"
#include "zb_json.h"
#include "zb_safetensors.h"

static int by_name(const void *a, const void *b) {
  const zb_st_entry *const *x = a, *const *y = b;
  return strcmp((*x)->name, (*y)->name);
}

/* Checks e and sets *bytes to its data size. */
static zb_err check_entry(const zb_st_entry *e, size_t i, uint64_t *bytes, zb_diag *diag) {
  if (!e->name)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "safetensors: entry %zu has no name", i);
  if (strcmp(e->name, "__metadata__") == 0)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "safetensors: a tensor may not be called __metadata__");
  if (e->ndim < 0 || e->ndim > ZB_ST_MAX_DIMS)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "safetensors: tensor \"%.100s\": %d dimensions (0 to %d)",
                       e->name, e->ndim, ZB_ST_MAX_DIMS);
  uint64_t numel = 1;
  for (int d = 0; d < e->ndim; d++)
    if (__builtin_mul_overflow(numel, e->shape[d], &numel))
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "safetensors: tensor \"%.100s\": shape overflows 64 bits",
                         e->name);
  /* Offsets must stay integers a JSON reader keeps exactly (2^53). */
  if (numel > (1ULL << 50))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "safetensors: tensor \"%.100s\": %llu elements is too many",
                       e->name, (unsigned long long)numel);
  if (numel && !e->data)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "safetensors: tensor \"%.100s\" has no data", e->name);
  *bytes = numel * 4;
  return ZB_OK;
}

/* The header JSON of the sorted entries, padded; sizes[i] their bytes. */
static zb_err build_header(const zb_st_entry **sorted, const uint64_t *sizes, size_t n, zb_buf *h,
                           uint64_t *data_len, zb_diag *diag) {
  zb_buf_puts(h, "{\"__metadata__\":{\"format\":\"pt\"}");
  uint64_t at = 0;
  for (size_t i = 0; i < n; i++) {
    const zb_st_entry *e = sorted[i];
    zb_buf_puts(h, ",");
    zb_buf_json_str(h, e->name);
    zb_buf_puts(h, ":{\"dtype\":\"F32\",\"shape\":[");
    for (int d = 0; d < e->ndim; d++)
      zb_buf_printf(h, "%s%llu", d ? "," : "", (unsigned long long)e->shape[d]);
    if (__builtin_add_overflow(at, sizes[i], &at) || at > (1ULL << 53))
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "safetensors: the data passes 2^53 bytes at \"%.100s\"",
                         e->name);
    zb_buf_printf(h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)(at - sizes[i]),
                  (unsigned long long)at);
  }
  zb_buf_puts(h, "}");
  while (h->len % 8)
    zb_buf_puts(h, " ");
  *data_len = at;
  if (h->len > ZB_ST_MAX_HEADER)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "safetensors: the header would be %zu bytes, over the limit of %u", h->len,
                       ZB_ST_MAX_HEADER);
  /* The names went in as given: a name that is not UTF-8 shows here. */
  zb_json *j;
  zb_diag jd = {{0}};
  if (zb_json_parse(h->data, h->len, &j, &jd) != ZB_OK)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "safetensors: a tensor name is not valid: %s", jd.msg);
  zb_json_free(j);
  return ZB_OK;
}

static void put_data(uint8_t *o, const float *x, uint64_t bytes) {
  for (uint64_t i = 0; i < bytes / 4; i++, o += 4) {
    uint32_t u;
    memcpy(&u, &x[i], 4);
    o[0] = (uint8_t)u, o[1] = (uint8_t)(u >> 8), o[2] = (uint8_t)(u >> 16), o[3] = (uint8_t)(u >> 24);
  }
}

static zb_err build_image(const zb_st_entry **sorted, const uint64_t *sizes, size_t n, uint8_t **out,
                          size_t *out_len, zb_diag *diag) {
  zb_buf h = ZB_BUF_INIT;
  uint64_t data_len = 0;
  zb_err err = build_header(sorted, sizes, n, &h, &data_len, diag);
  uint64_t total = 8 + (uint64_t)h.len + data_len;
  if (err == ZB_OK && total > SIZE_MAX)
    err = zb_diag_set(diag, ZB_ERR_INVALID_ARG, "safetensors: the file would be %llu bytes",
                      (unsigned long long)total);
  if (err != ZB_OK) {
    zb_buf_free(&h);
    return err;
  }
  uint8_t *img = zb_malloc((size_t)total);
  for (int i = 0; i < 8; i++)
    img[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
  memcpy(img + 8, h.data, h.len);
  uint8_t *o = img + 8 + h.len;
  for (size_t i = 0; i < n; i++, o += sizes[i - 1])
    put_data(o, sorted[i]->data, sizes[i]);
  zb_buf_free(&h);
  *out = img;
  *out_len = (size_t)total;
  return ZB_OK;
}

zb_err zb_st_build(const zb_st_entry *entries, size_t n, uint8_t **out, size_t *out_len, zb_diag *diag) {
  *out = NULL;
  *out_len = 0;
  const zb_st_entry **sorted = zb_calloc(n + 1, sizeof *sorted);
  uint64_t *sizes = zb_calloc(n + 1, sizeof *sizes);
  zb_err err = ZB_OK;
  for (size_t i = 0; i < n && err == ZB_OK; i++)
    sorted[i] = &entries[i], err = check_entry(&entries[i], i, &sizes[i], diag);
  if (err == ZB_OK) {
    qsort(sorted, n, sizeof *sorted, by_name);
    for (size_t i = 0; i < n; i++) /* sizes follow the sorted order */
      check_entry(sorted[i], i, &sizes[i], NULL);
    for (size_t i = 1; i < n && err == ZB_OK; i++)
      if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0)
        err = zb_diag_set(diag, ZB_ERR_INVALID_ARG, "safetensors: two tensors are called \"%.100s\"",
                          sorted[i]->name);
  }
  if (err == ZB_OK)
    err = build_image(sorted, sizes, n, out, out_len, diag);
  free(sorted);
  free(sizes);
  return err;
}
