/* step_device.c — the optimizer step on the device (zb_step_device.h):
 * every hosted stage's norm in one sumsq_multi and its AdamW in one
 * adamw_multi; a post-validated step keeps one copy (the parameters), not
 * three (docs/model.md, Optimizer and step). */
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_step_device.h"

/* One hosted stage: its device arrays and AdamW state. */
typedef struct dstage {
  size_t n;
  size_t counted; /* the leading gradients the check counts */
  float *p;       /* borrowed: the stage's device parameters */
  const float *g; /* borrowed: its device gradients */
  float *m, *v;   /* device moments */
  uint8_t *decay; /* device mask, 1 = decayed */
  float *bp;      /* device: the parameters before a tried step (rollback only) */
  int64_t steps, saved_steps;
} dstage;

struct zb_step_device {
  zb_device *dev;
  int n;
  zb_adamw **opt; /* borrowed */
  dstage *st;
  void *d_part;          /* device: n doubles (sums of squares), then n ints (non-finite flags) */
  void *h_part;          /* the same, read back */
  void *d_norm;          /* device: sumsq_multi's scratch */
  const float **gx;      /* per stage: its gradients, */
  size_t *gn;            /* and how many the check counts */
  zbm_adamw_tensor *tab; /* per stage with parameters: the last step's table */
  int n_tab;
  bool armed;    /* saved: the next step is tried (TRY) */
  bool tried;    /* a tried step waits for commit or restore */
  zb_err failed; /* a failed construction step, reported by new */
};

#define DEV(t, op, ...) ((t)->dev->ops->op((t)->dev->self, __VA_ARGS__))

static size_t part_bytes(int n) {
  return (size_t)(n ? n : 1) * (sizeof(double) + sizeof(int));
}

/* Device memory of `bytes` (none for 0), NULL after a failure. */
static void *dev_alloc(zb_step_device *t, size_t bytes, zb_diag *diag) {
  void *p = NULL;
  if (bytes && !t->failed)
    t->failed = DEV(t, alloc, bytes, &p, diag);
  return t->failed ? NULL : p;
}

static void dev_give(zb_step_device *t, void *p) {
  if (p)
    t->dev->ops->free(t->dev->self, p);
}

void zb_step_device_free(zb_step_device *t) {
  if (!t)
    return;
  for (int i = 0; t->st && i < t->n; i++) {
    dstage *s = &t->st[i];
    void *bufs[] = {s->m, s->v, s->decay, s->bp};
    for (size_t k = 0; k < sizeof bufs / sizeof *bufs; k++)
      dev_give(t, bufs[k]);
  }
  dev_give(t, t->d_part);
  dev_give(t, t->d_norm);
  free(t->h_part);
  free(t->gx);
  free(t->gn);
  free(t->tab);
  free(t->st);
  free(t->opt);
  free(t);
}

