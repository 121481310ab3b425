/* kernels_standin.c — the zbk_* launchers of model/zb_cuda_kernels.h as
 * host code on the CPU stand-in's streams (test-only; docs/model.md, The
 * CPU stand-in). Each op means what the zb_device op of the same name
 * means (model/zb_device.h) and computes with the per-element functions of
 * model/zb_kernel_math.h, so its arithmetic is the CUDA kernels'.
 *
 * A launcher checks its sizes and every device range it will touch (as
 * standin_check_device names them; cudaErrorInvalidValue), copies its
 * arguments and enqueues the loop on stream s, returning at once with what
 * cudaGetLastError says then, as a real launch's status is read. Row and
 * column reductions are pairwise trees over a power-of-two width padded
 * with the identity, the order a GPU block's shared-memory reduction
 * takes, not the host kernels' lane order. What a launcher cannot check
 * before it runs (a token or target past the table) fails on the stream
 * with cudaErrorIllegalAddress, sticky, as a bad read on a GPU would; a
 * negative one too.
 *
 * Threads: launchers may be called from any thread; the loops run on the
 * stream's thread. Scratch is allocated per launch and freed by it.
 * Device pointers reach the loops as the stand-in's views (launch_views;
 * standin.h, device memory the host cannot read).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin_internal.h"
#include "zb_cuda_kernels.h"

typedef struct kjob {
  const char *name;
  const float *a, *b, *c, *d;
  const uint8_t *bytes;
  const int32_t *ids; /* tokens or targets */
  float *o1, *o2, *o3;
  double *dout;
  int *iout;
  int n, h, t;
  int heads, hd, ld, inverse; /* rope */
  size_t len;
  float alpha, eps;
  zbm_adamw_step step;
} kjob;

static size_t pow2(size_t n) {
  size_t p = 1;
  while (p < n)
    p <<= 1;
  return p;
}

/* Pairwise tree over buf[0..n) (capacity pow2(n)), padded with zeros. */
static float tree_sum(float *buf, size_t n) {
  size_t p = pow2(n);
  for (size_t i = n; i < p; i++)
    buf[i] = 0.0f;
  for (size_t w = p / 2; w >= 1; w /= 2)
    for (size_t i = 0; i < w; i++)
      buf[i] += buf[i + w];
  return buf[0];
}

static double tree_sum_d(double *buf, size_t n) {
  size_t p = pow2(n);
  for (size_t i = n; i < p; i++)
    buf[i] = 0.0;
  for (size_t w = p / 2; w >= 1; w /= 2)
    for (size_t i = 0; i < w; i++)
      buf[i] += buf[i + w];
  return buf[0];
}

/* Padded with buf[0], the max's identity here. */
static float tree_max(float *buf, size_t n) {
  size_t p = pow2(n);
  for (size_t i = n; i < p; i++)
    buf[i] = buf[0];
  for (size_t w = p / 2; w >= 1; w /= 2)
    for (size_t i = 0; i < w; i++)
      buf[i] = buf[i + w] > buf[i] ? buf[i + w] : buf[i];
  return buf[0];
}

static float *scratch(size_t n) {
  return malloc(pow2(n ? n : 1) * sizeof(float));
}

static cudaError_t no_memory(const char *name) {
  standin_error("%s: out of host memory for the stand-in's scratch", name);
  return cudaErrorMemoryAllocation;
}

/* Swaps p for its view (standin.h: device memory the host cannot read). */
static bool view(const char *api, const void *p, const void **out) {
  if (!p)
    return true;
  *out = standin_view(p, 0, api);
  return *out != NULL;
}

#define VIEW(api, field) view(api, (field), (const void **)(void *)&(field))

/* Every pointer field of a kjob, checked by the launcher already, becomes
 * its view; a new field belongs here too. */
static bool launch_views(kjob *j) {
  const char *n = j->name;
  return VIEW(n, j->a) && VIEW(n, j->b) && VIEW(n, j->c) && VIEW(n, j->d) && VIEW(n, j->bytes) &&
         VIEW(n, j->ids) && VIEW(n, j->o1) && VIEW(n, j->o2) && VIEW(n, j->o3) && VIEW(n, j->dout) &&
         VIEW(n, j->iout);
}

static cudaError_t launch(cudaStream_t s, standin_fn fn, const kjob *k) {
  kjob *j = malloc(sizeof *j);
  if (!j)
    return standin_set_last(cudaErrorMemoryAllocation);
  *j = *k;
  if (standin_inject(k->name, NULL)) { /* as a launch that cannot run: the launcher's status says so */
    free(j);
    return standin_set_last(cudaErrorLaunchOutOfResources);
  }
  if (!launch_views(j)) {
    free(j);
    return standin_set_last(cudaErrorInvalidValue);
  }
  cudaError_t e = standin_enqueue(s, fn, j, free);
  if (e != cudaSuccess) {
    free(j);
    return standin_set_last(e);
  }
  /* kernels_cuda.cu's launchers return cudaGetLastError() after the launch,
   * which also reports an error an earlier call left on this thread */
  return cudaGetLastError();
}

