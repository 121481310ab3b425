/* step.c — a rank's optimizer step with clipping and the NaN/Inf check,
 * synchronous or post-validated, over a step target; and the host target,
 * zb_adamw over host arrays (zb_step.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_step.h"

typedef struct saved {
  int64_t steps;
  float *params, *m, *v; /* n floats each: the pre-step copy */
} saved;

/* The host target: the optimizers (borrowed), their rollback copies, and
 * the arrays of the step under way (set by zb_stepper_step). */
typedef struct host_target {
  int n;
  size_t *counted; /* per stage: the leading gradients the check counts */
  zb_adamw **opt;
  saved *save;
  float *const *params;
  const float *const *grads;
} host_target;

struct zb_stepper {
  zb_step_target target;
  host_target *host; /* zb_stepper_new's own target; NULL for another */
  double clip_norm;
  zb_step_mode mode;
};

/* ---- the host target ---- */

static zb_step_partial host_local(const host_target *h, const float *const *grads) {
  zb_step_partial p = {.sumsq = 0, .finite = true};
  for (int i = 0; i < h->n; i++) {
    for (size_t j = 0; j < h->counted[i]; j++) {
      double g = grads[i][j];
      p.finite &= isfinite(g) != 0;
      p.sumsq += g * g;
    }
  }
  return p;
}

static zb_err host_partial(void *self, zb_step_partial *out, zb_diag *diag) {
  (void)diag;
  host_target *h = self;
  *out = host_local(h, h->grads);
  return ZB_OK;
}

static zb_err host_save(void *self, zb_diag *diag) {
  (void)diag;
  host_target *h = self;
  for (int i = 0; i < h->n; i++) {
    size_t k = zb_adamw_size(h->opt[i]);
    const float *m, *v;
    zb_adamw_state(h->opt[i], &h->save[i].steps, &m, &v);
    memcpy(h->save[i].params, h->params[i], k * sizeof(float));
    memcpy(h->save[i].m, m, k * sizeof(float));
    memcpy(h->save[i].v, v, k * sizeof(float));
  }
  return ZB_OK;
}

static zb_err host_restore(void *self, zb_diag *diag) {
  (void)diag;
  host_target *h = self;
  for (int i = 0; i < h->n; i++) {
    size_t k = zb_adamw_size(h->opt[i]);
    memcpy(h->params[i], h->save[i].params, k * sizeof(float));
    /* the sizes match by construction: set_state cannot fail here */
    zb_adamw_set_state(h->opt[i], h->save[i].steps, h->save[i].m, h->save[i].v, k, NULL);
  }
  return ZB_OK;
}

static zb_err host_step(void *self, double coef, zb_diag *diag) {
  (void)diag;
  host_target *h = self;
  for (int i = 0; i < h->n; i++)
    zb_adamw_step_scaled(h->opt[i], h->params[i], h->grads[i], coef);
  return ZB_OK;
}

static const zb_step_target_ops host_ops = {
    .partial = host_partial, .save = host_save, .restore = host_restore, .step = host_step};

static host_target *host_new(int n, zb_adamw *const *opt) {
  host_target *h = zb_calloc(1, sizeof *h);
  h->n = n;
  h->opt = zb_calloc(n ? (size_t)n : 1, sizeof *h->opt);
  h->save = zb_calloc(n ? (size_t)n : 1, sizeof *h->save);
  h->counted = zb_calloc(n ? (size_t)n : 1, sizeof *h->counted);
  for (int i = 0; i < n; i++) {
    h->opt[i] = opt[i];
    size_t k = zb_adamw_size(opt[i]);
    h->counted[i] = k;
    /* allocated once: a post-validated step copies into them every iteration */
    h->save[i].params = zb_malloc((k ? k : 1) * sizeof(float));
    h->save[i].m = zb_malloc((k ? k : 1) * sizeof(float));
    h->save[i].v = zb_malloc((k ? k : 1) * sizeof(float));
  }
  return h;
}

static void host_free(host_target *h) {
  if (!h)
    return;
  for (int i = 0; i < h->n; i++) {
    free(h->save[i].params);
    free(h->save[i].m);
    free(h->save[i].v);
  }
  free(h->save);
  free(h->counted);
  free(h->opt);
  free(h);
}

/* ---- the stepper ---- */

static zb_err check_settings(double clip_norm, zb_step_mode mode, int n, zb_diag *diag) {
  if (n < 0 || !(isfinite(clip_norm) && clip_norm >= 0))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "step: %d stages, clip_norm %g (must be finite, >= 0)", n,
                       clip_norm);
  if (mode != ZB_STEP_POST_VALIDATED && mode != ZB_STEP_SYNCHRONOUS)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "step: unknown mode %d", (int)mode);
  return ZB_OK;
}

