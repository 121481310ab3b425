/* zb_dump.h — a cpu job's gradient dump (the job spec's model.dump_dir, a
 * testing and validation aid): after an iteration's step, each rank writes
 * one file per hosted stage with the stage's parameters before the step,
 * the gradients the iteration accumulated (before clipping), and the
 * parameters after the step (or after a rollback). zb-gradcheck reads a
 * job's dumps, computes the same iteration in one process without
 * pipelining, and compares every tensor; tests compare weights across
 * runs from them.
 *
 * Files: DIR/JOB_ID/it<iteration>-stage<stage>.dump, written atomically
 * (zb_file.h); with data_parallel > 1, replica 0 writes those names and
 * replica k > 0 writes it<iteration>-stage<stage>-replica<k>.dump, which
 * no replica 0 name can equal (zb_dump_name). Layout, native byte order (a
 * dump is read on the machine that wrote it, or one of the same
 * architecture), offsets in bytes:
 *     0  magic "ZBDUMP\0\1"
 *     8  uint32 version (2; 1 has no replica fields), uint32 tensor count
 *    16  char job_id[64], NUL-padded
 *    80  int32 iteration, stage, n_stages, rank,
 *        microbatches, vocab, hidden, heads,
 *        layers, seq_len, batch, flags (ZB_DUMP_*)
 *   128  uint64 seed; double loss (the iteration's mean over the
 *        replica's microbatches, with ZB_DUMP_HAS_LOSS), double
 *        grad_norm (global)
 *   152  char data[512], the text file's path, NUL-padded
 *   664  int32 replica, data_parallel (version 2; version 1 reads as 0, 1)
 *   672  per tensor: char name[48], int32 rows, int32 cols
 *  then  float before[n], grads[n], after[n] (n = the sum of rows*cols,
 *        tensors in the stage's order), then the uint64 FNV-1a checksum.
 *
 * With roots on (zb_roots.h, a worker's --path-root) the file is opened
 * beneath its root, following no symbolic link; NULL: the path as it is.
 *
 * Ownership: zb_dump_save borrows everything; zb_dump_load allocates the
 * tensor table and the arrays into *out, freed by zb_dump_free.
 * Results: zb_err from lib/zb_err.h; ZB_ERR_IO (cannot write or read) and
 * ZB_ERR_PARSE (not a dump, truncated, checksum) name the file.
 */
#ifndef ZB_DUMP_H
#define ZB_DUMP_H

#include <stddef.h>
#include <stdint.h>

#include "zb_err.h"
#include "zb_roots.h"

#define ZB_DUMP_VERSION 2

enum {
  ZB_DUMP_HAS_LOSS = 1, /* the stage is the last: loss is the iteration's */
  ZB_DUMP_CLIPPED = 2,  /* the step was clipped */
  ZB_DUMP_SKIPPED = 4,  /* a gradient was not finite: no step (after == before) */
  ZB_DUMP_ARCH = 8,     /* a model with an architecture (gpt2, llama): tensors carry transformers'
                           names; zb-gradcheck rebuilds only the builtin model */
};

typedef struct zb_dump_tensor {
  char name[48];
  int32_t rows, cols;
} zb_dump_tensor;

typedef struct zb_dump {
  char job_id[64];
  int32_t iteration, stage, n_stages, rank,
      microbatches;               /* rank: pipeline rank; microbatches: m per replica */
  int32_t replica, data_parallel; /* data parallelism: this replica of data_parallel (0 of 1: none) */
  int32_t vocab, hidden, heads, layers, seq_len, batch;
  uint64_t seed;
  char data[512];
  int32_t flags;
  double loss, grad_norm;
  int n_tensors;
  zb_dump_tensor *tensors;
  size_t n; /* floats in each array */
  float *before, *grads, *after;
} zb_dump;

/* The file name of (iteration, stage, replica) within a job's dump
 * directory, into buf (at least 64 bytes): it<N>-stage<S>.dump for
 * replica 0, it<N>-stage<S>-replica<K>.dump for replica K > 0. */
void zb_dump_name(int iteration, int stage, int replica, char *buf, size_t len);

/* Writes d to path atomically (path's directory must exist). */
zb_err zb_dump_save(const zb_roots *roots, const char *path, const zb_dump *d, zb_diag *diag);

/* Reads path into *out (allocating; zb_dump_free frees). */
zb_err zb_dump_load(const zb_roots *roots, const char *path, zb_dump *out, zb_diag *diag);

/* Frees what zb_dump_load allocated; a zeroed dump is a no-op. */
void zb_dump_free(zb_dump *d);

#endif