/* Checks a device range of `count` elements of `size` bytes. */
static cudaError_t dev(const char *api, const char *arg, const void *p, size_t count, size_t size) {
  char what[96];
  snprintf(what, sizeof what, "%s %s", api, arg);
  return standin_check_device(p, count * size, what);
}

static cudaError_t bad_shape(const char *api, const char *why) {
  standin_error("%s: %s", api, why);
  return standin_set_last(cudaErrorInvalidValue);
}

#define CHECK(expr)                                                                                          \
  do {                                                                                                       \
    cudaError_t e_ = (expr);                                                                                 \
    if (e_ != cudaSuccess)                                                                                   \
      return standin_set_last(e_);                                                                           \
  } while (0)

/* ---- embedding ---- */

/* The table's rows are checked here, against the room the table's
 * allocation had at the launch: the launcher does not know the vocabulary. */
static cudaError_t row_in(const char *api, size_t room, int token, int h) {
  if (token < 0 || ((size_t)token + 1) * (size_t)h * sizeof(float) > room) {
    standin_error("%s: token %d reads past the embedding table (illegal address)", api, token);
    return cudaErrorIllegalAddress;
  }
  return cudaSuccess;
}

static cudaError_t embed_fwd_run(void *arg) {
  const kjob *k = arg;
  for (int r = 0; r < k->n; r++) {
    cudaError_t e = row_in(k->name, k->len, k->ids[r], k->h);
    if (e != cudaSuccess)
      return e;
    const float *er = k->a + (size_t)k->ids[r] * k->h, *pr = k->b ? k->b + (size_t)(r % k->t) * k->h : NULL;
    float *xr = k->o1 + (size_t)r * k->h;
    for (int c = 0; c < k->h; c++)
      xr[c] = pr ? er[c] + pr[c] : er[c];
  }
  return cudaSuccess;
}

cudaError_t zbk_embed_fwd(cudaStream_t s, const float *emb, const float *pos, const int32_t *tokens, float *x,
                          int n, int h, int t) {
  const char *api = "zbk_embed_fwd";
  if (n < 0 || h < 0 || t <= 0)
    return bad_shape(api, "n, h must be >= 0 and t > 0");
  if (n == 0 || h == 0)
    return cudaSuccess;
  size_t tr = (size_t)(n < t ? n : t);
  CHECK(dev(api, "emb", emb, (size_t)h, sizeof(float)));
  if (pos)
    CHECK(dev(api, "pos", pos, tr * h, sizeof(float)));
  CHECK(dev(api, "tokens", tokens, (size_t)n, sizeof *tokens));
  CHECK(dev(api, "x", x, (size_t)n * h, sizeof(float)));
  return launch(s, embed_fwd_run,
                &(kjob){.name = api,
                        .a = emb,
                        .b = pos,
                        .ids = tokens,
                        .o1 = x,
                        .n = n,
                        .h = h,
                        .t = t,
                        .len = standin_room(emb)});
}

static cudaError_t embed_bwd_run(void *arg) {
  const kjob *k = arg;
  for (int r = 0; r < k->n; r++) {
    cudaError_t e = row_in(k->name, k->len, k->ids[r], k->h);
    if (e != cudaSuccess)
      return e;
    const float *dr = k->a + (size_t)r * k->h;
    float *er = k->o1 + (size_t)k->ids[r] * k->h, *pr = k->o2 ? k->o2 + (size_t)(r % k->t) * k->h : NULL;
    for (int c = 0; c < k->h; c++) {
      er[c] += dr[c];
      if (pr)
        pr[c] += dr[c];
    }
  }
  return cudaSuccess;
}

cudaError_t zbk_embed_bwd_acc(cudaStream_t s, const float *dx, const int32_t *tokens, float *demb,
                              float *dpos, int n, int h, int t) {
  const char *api = "zbk_embed_bwd_acc";
  if (n < 0 || h < 0 || t <= 0)
    return bad_shape(api, "n, h must be >= 0 and t > 0");
  if (n == 0 || h == 0)
    return cudaSuccess;
  size_t tr = (size_t)(n < t ? n : t);
  CHECK(dev(api, "dx", dx, (size_t)n * h, sizeof(float)));
  CHECK(dev(api, "tokens", tokens, (size_t)n, sizeof *tokens));
  CHECK(dev(api, "demb", demb, (size_t)h, sizeof(float)));
  if (dpos)
    CHECK(dev(api, "dpos", dpos, tr * h, sizeof(float)));
  return launch(s, embed_bwd_run,
                &(kjob){.name = api,
                        .a = dx,
                        .ids = tokens,
                        .o1 = demb,
                        .o2 = dpos,
                        .n = n,
                        .h = h,
                        .t = t,
                        .len = standin_room(demb)});
}

