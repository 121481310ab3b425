/* tokens_io.c — the file part of zb_tokens.h: the shards of a glob (or one
 * text file) opened read-only and mapped, their headers validated, then
 * handed to the pure dataset of tokens.c. Mapping, not reading: a rank
 * touches only the pages of the windows it draws, and ranks on one host
 * share the page cache. With a worker's --path-root (zb_roots.h) every
 * file and the glob's directory are opened beneath the root, following no
 * symbolic link (docs/model.md, Token data). */
#define _GNU_SOURCE /* fnmatch's FNM_PERIOD */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokens_internal.h"
#include "zb_alloc.h"
#include "zb_beneath.h"
#include "zb_roots.h"

/* At most this many files in one dataset. */
#define MAX_SHARDS 1000000

typedef struct maps {
  int n;
  void **at;
  size_t *len;
} maps;

static void maps_release(void *ctx) {
  maps *m = ctx;
  for (int i = 0; i < m->n; i++)
    if (m->at[i])
      munmap(m->at[i], m->len[i]);
  free(m->at);
  free(m->len);
  free(m);
}

/* Maps path read-only (*at NULL for an empty file), opened beneath its
 * root when roots are on. */
static zb_err map_file(const zb_roots *roots, const char *path, void **at, size_t *len, zb_diag *diag) {
  *at = NULL;
  *len = 0;
  int fd = zb_roots_open(roots, path, O_RDONLY, 0);
  if (fd < 0)
    return zb_diag_set(diag, ZB_ERR_IO, "%s: cannot open: %s", path, zb_beneath_strerror(errno));
  struct stat st;
  zb_err err = ZB_OK;
  if (fstat(fd, &st) != 0)
    err = zb_diag_set(diag, ZB_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
  else if (!S_ISREG(st.st_mode))
    err = zb_diag_set(diag, ZB_ERR_IO, "%s: not a regular file", path);
  else if (st.st_size > 0) {
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED)
      err = zb_diag_set(diag, ZB_ERR_IO, "%s: cannot map %lld bytes: %s", path, (long long)st.st_size,
                        strerror(errno));
    else {
      *at = p;
      *len = (size_t)st.st_size;
    }
  }
  close(fd);
  return err;
}

/* A shard's source: its header checked against its size. */
static zb_err shard_source(const char *path, const void *at, size_t len, zb_tokens_source *s, zb_diag *diag) {
  zb_tokens_header h;
  zb_err err = zb_tokens_parse_header(at, len, len, path, &h, diag);
  if (err)
    return err;
  *s = (zb_tokens_source){
      .name = path, .data = (const uint8_t *)at + ZB_TOKENS_HEADER_BYTES, .count = h.count, .width = h.width};
  return ZB_OK;
}

/* The paths of a dataset, sorted (owned). */
typedef struct path_list {
  char **v;
  size_t n, cap;
} path_list;

static void paths_add(path_list *pl, char *path) {
  if (pl->n == pl->cap) {
    pl->cap = pl->cap ? 2 * pl->cap : 16;
    pl->v = zb_realloc(pl->v, pl->cap * sizeof *pl->v);
  }
  pl->v[pl->n++] = path;
}

static void paths_free(path_list *pl) {
  for (size_t i = 0; i < pl->n; i++)
    free(pl->v[i]);
  free(pl->v);
}

static int by_strcmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* pattern's matches by glob(3), plain paths (symbolic links followed). */
static zb_err glob_plain(const char *pattern, path_list *pl, zb_diag *diag) {
  glob_t g;
  memset(&g, 0, sizeof g);
  /* No GLOB_ERR: a missing or unreadable directory is no match. */
  int rc = glob(pattern, 0, NULL, &g);
  zb_err err = ZB_OK;
  if (rc != 0 && rc != GLOB_NOMATCH)
    err = zb_diag_set(diag, ZB_ERR_IO, "tokens: cannot glob '%s'%s", pattern,
                      rc == GLOB_NOSPACE ? " (out of memory)" : "");
  for (size_t i = 0; rc == 0 && i < g.gl_pathc; i++)
    paths_add(pl, zb_strdup(g.gl_pathv[i]));
  globfree(&g);
  return err;
}

/* pattern's matches beneath a root: its directory (no wildcard there) is
 * opened beneath the root, following no link, and its entries are matched
 * by fnmatch as glob(3) would (a leading '.' only explicitly). */
