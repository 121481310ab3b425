/* checkpoint.c — see zb_checkpoint.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zb_alloc.h"
#include "zb_checkpoint.h"

static const char magic[8] = {'Z', 'B', 'C', 'K', 'P', 'T', 0, 1};

typedef struct ckpt_head {
  char magic[8];
  uint32_t version, pad0;
  char job_id[64];
  int32_t stage, iteration;
  int64_t steps;
  uint32_t n_tensors, pad1;
} ckpt_head;

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++)
    h = (h ^ b[i]) * 1099511628211ULL;
  return h;
}
#define FNV_START 1469598103934665603ULL

/* Writes all n bytes (write may write fewer) and folds them into *h. */
static int write_all(int fd, const void *p, size_t n, uint64_t *h) {
  *h = fnv(*h, p, n);
  const char *c = p;
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

static int read_all(FILE *f, void *p, size_t n, uint64_t *h) {
  if (fread(p, 1, n, f) != n)
    return -1;
  *h = fnv(*h, p, n);
  return 0;
}

zb_err zb_ckpt_mkdirs(const char *dir, zb_diag *diag) {
  char buf[1024];
  if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "checkpoint directory '%.100s...': too long", dir);
  for (char *p = buf + 1;; p++) {
    if (*p == '/' || *p == 0) {
      char c = *p;
      *p = 0;
      if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return zb_diag_set(diag, ZB_ERR_IO, "checkpoint directory '%s': %s", buf, strerror(errno));
      *p = c;
      if (!c)
        break;
    }
  }
  return ZB_OK;
}

zb_err zb_ckpt_save(const char *path, const zb_ckpt *c, zb_diag *diag) {
  char tmp[1100], dir[1100];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash)
    slash[slash == dir ? 1 : 0] = 0;
  else
    snprintf(dir, sizeof dir, ".");
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return zb_diag_set(diag, ZB_ERR_IO, "checkpoint '%s': cannot create: %s", tmp, strerror(errno));
  ckpt_head h;
  memset(&h, 0, sizeof h);
  memcpy(h.magic, magic, sizeof magic);
  h.version = ZB_CKPT_VERSION;
  snprintf(h.job_id, sizeof h.job_id, "%s", c->job_id);
  h.stage = c->stage;
  h.iteration = c->iteration;
  h.steps = c->steps;
  h.n_tensors = (uint32_t)c->n_tensors;
  uint64_t sum = FNV_START;
  size_t bytes = c->n * sizeof(float);
  bool ok = write_all(fd, &h, sizeof h, &sum) == 0 &&
            write_all(fd, c->sizes, sizeof(uint64_t) * (size_t)c->n_tensors, &sum) == 0 &&
            write_all(fd, c->params, bytes, &sum) == 0 && write_all(fd, c->m, bytes, &sum) == 0 &&
            write_all(fd, c->v, bytes, &sum) == 0;
  uint64_t trailer = sum, ignored = 0;
  ok = ok && write_all(fd, &trailer, sizeof trailer, &ignored) == 0;
  /* the data must be on disk before the rename makes it the checkpoint */
  ok = ok && fsync(fd) == 0;
  int saved = errno;
  if (close(fd) != 0 && ok) {
    ok = false;
    saved = errno;
  }
  if (!ok || rename(tmp, path) != 0) {
    if (ok)
      saved = errno;
    unlink(tmp);
    return zb_diag_set(diag, ZB_ERR_IO, "checkpoint '%s': cannot write: %s", path, strerror(saved));
  }
  /* and the rename itself must survive a crash: fsync the directory */
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0 || fsync(dfd) != 0) {
    saved = errno;
    if (dfd >= 0)
      close(dfd);
    return zb_diag_set(diag, ZB_ERR_IO, "checkpoint '%s': cannot sync directory '%s': %s", path, dir,
                       strerror(saved));
  }
  close(dfd);
  return ZB_OK;
}

zb_err zb_ckpt_load(const char *path, zb_ckpt *c, zb_diag *diag) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return zb_diag_set(diag, ZB_ERR_IO, "checkpoint '%s': cannot open: %s", path, strerror(errno));
  zb_err err = ZB_OK;
  uint64_t sum = FNV_START, *sizes = NULL;
  ckpt_head h;
  if (read_all(f, &h, sizeof h, &sum) != 0 || memcmp(h.magic, magic, sizeof magic) != 0) {
    err = zb_diag_set(diag, ZB_ERR_PARSE, "checkpoint '%s': not a zb checkpoint (bad magic)", path);
    goto out;
  }
  if (h.version != ZB_CKPT_VERSION) {
    err = zb_diag_set(diag, ZB_ERR_PARSE, "checkpoint '%s': version %u, this worker reads %d", path,
                      h.version, ZB_CKPT_VERSION);
    goto out;
  }
  h.job_id[sizeof h.job_id - 1] = 0;
  if (strcmp(h.job_id, c->job_id) != 0 || h.stage != c->stage) {
    err = zb_diag_set(diag, ZB_ERR_PARSE, "checkpoint '%s': holds job %s stage %d, expected job %s stage %d",
                      path, h.job_id, h.stage, c->job_id, c->stage);
    goto out;
  }
  if (h.n_tensors != (uint32_t)c->n_tensors || h.iteration < 0 || h.steps < 0) {
    err = zb_diag_set(diag, ZB_ERR_PARSE,
                      "checkpoint '%s': %u tensors, iteration %d, %lld steps; the model has %d tensors", path,
                      h.n_tensors, h.iteration, (long long)h.steps, c->n_tensors);
    goto out;
  }
  sizes = zb_malloc(sizeof(uint64_t) * (h.n_tensors ? h.n_tensors : 1));
  if (read_all(f, sizes, sizeof(uint64_t) * h.n_tensors, &sum) != 0) {
    err = zb_diag_set(diag, ZB_ERR_PARSE, "checkpoint '%s': truncated in the tensor sizes", path);
    goto out;
  }
  for (uint32_t t = 0; t < h.n_tensors; t++)
    if (sizes[t] != c->sizes[t]) {
      err = zb_diag_set(diag, ZB_ERR_PARSE, "checkpoint '%s': tensor %u has %llu elements, the model's %llu",
                        path, t, (unsigned long long)sizes[t], (unsigned long long)c->sizes[t]);
      goto out;
    }
  size_t bytes = c->n * sizeof(float);
  uint64_t trailer, ignored = 0;
  if (read_all(f, c->params, bytes, &sum) != 0 || read_all(f, c->m, bytes, &sum) != 0 ||
      read_all(f, c->v, bytes, &sum) != 0 || read_all(f, &trailer, sizeof trailer, &ignored) != 0) {
    err = zb_diag_set(diag, ZB_ERR_PARSE, "checkpoint '%s': truncated (expected %zu parameters)", path, c->n);
    goto out;
  }
  if (trailer != sum || fgetc(f) != EOF) {
    err = zb_diag_set(diag, ZB_ERR_PARSE, "checkpoint '%s': corrupt (checksum mismatch or trailing bytes)",
                      path);
    goto out;
  }
  c->iteration = h.iteration;
  c->steps = h.steps;
out:
  free(sizes);
  fclose(f);
  return err;
}