/* ---- LayerNorm ---- */

static cudaError_t ln_fwd_run(void *arg) {
  const kjob *k = arg;
  int h = k->h;
  float *buf = scratch((size_t)h);
  if (!buf)
    return no_memory(k->name);
  for (int r = 0; r < k->n; r++) {
    const float *xr = k->a + (size_t)r * h;
    float *yr = k->o1 + (size_t)r * h, *hr = k->o2 + (size_t)r * h;
    memcpy(buf, xr, (size_t)h * sizeof *buf);
    float mean = tree_sum(buf, (size_t)h) / (float)h;
    for (int c = 0; c < h; c++) {
      hr[c] = xr[c] - mean;
      buf[c] = hr[c] * hr[c];
    }
    float rs = zbm_ln_rstd(tree_sum(buf, (size_t)h), h);
    k->o3[r] = rs;
    for (int c = 0; c < h; c++) {
      hr[c] *= rs;
      yr[c] = hr[c] * k->b[c] + k->c[c];
    }
  }
  free(buf);
  return cudaSuccess;
}

cudaError_t zbk_layernorm_fwd(cudaStream_t s, const float *x, const float *g, const float *b, float *y,
                              float *xhat, float *rstd, int n, int h) {
  const char *api = "zbk_layernorm_fwd";
  if (n < 0 || h < 0)
    return bad_shape(api, "n and h must be >= 0");
  if (n == 0 || h == 0)
    return cudaSuccess;
  size_t nh = (size_t)n * h;
  CHECK(dev(api, "x", x, nh, sizeof(float)));
  CHECK(dev(api, "g", g, (size_t)h, sizeof(float)));
  CHECK(dev(api, "b", b, (size_t)h, sizeof(float)));
  CHECK(dev(api, "y", y, nh, sizeof(float)));
  CHECK(dev(api, "xhat", xhat, nh, sizeof(float)));
  CHECK(dev(api, "rstd", rstd, (size_t)n, sizeof(float)));
  return launch(
      s, ln_fwd_run,
      &(kjob){.name = api, .a = x, .b = g, .c = b, .o1 = y, .o2 = xhat, .o3 = rstd, .n = n, .h = h});
}

static cudaError_t ln_affine_run(void *arg) {
  const kjob *k = arg;
  for (size_t i = 0; i < (size_t)k->n * k->h; i++)
    k->o1[i] = k->c ? k->a[i] * k->b[i % k->h] + k->c[i % k->h] : k->a[i] * k->b[i % k->h];
  return cudaSuccess;
}

cudaError_t zbk_layernorm_affine(cudaStream_t s, const float *xhat, const float *g, const float *b, float *y,
                                 int n, int h) {
  const char *api = "zbk_layernorm_affine";
  if (n < 0 || h < 0)
    return bad_shape(api, "n and h must be >= 0");
  if (n == 0 || h == 0)
    return cudaSuccess;
  size_t nh = (size_t)n * h;
  CHECK(dev(api, "xhat", xhat, nh, sizeof(float)));
  CHECK(dev(api, "g", g, (size_t)h, sizeof(float)));
  if (b) /* NULL: no shift (RMSNorm) */
    CHECK(dev(api, "b", b, (size_t)h, sizeof(float)));
  CHECK(dev(api, "y", y, nh, sizeof(float)));
  return launch(s, ln_affine_run, &(kjob){.name = api, .a = xhat, .b = g, .c = b, .o1 = y, .n = n, .h = h});
}

static cudaError_t ln_bwd_run(void *arg) {
  const kjob *k = arg;
  int h = k->h;
  float *b1 = scratch((size_t)h), *b2 = scratch((size_t)h);
  if (!b1 || !b2) {
    free(b1);
    free(b2);
    return no_memory(k->name);
  }
  const float *g = k->d;
  for (int r = 0; r < k->n; r++) {
    const float *dr = k->a + (size_t)r * h, *hr = k->b + (size_t)r * h;
    float *xr = k->o1 + (size_t)r * h;
    for (int c = 0; c < h; c++) {
      b1[c] = dr[c] * g[c];
      b2[c] = b1[c] * hr[c];
    }
    float m1 = tree_sum(b1, (size_t)h) / (float)h, m2 = tree_sum(b2, (size_t)h) / (float)h;
    for (int c = 0; c < h; c++)
      xr[c] += zbm_ln_dx(dr[c], g[c], hr[c], k->c[r], m1, m2);
  }
  free(b1);
  free(b2);
  return cudaSuccess;
}

