/* safetensors_io.c — safetensors files on disk (zb_safetensors.h): a file's
 * header read with two preads, tensors read in bounded pieces and
 * converted to fp32, and checkpoint directories whose shards
 * (model.safetensors.index.json) are opened only when a tensor in them is
 * asked for. Files are opened by plain path, or beneath a worker's
 * --path-root following no link (zb_roots.h); the parsing is in the pure
 * files beside this one. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zb_alloc.h"
#include "zb_beneath.h"
#include "zb_file.h"
#include "zb_safetensors.h"

/* Bytes read per pread while converting a tensor. */
#define ST_READ_PIECE ((size_t)1 << 20)

static zb_err read_at(int fd, const char *path, void *buf, size_t n, uint64_t at, zb_diag *diag) {
  uint8_t *p = buf;
  while (n) {
    ssize_t r = pread(fd, p, n, (off_t)at);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return zb_diag_set(diag, ZB_ERR_IO, "safetensors %s: read at byte %llu failed: %s", path,
                         (unsigned long long)at, r < 0 ? strerror(errno) : "the file ended");
    p += r, n -= (size_t)r, at += (uint64_t)r;
  }
  return ZB_OK;
}

static zb_err read_table(zb_st_file *f, uint64_t size, zb_diag *diag) {
  uint8_t len8[8];
  uint64_t n;
  zb_diag d = {{0}};
  zb_err err = size < 8 ? ZB_OK : read_at(f->fd, f->path, len8, 8, 0, diag);
  if (err != ZB_OK)
    return err;
  if ((err = zb_st_header_len(len8, size < 8 ? 0 : 8, size, &n, &d)) != ZB_OK)
    return zb_diag_set(diag, err, "%s: %s", f->path, d.msg);
  uint8_t *prefix = zb_malloc((size_t)n + 8);
  memcpy(prefix, len8, 8);
  err = read_at(f->fd, f->path, prefix + 8, (size_t)n, 8, diag);
  if (err == ZB_OK && (err = zb_st_parse_header(prefix, (size_t)n + 8, size, &f->table, &d)) != ZB_OK)
    zb_diag_set(diag, err, "%s: %s", f->path, d.msg);
  free(prefix);
  return err;
}

static zb_err file_open_in(const zb_roots *roots, const char *path, zb_st_file **out, zb_diag *diag) {
  *out = NULL;
  int fd = zb_roots_open(roots, path, O_RDONLY, 0);
  if (fd < 0)
    return zb_diag_set(diag, ZB_ERR_IO, "safetensors %s: cannot open: %s", path, zb_beneath_strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return zb_diag_set(diag, ZB_ERR_IO, "safetensors %s: not a regular file", path);
  }
  zb_st_file *f = zb_calloc(1, sizeof *f);
  f->fd = fd;
  f->path = zb_strdup(path);
  zb_err err = read_table(f, (uint64_t)st.st_size, diag);
  if (err != ZB_OK) {
    zb_st_file_close(f);
    return err;
  }
  *out = f;
  return ZB_OK;
}

zb_err zb_st_file_open(const char *path, zb_st_file **out, zb_diag *diag) {
  return file_open_in(NULL, path, out, diag);
}

void zb_st_file_close(zb_st_file *f) {
  if (!f)
    return;
  close(f->fd);
  zb_st_table_free(f->table);
  free(f->path);
  free(f);
}

zb_err zb_st_file_read_f32(zb_st_file *f, const zb_st_tensor *x, float *dst, size_t n, zb_diag *diag) {
  if (n != x->numel)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "safetensors %s: tensor \"%.100s\" has %llu elements, not %zu", f->path, x->name,
                       (unsigned long long)x->numel, n);
  if (x->dtype != ZB_ST_F32 && x->dtype != ZB_ST_F16 && x->dtype != ZB_ST_BF16)
    return zb_diag_set(
        diag, ZB_ERR_UNSUPPORTED,
        "safetensors %s: tensor \"%.100s\": dtype %s does not convert to fp32 (only F32, F16 and "
        "BF16 do)",
        f->path, x->name, zb_st_dtype_name(x->dtype));
  size_t esize = (size_t)zb_st_dtype_bits(x->dtype) / 8;
  size_t piece = ST_READ_PIECE / esize; /* elements per read */
  uint8_t *buf = zb_malloc(ST_READ_PIECE);
  zb_err err = ZB_OK;
  for (size_t i = 0; i < n && err == ZB_OK; i += piece) {
    size_t k = n - i < piece ? n - i : piece;
    err = read_at(f->fd, f->path, buf, k * esize, x->offset + (uint64_t)i * esize, diag);
    if (err == ZB_OK)
      err = zb_st_decode_f32(x->dtype, buf, k, dst + i, diag);
  }
  free(buf);
  return err;
}

zb_err zb_st_write_file(const char *path, const zb_st_entry *entries, size_t n, zb_diag *diag) {
  uint8_t *img;
  size_t len;
  zb_err err = zb_st_build(entries, n, &img, &len, diag);
  if (err == ZB_OK)
    err = zb_file_write_atomic("safetensors", path, img, len, diag);
  free(img);
  return err;
}

struct zb_st_checkpoint {
  char *dir;
  const zb_roots *roots; /* borrowed; NULL: plain paths */
  zb_st_index *index;    /* NULL: one model.safetensors */
  size_t n_shards;
  const char **shard_names; /* the index's shard_files, or {"model.safetensors"} */
  zb_st_file **shards;      /* parallel; NULL until first used */
};

