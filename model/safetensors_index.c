/* safetensors_index.c — model.safetensors.index.json (zb_safetensors.h):
 * {"metadata": {...}, "weight_map": {tensor name: shard file name}}, the
 * file Hugging Face writes beside a checkpoint split into shards. Only
 * weight_map is read. A shard must be a plain file name in the index's
 * own directory: a path ("../x", "/etc/x") is refused, so an index cannot
 * send the reader elsewhere. Pure: text in, a map out. */
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_json.h"
#include "zb_safetensors.h"
#include "zb_strmap.h"

typedef struct ix_internal {
  zb_json *doc;
  zb_strmap by_name; /* tensor -> its file name */
} ix_internal;

static zb_err ix_fill(zb_st_index *ix, const zb_json *wm, zb_diag *diag) {
  ix_internal *in = ix->internal_;
  zb_strmap files = ZB_STRMAP_INIT;
  ix->names = zb_calloc(wm->n + 1, sizeof *ix->names);
  ix->files = zb_calloc(wm->n + 1, sizeof *ix->files);
  ix->shard_files = zb_calloc(wm->n + 1, sizeof *ix->shard_files);
  zb_err err = ZB_OK;
  for (size_t i = 0; i < wm->n && err == ZB_OK; i++) {
    const zb_json *f = &wm->items[i];
    if (f->kind != ZB_JSON_STRING)
      err = zb_diag_set(diag, ZB_ERR_PARSE, "safetensors index: weight_map \"%.100s\" is %s, not a file name",
                        wm->keys[i], zb_json_kind_phrase(f->kind));
    else if (!f->string[0] || strchr(f->string, '/') || strcmp(f->string, ".") == 0 ||
             strcmp(f->string, "..") == 0)
      err = zb_diag_set(diag, ZB_ERR_PARSE,
                        "safetensors index: weight_map \"%.100s\": \"%.100s\" is not a plain file name",
                        wm->keys[i], f->string);
    if (err != ZB_OK)
      break;
    ix->names[i] = wm->keys[i];
    ix->files[i] = f->string;
    zb_strmap_put(&in->by_name, wm->keys[i], f->string);
    if (!zb_strmap_get(&files, f->string)) {
      zb_strmap_put(&files, f->string, f->string);
      ix->shard_files[ix->n_files++] = f->string;
    }
    ix->n++;
  }
  zb_strmap_free(&files);
  return err;
}

zb_err zb_st_index_parse(const char *text, size_t len, zb_st_index **out, zb_diag *diag) {
  *out = NULL;
  zb_json *doc;
  zb_diag jd = {{0}};
  zb_err err = zb_json_parse(text, len, &doc, &jd);
  if (err != ZB_OK)
    return zb_diag_set(diag, err, "safetensors index: %s", jd.msg);
  const zb_json *wm = zb_json_get(doc, "weight_map");
  if (doc->kind != ZB_JSON_OBJECT || !wm || wm->kind != ZB_JSON_OBJECT) {
    err = zb_diag_set(diag, ZB_ERR_PARSE, "safetensors index: %s",
                      doc->kind != ZB_JSON_OBJECT ? "the document is not an object"
                      : !wm                       ? "missing weight_map"
                                                  : "weight_map is not an object");
    zb_json_free(doc);
    return err;
  }
  zb_st_index *ix = zb_calloc(1, sizeof *ix);
  ix_internal *in = zb_calloc(1, sizeof *in);
  in->doc = doc;
  ix->internal_ = in;
  if ((err = ix_fill(ix, wm, diag)) != ZB_OK) {
    zb_st_index_free(ix);
    return err;
  }
  *out = ix;
  return ZB_OK;
}

void zb_st_index_free(zb_st_index *ix) {
  if (!ix)
    return;
  ix_internal *in = ix->internal_;
  zb_strmap_free(&in->by_name);
  zb_json_free(in->doc);
  free(in);
  free(ix->names);
  free(ix->files);
  free(ix->shard_files);
  free(ix);
}

const char *zb_st_index_file(const zb_st_index *ix, const char *name) {
  if (!ix || !name)
    return NULL;
  return zb_strmap_get(&((const ix_internal *)ix->internal_)->by_name, name);
}
