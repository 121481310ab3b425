/* zb_checkpoint.h — one stage's checkpoint file of a cpu job (see docs/model.md;
 * layout in docs/formats.md):
 * the stage's parameters and its AdamW state (moments and step count)
 * after a completed iteration, so a job can go on where it stopped.
 *
 * File layout (native byte order and float format: a checkpoint is read
 * back by workers of the same architecture):
 *   magic "ZBCKPT\0\1" (8 bytes), uint32 version (1), uint32 shards,
 *   char job_id[64] (NUL-padded), int32 stage, int32 iteration (0-based,
 *   the last one completed), int64 adam steps, uint32 tensor count,
 *   uint32 shard, uint64 numel per tensor, then params (n floats, n the
 *   sum of the sizes), m and v (n floats each, or with shards > 0 the
 *   shard's length each), then a uint64 FNV-1a of every byte before it.
 *   The checksum catches a torn or damaged file that still has the right
 *   size. shards 0 (every file before ZeRO-1): the whole optimizer state;
 *   shards d > 0: ZeRO-1 (docs/model.md, Data parallelism: ZeRO-1), the
 *   moments of replica `shard`'s shard only, the parameters whole.
 *
 * Saving is atomic (zb_file.h): a crash at any point leaves either the old
 * file or the new one, never a mixture. With roots on (zb_roots.h, a
 * worker's --path-root) the file is opened beneath its root, following no
 * symbolic link; NULL: the path as it is.
 *
 * Ownership: the caller owns every buffer; nothing is kept past a call.
 * Results: zb_err from lib/zb_err.h; ZB_ERR_IO (cannot write or read) and
 * ZB_ERR_PARSE (not a checkpoint, or not the one expected) name the file.
 */
#ifndef ZB_CHECKPOINT_H
#define ZB_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "zb_err.h"
#include "zb_roots.h"

#define ZB_CKPT_VERSION 1

typedef struct zb_ckpt {
  char job_id[64];
  int32_t stage;
  int32_t iteration; /* the last completed iteration, 0-based */
  int64_t steps;     /* AdamW steps taken */
  int n_tensors;
  const uint64_t *sizes; /* numel per tensor (borrowed) */
  size_t n;              /* sum of sizes */
  float *params, *m, *v; /* params: n floats; m, v: n, or n_moments when sharded (borrowed) */
  /* ZeRO-1: the moments are shard `shard` of `shards` (0: whole), n_moments floats each */
  int32_t shard, shards;
  size_t n_moments;
} zb_ckpt;

/* Writes c to path atomically (path's directory must exist). */
zb_err zb_ckpt_save(const zb_roots *roots, const char *path, const zb_ckpt *c, zb_diag *diag);

/* Reads path into c: the header must match c's job_id, stage, n_tensors,
 * sizes, shards and shard (the caller fills them from its own model); on success
 * c->iteration, c->steps and the three arrays hold the file's. On failure
 * the arrays may have been written. */
zb_err zb_ckpt_load(const zb_roots *roots, const char *path, zb_ckpt *c, zb_diag *diag);

#endif