static char *join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = zb_malloc(n);
  snprintf(p, n, "%s/%s", dir, name);
  return p;
}

static zb_err open_index(zb_st_checkpoint *c, const char *path, zb_diag *diag) {
  uint8_t *text;
  size_t len;
  zb_diag d = {{0}};
  zb_err err = zb_file_slurp_in(c->roots, "safetensors index", path, &text, &len, diag);
  if (err != ZB_OK)
    return err;
  if ((err = zb_st_index_parse((const char *)text, len, &c->index, &d)) != ZB_OK)
    zb_diag_set(diag, err, "%s: %s", path, d.msg);
  free(text);
  if (err == ZB_OK) {
    c->n_shards = c->index->n_files;
    c->shard_names = c->index->shard_files;
  }
  return err;
}

/* Beneath a root, the directory itself first: a link or a path under no
 * root is named as such, not as a directory holding neither file. */
static zb_err check_dir(const zb_roots *roots, const char *dir, zb_diag *diag) {
  if (!zb_roots_on(roots))
    return ZB_OK;
  int fd = zb_roots_open(roots, dir, O_RDONLY | O_DIRECTORY, 0);
  if (fd < 0)
    return zb_diag_set(diag, ZB_ERR_IO, "safetensors %s: cannot open: %s", dir, zb_beneath_strerror(errno));
  close(fd);
  return ZB_OK;
}

/* Which layout dir holds: the index (read now) or one model.safetensors.
 * Beneath a root the files are lstat'ed: a link is found here and refused
 * when it is opened, naming it. */
static zb_err find_layout(zb_st_checkpoint *c, zb_diag *diag) {
  static const char *single[] = {"model.safetensors"};
  char *ipath = join(c->dir, "model.safetensors.index.json"), *spath = join(c->dir, single[0]);
  struct stat st;
  zb_err err = ZB_OK;
  if (zb_roots_stat(c->roots, ipath, &st) == 0)
    err = open_index(c, ipath, diag);
  else if (zb_roots_stat(c->roots, spath, &st) == 0)
    c->n_shards = 1, c->shard_names = single;
  else
    err = zb_diag_set(diag, ZB_ERR_IO,
                      "safetensors: %s holds neither model.safetensors.index.json nor "
                      "model.safetensors",
                      c->dir);
  free(ipath);
  free(spath);
  return err;
}

zb_err zb_st_checkpoint_open_in(const zb_roots *roots, const char *dir, zb_st_checkpoint **out,
                                zb_diag *diag) {
  *out = NULL;
  zb_err err = check_dir(roots, dir, diag);
  if (err != ZB_OK)
    return err;
  zb_st_checkpoint *c = zb_calloc(1, sizeof *c);
  c->dir = zb_strdup(dir);
  c->roots = roots;
  if ((err = find_layout(c, diag)) != ZB_OK) {
    zb_st_checkpoint_close(c);
    return err;
  }
  c->shards = zb_calloc(c->n_shards + 1, sizeof *c->shards);
  *out = c;
  return ZB_OK;
}

zb_err zb_st_checkpoint_open(const char *dir, zb_st_checkpoint **out, zb_diag *diag) {
  return zb_st_checkpoint_open_in(NULL, dir, out, diag);
}

void zb_st_checkpoint_close(zb_st_checkpoint *c) {
  if (!c)
    return;
  for (size_t i = 0; c->shards && i < c->n_shards; i++)
    zb_st_file_close(c->shards[i]);
  free(c->shards);
  zb_st_index_free(c->index);
  free(c->dir);
  free(c);
}

/* The open shard holding name, opened now if it was not. */
static zb_err shard_of(zb_st_checkpoint *c, const char *name, zb_st_file **out, zb_diag *diag) {
  const char *file = c->index ? zb_st_index_file(c->index, name) : c->shard_names[0];
  if (!file)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "safetensors %s: tensor \"%.100s\" is not in the index",
                       c->dir, name);
  size_t i = 0;
  while (strcmp(c->shard_names[i], file) != 0) /* present: the list holds every file of the index */
    i++;
  if (!c->shards[i]) {
    char *path = join(c->dir, file);
    zb_err err = file_open_in(c->roots, path, &c->shards[i], diag);
    free(path);
    if (err != ZB_OK)
      return err;
  }
  *out = c->shards[i];
  return ZB_OK;
}

zb_err zb_st_checkpoint_find(zb_st_checkpoint *c, const char *name, const zb_st_tensor **out, zb_diag *diag) {
  zb_st_file *f;
  *out = NULL;
  zb_err err = shard_of(c, name, &f, diag);
  if (err != ZB_OK)
    return err;
  *out = zb_st_find(f->table, name);
  if (!*out)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "safetensors %s: no tensor \"%.100s\"%s", f->path, name,
                       c->index ? " (the index says it is here)" : "");
  return ZB_OK;
}

zb_err zb_st_checkpoint_read_f32(zb_st_checkpoint *c, const char *name, float *dst, size_t n, zb_diag *diag) {
  const zb_st_tensor *x;
  zb_err err = zb_st_checkpoint_find(c, name, &x, diag);
  if (err != ZB_OK)
    return err;
  zb_st_file *f;
  shard_of(c, name, &f, NULL); /* open already: find opened it */
  return zb_st_file_read_f32(f, x, dst, n, diag);
}

size_t zb_st_checkpoint_open_shards(const zb_st_checkpoint *c) {
  size_t k = 0;
  for (size_t i = 0; i < c->n_shards; i++)
    k += c->shards[i] != NULL;
  return k;
}