zb_err zb_step_device_new(zb_device *dev, int n, zb_adamw *const *opt, float *const *params,
                          const float *const *grads, bool rollback, zb_step_device **out, zb_diag *diag) {
  if (!dev || n < 0 || (n && (!opt || !params || !grads)))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "device step: no device, or %d stages without arrays", n);
  if (!dev->ops->adamw_multi || !dev->ops->sumsq_multi)
    return zb_diag_set(diag, ZB_ERR_UNSUPPORTED, "device step: the device has no adamw_multi or sumsq_multi");
  zb_step_device *t = zb_calloc(1, sizeof *t);
  t->dev = dev;
  t->n = n;
  t->opt = zb_calloc(n ? (size_t)n : 1, sizeof *t->opt);
  t->st = zb_calloc(n ? (size_t)n : 1, sizeof *t->st);
  t->gx = zb_calloc(n ? (size_t)n : 1, sizeof *t->gx);
  t->gn = zb_calloc(n ? (size_t)n : 1, sizeof *t->gn);
  t->tab = zb_calloc(n ? (size_t)n : 1, sizeof *t->tab);
  for (int i = 0; i < n && !t->failed; i++) {
    dstage *s = &t->st[i];
    t->opt[i] = opt[i];
    s->n = zb_adamw_size(opt[i]);
    s->counted = s->n;
    if (s->n && (!params[i] || !grads[i])) {
      t->failed = zb_diag_set(diag, ZB_ERR_INVALID_ARG, "device step: stage %d has no device arrays", i);
      break;
    }
    s->p = params[i];
    s->g = grads[i];
    size_t fb = s->n * sizeof(float);
    s->m = dev_alloc(t, fb, diag);
    s->v = dev_alloc(t, fb, diag);
    s->decay = dev_alloc(t, s->n, diag);
    if (rollback) /* m and v are never overwritten before the check: only p needs keeping */
      s->bp = dev_alloc(t, fb, diag);
    if (!t->failed && s->n) /* once: the grouping never changes */
      t->failed = DEV(t, copy, s->decay, zb_adamw_decay_mask(opt[i]), s->n, ZB_COPY_H2D, diag);
  }
  t->d_part = dev_alloc(t, part_bytes(n), diag);
  if (!t->failed) {
    for (int i = 0; i < n; i++)
      t->gn[i] = t->st[i].n;
    t->d_norm = dev_alloc(t, zb_sumsq_multi_scratch(t->gn, n), diag);
  }
  t->h_part = zb_calloc(1, part_bytes(n));
  /* stages without parameters never write their slots: they stay 0 */
  if (!t->failed)
    t->failed = DEV(t, zero, t->d_part, part_bytes(n), diag);
  zb_err err = t->failed ? t->failed : zb_step_device_push_state(t, diag);
  if (err) {
    zb_step_device_free(t);
    return err;
  }
  *out = t;
  return ZB_OK;
}

zb_err zb_step_device_count_prefix(zb_step_device *t, int i, size_t n, zb_diag *diag) {
  if (i < 0 || i >= t->n || n > t->st[i].n)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "step: stage %d cannot count %zu gradients", i, n);
  t->st[i].counted = n;
  return ZB_OK;
}

size_t zb_step_device_rollback_bytes(const zb_step_device *t) {
  size_t bytes = 0;
  for (int i = 0; i < t->n; i++)
    bytes += t->st[i].bp ? t->st[i].n * sizeof(float) : 0;
  return bytes;
}

/* ---- the target ---- */

/* Every stage's sum of squares in one sumsq_multi (zb_kernel_math.h's
 * blocked order), one read-back, one wait. */
static zb_err dev_partial(void *self, zb_step_partial *out, zb_diag *diag) {
  zb_step_device *t = self;
  double *d_sums = t->d_part, *h_sums = t->h_part;
  int *d_bad = (int *)(d_sums + t->n), *h_bad = (int *)(h_sums + t->n);
  for (int i = 0; i < t->n; i++) {
    t->gx[i] = t->st[i].g;
    t->gn[i] = t->st[i].counted;
  }
  zb_err err = DEV(t, sumsq_multi, t->gx, t->gn, t->n, t->d_norm, d_sums, d_bad, diag);
  if (!err)
    err = DEV(t, copy, t->h_part, t->d_part, part_bytes(t->n), ZB_COPY_D2H, diag);
  if (!err)
    err = DEV(t, sync, diag);
  if (err)
    return err;
  out->sumsq = 0;
  out->finite = true;
  for (int i = 0; i < t->n; i++) { /* stage order, in double */
    out->sumsq += h_sums[i];
    out->finite &= h_bad[i] == 0;
  }
  return ZB_OK;
}

/* Save copies nothing: it arms the next step to be tried (adamw_multi's
 * TRY keeps the old parameters in bp and leaves m and v alone), which is
 * all a rollback needs. */
static zb_err dev_save(void *self, zb_diag *diag) {
  zb_step_device *t = self;
  for (int i = 0; i < t->n; i++) {
    if (t->st[i].n && !t->st[i].bp)
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "device step: made without rollback buffers");
    t->st[i].saved_steps = t->st[i].steps;
  }
  t->armed = true;
  return ZB_OK;
}