cudaError_t zbk_layernorm_bwd_acc(cudaStream_t s, const float *dy, const float *xhat, const float *rstd,
                                  const float *g, float *dx, int n, int h) {
  const char *api = "zbk_layernorm_bwd_acc";
  if (n < 0 || h < 0)
    return bad_shape(api, "n and h must be >= 0");
  if (n == 0 || h == 0)
    return cudaSuccess;
  size_t nh = (size_t)n * h;
  CHECK(dev(api, "dy", dy, nh, sizeof(float)));
  CHECK(dev(api, "xhat", xhat, nh, sizeof(float)));
  CHECK(dev(api, "rstd", rstd, (size_t)n, sizeof(float)));
  CHECK(dev(api, "g", g, (size_t)h, sizeof(float)));
  CHECK(dev(api, "dx", dx, nh, sizeof(float)));
  return launch(s, ln_bwd_run,
                &(kjob){.name = api, .a = dy, .b = xhat, .c = rstd, .d = g, .o1 = dx, .n = n, .h = h});
}

/* out[c] += tree over rows of f(r, c), f = a (b == NULL) or a * b. */
static cudaError_t col_tree_acc(const char *name, const float *a, const float *b, float *out, int n,
                                int cols) {
  float *buf = scratch((size_t)n);
  if (!buf)
    return no_memory(name);
  for (int c = 0; c < cols; c++) {
    for (int r = 0; r < n; r++) {
      size_t i = (size_t)r * cols + c;
      buf[r] = b ? a[i] * b[i] : a[i];
    }
    out[c] += tree_sum(buf, (size_t)n);
  }
  free(buf);
  return cudaSuccess;
}

static cudaError_t ln_param_run(void *arg) {
  const kjob *k = arg;
  cudaError_t e = col_tree_acc(k->name, k->a, k->b, k->o1, k->n, k->h);
  return e != cudaSuccess || !k->o2 ? e : col_tree_acc(k->name, k->a, NULL, k->o2, k->n, k->h);
}

cudaError_t zbk_layernorm_param_grads_acc(cudaStream_t s, const float *dy, const float *xhat, float *dg,
                                          float *db, int n, int h) {
  const char *api = "zbk_layernorm_param_grads_acc";
  if (n < 0 || h < 0)
    return bad_shape(api, "n and h must be >= 0");
  if (n == 0 || h == 0)
    return cudaSuccess;
  size_t nh = (size_t)n * h;
  CHECK(dev(api, "dy", dy, nh, sizeof(float)));
  CHECK(dev(api, "xhat", xhat, nh, sizeof(float)));
  CHECK(dev(api, "dg", dg, (size_t)h, sizeof(float)));
  if (db) /* NULL: dg alone (RMSNorm's weight) */
    CHECK(dev(api, "db", db, (size_t)h, sizeof(float)));
  return launch(s, ln_param_run,
                &(kjob){.name = api, .a = dy, .b = xhat, .o1 = dg, .o2 = db, .n = n, .h = h});
}

/* ---- bias and column sums ---- */

static cudaError_t bias_add_run(void *arg) {
  const kjob *k = arg;
  for (size_t i = 0; i < (size_t)k->n * k->h; i++)
    k->o1[i] += k->a[i % k->h];
  return cudaSuccess;
}

cudaError_t zbk_bias_add(cudaStream_t s, float *y, const float *b, int n, int cols) {
  const char *api = "zbk_bias_add";
  if (n < 0 || cols < 0)
    return bad_shape(api, "n and cols must be >= 0");
  if (n == 0 || cols == 0)
    return cudaSuccess;
  CHECK(dev(api, "y", y, (size_t)n * cols, sizeof(float)));
  CHECK(dev(api, "b", b, (size_t)cols, sizeof(float)));
  return launch(s, bias_add_run, &(kjob){.name = api, .a = b, .o1 = y, .n = n, .h = cols});
}

static cudaError_t col_sums_run(void *arg) {
  const kjob *k = arg;
  return col_tree_acc(k->name, k->a, NULL, k->o1, k->n, k->h);
}

cudaError_t zbk_col_sums_acc(cudaStream_t s, const float *dy, float *db, int n, int cols) {
  const char *api = "zbk_col_sums_acc";
  if (n < 0 || cols < 0)
    return bad_shape(api, "n and cols must be >= 0");
  if (n == 0 || cols == 0)
    return cudaSuccess;
  CHECK(dev(api, "dy", dy, (size_t)n * cols, sizeof(float)));
  CHECK(dev(api, "db", db, (size_t)cols, sizeof(float)));
  return launch(s, col_sums_run, &(kjob){.name = api, .a = dy, .o1 = db, .n = n, .h = cols});
}

