/* zb_roots.h — the directories a process may touch files under (a
 * worker's --path-root, docs/operations.md, Security), each held open
 * from start, and the file operations that stay beneath them.
 *
 * With roots on (a set with at least one), an absolute path is matched to
 * a root by its name: it must start with the root's real path (resolved
 * when it was added) or with the name it was added by; the rest is
 * opened beneath the root's descriptor (zb_beneath.h), every time, so a
 * symbolic link put anywhere below a root later is refused (ELOOP) rather
 * than followed. A path under no root is EXDEV. Directories are created,
 * and files renamed, linked and removed, by the *at calls on the
 * descriptor of their directory reached the same way.
 *
 * With roots off (NULL or empty) every function is the plain call on the
 * path (symbolic links followed): behaviour without --path-root.
 *
 * Results: a descriptor, or 0, or -1 with errno (zb_beneath_strerror
 * explains it); callers name the path in their messages.
 * Ownership: a zb_roots is its owner's; zb_roots_close closes what it
 * holds. Used read-only once filled, so threads may share it. */
#ifndef ZB_ROOTS_H
#define ZB_ROOTS_H

#include <stdbool.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "zb_err.h"

enum { ZB_ROOTS_MAX = 16 };

typedef struct zb_root {
  int fd;          /* the directory, O_PATH, held for the set's life */
  char real[512];  /* its real path when added */
  char given[512]; /* the absolute name it was added by; "" when that is real or not plain */
} zb_root;

typedef struct zb_roots {
  zb_root root[ZB_ROOTS_MAX];
  int n;
} zb_roots;

/* Adds dir (it must exist and be a directory). ZB_ERR_INVALID_ARG names
 * dir when it cannot be, or the set is full. */
zb_err zb_roots_add(zb_roots *rs, const char *dir, zb_diag *diag);
/* Whether path has a "." or ".." component. Pure. */
bool zb_path_has_dots(const char *path);
void zb_roots_close(zb_roots *rs);

static inline bool zb_roots_on(const zb_roots *rs) {
  return rs && rs->n > 0;
}

/* The root path is named under: its descriptor and the rest of path
 * below it (*rel points into path; "" for the root itself). False when
 * path is under none (or is not absolute). */
bool zb_roots_find(const zb_roots *rs, const char *path, int *root_fd, const char **rel);

/* open(2) of path, beneath its root when roots are on. */
int zb_roots_open(const zb_roots *rs, const char *path, int flags, mode_t mode);
/* Opens the directory path is in (O_RDONLY, so it can be fsynced) and
 * points *leaf at path's last component, for the *at calls. */
int zb_roots_open_dir(const zb_roots *rs, const char *path, const char **leaf);
/* mkdir -p of dir (mode 0755), beneath its root when roots are on:
 * mkdirat of each missing component on the directory reached so far. */
int zb_roots_mkdirs(const zb_roots *rs, const char *dir);
/* lstat(2) when roots are on (a link is not followed), stat(2) when off. */
int zb_roots_stat(const zb_roots *rs, const char *path, struct stat *sb);
int zb_roots_unlink(const zb_roots *rs, const char *path);
/* rmdir(2): an empty directory. */
int zb_roots_rmdir(const zb_roots *rs, const char *path);
/* link(2) (a hard link; from is not followed) and rename(2). */
int zb_roots_link(const zb_roots *rs, const char *from, const char *to);
int zb_roots_rename(const zb_roots *rs, const char *from, const char *to);

#endif
