/* fuzz_safetensors.c — the readers of Hugging Face checkpoint files: the
 * same bytes go to the safetensors header parser (zb_st_parse, then every
 * convertible tensor through zb_st_to_f32), the sharded index parser
 * (zb_st_index_parse) and the JSON reader underneath both (zb_json_parse).
 * Any bytes must give ZB_OK or an error with a message and no result.
 * A table that parses must tile its file exactly, find each tensor by
 * name, and survive a round trip: its tensors as fp32 written by
 * zb_st_build parse back with the same names and shapes.
 */
#include <string.h>

#include "fuzz.h"
#include "zb_json.h"
#include "zb_safetensors.h"

/* Past this many elements in all, the harness skips conversion and the
 * round trip, so a few header bytes cannot make a run slow. */
#define FUZZ_MAX_ELEMS 65536

static void check_table(const zb_st_table *t, size_t size) {
  uint64_t at = 8 + t->header_len;
  for (size_t i = 0; i < t->n; i++) {
    const zb_st_tensor *x = &t->tensors[i];
    FUZZ_CHECK(x->offset == at, "tensor %zu starts at %llu, not %llu", i, (unsigned long long)x->offset,
               (unsigned long long)at);
    at += x->nbytes;
    const zb_st_tensor *y = zb_st_find(t, x->name);
    FUZZ_CHECK(y == x, "tensor \"%s\" not found by name", x->name);
  }
  FUZZ_CHECK(at == size, "the tensors end at %llu in a file of %zu bytes", (unsigned long long)at, size);
}

/* Converts every tensor (those that do not convert must say so) and
 * writes the convertible ones back as F32. */
static void check_convert(const zb_st_table *t, const uint8_t *data, size_t size) {
  uint64_t total = 0;
  for (size_t i = 0; i < t->n; i++)
    total += t->tensors[i].numel;
  if (total > FUZZ_MAX_ELEMS)
    return;
  float *vals = malloc((size_t)total * sizeof *vals + 1);
  zb_st_entry *e = calloc(t->n + 1, sizeof *e);
  size_t ne = 0, at = 0;
  for (size_t i = 0; i < t->n; i++) {
    const zb_st_tensor *x = &t->tensors[i];
    zb_diag d = {{0}};
    zb_err err = zb_st_to_f32(data, size, x, vals + at, (size_t)x->numel, &d);
    if (err != ZB_OK) {
      FUZZ_CHECK(err == ZB_ERR_UNSUPPORTED && d.msg[0], "tensor \"%s\": error %d (%s)", x->name, (int)err,
                 d.msg);
      continue;
    }
    e[ne] = (zb_st_entry){.name = x->name, .ndim = x->ndim, .data = vals + at};
    memcpy(e[ne].shape, x->shape, sizeof x->shape);
    ne++;
    at += (size_t)x->numel;
  }
  uint8_t *img;
  size_t len;
  zb_diag d = {{0}};
  zb_err err = zb_st_build(e, ne, &img, &len, &d);
  FUZZ_CHECK(err == ZB_OK, "writing back %zu tensors failed: %s", ne, d.msg);
  zb_st_table *back;
  err = zb_st_parse(img, len, &back, &d);
  FUZZ_CHECK(err == ZB_OK, "the written image does not parse: %s", d.msg);
  FUZZ_CHECK(back->n == ne, "%zu tensors written, %zu read back", ne, back->n);
  for (size_t i = 0; i < ne; i++) {
    const zb_st_tensor *y = zb_st_find(back, e[i].name);
    FUZZ_CHECK(y && y->dtype == ZB_ST_F32 && y->ndim == e[i].ndim &&
                   memcmp(y->shape, e[i].shape, sizeof y->shape) == 0,
               "tensor \"%s\" changed in the round trip", e[i].name);
  }
  zb_st_table_free(back);
  free(img);
  free(e);
  free(vals);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  zb_diag d = {{0}};
  zb_st_table *t = NULL;
  zb_err err = zb_st_parse(data, size, &t, &d);
  if (err == ZB_OK) {
    check_table(t, size);
    check_convert(t, data, size);
    zb_st_table_free(t);
  } else
    FUZZ_CHECK(!t && d.msg[0], "safetensors error %d without a message or with a table", (int)err);

  zb_st_index *ix = NULL;
  d.msg[0] = '\0';
  err = zb_st_index_parse((const char *)data, size, &ix, &d);
  if (err == ZB_OK) {
    for (size_t i = 0; i < ix->n; i++)
      FUZZ_CHECK(zb_st_index_file(ix, ix->names[i]) == ix->files[i], "index entry %zu not found", i);
    zb_st_index_free(ix);
  } else
    FUZZ_CHECK(!ix && d.msg[0], "index error %d without a message or with an index", (int)err);

  zb_json *j = NULL;
  d.msg[0] = '\0';
  err = zb_json_parse((const char *)data, size, &j, &d);
  FUZZ_CHECK(err == ZB_OK ? j != NULL : (!j && d.msg[0]), "JSON error %d: %s", (int)err, d.msg);
  zb_json_free(j);
  return 0;
}
