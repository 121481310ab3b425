/* roots.c — see zb_roots.h. */
#define _GNU_SOURCE /* O_PATH, realpath */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zb_beneath.h"
#include "zb_roots.h"

bool zb_path_has_dots(const char *path) {
  for (const char *p = path; *p;) {
    while (*p == '/')
      p++;
    size_t n = strcspn(p, "/");
    if ((n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
      return true;
    p += n;
  }
  return false;
}

zb_err zb_roots_add(zb_roots *rs, const char *dir, zb_diag *diag) {
  if (rs->n == ZB_ROOTS_MAX)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "--path-root: at most %d", ZB_ROOTS_MAX);
  zb_root *r = &rs->root[rs->n];
  char real[PATH_MAX];
  if (!realpath(dir, real))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "--path-root %s: %s", dir, strerror(errno));
  if (strlen(real) >= sizeof r->real || strlen(dir) >= sizeof r->given)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "--path-root %s: longer than %zu characters", dir,
                       sizeof r->real - 1);
  int fd = open(real, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "--path-root %s: %s", dir, strerror(errno));
  r->fd = fd;
  memcpy(r->real, real, strlen(real) + 1); /* both lengths checked above */
  /* the name it was given, when that is another plain one (a link above
   * the root, followed once here): job specs may name paths either way */
  const char *given = dir[0] == '/' && !zb_path_has_dots(dir) && strcmp(dir, real) ? dir : "";
  memcpy(r->given, given, strlen(given) + 1);
  rs->n++;
  return ZB_OK;
}

void zb_roots_close(zb_roots *rs) {
  for (int k = 0; k < rs->n; k++)
    close(rs->root[k].fd);
  rs->n = 0;
}

/* path's rest below root, both absolute, by their components (empty ones
 * skipped): NULL when root's components do not start path's. */
static const char *below(const char *path, const char *root) {
  const char *p = path, *r = root;
  for (;;) {
    while (*r == '/')
      r++;
    while (*p == '/')
      p++;
    if (!*r)
      return p;
    size_t n = strcspn(r, "/");
    if (strncmp(p, r, n) != 0 || (p[n] != '/' && p[n] != '\0'))
      return NULL;
    p += n;
    r += n;
  }
}

bool zb_roots_find(const zb_roots *rs, const char *path, int *root_fd, const char **rel) {
  if (path[0] != '/')
    return false;
  for (int k = 0; k < rs->n; k++) {
    const zb_root *r = &rs->root[k];
    const char *rest = below(path, r->real);
    if (!rest && r->given[0])
      rest = below(path, r->given);
    if (rest) {
      *root_fd = r->fd;
      *rel = rest;
      return true;
    }
  }
  return false;
}

/* The root and rest of path, or -1 with EXDEV (under no root). */
static int locate(const zb_roots *rs, const char *path, int *root_fd, const char **rel) {
  if (zb_roots_find(rs, path, root_fd, rel))
    return 0;
  errno = EXDEV;
  return -1;
}

int zb_roots_open(const zb_roots *rs, const char *path, int flags, mode_t mode) {
  if (!zb_roots_on(rs))
    return open(path, flags | O_CLOEXEC, mode);
  int root_fd;
  const char *rel;
  if (locate(rs, path, &root_fd, &rel) != 0)
    return -1;
  return zb_beneath_open(root_fd, rel, flags, mode);
}

int zb_roots_open_dir(const zb_roots *rs, const char *path, const char **leaf) {
  const char *from = path; /* what the directory's name is read from */
  int root_fd = AT_FDCWD;
  if (zb_roots_on(rs) && locate(rs, path, &root_fd, &from) != 0)
    return -1;
  const char *slash = strrchr(from, '/');
  *leaf = slash ? slash + 1 : from;
  if (!**leaf) { /* "dir/" or the root itself: no file named */
    errno = EISDIR;
    return -1;
  }
  char dir[PATH_MAX];
  size_t n = slash ? (size_t)(slash - from) : 0;
  if (n >= sizeof dir) {
    errno = ENAMETOOLONG;
    return -1;
  }
  memcpy(dir, from, n);
  dir[n] = 0;
  if (zb_roots_on(rs)) /* dir "": the root itself */
    return zb_beneath_open(root_fd, dir, O_RDONLY | O_DIRECTORY, 0);
  return open(slash == from ? "/" : n ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

/* mkdir -p on the path itself (roots off): mkdir(2) of each prefix. */
static int mkdirs_plain(const char *dir) {
  char buf[PATH_MAX];
  if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf) {
    errno = ENAMETOOLONG;
    return -1;
  }
  for (char *p = buf + (buf[0] == '/');; p++) {
    if (*p == '/' || *p == 0) {
      char c = *p;
      *p = 0;
      if (buf[0] && mkdir(buf, 0755) != 0 && errno != EEXIST)
        return -1;
      *p = c;
      if (!c)
        return 0;
    }
  }
}

int zb_roots_mkdirs(const zb_roots *rs, const char *dir) {
  if (!zb_roots_on(rs))
    return mkdirs_plain(dir);
  int root_fd;
  const char *rel;
  if (locate(rs, dir, &root_fd, &rel) != 0)
    return -1;
  return zb_beneath_mkdirs(root_fd, rel, 0755);
}

int zb_roots_stat(const zb_roots *rs, const char *path, struct stat *sb) {
  if (!zb_roots_on(rs))
    return stat(path, sb);
  const char *leaf;
  int dfd = zb_roots_open_dir(rs, path, &leaf);
  if (dfd < 0)
    return -1;
  int rc = fstatat(dfd, leaf, sb, AT_SYMLINK_NOFOLLOW);
  int saved = errno;
  close(dfd);
  errno = saved;
  return rc;
}

/* unlinkat(2) of path's leaf on its directory's descriptor (flags 0 or
 * AT_REMOVEDIR). */
static int roots_unlinkat(const zb_roots *rs, const char *path, int flags) {
  if (!zb_roots_on(rs))
    return flags & AT_REMOVEDIR ? rmdir(path) : unlink(path);
  const char *leaf;
  int dfd = zb_roots_open_dir(rs, path, &leaf);
  if (dfd < 0)
    return -1;
  int rc = unlinkat(dfd, leaf, flags);
  int saved = errno;
  close(dfd);
  errno = saved;
  return rc;
}

int zb_roots_unlink(const zb_roots *rs, const char *path) {
  return roots_unlinkat(rs, path, 0);
}

int zb_roots_rmdir(const zb_roots *rs, const char *path) {
  return roots_unlinkat(rs, path, AT_REMOVEDIR);
}

/* link (true) or rename from into to, on their directories' descriptors. */
static int between(const zb_roots *rs, const char *from, const char *to, bool link) {
  const char *lf, *lt;
  int df = zb_roots_open_dir(rs, from, &lf);
  if (df < 0)
    return -1;
  int dt = zb_roots_open_dir(rs, to, &lt), rc = -1;
  if (dt >= 0)
    rc = link ? linkat(df, lf, dt, lt, 0) : renameat(df, lf, dt, lt);
  int saved = errno;
  close(df);
  if (dt >= 0)
    close(dt);
  errno = saved;
  return rc;
}

int zb_roots_link(const zb_roots *rs, const char *from, const char *to) {
  return zb_roots_on(rs) ? between(rs, from, to, true) : link(from, to);
}

int zb_roots_rename(const zb_roots *rs, const char *from, const char *to) {
  return zb_roots_on(rs) ? between(rs, from, to, false) : rename(from, to);
}
