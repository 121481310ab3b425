/* file.c — see zb_file.h. */
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

#define FNV_START 1469598103934665603ULL

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++)
    h = (h ^ b[i]) * 1099511628211ULL;
  return h;
}

zb_err zb_file_begin(zb_file_writer *w, const char *what, const char *path, zb_diag *diag) {
  return zb_file_begin_in(w, NULL, what, path, diag);
}

zb_err zb_file_begin_in(zb_file_writer *w, const zb_roots *roots, const char *what, const char *path,
                        zb_diag *diag) {
  memset(w, 0, sizeof *w);
  w->what = what;
  w->sum = FNV_START;
  w->fd = w->dirfd = -1;
  w->confined = zb_roots_on(roots);
  if (snprintf(w->path, sizeof w->path, "%s", path) >= (int)sizeof w->path)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "%s '%.100s...': path too long", what, path);
  snprintf(w->tmp, sizeof w->tmp, "%s.tmp.%d", path, (int)getpid());
  const char *leaf;
  w->dirfd = zb_roots_open_dir(roots, w->path, &leaf);
  if (w->dirfd < 0)
    return zb_diag_set(diag, ZB_ERR_IO, "%s '%s': cannot open its directory: %s", what, path,
                       zb_beneath_strerror(errno));
  w->leaf_at = (size_t)(leaf - w->path);
  int nofollow = w->confined ? O_NOFOLLOW : 0;
  w->fd = openat(w->dirfd, w->tmp + w->leaf_at, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | nofollow, 0644);
  if (w->fd < 0) {
    int saved = errno;
    close(w->dirfd);
    w->dirfd = -1;
    return zb_diag_set(diag, ZB_ERR_IO, "%s '%s': cannot create: %s", what, w->tmp,
                       zb_beneath_strerror(saved));
  }
  return ZB_OK;
}

void zb_file_write(zb_file_writer *w, const void *p, size_t n) {
  if (w->failed)
    return;
  if (!w->plain) /* a plain file has no checksum trailer */
    w->sum = fnv(w->sum, p, n);
  const char *c = p;
  while (n > 0) { /* write may write fewer bytes than asked */
    ssize_t got = write(w->fd, c, n);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0) {
      w->failed = true;
      w->saved_errno = got < 0 ? errno : EIO;
      return;
    }
    c += got;
    n -= (size_t)got;
  }
}

/* Closes the writer's directory; ends it. */
static void writer_end(zb_file_writer *w) {
  if (w->dirfd >= 0)
    close(w->dirfd);
  w->dirfd = -1;
}

void zb_file_abort(zb_file_writer *w) {
  if (w->fd >= 0) {
    close(w->fd);
    unlinkat(w->dirfd, w->tmp + w->leaf_at, 0);
  }
  w->fd = -1;
  writer_end(w);
}

zb_err zb_file_commit(zb_file_writer *w, zb_diag *diag) {
  uint64_t trailer = w->sum;
  if (!w->plain)
    zb_file_write(w, &trailer, sizeof trailer);
  /* the data must be on disk before the rename makes it the file */
  if (!w->failed && fsync(w->fd) != 0) {
    w->failed = true;
    w->saved_errno = errno;
  }
  if (close(w->fd) != 0 && !w->failed) {
    w->failed = true;
    w->saved_errno = errno;
  }
  w->fd = -1;
  /* both names in the directory reached at begin: nothing is resolved again */
  if (!w->failed && renameat(w->dirfd, w->tmp + w->leaf_at, w->dirfd, w->path + w->leaf_at) != 0) {
    w->failed = true;
    w->saved_errno = errno;
  }
  if (w->failed) {
    unlinkat(w->dirfd, w->tmp + w->leaf_at, 0);
    writer_end(w);
    return zb_diag_set(diag, ZB_ERR_IO, "%s '%s': cannot write: %s", w->what, w->path,
                       zb_beneath_strerror(w->saved_errno));
  }
  /* and the rename itself must survive a crash: fsync the directory */
  int rc = fsync(w->dirfd), saved = errno;
  writer_end(w);
  if (rc != 0)
    return zb_diag_set(diag, ZB_ERR_IO, "%s '%s': cannot sync its directory: %s", w->what, w->path,
                       strerror(saved));
  return ZB_OK;
}

