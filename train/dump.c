/* dump.c — see zb_dump.h. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "zb_alloc.h"
#include "zb_dump.h"
#include "zb_file.h"

static const char magic[8] = {'Z', 'B', 'D', 'U', 'M', 'P', 0, 1};

/* The fixed part, 672 bytes with no padding (every field at a multiple of
 * its size): the offsets zb_dump.h documents. */
typedef struct dump_head {
  char magic[8];
  uint32_t version, n_tensors;
  char job_id[64];
  int32_t iteration, stage, n_stages, rank;
  int32_t microbatches, vocab, hidden, heads;
  int32_t layers, seq_len, batch, flags;
  uint64_t seed;
  double loss, grad_norm;
  char data[512];
  int32_t replica, data_parallel; /* version 2 */
} dump_head;
_Static_assert(sizeof(dump_head) == 672, "zb_dump.h documents a 672-byte header");
/* version 1 ends before the replica fields */
#define DUMP_HEAD_V1 ((size_t)664)

void zb_dump_name(int iteration, int stage, int replica, char *buf, size_t len) {
  if (replica > 0)
    snprintf(buf, len, "it%d-stage%d-replica%d.dump", iteration, stage, replica);
  else
    snprintf(buf, len, "it%d-stage%d.dump", iteration, stage);
}
_Static_assert(sizeof(zb_dump_tensor) == 56, "zb_dump.h documents 56 bytes per tensor");

/* The tensors' sizes must add up to n (the arrays' length). */
static bool dump_sizes_ok(const zb_dump_tensor *t, int nt, size_t n) {
  size_t sum = 0;
  for (int i = 0; i < nt; i++) {
    if (t[i].rows < 0 || t[i].cols < 0)
      return false;
    sum += (size_t)t[i].rows * (size_t)t[i].cols;
  }
  return sum == n;
}

zb_err zb_dump_save(const zb_roots *roots, const char *path, const zb_dump *d, zb_diag *diag) {
  if (d->n_tensors < 0 || !dump_sizes_ok(d->tensors, d->n_tensors, d->n))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "dump '%s': the tensor sizes do not add up to %zu", path,
                       d->n);
  dump_head h;
  memset(&h, 0, sizeof h);
  memcpy(h.magic, magic, sizeof magic);
  h.version = ZB_DUMP_VERSION;
  h.n_tensors = (uint32_t)d->n_tensors;
  snprintf(h.job_id, sizeof h.job_id, "%s", d->job_id);
  h.iteration = d->iteration;
  h.stage = d->stage;
  h.n_stages = d->n_stages;
  h.rank = d->rank;
  h.microbatches = d->microbatches;
  h.vocab = d->vocab;
  h.hidden = d->hidden;
  h.heads = d->heads;
  h.layers = d->layers;
  h.seq_len = d->seq_len;
  h.batch = d->batch;
  h.flags = d->flags;
  h.seed = d->seed;
  h.loss = d->loss;
  h.grad_norm = d->grad_norm;
  snprintf(h.data, sizeof h.data, "%s", d->data);
  h.replica = d->replica;
  h.data_parallel = d->data_parallel > 0 ? d->data_parallel : 1;
  zb_file_writer w;
  zb_err err = zb_file_begin_in(&w, roots, "dump", path, diag);
  if (err)
    return err;
  zb_file_write(&w, &h, sizeof h);
  for (int t = 0; t < d->n_tensors; t++) {
    zb_dump_tensor row;
    memset(&row, 0, sizeof row); /* no stray bytes after the name */
    snprintf(row.name, sizeof row.name, "%s", d->tensors[t].name);
    row.rows = d->tensors[t].rows;
    row.cols = d->tensors[t].cols;
    zb_file_write(&w, &row, sizeof row);
  }
  size_t bytes = d->n * sizeof(float);
  zb_file_write(&w, d->before, bytes);
  zb_file_write(&w, d->grads, bytes);
  zb_file_write(&w, d->after, bytes);
  return zb_file_commit(&w, diag);
}

void zb_dump_free(zb_dump *d) {
  free(d->tensors);
  free(d->before);
  free(d->grads);
  free(d->after);
  d->tensors = NULL;
  d->before = d->grads = d->after = NULL;
}

/* Tensors and floats a dump may claim: far above any model a worker runs,
 * low enough that a damaged count cannot ask for absurd allocations. */
#define DUMP_MAX_TENSORS 1000000u
#define DUMP_MAX_FLOATS ((size_t)1 << 33)

/* Reads the header of either version into *h (version 1's replica
 * fields: 0 of 1); *head is its size in the file. */
