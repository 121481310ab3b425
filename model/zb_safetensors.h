/* zb_safetensors.h — Hugging Face safetensors checkpoints: reading a file's
 * header and tensors as fp32, writing fp32 files, and sharded checkpoints
 * (model.safetensors.index.json). Format and checks: docs/model.md,
 * Safetensors.
 *
 * A file is: 8 bytes N (uint64, little-endian); N bytes of a JSON object
 * {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
 * {string: string}} padded with spaces; then the data, which the tensors
 * cover exactly (offsets relative to the data's start, no holes, no
 * overlaps). The parser checks what the reference implementation checks
 * and a little more (the header starts with '{').
 *
 * Two parts: safetensors.c is pure (bytes in, tables and images out);
 * safetensors_io.c opens files by path (plain open(); no --path-root
 * confinement yet) and reads only the bytes it needs with pread.
 *
 * Ownership: every zb_st_* object returned through an out pointer belongs
 * to the caller and is released by its _free/_close function (NULL is a
 * no-op). Tensor records and names point into their table and live as
 * long as it does. Results: zb_err from lib/zb_err.h with a message that
 * names the tensor, the key or the offset.
 */
#ifndef ZB_SAFETENSORS_H
#define ZB_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "zb_err.h"
#include "zb_roots.h"

/* The reference implementation's limit on N (100 MB). */
#define ZB_ST_MAX_HEADER 100000000u
#define ZB_ST_MAX_DIMS 8

/* Every dtype the format names; only F32, F16 and BF16 convert to fp32,
 * the rest parse (a file may hold them) but zb_st_*_f32 refuses them. */
typedef enum zb_st_dtype {
  ZB_ST_F32,
  ZB_ST_F16,
  ZB_ST_BF16,
  ZB_ST_F64,
  ZB_ST_I64,
  ZB_ST_I32,
  ZB_ST_I16,
  ZB_ST_I8,
  ZB_ST_U64,
  ZB_ST_U32,
  ZB_ST_U16,
  ZB_ST_U8,
  ZB_ST_BOOL,
  ZB_ST_C64,
  ZB_ST_F8_E4M3,
  ZB_ST_F8_E5M2,
  ZB_ST_F8_E8M0,
  ZB_ST_F8_E4M3FNUZ,
  ZB_ST_F8_E5M2FNUZ,
  ZB_ST_F6_E2M3,
  ZB_ST_F6_E3M2,
  ZB_ST_F4,
  ZB_ST_DTYPE_COUNT
} zb_st_dtype;

typedef struct zb_st_tensor {
  const char *name;
  zb_st_dtype dtype;
  int ndim; /* 0: a scalar */
  uint64_t shape[ZB_ST_MAX_DIMS];
  uint64_t numel;  /* product of shape (1 for a scalar) */
  uint64_t offset; /* where its bytes start in the file (8 + N + begin) */
  uint64_t nbytes; /* end - begin */
} zb_st_tensor;

typedef struct zb_st_table {
  zb_st_tensor *tensors; /* in data order (by offset) */
  size_t n;
  uint64_t header_len;                   /* N */
  uint64_t file_len;                     /* 8 + N + the data */
  const char **meta_keys, **meta_values; /* "__metadata__", in document order */
  size_t n_meta;
  void *internal_; /* the JSON tree and the name map */
} zb_st_table;

/* "F32", "BF16", ... */
const char *zb_st_dtype_name(zb_st_dtype d);
/* Bits per element (4 for F4, 6 for the F6 kinds, else 8 to 64). */
int zb_st_dtype_bits(zb_st_dtype d);

/* N from a file's first 8 bytes (len >= 8), checked against
 * ZB_ST_MAX_HEADER and file_len. */
zb_err zb_st_header_len(const uint8_t *bytes, size_t len, uint64_t file_len, uint64_t *n, zb_diag *diag);
/* Parses and validates the header of a file of file_len bytes from its
 * first 8 + N bytes (prefix[0..prefix_len), prefix_len >= 8 + N): the
 * data need not be in memory. */
zb_err zb_st_parse_header(const uint8_t *prefix, size_t prefix_len, uint64_t file_len, zb_st_table **out,
                          zb_diag *diag);
/* The same on a whole file image bytes[0..len). */
zb_err zb_st_parse(const uint8_t *bytes, size_t len, zb_st_table **out, zb_diag *diag);
void zb_st_table_free(zb_st_table *t);
/* The tensor called name; NULL when there is none (constant time). */
const zb_st_tensor *zb_st_find(const zb_st_table *t, const char *name);
/* The value of a "__metadata__" key; NULL when absent. */
const char *zb_st_meta(const zb_st_table *t, const char *key);