static zb_err glob_beneath(const zb_roots *roots, const char *pattern, path_list *pl, zb_diag *diag) {
  const char *slash = strrchr(pattern, '/');
  const char *leaf = slash ? slash + 1 : pattern;
  size_t dlen = slash ? (size_t)(slash - pattern) : 0;
  char *dir = zb_malloc(dlen + 2);
  memcpy(dir, pattern, dlen);
  snprintf(dir + dlen, 2, "%s", slash == pattern ? "/" : slash ? "" : "."); /* "/x": "/"; "x": "." */
  if (strpbrk(dir, "*?[\\")) {
    free(dir);
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "tokens: '%s': beneath --path-root only the file name may hold wildcards", pattern);
  }
  int fd = zb_roots_open(roots, dir, O_RDONLY | O_DIRECTORY, 0);
  DIR *d = fd < 0 ? NULL : fdopendir(fd);
  zb_err err = ZB_OK;
  if (!d) {
    err = zb_diag_set(diag, ZB_ERR_IO, "tokens: cannot list %s (for '%s'): %s", dir, pattern,
                      zb_beneath_strerror(errno));
    if (fd >= 0)
      close(fd);
  }
  for (struct dirent *e; d && (e = readdir(d));) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 || fnmatch(leaf, e->d_name, FNM_PERIOD))
      continue;
    size_t n = strlen(pattern) + strlen(e->d_name) + 2;
    char *path = zb_malloc(n);
    snprintf(path, n, "%.*s%s%s", (int)dlen, pattern, slash ? "/" : "", e->d_name);
    paths_add(pl, path);
  }
  if (d)
    closedir(d);
  free(dir);
  return err;
}

/* The sorted paths of pattern's matches. */
static zb_err glob_paths(const zb_roots *roots, const char *pattern, path_list *pl, zb_diag *diag) {
  zb_err err = zb_roots_on(roots) ? glob_beneath(roots, pattern, pl, diag) : glob_plain(pattern, pl, diag);
  if (err)
    return err;
  if (pl->n == 0)
    return zb_diag_set(diag, ZB_ERR_IO, "tokens: no file matches '%s'", pattern);
  if (pl->n > MAX_SHARDS)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "tokens: '%s' matches %zu files (at most %d)", pattern,
                       pl->n, MAX_SHARDS);
  /* strcmp, not the locale's collation: every rank sees one order. */
  qsort(pl->v, pl->n, sizeof *pl->v, by_strcmp);
  return ZB_OK;
}

static zb_err open_paths(const zb_roots *roots, zb_tokens_kind kind, char **paths, int n, int seq_len,
                         int64_t vocab, zb_tokens **out, zb_diag *diag) {
  maps *m = zb_calloc(1, sizeof *m);
  m->at = zb_calloc((size_t)n, sizeof *m->at);
  m->len = zb_calloc((size_t)n, sizeof *m->len);
  zb_tokens_source *src = zb_calloc((size_t)n, sizeof *src);
  zb_err err = ZB_OK;
  for (int i = 0; i < n && !err; i++) {
    m->n = i + 1;
    err = map_file(roots, paths[i], &m->at[i], &m->len[i], diag);
    if (!err && kind == ZB_TOKENS_SHARDS)
      err = shard_source(paths[i], m->at[i], m->len[i], &src[i], diag);
    else if (!err)
      src[i] =
          (zb_tokens_source){.name = paths[i], .data = m->at[i], .count = (int64_t)m->len[i], .width = 1};
  }
  if (!err)
    err = zb_tokens_new(src, n, seq_len, vocab, out, diag);
  free(src);
  if (err) {
    maps_release(m);
    return err;
  }
  (*out)->release = maps_release;
  (*out)->ctx = m;
  return ZB_OK;
}

zb_err zb_tokens_open_in(const zb_roots *roots, zb_tokens_kind kind, const char *pattern, int seq_len,
                         int64_t vocab, zb_tokens **out, zb_diag *diag) {
  *out = NULL;
  if (!pattern || (kind != ZB_TOKENS_SHARDS && kind != ZB_TOKENS_TEXT_BYTES))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "tokens: need a pattern and a kind (shards or text bytes)");
  if (kind == ZB_TOKENS_TEXT_BYTES) {
    char *path = (char *)pattern; /* read only */
    return open_paths(roots, kind, &path, 1, seq_len, vocab, out, diag);
  }
  path_list pl = {0};
  zb_err err = glob_paths(roots, pattern, &pl, diag);
  if (!err)
    err = open_paths(roots, kind, pl.v, (int)pl.n, seq_len, vocab, out, diag);
  paths_free(&pl);
  return err;
}

zb_err zb_tokens_open(zb_tokens_kind kind, const char *pattern, int seq_len, int64_t vocab, zb_tokens **out,
                      zb_diag *diag) {
  return zb_tokens_open_in(NULL, kind, pattern, seq_len, vocab, out, diag);
}
