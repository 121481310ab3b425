/* step.c — a cpu job's optimizer step with clipping and the NaN/Inf check,
 * synchronous or post-validated (zb_step.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_step.h"

typedef struct saved {
  int64_t steps;
  float *params, *m, *v; /* n floats each: the pre-step copy */
} saved;

struct zb_stepper {
  int n;
  zb_adamw **opt;
  saved *save;
  double clip_norm;
  zb_step_mode mode;
};

zb_err zb_stepper_new(int n, zb_adamw *const *opt, double clip_norm, zb_step_mode mode, zb_stepper **out,
                      zb_diag *diag) {
  if (n < 0 || !(isfinite(clip_norm) && clip_norm >= 0))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "step: %d stages, clip_norm %g (must be finite, >= 0)", n,
                       clip_norm);
  if (mode != ZB_STEP_POST_VALIDATED && mode != ZB_STEP_SYNCHRONOUS)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "step: unknown mode %d", (int)mode);
  zb_stepper *s = zb_calloc(1, sizeof *s);
  s->n = n;
  s->clip_norm = clip_norm;
  s->mode = mode;
  s->opt = zb_calloc(n ? (size_t)n : 1, sizeof *s->opt);
  s->save = zb_calloc(n ? (size_t)n : 1, sizeof *s->save);
  for (int i = 0; i < n; i++) {
    s->opt[i] = opt[i];
    size_t k = zb_adamw_size(opt[i]);
    /* allocated once: a post-validated step copies into them every iteration */
    s->save[i].params = zb_malloc((k ? k : 1) * sizeof(float));
    s->save[i].m = zb_malloc((k ? k : 1) * sizeof(float));
    s->save[i].v = zb_malloc((k ? k : 1) * sizeof(float));
  }
  *out = s;
  return ZB_OK;
}

void zb_stepper_free(zb_stepper *s) {
  if (!s)
    return;
  for (int i = 0; i < s->n; i++) {
    free(s->save[i].params);
    free(s->save[i].m);
    free(s->save[i].v);
  }
  free(s->save);
  free(s->opt);
  free(s);
}

zb_step_partial zb_step_local(const zb_stepper *s, const float *const *grads) {
  zb_step_partial p = {.sumsq = 0, .finite = true};
  for (int i = 0; i < s->n; i++) {
    size_t k = zb_adamw_size(s->opt[i]);
    for (size_t j = 0; j < k; j++) {
      double g = grads[i][j];
      p.finite &= isfinite(g) != 0;
      p.sumsq += g * g;
    }
  }
  return p;
}

static void save_state(zb_stepper *s, float *const *params) {
  for (int i = 0; i < s->n; i++) {
    size_t k = zb_adamw_size(s->opt[i]);
    const float *m, *v;
    zb_adamw_state(s->opt[i], &s->save[i].steps, &m, &v);
    memcpy(s->save[i].params, params[i], k * sizeof(float));
    memcpy(s->save[i].m, m, k * sizeof(float));
    memcpy(s->save[i].v, v, k * sizeof(float));
  }
}

static void restore_state(zb_stepper *s, float *const *params) {
  for (int i = 0; i < s->n; i++) {
    size_t k = zb_adamw_size(s->opt[i]);
    memcpy(params[i], s->save[i].params, k * sizeof(float));
    /* the sizes match by construction: set_state cannot fail here */
    zb_adamw_set_state(s->opt[i], s->save[i].steps, s->save[i].m, s->save[i].v, k, NULL);
  }
}

static void step_all(zb_stepper *s, float *const *params, const float *const *grads, double coef) {
  for (int i = 0; i < s->n; i++)
    zb_adamw_step_scaled(s->opt[i], params[i], grads[i], coef);
}

/* The decision every rank takes alike from the reduced values. */
static void decide(const zb_stepper *s, zb_step_partial g, zb_step_result *r) {
  r->grad_norm = sqrt(g.sumsq);
  r->skipped = !g.finite || !isfinite(r->grad_norm);
  r->clipped = !r->skipped && s->clip_norm > 0 && r->grad_norm > s->clip_norm;
  r->coef = r->clipped ? s->clip_norm / r->grad_norm : 1.0;
}

zb_err zb_stepper_step(zb_stepper *s, float *const *params, const float *const *grads, zb_step_reduce_fn fn,
                       void *arg, zb_step_result *out, zb_diag *diag) {
  memset(out, 0, sizeof *out);
  zb_step_partial g = zb_step_local(s, grads);
  bool optimistic = s->mode == ZB_STEP_POST_VALIDATED;
  if (optimistic) {
    /* step now, as if the check will pass, while slower ranks may still be
     * in their W ops: a passing check then costs only the reduction, a
     * failing one a rollback and (clipping) a second step */
    save_state(s, params);
    step_all(s, params, grads, 1.0);
  }
  zb_err err = fn(arg, &g, diag);
  if (err) {
    if (optimistic)
      restore_state(s, params);
    return err;
  }
  decide(s, g, out);
  if (optimistic) {
    if (out->clipped || out->skipped) {
      restore_state(s, params);
      out->rolled_back = true;
      if (out->clipped)
        step_all(s, params, grads, out->coef);
    }
  } else if (!out->skipped) {
    step_all(s, params, grads, out->coef);
  }
  return ZB_OK;
}