/* ---- GeLU ---- */

static cudaError_t gelu_fwd_run(void *arg) {
  const kjob *k = arg;
  for (size_t i = 0; i < k->len; i++)
    k->o1[i] = zbm_gelu(k->a[i]);
  return cudaSuccess;
}

cudaError_t zbk_gelu_fwd(cudaStream_t s, const float *u, float *out, size_t len) {
  const char *api = "zbk_gelu_fwd";
  if (len == 0)
    return cudaSuccess;
  CHECK(dev(api, "u", u, len, sizeof(float)));
  CHECK(dev(api, "out", out, len, sizeof(float)));
  return launch(s, gelu_fwd_run, &(kjob){.name = api, .a = u, .o1 = out, .len = len});
}

static cudaError_t gelu_bwd_run(void *arg) {
  const kjob *k = arg;
  for (size_t i = 0; i < k->len; i++)
    k->o1[i] = zbm_gelu_grad(k->o1[i], k->a[i]);
  return cudaSuccess;
}

cudaError_t zbk_gelu_bwd_inplace(cudaStream_t s, const float *dout, float *u, size_t len) {
  const char *api = "zbk_gelu_bwd_inplace";
  if (len == 0)
    return cudaSuccess;
  CHECK(dev(api, "dout", dout, len, sizeof(float)));
  CHECK(dev(api, "u", u, len, sizeof(float)));
  return launch(s, gelu_bwd_run, &(kjob){.name = api, .a = dout, .o1 = u, .len = len});
}

/* ---- llama: RMSNorm, rotary embeddings, SwiGLU ---- */

static cudaError_t rms_fwd_run(void *arg) {
  const kjob *k = arg;
  int h = k->h;
  float *buf = scratch((size_t)h);
  if (!buf)
    return no_memory(k->name);
  for (int r = 0; r < k->n; r++) {
    const float *xr = k->a + (size_t)r * h;
    float *yr = k->o1 + (size_t)r * h, *hr = k->o2 + (size_t)r * h;
    for (int c = 0; c < h; c++)
      buf[c] = xr[c] * xr[c];
    float rs = zbm_rms_rstd(tree_sum(buf, (size_t)h), h, k->eps);
    k->o3[r] = rs;
    for (int c = 0; c < h; c++) {
      hr[c] = xr[c] * rs;
      yr[c] = hr[c] * k->b[c];
    }
  }
  free(buf);
  return cudaSuccess;
}

cudaError_t zbk_rmsnorm_fwd(cudaStream_t s, const float *x, const float *g, float *y, float *xhat,
                            float *rstd, int n, int h, float eps) {
  const char *api = "zbk_rmsnorm_fwd";
  if (n < 0 || h < 0)
    return bad_shape(api, "n and h must be >= 0");
  if (n == 0 || h == 0)
    return cudaSuccess;
  size_t nh = (size_t)n * h;
  CHECK(dev(api, "x", x, nh, sizeof(float)));
  CHECK(dev(api, "g", g, (size_t)h, sizeof(float)));
  CHECK(dev(api, "y", y, nh, sizeof(float)));
  CHECK(dev(api, "xhat", xhat, nh, sizeof(float)));
  CHECK(dev(api, "rstd", rstd, (size_t)n, sizeof(float)));
  return launch(
      s, rms_fwd_run,
      &(kjob){.name = api, .a = x, .b = g, .o1 = y, .o2 = xhat, .o3 = rstd, .n = n, .h = h, .eps = eps});
}

static cudaError_t rms_bwd_run(void *arg) {
  const kjob *k = arg;
  int h = k->h;
  float *buf = scratch((size_t)h);
  if (!buf)
    return no_memory(k->name);
  for (int r = 0; r < k->n; r++) {
    const float *dr = k->a + (size_t)r * h, *hr = k->b + (size_t)r * h;
    float *xr = k->o1 + (size_t)r * h;
    for (int c = 0; c < h; c++)
      buf[c] = dr[c] * k->d[c] * hr[c];
    float m2 = tree_sum(buf, (size_t)h) / (float)h;
    for (int c = 0; c < h; c++)
      xr[c] += zbm_rms_dx(dr[c], k->d[c], hr[c], k->c[r], m2);
  }
  free(buf);
  return cudaSuccess;
}

