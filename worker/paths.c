/* paths.c — the job-spec paths a worker may touch (docs/operations.md,
 * Security): with --path-root DIR (repeatable) a job's model.data,
 * weights (a job with an architecture's checkpoint directory),
 * checkpoint_dir and dump_dir must lie inside one of those directories,
 * or the job fails naming the path; without any, every path is allowed
 * (and the worker says so at start).
 *
 * This is the check at job start, for a clear early refusal: a path must
 * be named under a root (zb_roots_find: the root's real path or the name
 * it was given), and lead there too: its deepest existing ancestor is
 * resolved (symbolic links followed) and the rest may hold no "." or
 * "..". What keeps a running job inside is not this check but every open
 * after it, each beneath the root's held descriptor, following no link
 * (zb_roots.h): a link planted later fails that open, naming the path. */
#define _DEFAULT_SOURCE /* realpath */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker.h"

zb_err worker_add_path_root(worker *w, const char *dir, zb_diag *diag) {
  return zb_roots_add(&w->roots, dir, diag);
}

/* path as it really leads, into out; false when it cannot be told (not
 * absolute, too long, or "."/".." below its deepest existing ancestor). */
static bool resolve(const char *path, char *out, size_t cap) {
  char head[PATH_MAX], real[PATH_MAX];
  if (path[0] != '/' || strlen(path) >= sizeof head)
    return false;
  snprintf(head, sizeof head, "%s", path);
  size_t cut = strlen(head);
  for (;;) { /* shorten to the deepest ancestor that exists */
    head[cut] = '\0';
    if (realpath(cut ? head : "/", real))
      break;
    char *slash = strrchr(head, '/');
    if (!slash)
      return false;
    cut = (size_t)(slash - head);
  }
  const char *rest = path + cut; /* "" or "/a/b": what does not exist yet */
  if (zb_path_has_dots(rest))
    return false;
  int len = snprintf(out, cap, "%s%s", strcmp(real, "/") ? real : "", rest[0] ? rest : "");
  if (!out[0])
    snprintf(out, cap, "/");
  return len > 0 && (size_t)len < cap;
}

static bool inside(const char *path, const char *root) {
  size_t n = strlen(root);
  if (!strcmp(root, "/"))
    return true;
  return strncmp(path, root, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

zb_err worker_check_path(const worker *w, const char *what, const char *path, zb_diag *diag) {
  const zb_roots *rs = &w->roots;
  if (!path[0] || !zb_roots_on(rs))
    return ZB_OK;
  char real[PATH_MAX];
  int root_fd;
  const char *rel;
  if (zb_roots_find(rs, path, &root_fd, &rel) && resolve(path, real, sizeof real))
    for (int k = 0; k < rs->n; k++)
      if (inside(real, rs->root[k].real))
        return ZB_OK;
  char roots[512] = "";
  for (int k = 0, len = 0; k < rs->n && len < (int)sizeof roots - 2; k++)
    len += snprintf(roots + len, sizeof roots - (size_t)len, "%s%s", k ? ", " : "", rs->root[k].real);
  return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "%s: '%.200s' is outside this worker's path roots (%.200s)",
                     what, path, roots);
}

zb_err worker_check_model_paths(const worker *w, const zb_model_spec *ms, zb_diag *diag) {
  zb_err err = worker_check_path(w, "model.data", ms->data, diag);
  if (!err)
    err = worker_check_path(w, "model.weights", ms->weights, diag);
  if (!err)
    err = worker_check_path(w, "model.checkpoint_dir", ms->checkpoint_dir, diag);
  if (!err)
    err = worker_check_path(w, "model.dump_dir", ms->dump_dir, diag);
  return err;
}