/* path opened for reading as a stream (beneath its root when roots are
 * on); NULL with errno. */
static FILE *open_read(const zb_roots *roots, const char *path) {
  int fd = zb_roots_open(roots, path, O_RDONLY, 0);
  FILE *f = fd < 0 ? NULL : fdopen(fd, "rb");
  if (fd >= 0 && !f) {
    int saved = errno;
    close(fd);
    errno = saved;
  }
  return f;
}

zb_err zb_file_open(zb_file_reader *r, const char *what, const char *path, zb_diag *diag) {
  return zb_file_open_in(r, NULL, what, path, diag);
}

zb_err zb_file_open_in(zb_file_reader *r, const zb_roots *roots, const char *what, const char *path,
                       zb_diag *diag) {
  r->sum = FNV_START;
  r->f = open_read(roots, path);
  if (!r->f)
    return zb_diag_set(diag, ZB_ERR_IO, "%s '%s': cannot open: %s", what, path, zb_beneath_strerror(errno));
  return ZB_OK;
}

bool zb_file_read(zb_file_reader *r, void *p, size_t n) {
  if (fread(p, 1, n, r->f) != n)
    return false;
  r->sum = fnv(r->sum, p, n);
  return true;
}

bool zb_file_check_end(zb_file_reader *r) {
  uint64_t expect = r->sum, trailer;
  return fread(&trailer, 1, sizeof trailer, r->f) == sizeof trailer && trailer == expect &&
         fgetc(r->f) == EOF;
}

void zb_file_close(zb_file_reader *r) {
  if (r->f)
    fclose(r->f);
  r->f = NULL;
}

zb_err zb_file_slurp(const char *what, const char *path, uint8_t **out, size_t *len, zb_diag *diag) {
  return zb_file_slurp_in(NULL, what, path, out, len, diag);
}

zb_err zb_file_slurp_in(const zb_roots *roots, const char *what, const char *path, uint8_t **out, size_t *len,
                        zb_diag *diag) {
  bool is_stdin = strcmp(path, "-") == 0;
  FILE *f = is_stdin ? stdin : open_read(roots, path);
  if (!f)
    return zb_diag_set(diag, ZB_ERR_IO, "%s: cannot open '%s': %s", what, path, zb_beneath_strerror(errno));
  size_t cap = 1 << 16, n = 0;
  uint8_t *buf = zb_malloc(cap);
  size_t got;
  while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) { /* one byte kept for the NUL */
    n += got;
    if (cap - n - 1 == 0)
      buf = zb_realloc(buf, cap *= 2);
  }
  bool failed = ferror(f);
  int saved = errno;
  if (!is_stdin)
    fclose(f);
  if (failed) {
    free(buf);
    return zb_diag_set(diag, ZB_ERR_IO, "%s: cannot read '%s': %s", what, path, strerror(saved));
  }
  buf[n] = 0;
  *out = buf;
  *len = n;
  return ZB_OK;
}

zb_err zb_file_write_atomic(const char *what, const char *path, const void *data, size_t len, zb_diag *diag) {
  return zb_file_write_atomic_in(NULL, what, path, data, len, diag);
}

zb_err zb_file_write_atomic_in(const zb_roots *roots, const char *what, const char *path, const void *data,
                               size_t len, zb_diag *diag) {
  zb_file_writer w;
  zb_err err = zb_file_begin_in(&w, roots, what, path, diag);
  if (err)
    return err;
  w.plain = true;
  zb_file_write(&w, data, len);
  return zb_file_commit(&w, diag);
}

zb_err zb_file_mkdirs(const char *what, const char *dir, zb_diag *diag) {
  return zb_file_mkdirs_in(NULL, what, dir, diag);
}

zb_err zb_file_mkdirs_in(const zb_roots *roots, const char *what, const char *dir, zb_diag *diag) {
  if (strlen(dir) >= 1024)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "%s directory '%.100s...': too long", what, dir);
  if (zb_roots_mkdirs(roots, dir) != 0)
    return zb_diag_set(diag, ZB_ERR_IO, "%s directory '%s': %s", what, dir, zb_beneath_strerror(errno));
  return ZB_OK;
}