cudaError_t zbk_rmsnorm_bwd_acc(cudaStream_t s, const float *dy, const float *xhat, const float *rstd,
                                const float *g, float *dx, int n, int h) {
  const char *api = "zbk_rmsnorm_bwd_acc";
  if (n < 0 || h < 0)
    return bad_shape(api, "n and h must be >= 0");
  if (n == 0 || h == 0)
    return cudaSuccess;
  size_t nh = (size_t)n * h;
  CHECK(dev(api, "dy", dy, nh, sizeof(float)));
  CHECK(dev(api, "xhat", xhat, nh, sizeof(float)));
  CHECK(dev(api, "rstd", rstd, (size_t)n, sizeof(float)));
  CHECK(dev(api, "g", g, (size_t)h, sizeof(float)));
  CHECK(dev(api, "dx", dx, nh, sizeof(float)));
  return launch(s, rms_bwd_run,
                &(kjob){.name = api, .a = dy, .b = xhat, .c = rstd, .d = g, .o1 = dx, .n = n, .h = h});
}

static cudaError_t rope_run(void *arg) {
  const kjob *k = arg;
  int half = k->hd / 2;
  float sign = k->inverse ? -1.0f : 1.0f;
  for (int r = 0; r < k->n; r++) {
    size_t tab = (size_t)(r % k->t) * (size_t)half;
    for (int hh = 0; hh < k->heads; hh++) {
      float *xh = k->o1 + (size_t)r * k->ld + (size_t)hh * k->hd;
      for (int j = 0; j < half; j++)
        zbm_rope_pair(&xh[j], &xh[j + half], k->a[tab + j], sign * k->b[tab + j]);
    }
  }
  return cudaSuccess;
}

cudaError_t zbk_rope(cudaStream_t s, float *x, const float *cos, const float *sin, int n, int t, int heads,
                     int hd, int ld, int inverse) {
  const char *api = "zbk_rope";
  if (n < 0 || t < 1 || heads < 0 || hd < 0 || hd % 2 != 0 || ld < heads * hd)
    return bad_shape(api, "needs n >= 0, t >= 1, an even hd and ld >= heads * hd");
  if (n == 0 || heads == 0 || hd == 0)
    return cudaSuccess;
  int rows_t = n < t ? n : t; /* table rows the launch reads */
  CHECK(dev(api, "x", x, (size_t)(n - 1) * ld + (size_t)heads * hd, sizeof(float)));
  CHECK(dev(api, "cos", cos, (size_t)rows_t * (size_t)(hd / 2), sizeof(float)));
  CHECK(dev(api, "sin", sin, (size_t)rows_t * (size_t)(hd / 2), sizeof(float)));
  return launch(s, rope_run,
                &(kjob){.name = api,
                        .a = cos,
                        .b = sin,
                        .o1 = x,
                        .n = n,
                        .t = t,
                        .heads = heads,
                        .hd = hd,
                        .ld = ld,
                        .inverse = inverse});
}

static cudaError_t swiglu_fwd_run(void *arg) {
  const kjob *k = arg;
  for (size_t i = 0; i < k->len; i++)
    k->o1[i] = zbm_swiglu(k->a[i], k->b[i]);
  return cudaSuccess;
}

cudaError_t zbk_swiglu_fwd(cudaStream_t s, const float *gate, const float *up, float *out, size_t len) {
  const char *api = "zbk_swiglu_fwd";
  if (len == 0)
    return cudaSuccess;
  CHECK(dev(api, "gate", gate, len, sizeof(float)));
  CHECK(dev(api, "up", up, len, sizeof(float)));
  CHECK(dev(api, "out", out, len, sizeof(float)));
  return launch(s, swiglu_fwd_run, &(kjob){.name = api, .a = gate, .b = up, .o1 = out, .len = len});
}

static cudaError_t swiglu_bwd_run(void *arg) {
  const kjob *k = arg;
  for (size_t i = 0; i < k->len; i++)
    zbm_swiglu_grad(k->o1[i], k->o2[i], k->a[i], &k->o1[i], &k->o2[i]);
  return cudaSuccess;
}

cudaError_t zbk_swiglu_bwd_inplace(cudaStream_t s, const float *dout, float *gate, float *up, size_t len) {
  const char *api = "zbk_swiglu_bwd_inplace";
  if (len == 0)
    return cudaSuccess;
  CHECK(dev(api, "dout", dout, len, sizeof(float)));
  CHECK(dev(api, "gate", gate, len, sizeof(float)));
  CHECK(dev(api, "up", up, len, sizeof(float)));
  return launch(s, swiglu_bwd_run, &(kjob){.name = api, .a = dout, .o1 = gate, .o2 = up, .len = len});
}

/* ---- causal softmax ---- */

/* In place on row[0..len): e^(x - max) / sum; returns the sum (scaled
 * entries) and the max through *mx. */
