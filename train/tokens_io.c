/* tokens_io.c — the file part of zb_tokens.h: the shards of a glob (or one
 * text file) opened read-only and mapped, their headers validated, then
 * handed to the pure dataset of tokens.c. Mapping, not reading: a rank
 * touches only the pages of the windows it draws, and ranks on one host
 * share the page cache. */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokens_internal.h"
#include "zb_alloc.h"

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

/* Maps path read-only (*at NULL for an empty file). */
static zb_err map_file(const char *path, void **at, size_t *len, zb_diag *diag) {
  *at = NULL;
  *len = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return zb_diag_set(diag, ZB_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
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

static int by_strcmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The sorted paths of pattern's matches (globfree'd by the caller). */
static zb_err glob_paths(const char *pattern, glob_t *g, zb_diag *diag) {
  /* No GLOB_ERR: a missing or unreadable directory is no match. */
  int rc = glob(pattern, 0, NULL, g);
  if (rc == GLOB_NOMATCH || (rc == 0 && g->gl_pathc == 0))
    return zb_diag_set(diag, ZB_ERR_IO, "tokens: no file matches '%s'", pattern);
  if (rc != 0)
    return zb_diag_set(diag, ZB_ERR_IO, "tokens: cannot glob '%s'%s", pattern,
                       rc == GLOB_NOSPACE ? " (out of memory)" : "");
  if (g->gl_pathc > 1000000)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "tokens: '%s' matches %zu files (at most 1000000)", pattern,
                       (size_t)g->gl_pathc);
  /* strcmp, not the locale's collation: every rank sees one order. */
  qsort(g->gl_pathv, g->gl_pathc, sizeof *g->gl_pathv, by_strcmp);
  return ZB_OK;
}

static zb_err open_paths(zb_tokens_kind kind, char **paths, int n, int seq_len, int64_t vocab,
                         zb_tokens **out, zb_diag *diag) {
  maps *m = zb_calloc(1, sizeof *m);
  m->at = zb_calloc((size_t)n, sizeof *m->at);
  m->len = zb_calloc((size_t)n, sizeof *m->len);
  zb_tokens_source *src = zb_calloc((size_t)n, sizeof *src);
  zb_err err = ZB_OK;
  for (int i = 0; i < n && !err; i++) {
    m->n = i + 1;
    err = map_file(paths[i], &m->at[i], &m->len[i], diag);
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

zb_err zb_tokens_open(zb_tokens_kind kind, const char *pattern, int seq_len, int64_t vocab, zb_tokens **out,
                      zb_diag *diag) {
  *out = NULL;
  if (!pattern || (kind != ZB_TOKENS_SHARDS && kind != ZB_TOKENS_TEXT_BYTES))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "tokens: need a pattern and a kind (shards or text bytes)");
  if (kind == ZB_TOKENS_TEXT_BYTES) {
    char *path = (char *)pattern; /* read only */
    return open_paths(kind, &path, 1, seq_len, vocab, out, diag);
  }
  glob_t g;
  memset(&g, 0, sizeof g);
  zb_err err = glob_paths(pattern, &g, diag);
  if (!err)
    err = open_paths(kind, g.gl_pathv, (int)g.gl_pathc, seq_len, vocab, out, diag);
  globfree(&g);
  return err;
}
