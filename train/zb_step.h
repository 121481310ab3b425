/* zb_step.h — one rank's optimizer step of a cpu job with global
 * gradient-norm clipping and a NaN/Inf check (docs/model.md; the Zero Bubble
 * paper's section 4, "optimizer post-validation").
 *
 * Clipping needs the gradient norm over every rank's parameters, and the
 * check needs to know that no rank saw a non-finite gradient: both are
 * global. Two ways to take the step, chosen per job:
 *   - synchronous: reduce first (every rank waits for the slowest), then
 *     step once with the gradients scaled by c = min(1, clip_norm / norm),
 *     or not at all when a gradient is not finite.
 *   - post-validated: step at once as if nothing were clipped (c = 1) and
 *     every gradient finite, keeping what a rollback needs (the parameters
 *     and the optimizer's moments and step count); then reduce. When the
 *     check fails the step is rolled back exactly, then redone with c
 *     (clipping) or left undone (non-finite). Every rank decides from the
 *     same reduced values, so they all take the same branch.
 * Both give bit-identical parameters and moments: a step scaled by c = 1
 * is the unscaled step (g * 1.0 is exact), a rollback restores every bit,
 * and the redo is the synchronous step from the same state.
 *
 * The reduction is the caller's (a callback): the worker's goes over the
 * transport (zb_step_reduce_chain, worker/zb_step_chain.h), a test's may be
 * local.
 *
 * What is stepped is a target (zb_step_target): zb_stepper_new's own host
 * target steps zb_adamw over host arrays (a cpu job); zb_stepper_new_target
 * takes another, such as the device target of zb_step_device.h (a cuda
 * job, stepping on the device). The decision, post-validation and
 * rollback above are the same code for both.
 *
 * Ownership: zb_stepper_new() gives the caller a zb_stepper, freed with
 * zb_stepper_free() (NULL is a no-op). It borrows the optimizers (or the
 * target), which must outlive it; the host target's rollback copies are
 * its own. One thread at a time.
 *
 * Results: zb_err from lib/zb_err.h; the reduction's errors pass through.
 */
#ifndef ZB_STEP_H
#define ZB_STEP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zb_err.h"
#include "zb_optimizer.h"

typedef enum zb_step_mode { ZB_STEP_POST_VALIDATED = 0, ZB_STEP_SYNCHRONOUS = 1 } zb_step_mode;

/* One rank's share of the global check, and after the reduction the
 * job's: the sum of squared gradients (double, summed in parameter order
 * per stage, stages in the given order) and whether every gradient is
 * finite. */
typedef struct zb_step_partial {
  double sumsq;
  bool finite;
} zb_step_partial;

/* Replaces *p (this rank's share) by the job's (every rank's, reduced in
 * the same order on every run and every rank). */
typedef zb_err (*zb_step_reduce_fn)(void *arg, zb_step_partial *p, zb_diag *diag);

/* What the step did. */
typedef struct zb_step_result {
  double grad_norm; /* global L2 norm of the gradients (NaN/Inf when not finite) */
  double coef;      /* the scale applied: min(1, clip_norm / grad_norm); 1 when not clipped */
  bool clipped;     /* grad_norm > clip_norm (clip_norm > 0): the step used coef < 1 */
  bool skipped;     /* a gradient was not finite: no step was taken */
  bool rolled_back; /* post-validated only: the optimistic step was undone */
} zb_step_result;

typedef struct zb_stepper zb_stepper;

/* What a stepper steps: every stage this rank hosts, with its optimizer
 * state. Errors (a device's) are returned with diag set; after one the
 * stepper returns it and the state is whatever the target left. */
typedef struct zb_step_target_ops {
  /* this rank's partial: squared gradients summed in double, stage by
   * stage in order, and whether every gradient is finite */
  zb_err (*partial)(void *self, zb_step_partial *out, zb_diag *diag);
  /* keeps what a rollback needs: parameters, moments and step counts */
  zb_err (*save)(void *self, zb_diag *diag);
  /* puts back, bit for bit, what the last save kept */
  zb_err (*restore)(void *self, zb_diag *diag);
  /* one AdamW step of every stage with the gradients times coef (in
   * double; coef 1 is the unscaled step) */
  zb_err (*step)(void *self, double coef, zb_diag *diag);
  /* post-validated only, optional (NULL: nothing to do): the check passed
   * and the step after the last save stands. A target that keeps less
   * than a full copy (the device target: docs/model.md, Optimizer and
   * step) finishes that step here; between save and commit or restore
   * only these calls come. */
  zb_err (*commit)(void *self, zb_diag *diag);
} zb_step_target_ops;

typedef struct zb_step_target {
  const zb_step_target_ops *ops;
  void *self;
} zb_step_target;

/* A stepper for n stages with one optimizer each (opt[i] borrowed), clip
 * norm clip_norm (0: no clipping; finite, >= 0). ZB_ERR_INVALID_ARG for a
 * bad clip_norm or mode. */
zb_err zb_stepper_new(int n, zb_adamw *const *opt, double clip_norm, zb_step_mode mode, zb_stepper **out,
                      zb_diag *diag);
void zb_stepper_free(zb_stepper *s);

/* A stepper over *target (copied; target->self borrowed), clip_norm and
 * mode as for zb_stepper_new. Rollback (post-validated) uses the target's
 * save and restore; a synchronous stepper never calls them. */
zb_err zb_stepper_new_target(const zb_step_target *target, double clip_norm, zb_step_mode mode,
                             zb_stepper **out, zb_diag *diag);

/* The check (norm and finiteness) counts only stage i's first n
 * gradients (a stepper from zb_stepper_new; default: all of them). What
 * follows still steps: a tied weight's second holder, whose gradient is
 * the first holder's and must count once (docs/model.md, Tied head).
 * ZB_ERR_INVALID_ARG for a bad stage or n, or another stepper. */
zb_err zb_stepper_count_prefix(zb_stepper *s, int i, size_t n, zb_diag *diag);

/* This rank's partial over grads[i][0..size of opt[i]) (a stepper from
 * zb_stepper_new). */
zb_step_partial zb_step_local(const zb_stepper *s, const float *const *grads);

/* Takes the step on params[i] from grads[i] (i < n), reducing with fn (a
 * stepper from zb_stepper_new; ZB_ERR_INVALID_ARG for another). On an
 * error from fn nothing was stepped (post-validated: rolled back). */
zb_err zb_stepper_step(zb_stepper *s, float *const *params, const float *const *grads, zb_step_reduce_fn fn,
                       void *arg, zb_step_result *out, zb_diag *diag);

/* The same on the target's own parameters and gradients (a stepper from
 * zb_stepper_new_target; ZB_ERR_INVALID_ARG for another). An error of the
 * target is returned as it is; on an error from fn the optimistic step
 * was rolled back. */
zb_err zb_stepper_run(zb_stepper *s, zb_step_reduce_fn fn, void *arg, zb_step_result *out, zb_diag *diag);

#endif
