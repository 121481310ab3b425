/* optimizer.c — AdamW over a flat fp32 parameter array (zb_optimizer.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_optimizer.h"

struct zb_adamw {
  zb_adamw_config cfg;
  size_t n;
  int64_t t;
  float *m, *v;
  uint8_t *decay; /* per parameter: 1 = decayed */
};

static bool in_unit(double x) {
  return isfinite(x) && x >= 0 && x < 1;
}

zb_err zb_adamw_new(const zb_adamw_config *cfg, size_t n, zb_adamw **out, zb_diag *diag) {
  if (!(isfinite(cfg->lr) && cfg->lr > 0))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "adamw: lr must be a finite number > 0, got %g", cfg->lr);
  if (!(isfinite(cfg->weight_decay) && cfg->weight_decay >= 0))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "adamw: weight_decay must be a finite number >= 0, got %g",
                       cfg->weight_decay);
  if (!in_unit(cfg->beta1) || !in_unit(cfg->beta2))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "adamw: beta1 %g and beta2 %g must be in [0, 1)", cfg->beta1,
                       cfg->beta2);
  if (!(isfinite(cfg->eps) && cfg->eps > 0))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "adamw: eps must be a finite number > 0, got %g", cfg->eps);
  zb_adamw *o = zb_calloc(1, sizeof *o);
  o->cfg = *cfg;
  o->n = n;
  /* calloc of at least one element: a stage may have no parameters. The
   * moments are as large as the model: a model too large for the host is
   * an error the job fails with, not an abort of the worker. */
  o->m = calloc(n ? n : 1, sizeof(float));
  o->v = calloc(n ? n : 1, sizeof(float));
  o->decay = malloc(n ? n : 1);
  if (!o->m || !o->v || !o->decay) {
    zb_adamw_free(o);
    return zb_diag_set(diag, ZB_ERR_IO, "adamw: out of memory for the moments of %zu parameters (%.3g bytes)",
                       n, (double)n * (2 * sizeof(float) + 1));
  }
  memset(o->decay, 1, n);
  *out = o;
  return ZB_OK;
}

void zb_adamw_free(zb_adamw *o) {
  if (!o)
    return;
  free(o->m);
  free(o->v);
  free(o->decay);
  free(o);
}

zb_err zb_adamw_set_decay(zb_adamw *o, size_t offset, size_t count, bool decay, zb_diag *diag) {
  if (offset > o->n || count > o->n - offset)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "adamw: parameters %zu..%zu are outside 0..%zu", offset,
                       offset + count, o->n);
  memset(o->decay + offset, decay ? 1 : 0, count);
  return ZB_OK;
}

void zb_adamw_set_decay_in_shard(zb_adamw *o, size_t shard_off, size_t offset, size_t count, bool decay) {
  size_t lo = offset > shard_off ? offset : shard_off;
  size_t hi = offset + count < shard_off + o->n ? offset + count : shard_off + o->n;
  if (lo < hi)
    memset(o->decay + (lo - shard_off), decay ? 1 : 0, hi - lo);
}

void zb_adamw_coefs(const zb_adamw_config *c, int64_t t, double *step_size, double *sqrt_bc2,
                    double *shrink) {
  *step_size = c->lr / (1 - pow(c->beta1, (double)t));
  *sqrt_bc2 = sqrt(1 - pow(c->beta2, (double)t));
  *shrink = 1 - c->lr * c->weight_decay;
}

void zb_adamw_step(zb_adamw *o, float *params, const float *grads) {
  zb_adamw_step_scaled(o, params, grads, 1.0);
}

void zb_adamw_step_scaled(zb_adamw *o, float *params, const float *grads, double scale) {
  const zb_adamw_config *c = &o->cfg;
  o->t++;
  double b1 = c->beta1, b2 = c->beta2;
  double step_size, sqrt_bc2, shrink;
  zb_adamw_coefs(c, o->t, &step_size, &sqrt_bc2, &shrink);
  for (size_t i = 0; i < o->n; i++) {
    /* in double: scale 1 leaves g exact, so the unscaled step is this one */
    double g = (double)grads[i] * scale;
    double m = b1 * o->m[i] + (1 - b1) * g;
    double v = b2 * o->v[i] + (1 - b2) * g * g;
    /* the moments are stored rounded, and the update reads what is stored,
     * as an fp32 implementation (PyTorch's) does */
    o->m[i] = (float)m;
    o->v[i] = (float)v;
    double p = params[i];
    if (o->decay[i])
      p *= shrink;
    p -= step_size * (double)o->m[i] / (sqrt((double)o->v[i]) / sqrt_bc2 + c->eps);
    params[i] = (float)p;
  }
}

const zb_adamw_config *zb_adamw_config_of(const zb_adamw *o) {
  return &o->cfg;
}

const uint8_t *zb_adamw_decay_mask(const zb_adamw *o) {
  return o->decay;
}

size_t zb_adamw_size(const zb_adamw *o) {
  return o->n;
}

int64_t zb_adamw_steps(const zb_adamw *o) {
  return o->t;
}

void zb_adamw_state(const zb_adamw *o, int64_t *steps, const float **m, const float **v) {
  *steps = o->t;
  *m = o->m;
  *v = o->v;
}

zb_err zb_adamw_set_state(zb_adamw *o, int64_t steps, const float *m, const float *v, size_t n,
                          zb_diag *diag) {
  if (n != o->n || steps < 0 || (n && (!m || !v)))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "adamw: state of %zu parameters at step %lld for %zu", n,
                       (long long)steps, o->n);
  o->t = steps;
  if (n) {
    memcpy(o->m, m, n * sizeof(float));
    memcpy(o->v, v, n * sizeof(float));
  }
  return ZB_OK;
}