/* Converts tensor x to fp32 in dst[0..n), n == x->numel: F32 as is, F16
 * and BF16 exactly (subnormals, infinities, NaN payloads, signed zeros);
 * other dtypes are refused with their name. The _f32 form reads x's bytes
 * from the file image bytes[0..len); zb_st_decode_f32 from src, which
 * holds count elements of dtype (count <= the elements there). */
zb_err zb_st_to_f32(const uint8_t *bytes, size_t len, const zb_st_tensor *x, float *dst, size_t n,
                    zb_diag *diag);
zb_err zb_st_decode_f32(zb_st_dtype dtype, const uint8_t *src, size_t count, float *dst, zb_diag *diag);
/* One element conversions (exact). */
float zb_st_f16_to_f32(uint16_t h);
float zb_st_bf16_to_f32(uint16_t b);

/* One fp32 tensor to write. */
typedef struct zb_st_entry {
  const char *name; /* UTF-8, unique, not "__metadata__" */
  int ndim;         /* 0..ZB_ST_MAX_DIMS */
  uint64_t shape[ZB_ST_MAX_DIMS];
  const float *data; /* numel values, row-major */
} zb_st_entry;

/* Builds a whole file image (*out, *out_len; the caller frees *out) of
 * the entries as F32 with "__metadata__": {"format": "pt"}: tensors
 * sorted by name (byte order), the header compact JSON padded with spaces
 * to a multiple of 8, as the reference writer (safetensors save_file)
 * lays out an all-F32 set, so Hugging Face transformers loads it. */
zb_err zb_st_build(const zb_st_entry *entries, size_t n, uint8_t **out, size_t *out_len, zb_diag *diag);

/* A sharded checkpoint's index (model.safetensors.index.json): for each
 * tensor name its shard, a plain file name in the index's directory. */
typedef struct zb_st_index {
  size_t n;
  const char **names, **files; /* weight_map, in document order */
  size_t n_files;
  const char **shard_files; /* distinct files, first-use order */
  void *internal_;
} zb_st_index;

zb_err zb_st_index_parse(const char *text, size_t len, zb_st_index **out, zb_diag *diag);
void zb_st_index_free(zb_st_index *ix);
/* The shard file of name; NULL when the index has no such tensor. */
const char *zb_st_index_file(const zb_st_index *ix, const char *name);

/* ---- Files (safetensors_io.c) ---- */

/* One safetensors file, its header read; tensors are read on request. */
typedef struct zb_st_file {
  char *path;
  int fd;
  zb_st_table *table;
} zb_st_file;

zb_err zb_st_file_open(const char *path, zb_st_file **out, zb_diag *diag);
void zb_st_file_close(zb_st_file *f);
/* Reads tensor x (of f->table) into dst[0..n) as fp32, n == x->numel, in
 * bounded pieces: no copy of the file is held. */
zb_err zb_st_file_read_f32(zb_st_file *f, const zb_st_tensor *x, float *dst, size_t n, zb_diag *diag);
/* Writes zb_st_build's image to path atomically (zb_file_write_atomic). */
zb_err zb_st_write_file(const char *path, const zb_st_entry *entries, size_t n, zb_diag *diag);

/* A checkpoint directory: model.safetensors.index.json and its shards, or
 * one model.safetensors. Shards are opened on first use, so a rank that
 * reads only its stages' tensors opens only the shards holding them. */
typedef struct zb_st_checkpoint zb_st_checkpoint;

zb_err zb_st_checkpoint_open(const char *dir, zb_st_checkpoint **out, zb_diag *diag);
/* The same beneath a worker's --path-root (zb_roots.h; NULL or empty:
 * plain paths): dir must be absolute and under a root, and the index and
 * every shard are opened beneath it following no symbolic link; a link or
 * a path under no root fails with ZB_ERR_IO naming the file. roots is
 * borrowed until zb_st_checkpoint_close (shards open on first use). */
zb_err zb_st_checkpoint_open_in(const zb_roots *roots, const char *dir, zb_st_checkpoint **out,
                                zb_diag *diag);
void zb_st_checkpoint_close(zb_st_checkpoint *c);
/* The record of tensor name (its dtype and shape), opening its shard. */
zb_err zb_st_checkpoint_find(zb_st_checkpoint *c, const char *name, const zb_st_tensor **out, zb_diag *diag);
/* Reads tensor name as fp32 into dst[0..n), n == its numel. */
zb_err zb_st_checkpoint_read_f32(zb_st_checkpoint *c, const char *name, float *dst, size_t n, zb_diag *diag);
/* How many shard files are open now (for tests and logs). */
size_t zb_st_checkpoint_open_shards(const zb_st_checkpoint *c);

#endif