zb_err zb_stepper_new(int n, zb_adamw *const *opt, double clip_norm, zb_step_mode mode, zb_stepper **out,
                      zb_diag *diag) {
  zb_err err = check_settings(clip_norm, mode, n, diag);
  if (err)
    return err;
  zb_stepper *s = zb_calloc(1, sizeof *s);
  s->clip_norm = clip_norm;
  s->mode = mode;
  s->host = host_new(n, opt);
  s->target = (zb_step_target){.ops = &host_ops, .self = s->host};
  *out = s;
  return ZB_OK;
}

zb_err zb_stepper_new_target(const zb_step_target *target, double clip_norm, zb_step_mode mode,
                             zb_stepper **out, zb_diag *diag) {
  if (!target || !target->ops)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "step: no target");
  zb_err err = check_settings(clip_norm, mode, 0, diag);
  if (err)
    return err;
  zb_stepper *s = zb_calloc(1, sizeof *s);
  s->clip_norm = clip_norm;
  s->mode = mode;
  s->target = *target;
  *out = s;
  return ZB_OK;
}

void zb_stepper_free(zb_stepper *s) {
  if (!s)
    return;
  host_free(s->host);
  free(s);
}

zb_err zb_stepper_count_prefix(zb_stepper *s, int i, size_t n, zb_diag *diag) {
  if (!s->host)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "step: this stepper's target counts its own gradients");
  if (i < 0 || i >= s->host->n || n > zb_adamw_size(s->host->opt[i]))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "step: stage %d cannot count %zu gradients", i, n);
  s->host->counted[i] = n;
  return ZB_OK;
}

zb_step_partial zb_step_local(const zb_stepper *s, const float *const *grads) {
  return host_local(s->host, grads);
}

/* The decision every rank takes alike from the reduced values. */
static void decide(const zb_stepper *s, zb_step_partial g, zb_step_result *r) {
  r->grad_norm = sqrt(g.sumsq);
  r->skipped = !g.finite || !isfinite(r->grad_norm);
  r->clipped = !r->skipped && s->clip_norm > 0 && r->grad_norm > s->clip_norm;
  r->coef = r->clipped ? s->clip_norm / r->grad_norm : 1.0;
}

/* The step over the target: decide, post-validate, roll back. */
static zb_err stepper_go(zb_stepper *s, zb_step_reduce_fn fn, void *arg, zb_step_result *out, zb_diag *diag) {
  const zb_step_target_ops *t = s->target.ops;
  void *self = s->target.self;
  memset(out, 0, sizeof *out);
  zb_step_partial g;
  zb_err err = t->partial(self, &g, diag);
  if (err)
    return err;
  bool optimistic = s->mode == ZB_STEP_POST_VALIDATED;
  if (optimistic) {
    /* step now, as if the check will pass, while slower ranks may still be
     * in their W ops: a passing check then costs only the reduction, a
     * failing one a rollback and (clipping) a second step */
    if ((err = t->save(self, diag)) || (err = t->step(self, 1.0, diag)))
      return err;
  }
  if ((err = fn(arg, &g, diag))) {
    if (optimistic) {
      zb_diag rd = {{0}}; /* fn's error is the one to report */
      (void)t->restore(self, &rd);
    }
    return err;
  }
  decide(s, g, out);
  if (optimistic) {
    if (out->clipped || out->skipped) {
      if ((err = t->restore(self, diag)))
        return err;
      out->rolled_back = true;
      if (out->clipped)
        err = t->step(self, out->coef, diag);
    } else if (t->commit) {
      err = t->commit(self, diag);
    }
  } else if (!out->skipped) {
    err = t->step(self, out->coef, diag);
  }
  return err;
}

zb_err zb_stepper_step(zb_stepper *s, float *const *params, const float *const *grads, zb_step_reduce_fn fn,
                       void *arg, zb_step_result *out, zb_diag *diag) {
  if (!s->host)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "step: this stepper has its own target (zb_stepper_run)");
  s->host->params = params;
  s->host->grads = grads;
  zb_err err = stepper_go(s, fn, arg, out, diag);
  s->host->params = NULL;
  s->host->grads = NULL;
  return err;
}

zb_err zb_stepper_run(zb_stepper *s, zb_step_reduce_fn fn, void *arg, zb_step_result *out, zb_diag *diag) {
  if (s->host)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "step: a host stepper steps given arrays (zb_stepper_step)");
  return stepper_go(s, fn, arg, out, diag);
}