static zb_err dump_read_head(zb_file_reader *r, const char *path, dump_head *h, size_t *head, zb_diag *diag) {
  memset(h, 0, sizeof *h);
  h->data_parallel = 1;
  if (!zb_file_read(r, h, DUMP_HEAD_V1) || memcmp(h->magic, magic, sizeof magic) != 0)
    return zb_diag_set(diag, ZB_ERR_PARSE, "dump '%s': not a zb gradient dump (bad magic)", path);
  if ((h->version != 1 && h->version != ZB_DUMP_VERSION) || h->n_tensors > DUMP_MAX_TENSORS)
    return zb_diag_set(diag, ZB_ERR_PARSE,
                       "dump '%s': version %u with %u tensors; this reads versions 1 to %d", path, h->version,
                       h->n_tensors, ZB_DUMP_VERSION);
  *head = h->version == 1 ? DUMP_HEAD_V1 : sizeof *h;
  if (*head > DUMP_HEAD_V1 && !zb_file_read(r, (char *)h + DUMP_HEAD_V1, *head - DUMP_HEAD_V1))
    return zb_diag_set(diag, ZB_ERR_PARSE, "dump '%s': truncated in the header", path);
  return ZB_OK;
}

zb_err zb_dump_load(const zb_roots *roots, const char *path, zb_dump *out, zb_diag *diag) {
  memset(out, 0, sizeof *out);
  zb_file_reader r;
  zb_err err = zb_file_open_in(&r, roots, "dump", path, diag);
  if (err)
    return err;
  dump_head h;
  size_t head = 0;
  err = dump_read_head(&r, path, &h, &head, diag);
  if (err)
    goto out;
  h.job_id[sizeof h.job_id - 1] = 0;
  h.data[sizeof h.data - 1] = 0;
  memcpy(out->job_id, h.job_id, sizeof out->job_id);
  memcpy(out->data, h.data, sizeof out->data);
  out->iteration = h.iteration;
  out->stage = h.stage;
  out->n_stages = h.n_stages;
  out->rank = h.rank;
  out->microbatches = h.microbatches;
  out->vocab = h.vocab;
  out->hidden = h.hidden;
  out->heads = h.heads;
  out->layers = h.layers;
  out->seq_len = h.seq_len;
  out->batch = h.batch;
  out->flags = h.flags;
  out->seed = h.seed;
  out->loss = h.loss;
  out->grad_norm = h.grad_norm;
  out->replica = h.replica;
  out->data_parallel = h.data_parallel;
  out->n_tensors = (int)h.n_tensors;
  out->tensors = zb_calloc(h.n_tensors ? h.n_tensors : 1, sizeof *out->tensors);
  size_t n = 0;
  for (uint32_t t = 0; t < h.n_tensors; t++) {
    zb_dump_tensor *row = &out->tensors[t];
    if (!zb_file_read(&r, row, sizeof *row)) {
      err = zb_diag_set(diag, ZB_ERR_PARSE, "dump '%s': truncated in the tensor table", path);
      goto out;
    }
    row->name[sizeof row->name - 1] = 0;
    size_t numel = (size_t)row->rows * (size_t)row->cols;
    if (row->rows < 0 || row->cols < 0 || numel > DUMP_MAX_FLOATS - n) {
      err = zb_diag_set(diag, ZB_ERR_PARSE, "dump '%s': tensor '%s' claims %d x %d elements", path, row->name,
                        row->rows, row->cols);
      goto out;
    }
    n += numel;
  }
  out->n = n;
  size_t bytes = n * sizeof(float);
  /* the size must be what the table says before anything that big is allocated */
  struct stat sb;
  uint64_t expect = head + (uint64_t)h.n_tensors * sizeof(zb_dump_tensor) + 3 * (uint64_t)bytes + 8;
  if (fstat(fileno(r.f), &sb) != 0 || (uint64_t)sb.st_size != expect) {
    err = zb_diag_set(diag, ZB_ERR_PARSE, "dump '%s': %lld bytes, its tensor table says %llu", path,
                      (long long)sb.st_size, (unsigned long long)expect);
    goto out;
  }
  out->before = zb_malloc(bytes ? bytes : 1);
  out->grads = zb_malloc(bytes ? bytes : 1);
  out->after = zb_malloc(bytes ? bytes : 1);
  if (!zb_file_read(&r, out->before, bytes) || !zb_file_read(&r, out->grads, bytes) ||
      !zb_file_read(&r, out->after, bytes)) {
    err = zb_diag_set(diag, ZB_ERR_PARSE, "dump '%s': truncated (expected 3 x %zu floats)", path, n);
    goto out;
  }
  if (!zb_file_check_end(&r))
    err = zb_diag_set(diag, ZB_ERR_PARSE, "dump '%s': corrupt (checksum mismatch or trailing bytes)", path);
out:
  zb_file_close(&r);
  if (err)
    zb_dump_free(out);
  return err;
}
