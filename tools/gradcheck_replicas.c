/* gradcheck_replicas.c — the dumps of a data-parallel job's replicas 1..d-1
 * against replica 0's (gradcheck.h; docs/model.md, Data parallelism):
 * after the reduction every replica holds the same gradients, takes the
 * same step and keeps the same weights, bit for bit, so anything but
 * equal bits is a replica that reduced wrongly, or not at all. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "zb_alloc.h"
#include "zb_dump.h"

/* The first element where a and b (n floats) differ in any bit, or -1. */
static long long first_diff(const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
      return (long long)i;
  return -1;
}

/* Replica 0's dump of stage, or NULL. */
static const zb_dump *stage_of(const zb_dump *d0, int nf0, int stage) {
  for (int j = 0; j < nf0; j++)
    if (d0[j].stage == stage)
      return &d0[j];
  return NULL;
}

/* Whether dump x (file f) holds the same tensors as replica 0's r. */
static bool same_table(gc_iter *it, const gc_file *f, const zb_dump *x, const zb_dump *r) {
  bool same = x->n == r->n && x->n_tensors == r->n_tensors;
  for (int t = 0; same && t < x->n_tensors; t++)
    same = strcmp(x->tensors[t].name, r->tensors[t].name) == 0 && x->tensors[t].rows == r->tensors[t].rows &&
           x->tensors[t].cols == r->tensors[t].cols;
  if (!same)
    gc_fail(it, 1, "'%s' (replica %d, stage %d) holds other tensors than replica 0's stage %d", f->path,
            x->replica, x->stage, r->stage);
  return same;
}

/* Bit-identity of one replica's stage with replica 0's; false on a difference. */
static bool same_bits(gc_iter *it, const gc_file *f, const zb_dump *x, const zb_dump *r) {
  const char *names[3] = {"weights before the step", "gradients", "weights after the step"};
  const float *xs[3] = {x->before, x->grads, x->after}, *rs[3] = {r->before, r->grads, r->after};
  for (int a = 0; a < 3; a++) {
    long long at = first_diff(xs[a], rs[a], x->n);
    if (at >= 0) {
      gc_fail(it, 1,
              "'%s': replica %d's %s of stage %d differ from replica 0's at element %lld: %.9g vs %.9g",
              f->path, x->replica, names[a], x->stage, at, (double)xs[a][at], (double)rs[a][at]);
      return false;
    }
  }
  int steps = ZB_DUMP_CLIPPED | ZB_DUMP_SKIPPED;
  if (memcmp(&x->grad_norm, &r->grad_norm, sizeof x->grad_norm) != 0 ||
      (x->flags & steps) != (r->flags & steps)) {
    gc_fail(it, 1, "'%s': replica %d's step of stage %d (grad norm %.9g) differs from replica 0's (%.9g)",
            f->path, x->replica, x->stage, x->grad_norm, r->grad_norm);
    return false;
  }
  return true;
}

/* A replica's loss, the mean over its own microbatches k*m .. k*m+m-1,
 * against the reference's. */
static void replica_loss(gc_iter *it, const gc_file *f, const zb_dump *x, const double *mb_loss) {
  double sum = 0;
  int m = x->microbatches;
  for (int j = 0; j < m; j++)
    sum += mb_loss[x->replica * m + j];
  double ref = sum / m, diff = fabs(x->loss - ref), rel = ref != 0 ? diff / fabs(ref) : diff;
  if (!(rel <= it->o->tol))
    gc_fail(it, 1,
            "'%s': replica %d's loss %.9g differs from the reference's over its microbatches %d..%d, %.9g: "
            "relative error %.3e > tolerance %g",
            f->path, x->replica, x->loss, x->replica * m, x->replica * m + m - 1, ref, rel, it->o->tol);
}

/* One file of a replica > 0: in range, of the job, and identical. */
static bool check_one(gc_iter *it, const gc_file *f, const zb_dump *x, const zb_dump *d0, int nf0,
                      const double *mb_loss) {
  int dp = it->data_parallel;
  if (x->replica < 1 || x->replica >= dp || x->data_parallel != dp || strcmp(x->job_id, d0->job_id) != 0 ||
      x->microbatches != d0->microbatches) {
    gc_fail(
        it, 1,
        "'%s' is replica %d of %d of job '%s' (m %d); replica 0's dumps say %d replicas of job '%s' (m %d)",
        f->path, x->replica, x->data_parallel, x->job_id, x->microbatches, dp, d0->job_id, d0->microbatches);
    return true; /* not a difference in bits */
  }
  if (f->named &&
      (f->name_iteration != x->iteration || f->name_stage != x->stage || f->name_replica != x->replica))
    gc_fail(it, 1, "'%s' holds iteration %d stage %d of replica %d, not what its name says", f->path,
            x->iteration, x->stage, x->replica);
  const zb_dump *r = stage_of(d0, nf0, x->stage);
  if (!r) {
    gc_fail(it, 1, "'%s' is stage %d, which replica 0 did not dump", f->path, x->stage);
    return true;
  }
  if (mb_loss && (x->flags & ZB_DUMP_HAS_LOSS))
    replica_loss(it, f, x, mb_loss);
  return same_table(it, f, x, r) && same_bits(it, f, x, r);
}

void gc_check_replicas(gc_iter *it, const gc_file *f0, const zb_dump *d0, int nf0, const gc_file *f,
                       const zb_dump *d, int nf, const double *mb_loss) {
  (void)f0;
  int dp = it->data_parallel, ns = d0->n_stages;
  bool identical = true;
  for (int k = 0; k < nf; k++)
    identical &= check_one(it, &f[k], &d[k], d0, nf0, mb_loss);
  /* every replica dumped every stage once (files sorted by replica, stage) */
  int *seen = zb_calloc((size_t)dp * (size_t)ns, sizeof *seen);
  for (int k = 0; k < nf; k++)
    if (d[k].replica > 0 && d[k].replica < dp && d[k].stage >= 0 && d[k].stage < ns)
      seen[(size_t)d[k].replica * (size_t)ns + (size_t)d[k].stage]++;
  for (int r = 1; r < dp; r++)
    for (int s = 0; s < ns; s++) {
      int c = seen[(size_t)r * (size_t)ns + (size_t)s];
      if (c != 1)
        gc_fail(it, 1, "replica %d of %d: stage %d is dumped %d times (it%d-stage%d-replica%d.dump in '%s')",
                r, dp, s, c, it->iteration, s, r, it->o->dir);
    }
  free(seen);
  it->replicas_identical = identical ? 1 : 0;
}