/* Puts back the parameters a tried step changed (one copy per stage) and
 * the step counts; the moments were never written. */
static zb_err dev_restore(void *self, zb_diag *diag) {
  zb_step_device *t = self;
  zb_err err = ZB_OK;
  for (int i = 0; i < t->n && !err; i++) {
    dstage *s = &t->st[i];
    if (t->tried && s->n)
      err = DEV(t, copy, s->p, s->bp, s->n * sizeof(float), ZB_COPY_D2D, diag);
    if (!err)
      s->steps = s->saved_steps;
  }
  t->armed = t->tried = false;
  return err;
}

/* The tried step stands: its moments, from the same table. */
static zb_err dev_commit(void *self, zb_diag *diag) {
  zb_step_device *t = self;
  bool tried = t->tried;
  t->armed = t->tried = false;
  return tried ? DEV(t, adamw_multi, t->tab, t->n_tab, ZBM_ADAMW_COMMIT, diag) : ZB_OK;
}

static zb_err dev_step(void *self, double coef, zb_diag *diag) {
  zb_step_device *t = self;
  t->n_tab = 0;
  for (int i = 0; i < t->n; i++) {
    dstage *s = &t->st[i];
    const zb_adamw_config *c = zb_adamw_config_of(t->opt[i]);
    s->steps++; /* as zb_adamw counts a step of no parameters too */
    zbm_adamw_step k = {.beta1 = c->beta1, .beta2 = c->beta2, .eps = c->eps, .grad_scale = coef};
    zb_adamw_coefs(c, s->steps, &k.step_size, &k.sqrt_bc2, &k.shrink);
    if (s->n)
      t->tab[t->n_tab++] = (zbm_adamw_tensor){
          .p = s->p, .m = s->m, .v = s->v, .g = s->g, .decay = s->decay, .keep = s->bp, .n = s->n, .step = k};
  }
  zbm_adamw_mode mode = t->armed ? ZBM_ADAMW_TRY : ZBM_ADAMW_FULL;
  t->tried = t->armed;
  t->armed = false;
  /* enqueued: the next sync (the next partial, a pull) reports a failure */
  return DEV(t, adamw_multi, t->tab, t->n_tab, mode, diag);
}

static const zb_step_target_ops dev_ops = {
    .partial = dev_partial, .save = dev_save, .restore = dev_restore, .step = dev_step, .commit = dev_commit};

zb_step_target zb_step_device_target(zb_step_device *t) {
  return (zb_step_target){.ops = &dev_ops, .self = t};
}

/* ---- checkpoints ---- */

zb_err zb_step_device_pull_state(zb_step_device *t, zb_diag *diag) {
  zb_err err = ZB_OK;
  for (int i = 0; i < t->n && !err; i++) {
    dstage *s = &t->st[i];
    float *mv = zb_malloc(2 * (s->n ? s->n : 1) * sizeof(float));
    if (s->n && !(err = DEV(t, copy, mv, s->m, s->n * sizeof(float), ZB_COPY_D2H, diag)) &&
        !(err = DEV(t, copy, mv + s->n, s->v, s->n * sizeof(float), ZB_COPY_D2H, diag)))
      err = DEV(t, sync, diag);
    if (!err)
      err = zb_adamw_set_state(t->opt[i], s->steps, mv, mv + s->n, s->n, diag);
    free(mv);
  }
  return err;
}

zb_err zb_step_device_push_state(zb_step_device *t, zb_diag *diag) {
  zb_err err = ZB_OK;
  for (int i = 0; i < t->n && !err; i++) {
    dstage *s = &t->st[i];
    const float *m, *v;
    zb_adamw_state(t->opt[i], &s->steps, &m, &v);
    if (s->n && !(err = DEV(t, copy, s->m, m, s->n * sizeof(float), ZB_COPY_H2D, diag)))
      err = DEV(t, copy, s->v, v, s->n * sizeof(float), ZB_COPY_H2D, diag);
  }
  return err ? err : DEV(t, sync, diag);
}