static float softmax_row(float *row, int len, float *buf, float *mx) {
  memcpy(buf, row, (size_t)len * sizeof *buf);
  *mx = tree_max(buf, (size_t)len);
  for (int j = 0; j < len; j++)
    buf[j] = row[j] = zbm_exp(row[j] - *mx);
  float sum = tree_sum(buf, (size_t)len), inv = 1.0f / sum;
  for (int j = 0; j < len; j++)
    row[j] *= inv;
  return sum;
}

static cudaError_t softmax_run(void *arg) {
  const kjob *k = arg;
  int t = k->t;
  float *buf = scratch((size_t)t);
  if (!buf)
    return no_memory(k->name);
  for (size_t m = 0; m < (size_t)k->n; m++)
    for (int i = 0; i < t; i++) {
      float *row = k->o1 + (m * t + i) * t, mx;
      softmax_row(row, i + 1, buf, &mx);
      for (int j = i + 1; j < t; j++)
        row[j] = 0.0f;
    }
  free(buf);
  return cudaSuccess;
}

cudaError_t zbk_softmax_causal(cudaStream_t s, float *p, int t, int count) {
  const char *api = "zbk_softmax_causal";
  if (t < 0 || count < 0)
    return bad_shape(api, "t and count must be >= 0");
  if (t == 0 || count == 0)
    return cudaSuccess;
  CHECK(dev(api, "p", p, (size_t)count * t * t, sizeof(float)));
  return launch(s, softmax_run, &(kjob){.name = api, .o1 = p, .n = count, .t = t});
}

static cudaError_t softmax_bwd_run(void *arg) {
  const kjob *k = arg;
  int t = k->t;
  float *buf = scratch((size_t)t);
  if (!buf)
    return no_memory(k->name);
  for (size_t m = 0; m < (size_t)k->n; m++)
    for (int i = 0; i < t; i++) {
      const float *pr = k->a + (m * t + i) * t;
      float *dr = k->o1 + (m * t + i) * t;
      for (int j = 0; j <= i; j++)
        buf[j] = pr[j] * dr[j];
      float dot = tree_sum(buf, (size_t)i + 1);
      for (int j = 0; j <= i; j++)
        dr[j] = zbm_softmax_bwd(pr[j], dr[j], dot);
      for (int j = i + 1; j < t; j++)
        dr[j] = 0.0f;
    }
  free(buf);
  return cudaSuccess;
}

cudaError_t zbk_softmax_causal_bwd(cudaStream_t s, const float *p, float *dp, int t, int count) {
  const char *api = "zbk_softmax_causal_bwd";
  if (t < 0 || count < 0)
    return bad_shape(api, "t and count must be >= 0");
  if (t == 0 || count == 0)
    return cudaSuccess;
  size_t len = (size_t)count * t * t;
  CHECK(dev(api, "p", p, len, sizeof(float)));
  CHECK(dev(api, "dp", dp, len, sizeof(float)));
  return launch(s, softmax_bwd_run, &(kjob){.name = api, .a = p, .o1 = dp, .n = count, .t = t});
}

/* ---- cross-entropy ---- */

static cudaError_t bad_target(const char *name, int r, int target, int v) {
  standin_error("%s: row %d's target %d is not in [0, v = %d) (illegal address)", name, r, target, v);
  return cudaErrorIllegalAddress;
}

static cudaError_t xent_fwd_run(void *arg) {
  const kjob *k = arg;
  int v = k->h;
  float *buf = scratch((size_t)v);
  if (!buf)
    return no_memory(k->name);
  cudaError_t e = cudaSuccess;
  for (int r = 0; r < k->n && e == cudaSuccess; r++) {
    float *row = k->o1 + (size_t)r * v, mx;
    int tg = k->ids[r];
    if (tg < 0 || tg >= v) {
      e = bad_target(k->name, r, tg, v);
      break;
    }
    float logit = row[tg];
    float sum = softmax_row(row, v, buf, &mx);
    k->dout[r] = zbm_xent_loss(sum, logit - mx);
  }
  free(buf);
  return e;
}

cudaError_t zbk_xent_fwd(cudaStream_t s, float *logits, const int32_t *targets, double *row_loss, int n,
                         int v) {
  const char *api = "zbk_xent_fwd";
  if (n < 0 || v < 0)
    return bad_shape(api, "n and v must be >= 0");
  if (n == 0 || v == 0)
    return cudaSuccess;
  CHECK(dev(api, "logits", logits, (size_t)n * v, sizeof(float)));
  CHECK(dev(api, "targets", targets, (size_t)n, sizeof *targets));
  CHECK(dev(api, "row_loss", row_loss, (size_t)n, sizeof(double)));
  return launch(s, xent_fwd_run,
                &(kjob){.name = api, .o1 = logits, .ids = targets, .dout = row_loss, .n = n, .h = v});
}

static cudaError_t xent_bwd_run(void *arg) {
  const kjob *k = arg;
  int v = k->h;
  for (int r = 0; r < k->n; r++) {
    float *row = k->o1 + (size_t)r * v;
    int tg = k->ids[r];
    if (tg < 0 || tg >= v)
      return bad_target(k->name, r, tg, v);
    for (int j = 0; j < v; j++)
      row[j] = zbm_xent_grad(row[j], j == tg, k->alpha);
  }
  return cudaSuccess;
}

cudaError_t zbk_xent_bwd(cudaStream_t s, float *probs, const int32_t *targets, int n, int v, float scale) {
  const char *api = "zbk_xent_bwd";
  if (n < 0 || v < 0)
    return bad_shape(api, "n and v must be >= 0");
  if (n == 0 || v == 0)
    return cudaSuccess;
  CHECK(dev(api, "probs", probs, (size_t)n * v, sizeof(float)));
  CHECK(dev(api, "targets", targets, (size_t)n, sizeof *targets));
  return launch(s, xent_bwd_run,
                &(kjob){.name = api, .o1 = probs, .ids = targets, .n = n, .h = v, .alpha = scale});
}

/* ---- optimizer and vector ops ---- */

static cudaError_t adamw_run(void *arg) {
  const kjob *k = arg;
  for (size_t i = 0; i < k->len; i++)
    zbm_adamw(&k->o1[i], &k->o2[i], &k->o3[i], k->a[i], k->bytes[i] != 0, &k->step);
  return cudaSuccess;
}

cudaError_t zbk_adamw(cudaStream_t s, float *p, float *m, float *v, const float *g, const uint8_t *decay,
                      size_t n, zbm_adamw_step step) {
  const char *api = "zbk_adamw";
  if (n == 0)
    return cudaSuccess;
  CHECK(dev(api, "p", p, n, sizeof(float)));
  CHECK(dev(api, "m", m, n, sizeof(float)));
  CHECK(dev(api, "v", v, n, sizeof(float)));
  CHECK(dev(api, "g", g, n, sizeof(float)));
  CHECK(dev(api, "decay", decay, n, 1));
  return launch(
      s, adamw_run,
      &(kjob){.name = api, .o1 = p, .o2 = m, .o3 = v, .a = g, .bytes = decay, .len = n, .step = step});
}

static cudaError_t add_run(void *arg) {
  const kjob *k = arg;
  for (size_t i = 0; i < k->len; i++)
    k->o1[i] += k->alpha * k->a[i];
  return cudaSuccess;
}

cudaError_t zbk_add(cudaStream_t s, float *y, const float *x, float alpha, size_t n) {
  const char *api = "zbk_add";
  if (n == 0)
    return cudaSuccess;
  CHECK(dev(api, "y", y, n, sizeof(float)));
  CHECK(dev(api, "x", x, n, sizeof(float)));
  return launch(s, add_run, &(kjob){.name = api, .o1 = y, .a = x, .alpha = alpha, .len = n});
}

static cudaError_t scale_run(void *arg) {
  const kjob *k = arg;
  for (size_t i = 0; i < k->len; i++)
    k->o1[i] *= k->alpha;
  return cudaSuccess;
}

cudaError_t zbk_scale(cudaStream_t s, float *x, float alpha, size_t n) {
  const char *api = "zbk_scale";
  if (n == 0)
    return cudaSuccess;
  CHECK(dev(api, "x", x, n, sizeof(float)));
  return launch(s, scale_run, &(kjob){.name = api, .o1 = x, .alpha = alpha, .len = n});
}

static cudaError_t sumsq_run(void *arg) {
  const kjob *k = arg;
  double *buf = malloc(pow2(k->len) * sizeof *buf);
  if (!buf)
    return no_memory(k->name);
  int bad = 0;
  for (size_t i = 0; i < k->len; i++) {
    float x = k->a[i];
    bad |= !isfinite(x);
    buf[i] = (double)x * (double)x;
  }
  *k->dout = tree_sum_d(buf, k->len);
  *k->iout = bad;
  free(buf);
  return cudaSuccess;
}

/* n = 0 still writes the results (0 and 0): the outputs are "overwritten". */
cudaError_t zbk_sumsq(cudaStream_t s, const float *x, size_t n, double *out, int *nonfinite) {
  const char *api = "zbk_sumsq";
  if (n > 0)
    CHECK(dev(api, "x", x, n, sizeof(float)));
  CHECK(dev(api, "out", out, 1, sizeof(double)));
  CHECK(dev(api, "nonfinite", nonfinite, 1, sizeof(int)));
  return launch(s, sumsq_run, &(kjob){.name = api, .a = x, .dout = out, .iout = nonfinite, .len = n});
}
