/* test_device_ops.c — every op of zb_device_ops on the CUDA device against
 * the host device (docs/model.md, Devices), over odd shapes: n = 1, 7, 33
 * rows; h = 3, 64, 129 columns; t = 1, 5, 17 positions; v = 5, 256 (on a
 * GPU also the model's own shapes: run_gpu_shapes); batched
 * GEMMs with transposes, leading dimensions wider than the rows, batch
 * strides, head-like column blocks, alpha and beta other than 1 and 0.
 * Flash attention at T = 1 to 1024 (across its tiles), one head, head
 * dimensions 8 to 128 (80 too), grouped-query attention, padded rows.
 *
 * The rule: an output element passes when
 *     |got - want| <= 1e-5 * max(|want|, 1),
 * i.e. 1e-5 relative, with the inputs' own scale (uniform in [-1, 1]) as
 * the floor under values near zero, where a reduction in another order
 * (a tree of threads instead of lanes, atomics, FMA) can differ by more
 * than 1e-5 of a tiny result. The program prints, per op, the number of
 * cases and the largest error under that rule, and fails if any exceeds
 * 1e-5. Inputs that an op must not read (above a causal diagonal) are NaN.
 *
 * The device under test is zb_device_cuda_new(ordinal 0): the real runtime
 * on a GPU (ctest label gpu), or the CPU stand-in of the CUDA APIs when the
 * binary is linked against it. Without a device it prints why and exits 77
 * (ctest's SKIP_RETURN_CODE). Any device error ends the run with exit 1.
 * Single-threaded; everything it allocates it frees.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "zb_device.h"

#define TOL 1e-5

typedef struct stat {
  const char *op;
  int cases;
  double max_err;
  char worst[80];
} stat;

typedef struct ctx {
  zb_device *dev[2]; /* 0: host (reference), 1: under test */
  stat stats[64];
  int n_stats;
  uint64_t rng;
  bool gpu; /* a real GPU: the model's own shapes run too (run_gpu_shapes) */
} ctx;

/* a buffer on both devices */
typedef struct dbuf {
  void *p[2];
  size_t bytes;
} dbuf;

static void must(zb_err err, const zb_diag *diag, const char *what, int dev) {
  if (err) {
    fprintf(stderr, "test_device_ops: %s on the %s device: %s: %s\n", what, dev ? "tested" : "host",
            zb_strerror(err), diag->msg);
    exit(1);
  }
}

#define ON_BOTH(c, call_name, expr)                                                                          \
  for (int i_ = 0; i_ < 2; i_++) {                                                                           \
    zb_device *dv = (c)->dev[i_];                                                                            \
    int i = i_;                                                                                              \
    zb_diag dg_ = {{0}};                                                                                     \
    (void)i;                                                                                                 \
    must((expr), &dg_, call_name, i_);                                                                       \
  }
#define DIAG (&dg_)

static float frand(ctx *c) {
  c->rng = c->rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((double)(c->rng >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static float *rand_floats(ctx *c, size_t n, float scale) {
  float *x = malloc((n ? n : 1) * sizeof *x);
  for (size_t i = 0; i < n; i++)
    x[i] = frand(c) * scale;
  return x;
}

static uint8_t *rand_bytes(ctx *c, size_t n, int below) {
  uint8_t *x = malloc(n ? n : 1);
  for (size_t i = 0; i < n; i++)
    x[i] = (uint8_t)(((frand(c) + 1.0f) * 0.5f) * (float)below) % below;
  return x;
}

/* Token ids below `below` (the same draws as rand_bytes). */
static int32_t *rand_ids(ctx *c, size_t n, int below) {
  int32_t *x = malloc((n ? n : 1) * sizeof *x);
  for (size_t i = 0; i < n; i++)
    x[i] = (int32_t)(((frand(c) + 1.0f) * 0.5f) * (float)below) % below;
  return x;
}

static dbuf up(ctx *c, const void *src, size_t bytes) {
  dbuf b = {.bytes = bytes};
  ON_BOTH(c, "alloc", dv->ops->alloc(dv->self, bytes, &b.p[i], DIAG));
  if (bytes)
    ON_BOTH(c, "copy H2D", dv->ops->copy(dv->self, b.p[i], src, bytes, ZB_COPY_H2D, DIAG));
  return b;
}

static void release(ctx *c, dbuf *b) {
  for (int i = 0; i < 2; i++)
    c->dev[i]->ops->free(c->dev[i]->self, b->p[i]);
}

/* both copies of b, back on the host, after both devices synced */
static void down(ctx *c, const dbuf *b, void *want, void *got) {
  void *dst[2] = {want, got};
  ON_BOTH(c, "copy D2H", dv->ops->copy(dv->self, dst[i], b->p[i], b->bytes, ZB_COPY_D2H, DIAG));
  ON_BOTH(c, "sync", dv->ops->sync(dv->self, DIAG));
}

static stat *stat_of(ctx *c, const char *op) {
  for (int i = 0; i < c->n_stats; i++)
    if (strcmp(c->stats[i].op, op) == 0)
      return &c->stats[i];
  stat *s = &c->stats[c->n_stats++];
  memset(s, 0, sizeof *s);
  s->op = op;
  return s;
}

static void record(ctx *c, const char *op, double err, const char *desc) {
  stat *s = stat_of(c, op);
  s->cases++;
  if (s->cases == 1 || !(err <= s->max_err)) { /* a NaN error counts as the worst */
    s->max_err = err;
    snprintf(s->worst, sizeof s->worst, "%s", desc);
  }
}

static double err_of(double got, double want) {
  double d = fabs(got - want), floor_ = fabs(want) > 1.0 ? fabs(want) : 1.0;
  if (isnan(got) != isnan(want))
    return INFINITY;
  return isnan(got) ? 0.0 : d / floor_;
}

/* compares n floats of b on both devices under the rule */
static void cmp(ctx *c, const char *op, const dbuf *b, size_t n, const char *desc) {
  float *want = malloc(b->bytes ? b->bytes : 1), *got = malloc(b->bytes ? b->bytes : 1);
  down(c, b, want, got);
  double worst = 0.0;
  for (size_t i = 0; i < n; i++) {
    double e = err_of(got[i], want[i]);
    worst = e > worst || isnan(e) ? e : worst;
  }
  record(c, op, worst, desc);
  free(want);
  free(got);
}

static void cmp_doubles(ctx *c, const char *op, const dbuf *b, size_t n, const char *desc) {
  double *want = malloc(b->bytes), *got = malloc(b->bytes);
  down(c, b, want, got);
  double worst = 0.0;
  for (size_t i = 0; i < n; i++) {
    double e = err_of(got[i], want[i]);
    worst = e > worst ? e : worst;
  }
  record(c, op, worst, desc);
  free(want);
  free(got);
}

/* ---- GEMM ---- */

typedef struct gemm_case {
  bool ta, tb;
  int m, n, k, pad_a, pad_b, pad_c, batch;
  int64_t extra_stride; /* added to each operand's packed stride */
  float alpha, beta;
  int heads; /* > 0: C_i is a column block of one wide C (stride = n, ldc = n * batch) */
} gemm_case;

static void run_gemm(ctx *c, const gemm_case *gc) {
  int a_rows = gc->ta ? gc->k : gc->m, a_cols = gc->ta ? gc->m : gc->k;
  int b_rows = gc->tb ? gc->n : gc->k, b_cols = gc->tb ? gc->k : gc->n;
  zb_gemm g = {.trans_a = gc->ta,
               .trans_b = gc->tb,
               .m = gc->m,
               .n = gc->n,
               .k = gc->k,
               .alpha = gc->alpha,
               .beta = gc->beta,
               .lda = a_cols + gc->pad_a,
               .ldb = b_cols + gc->pad_b,
               .batch = gc->batch};
  g.stride_a = (int64_t)a_rows * g.lda + gc->extra_stride;
  g.stride_b = (int64_t)b_rows * g.ldb + gc->extra_stride;
  size_t c_elems;
  if (gc->heads) {
    g.ldc = gc->n * gc->batch + gc->pad_c;
    g.stride_c = gc->n;
    c_elems = (size_t)gc->m * (size_t)g.ldc;
  } else {
    g.ldc = gc->n + gc->pad_c;
    g.stride_c = (int64_t)gc->m * g.ldc + gc->extra_stride;
    c_elems = (size_t)g.stride_c * (size_t)gc->batch;
  }
  size_t na = (size_t)g.stride_a * (size_t)gc->batch, nb = (size_t)g.stride_b * (size_t)gc->batch;
  float *ha = rand_floats(c, na, 1.0f), *hb = rand_floats(c, nb, 1.0f), *hc = rand_floats(c, c_elems, 1.0f);
  dbuf a = up(c, ha, na * 4), b = up(c, hb, nb * 4), cc = up(c, hc, c_elems * 4);
  ON_BOTH(c, "gemm", (g.a = a.p[i], g.b = b.p[i], g.c = cc.p[i], dv->ops->gemm(dv->self, &g, DIAG)));
  char desc[80];
  snprintf(desc, sizeof desc, "%c%c m%d n%d k%d b%d a%g b%g%s", gc->ta ? 'T' : 'N', gc->tb ? 'T' : 'N', gc->m,
           gc->n, gc->k, gc->batch, gc->alpha, gc->beta, gc->heads ? " heads" : "");
  cmp(c, "gemm", &cc, c_elems, desc);
  release(c, &a);
  release(c, &b);
  release(c, &cc);
  free(ha);
  free(hb);
  free(hc);
}

static void test_gemm(ctx *c) {
  static const gemm_case cases[] = {
      {false, false, 7, 33, 5, 0, 0, 0, 1, 0, 1.0f, 0.0f, 0},
      {false, false, 1, 1, 1, 0, 0, 0, 1, 0, 1.0f, 0.0f, 0},
      {true, false, 33, 7, 129, 3, 0, 5, 1, 0, 0.5f, 0.25f, 0},
      {false, true, 17, 64, 33, 0, 2, 0, 1, 0, -1.5f, 1.0f, 0},
      {true, true, 5, 3, 64, 1, 1, 1, 1, 0, 2.0f, -0.75f, 0},
      {false, false, 7, 5, 3, 2, 3, 4, 3, 11, 0.5f, 0.5f, 0},
      {true, false, 17, 17, 64, 0, 0, 0, 4, 7, 1.0f, 0.0f, 0},
      {false, true, 17, 17, 16, 0, 0, 0, 4, 0, 0.125f, 0.0f, 0},
      {false, true, 5, 16, 17, 0, 0, 0, 4, 0, 1.0f, 1.0f, 1},
      {false, false, 129, 33, 7, 0, 0, 0, 2, 0, 1.0f, 0.0f, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    run_gemm(c, &cases[i]);
}

/* ---- element-wise and row ops ---- */

static const int NS[] = {1, 7, 33}, HS[] = {3, 64, 129}, TS[] = {1, 5, 17}, VS[] = {5, 256, 1000};
#define COUNT(a) (int)(sizeof(a) / sizeof((a)[0]))

static void test_embed(ctx *c, int n, int h, int t, int vocab) {
  float *he = rand_floats(c, (size_t)vocab * h, 1.0f), *hp = rand_floats(c, (size_t)t * h, 1.0f);
  float *hx = rand_floats(c, (size_t)n * h, 1.0f);
  int32_t *tok = rand_ids(c, (size_t)n, vocab);
  dbuf e = up(c, he, (size_t)vocab * h * 4), p = up(c, hp, (size_t)t * h * 4),
       x = up(c, hx, (size_t)n * h * 4);
  dbuf tk = up(c, tok, (size_t)n * sizeof *tok);
  char desc[80];
  snprintf(desc, sizeof desc, "n%d h%d t%d vocab%d", n, h, t, vocab);
  ON_BOTH(c, "embed_fwd", dv->ops->embed_fwd(dv->self, e.p[i], p.p[i], tk.p[i], x.p[i], n, h, t, DIAG));
  cmp(c, "embed_fwd", &x, (size_t)n * h, desc);
  /* x now serves as dx; demb, dpos accumulate onto their random contents */
  ON_BOTH(c, "embed_bwd_acc",
          dv->ops->embed_bwd_acc(dv->self, x.p[i], tk.p[i], e.p[i], p.p[i], n, h, t, DIAG));
  cmp(c, "embed_bwd_acc demb", &e, (size_t)vocab * h, desc);
  cmp(c, "embed_bwd_acc dpos", &p, (size_t)t * h, desc);
  release(c, &e);
  release(c, &p);
  release(c, &x);
  release(c, &tk);
  free(he);
  free(hp);
  free(hx);
  free(tok);
}

/* Without learned positions (pos and dpos NULL, a rotary model's
 * embedding): x[r] = emb[tokens[r]], and only demb accumulates. */
static void test_embed_no_pos(ctx *c, int n, int h, int vocab) {
  float *he = rand_floats(c, (size_t)vocab * h, 1.0f), *hx = rand_floats(c, (size_t)n * h, 1.0f);
  int32_t *tok = rand_ids(c, (size_t)n, vocab);
  dbuf e = up(c, he, (size_t)vocab * h * 4), x = up(c, hx, (size_t)n * h * 4),
       tk = up(c, tok, (size_t)n * sizeof *tok);
  char desc[80];
  snprintf(desc, sizeof desc, "no pos: n%d h%d vocab%d", n, h, vocab);
  ON_BOTH(c, "embed_fwd", dv->ops->embed_fwd(dv->self, e.p[i], NULL, tk.p[i], x.p[i], n, h, 1, DIAG));
  cmp(c, "embed_fwd", &x, (size_t)n * h, desc);
  float *got[2] = {malloc((size_t)n * h * 4), malloc((size_t)n * h * 4)}; /* host, tested */
  down(c, &x, got[0], got[1]);
  bool same = true;
  for (int r = 0; r < n; r++)
    for (int k = 0; k < 2; k++)
      same = same && memcmp(got[k] + (size_t)r * h, he + (size_t)tok[r] * h, (size_t)h * 4) == 0;
  record(c, "embed_fwd no pos = emb rows", same ? 0.0 : INFINITY, desc);
  ON_BOTH(c, "embed_bwd_acc", dv->ops->embed_bwd_acc(dv->self, x.p[i], tk.p[i], e.p[i], NULL, n, h, 1, DIAG));
  cmp(c, "embed_bwd_acc demb", &e, (size_t)vocab * h, desc);
  release(c, &e);
  release(c, &x);
  release(c, &tk);
  free(he);
  free(hx);
  free(tok);
  free(got[0]);
  free(got[1]);
}

/* Whether n floats at device pointer p of the tested device equal want
 * bit for bit. */
static bool bits_equal(ctx *c, void *p, const float *want, size_t n) {
  float *got = malloc(n * sizeof *got);
  zb_diag dg = {{0}};
  zb_device *d = c->dev[1];
  must(d->ops->copy(d->self, got, p, n * sizeof *got, ZB_COPY_D2H, &dg), &dg, "copy D2H", 1);
  must(d->ops->sync(d->self, &dg), &dg, "sync", 1);
  bool same = memcmp(got, want, n * sizeof *got) == 0;
  free(got);
  return same;
}

/* Reductions whose terms meet at one output (the embedding gradient's
 * repeated tokens and positions, column sums over many rows) must not
 * depend on timing: the embedding backward adds each output's rows in row
 * order, as the host does, so it equals the host bit for bit; the column
 * sums give the same bits on a second run. Vocabulary 5 over 4099 rows
 * puts ~800 terms on each token's row; vocabulary 1000 puts several
 * tokens in each of the GPU kernel's id groups; 4099 rows are 16 row
 * chunks and more. Only a GPU can fail this (the stand-in runs kernels in
 * order). */
static void test_determinism(ctx *c, int vocab) {
  int n = 4099, h = 129, t = 17;
  char desc[80];
  snprintf(desc, sizeof desc, "n4099 h129 t17 vocab%d", vocab);
  size_t nh = (size_t)n * h;
  float *hx = rand_floats(c, nh, 1.0f), *he = rand_floats(c, (size_t)vocab * h, 1.0f),
        *hp = rand_floats(c, (size_t)t * h, 1.0f), *hg = rand_floats(c, (size_t)h, 1.0f);
  int32_t *tok = rand_ids(c, (size_t)n, vocab);
  dbuf x = up(c, hx, nh * 4), e = up(c, he, (size_t)vocab * h * 4), p = up(c, hp, (size_t)t * h * 4),
       tk = up(c, tok, (size_t)n * sizeof *tok);
  ON_BOTH(c, "embed_bwd_acc",
          dv->ops->embed_bwd_acc(dv->self, x.p[i], tk.p[i], e.p[i], p.p[i], n, h, t, DIAG));
  float *want_e = malloc((size_t)vocab * h * 4), *want_p = malloc((size_t)t * h * 4),
        *scratch = malloc(nh * 4);
  down(c, &e, want_e, scratch);
  down(c, &p, want_p, scratch);
  bool same =
      bits_equal(c, e.p[1], want_e, (size_t)vocab * h) && bits_equal(c, p.p[1], want_p, (size_t)t * h);
  record(c, "embed_bwd_acc bits = host", same ? 0.0 : INFINITY, desc);
  /* column sums twice from the same accumulators: the same bits */
  dbuf g1 = up(c, hg, (size_t)h * 4), b1 = up(c, hg, (size_t)h * 4), g2 = up(c, hg, (size_t)h * 4),
       b2 = up(c, hg, (size_t)h * 4);
  zb_device *d = c->dev[1];
  zb_diag dg = {{0}};
  must(d->ops->layernorm_param_grads_acc(d->self, x.p[1], x.p[1], g1.p[1], b1.p[1], n, h, &dg), &dg,
       "layernorm_param_grads_acc", 1);
  must(d->ops->layernorm_param_grads_acc(d->self, x.p[1], x.p[1], g2.p[1], b2.p[1], n, h, &dg), &dg,
       "layernorm_param_grads_acc", 1);
  float *first = malloc((size_t)h * 4);
  must(d->ops->copy(d->self, first, g1.p[1], (size_t)h * 4, ZB_COPY_D2H, &dg), &dg, "copy D2H", 1);
  must(d->ops->sync(d->self, &dg), &dg, "sync", 1);
  same = bits_equal(c, g2.p[1], first, (size_t)h);
  must(d->ops->copy(d->self, first, b1.p[1], (size_t)h * 4, ZB_COPY_D2H, &dg), &dg, "copy D2H", 1);
  must(d->ops->sync(d->self, &dg), &dg, "sync", 1);
  same = same && bits_equal(c, b2.p[1], first, (size_t)h);
  record(c, "col sums run to run", same ? 0.0 : INFINITY, "n4099 h129, twice");
  dbuf *all[] = {&x, &e, &p, &tk, &g1, &b1, &g2, &b2};
  for (int i = 0; i < COUNT(all); i++)
    release(c, all[i]);
  void *hs[] = {hx, he, hp, hg, tok, want_e, want_p, scratch, first};
  for (int i = 0; i < COUNT(hs); i++)
    free(hs[i]);
}

static void test_layernorm(ctx *c, int n, int h) {
  size_t nh = (size_t)n * h;
  float *hx = rand_floats(c, nh, 2.0f), *hg = rand_floats(c, (size_t)h, 1.0f),
        *hb = rand_floats(c, (size_t)h, 1.0f);
  float *hdy = rand_floats(c, nh, 1.0f), *hacc = rand_floats(c, nh, 1.0f);
  dbuf x = up(c, hx, nh * 4), g = up(c, hg, (size_t)h * 4), b = up(c, hb, (size_t)h * 4);
  dbuf y = up(c, hx, nh * 4), xh = up(c, hx, nh * 4), rs = up(c, hx, (size_t)n * 4);
  dbuf dy = up(c, hdy, nh * 4), dx = up(c, hacc, nh * 4), dg = up(c, hg, (size_t)h * 4),
       db = up(c, hb, (size_t)h * 4);
  char desc[80];
  snprintf(desc, sizeof desc, "n%d h%d", n, h);
  ON_BOTH(c, "layernorm_fwd",
          dv->ops->layernorm_fwd(dv->self, x.p[i], g.p[i], b.p[i], y.p[i], xh.p[i], rs.p[i], n, h, DIAG));
  cmp(c, "layernorm_fwd y", &y, nh, desc);
  cmp(c, "layernorm_fwd xhat", &xh, nh, desc);
  cmp(c, "layernorm_fwd rstd", &rs, (size_t)n, desc);
  ON_BOTH(c, "layernorm_affine",
          dv->ops->layernorm_affine(dv->self, xh.p[i], g.p[i], b.p[i], x.p[i], n, h, DIAG));
  cmp(c, "layernorm_affine", &x, nh, desc);
  ON_BOTH(c, "layernorm_bwd_acc",
          dv->ops->layernorm_bwd_acc(dv->self, dy.p[i], xh.p[i], rs.p[i], g.p[i], dx.p[i], n, h, DIAG));
  cmp(c, "layernorm_bwd_acc", &dx, nh, desc);
  ON_BOTH(c, "layernorm_param_grads_acc",
          dv->ops->layernorm_param_grads_acc(dv->self, dy.p[i], xh.p[i], dg.p[i], db.p[i], n, h, DIAG));
  cmp(c, "layernorm_param_grads dg", &dg, (size_t)h, desc);
  cmp(c, "layernorm_param_grads db", &db, (size_t)h, desc);
  dbuf *all[] = {&x, &g, &b, &y, &xh, &rs, &dy, &dx, &dg, &db};
  for (int i = 0; i < COUNT(all); i++)
    release(c, all[i]);
  free(hx);
  free(hg);
  free(hb);
  free(hdy);
  free(hacc);
}

static void test_bias_gelu(ctx *c, int n, int cols) {
  size_t len = (size_t)n * cols;
  float *hy = rand_floats(c, len, 3.0f), *hb = rand_floats(c, (size_t)cols, 1.0f),
        *hd = rand_floats(c, len, 1.0f);
  dbuf y = up(c, hy, len * 4), b = up(c, hb, (size_t)cols * 4), d = up(c, hd, len * 4),
       o = up(c, hd, len * 4);
  char desc[80];
  snprintf(desc, sizeof desc, "n%d cols%d", n, cols);
  ON_BOTH(c, "bias_add", dv->ops->bias_add(dv->self, y.p[i], b.p[i], n, cols, DIAG));
  cmp(c, "bias_add", &y, len, desc);
  ON_BOTH(c, "col_sums_acc", dv->ops->col_sums_acc(dv->self, d.p[i], b.p[i], n, cols, DIAG));
  cmp(c, "col_sums_acc", &b, (size_t)cols, desc);
  ON_BOTH(c, "gelu_fwd", dv->ops->gelu_fwd(dv->self, y.p[i], o.p[i], len, DIAG));
  cmp(c, "gelu_fwd", &o, len, desc);
  ON_BOTH(c, "gelu_bwd_inplace", dv->ops->gelu_bwd_inplace(dv->self, d.p[i], y.p[i], len, DIAG));
  cmp(c, "gelu_bwd_inplace", &y, len, desc);
  ON_BOTH(c, "add", dv->ops->add(dv->self, y.p[i], d.p[i], -0.375f, len, DIAG));
  cmp(c, "add", &y, len, desc);
  ON_BOTH(c, "scale", dv->ops->scale(dv->self, y.p[i], 1.75f, len, DIAG));
  cmp(c, "scale", &y, len, desc);
  release(c, &y);
  release(c, &b);
  release(c, &d);
  release(c, &o);
  free(hy);
  free(hb);
  free(hd);
}

/* llama's ops: RMSNorm (and its weight's gradient through
 * layernorm_param_grads_acc without db), SwiGLU and its gradients, on
 * [n, h] */
static void test_llama_rows(ctx *c, int n, int h) {
  size_t nh = (size_t)n * h;
  float *hx = rand_floats(c, nh, 2.0f), *hg = rand_floats(c, (size_t)h, 1.0f);
  float *hdy = rand_floats(c, nh, 1.0f), *hacc = rand_floats(c, nh, 1.0f);
  dbuf x = up(c, hx, nh * 4), g = up(c, hg, (size_t)h * 4), y = up(c, hx, nh * 4), xh = up(c, hx, nh * 4);
  dbuf rs = up(c, hx, (size_t)n * 4), dy = up(c, hdy, nh * 4), dx = up(c, hacc, nh * 4),
       dg = up(c, hg, (size_t)h * 4);
  char desc[80];
  snprintf(desc, sizeof desc, "n%d h%d", n, h);
  ON_BOTH(c, "rmsnorm_fwd",
          dv->ops->rmsnorm_fwd(dv->self, x.p[i], g.p[i], y.p[i], xh.p[i], rs.p[i], n, h, 1e-6f, DIAG));
  cmp(c, "rmsnorm_fwd y", &y, nh, desc);
  cmp(c, "rmsnorm_fwd xhat", &xh, nh, desc);
  cmp(c, "rmsnorm_fwd rstd", &rs, (size_t)n, desc);
  ON_BOTH(c, "rmsnorm_bwd_acc",
          dv->ops->rmsnorm_bwd_acc(dv->self, dy.p[i], xh.p[i], rs.p[i], g.p[i], dx.p[i], n, h, DIAG));
  cmp(c, "rmsnorm_bwd_acc", &dx, nh, desc);
  ON_BOTH(c, "layernorm_affine",
          dv->ops->layernorm_affine(dv->self, xh.p[i], g.p[i], NULL, dx.p[i], n, h, DIAG));
  cmp(c, "layernorm_affine no shift", &dx, nh, desc);
  ON_BOTH(c, "layernorm_param_grads_acc",
          dv->ops->layernorm_param_grads_acc(dv->self, dy.p[i], xh.p[i], dg.p[i], NULL, n, h, DIAG));
  cmp(c, "layernorm_param_grads dg only", &dg, (size_t)h, desc);
  /* x as gate, y as up (normalised, so both signs and sizes occur) */
  ON_BOTH(c, "swiglu_fwd", dv->ops->swiglu_fwd(dv->self, x.p[i], y.p[i], xh.p[i], nh, DIAG));
  cmp(c, "swiglu_fwd", &xh, nh, desc);
  ON_BOTH(c, "swiglu_bwd_inplace", dv->ops->swiglu_bwd_inplace(dv->self, dy.p[i], x.p[i], y.p[i], nh, DIAG));
  cmp(c, "swiglu_bwd_inplace gate", &x, nh, desc);
  cmp(c, "swiglu_bwd_inplace up", &y, nh, desc);
  dbuf *all[] = {&x, &g, &y, &xh, &rs, &dy, &dx, &dg};
  for (int i = 0; i < COUNT(all); i++)
    release(c, all[i]);
  free(hx);
  free(hg);
  free(hdy);
  free(hacc);
}

/* Rotary embeddings on n rows of `heads` heads of hd, row stride padded
 * past the heads (ld), positions r % t, then rotated back. */
static void test_rope(ctx *c, int n, int t, int heads, int hd) {
  int ld = heads * hd + 3, half = hd / 2;
  size_t len = (size_t)n * ld, tab = (size_t)t * half;
  float *hx = rand_floats(c, len, 2.0f), *ang = rand_floats(c, tab, 3.0f);
  float *hc = malloc(tab * sizeof *hc), *hs = malloc(tab * sizeof *hs);
  for (size_t k = 0; k < tab; k++) {
    hc[k] = cosf(ang[k]);
    hs[k] = sinf(ang[k]);
  }
  dbuf x = up(c, hx, len * 4), cs = up(c, hc, tab * 4), sn = up(c, hs, tab * 4);
  char desc[80];
  snprintf(desc, sizeof desc, "n%d t%d heads%d hd%d", n, t, heads, hd);
  ON_BOTH(c, "rope", dv->ops->rope(dv->self, x.p[i], cs.p[i], sn.p[i], n, t, heads, hd, ld, 0, DIAG));
  cmp(c, "rope", &x, len, desc);
  ON_BOTH(c, "rope inverse", dv->ops->rope(dv->self, x.p[i], cs.p[i], sn.p[i], n, t, heads, hd, ld, 1, DIAG));
  cmp(c, "rope inverse", &x, len, desc);
  release(c, &x);
  release(c, &cs);
  release(c, &sn);
  free(hx);
  free(ang);
  free(hc);
  free(hs);
}

/* NaN above each diagonal: the op must not read there */
static float *causal_input(ctx *c, int t, int count, float scale) {
  float *s = rand_floats(c, (size_t)t * t * count, scale);
  for (int m = 0; m < count; m++)
    for (int i = 0; i < t; i++)
      for (int j = i + 1; j < t; j++)
        s[((size_t)m * t + i) * t + j] = NAN;
  return s;
}

static void test_softmax(ctx *c, int t, int count) {
  size_t len = (size_t)t * t * count;
  float *hs = causal_input(c, t, count, 4.0f), *hd = causal_input(c, t, count, 1.0f);
  dbuf s = up(c, hs, len * 4), d = up(c, hd, len * 4);
  char desc[80];
  snprintf(desc, sizeof desc, "t%d count%d", t, count);
  ON_BOTH(c, "softmax_causal", dv->ops->softmax_causal(dv->self, s.p[i], t, count, DIAG));
  cmp(c, "softmax_causal", &s, len, desc);
  ON_BOTH(c, "softmax_causal_bwd", dv->ops->softmax_causal_bwd(dv->self, s.p[i], d.p[i], t, count, DIAG));
  cmp(c, "softmax_causal_bwd", &d, len, desc);
  release(c, &s);
  release(c, &d);
  free(hs);
  free(hd);
}

/* Flash attention (attn_fwd, attn_bwd; docs/model.md, Flash attention
 * (CUDA)) against the host's: o, lse and dqkv, whose rows' padding (random
 * on both) must come back as it went. */
static void test_attention(ctx *c, int batch, int t, int heads, int kv_heads, int hd) {
  zb_attn a = {.batch = batch, .t = t, .heads = heads, .kv_heads = kv_heads, .hd = hd};
  a.ld = (heads + 2 * kv_heads) * hd + 3;
  a.lo = heads * hd + 1;
  a.scale = 1.0f / sqrtf((float)hd);
  size_t rows = (size_t)batch * t, nq = rows * a.ld, no = rows * a.lo, nl = rows * heads;
  float *hq = rand_floats(c, nq, 2.0f), *hd_ = rand_floats(c, no, 1.0f), *hx = rand_floats(c, nq, 1.0f);
  float *ho = rand_floats(c, no, 1.0f), *hl = rand_floats(c, nl, 1.0f);
  dbuf q = up(c, hq, nq * 4), d = up(c, hd_, no * 4), dq = up(c, hx, nq * 4), o = up(c, ho, no * 4),
       l = up(c, hl, nl * 4);
  char desc[80];
  snprintf(desc, sizeof desc, "b%d t%d heads %d/%d hd%d", batch, t, heads, kv_heads, hd);
  ON_BOTH(c, "attn_fwd", dv->ops->attn_fwd(dv->self, q.p[i], o.p[i], l.p[i], &a, DIAG));
  cmp(c, "attn_fwd o", &o, no, desc);
  cmp(c, "attn_fwd lse", &l, nl, desc);
  ON_BOTH(c, "attn_bwd", dv->ops->attn_bwd(dv->self, q.p[i], o.p[i], l.p[i], d.p[i], dq.p[i], &a, DIAG));
  cmp(c, "attn_bwd dqkv", &dq, nq, desc);
  dbuf *all[] = {&q, &d, &dq, &o, &l};
  for (int k = 0; k < 5; k++)
    release(c, all[k]);
  free(hq), free(hd_), free(hx), free(ho), free(hl);
}

static void test_xent(ctx *c, int n, int v) {
  size_t len = (size_t)n * v;
  float *hl = rand_floats(c, len, 6.0f);
  int32_t *tg = rand_ids(c, (size_t)n, v);
  double *zero = calloc((size_t)n, sizeof *zero);
  dbuf l = up(c, hl, len * 4), t = up(c, tg, (size_t)n * sizeof *tg),
       loss = up(c, zero, (size_t)n * sizeof(double));
  char desc[80];
  snprintf(desc, sizeof desc, "n%d v%d", n, v);
  ON_BOTH(c, "xent_fwd", dv->ops->xent_fwd(dv->self, l.p[i], t.p[i], loss.p[i], n, v, DIAG));
  cmp(c, "xent_fwd probs", &l, len, desc);
  cmp_doubles(c, "xent_fwd row_loss", &loss, (size_t)n, desc);
  ON_BOTH(c, "xent_bwd", dv->ops->xent_bwd(dv->self, l.p[i], t.p[i], n, v, 1.0f / (float)n, DIAG));
  cmp(c, "xent_bwd", &l, len, desc);
  release(c, &l);
  release(c, &t);
  release(c, &loss);
  free(hl);
  free(tg);
  free(zero);
}

static void test_adamw_sumsq(ctx *c, size_t n, bool poison_one) {
  float *hp = rand_floats(c, n, 1.0f), *hm = rand_floats(c, n, 0.1f), *hv = rand_floats(c, n, 0.01f);
  float *hg = rand_floats(c, n, 1.0f);
  for (size_t i = 0; i < n; i++)
    hv[i] = fabsf(hv[i]);
  uint8_t *dec = rand_bytes(c, n, 2);
  if (poison_one)
    hg[n / 2] = INFINITY;
  dbuf p = up(c, hp, n * 4), m = up(c, hm, n * 4), v = up(c, hv, n * 4), g = up(c, hg, n * 4),
       d = up(c, dec, n);
  double zero[2] = {0};
  dbuf out = up(c, zero, sizeof(double)), nf = up(c, zero, sizeof(int));
  char desc[80];
  snprintf(desc, sizeof desc, "n%zu%s", n, poison_one ? " +inf" : "");
  ON_BOTH(c, "sumsq", dv->ops->sumsq(dv->self, g.p[i], n, out.p[i], nf.p[i], DIAG));
  cmp_doubles(c, "sumsq", &out, 1, desc);
  int flags[2];
  down(c, &nf, &flags[0], &flags[1]);
  record(c, "sumsq nonfinite", flags[0] == flags[1] && flags[0] == (int)poison_one ? 0.0 : INFINITY, desc);
  if (!poison_one) {
    zbm_adamw_step st = {.beta1 = 0.9,
                         .beta2 = 0.999,
                         .eps = 1e-8,
                         .step_size = 1e-3 / (1 - 0.9 * 0.9 * 0.9),
                         .sqrt_bc2 = sqrt(1 - 0.999 * 0.999 * 0.999),
                         .shrink = 1 - 1e-3 * 0.1,
                         .grad_scale = 0.5};
    ON_BOTH(c, "adamw", dv->ops->adamw(dv->self, p.p[i], m.p[i], v.p[i], g.p[i], d.p[i], n, &st, DIAG));
    cmp(c, "adamw p", &p, n, desc);
    cmp(c, "adamw m", &m, n, desc);
    cmp(c, "adamw v", &v, n, desc);
  }
  dbuf *all[] = {&p, &m, &v, &g, &d, &out, &nf};
  for (int i = 0; i < COUNT(all); i++)
    release(c, all[i]);
  free(hp);
  free(hm);
  free(hv);
  free(hg);
  free(dec);
}

/* ---- the step's fused ops: sumsq_multi, adamw_multi ---- */

/* 1 when the two devices' copies of b differ in any bit, else 0 */
static double bits_differ(ctx *c, const dbuf *b) {
  char *want = malloc(b->bytes ? b->bytes : 1), *got = malloc(b->bytes ? b->bytes : 1);
  down(c, b, want, got);
  double d = memcmp(want, got, b->bytes) ? INFINITY : 0.0;
  free(want);
  free(got);
  return d;
}

/* sumsq_multi over arrays spanning many chunks (8192 elements each): the
 * same bits on both devices (one blocked order: zb_kernel_math.h), within
 * 1e-12 relative of a plain double sum, and the flags right. */
static void test_sumsq_multi(ctx *c, bool poison) {
  static const size_t lens[] = {0, 1, 8193, 100003, 3 * 8192, 257};
  enum { K = COUNT(lens) };
  float *h[K];
  dbuf x[K];
  const float *px[2][K];
  double ref[K];
  for (int k = 0; k < K; k++) {
    h[k] = rand_floats(c, lens[k], 1.0f);
    if (poison && k == 3)
      h[k][77777] = NAN;
    ref[k] = 0;
    for (size_t i = 0; i < lens[k]; i++)
      ref[k] += (double)h[k][i] * h[k][i];
    x[k] = up(c, h[k], lens[k] * 4);
    px[0][k] = x[k].p[0];
    px[1][k] = x[k].p[1];
  }
  size_t sb = zb_sumsq_multi_scratch(lens, K);
  double init[K];
  for (int k = 0; k < K; k++)
    init[k] = -1.0; /* every output must be overwritten */
  int ibad[K];
  memset(ibad, 0x55, sizeof ibad);
  char *junk = malloc(sb);
  memset(junk, 0x7f, sb);
  dbuf scr = up(c, junk, sb), sums = up(c, init, sizeof init), bad = up(c, ibad, sizeof ibad);
  const char *desc = poison ? "6 arrays, NaN in one" : "6 arrays to 100003";
  ON_BOTH(c, "sumsq_multi",
          dv->ops->sumsq_multi(dv->self, px[i], lens, K, scr.p[i], sums.p[i], bad.p[i], DIAG));
  record(c, "sumsq_multi bits (vs host)", bits_differ(c, &sums), desc);
  double got[K];
  int flags[2][K];
  down(c, &sums, got, got); /* both equal: the tested device's */
  down(c, &bad, flags[0], flags[1]);
  double err = 0;
  for (int k = 0; k < K; k++) {
    if (!(poison && k == 3))
      err = fmax(err, fabs(got[k] - ref[k]) / fmax(ref[k], 1.0));
    bool want_bad = poison && k == 3;
    if (flags[0][k] != want_bad || flags[1][k] != want_bad)
      err = INFINITY;
  }
  record(c, "sumsq_multi (vs double, 1e-12)", err <= 1e-12 ? err : INFINITY, desc);
  dbuf *all[] = {&scr, &sums, &bad};
  for (int i = 0; i < COUNT(all); i++)
    release(c, all[i]);
  for (int k = 0; k < K; k++) {
    release(c, &x[k]);
    free(h[k]);
  }
  free(junk);
}

/* A set of AdamW arrays (p | m | v | g | decay | keep) on both devices;
 * sets made from the same rng state are equal. */
typedef struct mt {
  size_t n;
  dbuf b[6]; /* p, m, v, g, decay, keep */
} mt;

static void mt_new(ctx *c, mt *t, size_t n) {
  float *h[4] = {rand_floats(c, n, 1.0f), rand_floats(c, n, 0.1f), rand_floats(c, n, 0.01f),
                 rand_floats(c, n, 1.0f)};
  for (size_t i = 0; i < n; i++)
    h[2][i] = fabsf(h[2][i]);
  uint8_t *dec = rand_bytes(c, n, 2);
  t->n = n;
  for (int q = 0; q < 4; q++)
    t->b[q] = up(c, h[q], n * 4);
  t->b[4] = up(c, dec, n);
  float *zero = calloc(n ? n : 1, sizeof *zero);
  t->b[5] = up(c, zero, n * 4);
  for (int q = 0; q < 4; q++)
    free(h[q]);
  free(dec);
  free(zero);
}

static zbm_adamw_tensor mt_tab(const mt *t, int dev, double scale) {
  zbm_adamw_step st = {.beta1 = 0.9,
                       .beta2 = 0.95,
                       .eps = 1e-8,
                       .step_size = 1e-3 / (1 - 0.9 * 0.9),
                       .sqrt_bc2 = sqrt(1 - 0.95 * 0.95),
                       .shrink = 1 - 1e-3 * 0.1,
                       .grad_scale = scale};
  return (zbm_adamw_tensor){.p = t->b[0].p[dev],
                            .m = t->b[1].p[dev],
                            .v = t->b[2].p[dev],
                            .g = t->b[3].p[dev],
                            .decay = t->b[4].p[dev],
                            .keep = t->b[5].p[dev],
                            .n = t->n,
                            .step = st};
}

/* 0 when buffer q of x and y holds the same bits on each device, else Inf. */
static double mt_same(ctx *c, const mt *x, int qx, const mt *y, int qy) {
  size_t bytes = x->b[qx].bytes;
  char *h[4];
  for (int i = 0; i < 4; i++)
    h[i] = malloc(bytes ? bytes : 1);
  down(c, &x->b[qx], h[0], h[1]);
  down(c, &y->b[qy], h[2], h[3]);
  double d = memcmp(h[0], h[2], bytes) || memcmp(h[1], h[3], bytes) ? INFINITY : 0.0;
  for (int i = 0; i < 4; i++)
    free(h[i]);
  return d;
}

/* adamw_multi over three arrays with their own constants: FULL is the
 * per-array adamw bit for bit, TRY keeps the old p and leaves m and v,
 * TRY then COMMIT is FULL bit for bit; on each device, and the devices
 * within the rule of each other. */
static void test_adamw_multi(ctx *c) {
  static const size_t lens[] = {1, 5000, 100003};
  enum { K = COUNT(lens) };
  mt a[K], b[K], t[K], orig[K];
  uint64_t seed = c->rng;
  mt *sets[] = {a, b, t, orig};
  for (int s = 0; s < 4; s++) {
    c->rng = seed;
    for (int k = 0; k < K; k++)
      mt_new(c, &sets[s][k], lens[k]);
  }
  zbm_adamw_tensor tab[2][K];
  for (int k = 0; k < K; k++)
    for (int d = 0; d < 2; d++)
      tab[d][k] = mt_tab(&a[k], d, 0.5 + k);
  for (int k = 0; k < K; k++)
    ON_BOTH(c, "adamw",
            dv->ops->adamw(dv->self, tab[i][k].p, tab[i][k].m, tab[i][k].v, tab[i][k].g, tab[i][k].decay,
                           tab[i][k].n, &tab[i][k].step, DIAG));
  for (int k = 0; k < K; k++)
    for (int d = 0; d < 2; d++)
      tab[d][k] = mt_tab(&b[k], d, 0.5 + k);
  ON_BOTH(c, "adamw_multi", dv->ops->adamw_multi(dv->self, tab[i], K, ZBM_ADAMW_FULL, DIAG));
  for (int k = 0; k < K; k++)
    for (int d = 0; d < 2; d++)
      tab[d][k] = mt_tab(&t[k], d, 0.5 + k);
  ON_BOTH(c, "adamw_multi", dv->ops->adamw_multi(dv->self, tab[i], K, ZBM_ADAMW_TRY, DIAG));
  double full = 0, tried = 0, committed = 0;
  for (int k = 0; k < K; k++) {
    for (int q = 0; q < 3; q++)
      full = fmax(full, mt_same(c, &a[k], q, &b[k], q));
    tried = fmax(tried, mt_same(c, &t[k], 0, &a[k], 0));    /* the new p */
    tried = fmax(tried, mt_same(c, &t[k], 5, &orig[k], 0)); /* keep = the old p */
    for (int q = 1; q < 3; q++)
      tried = fmax(tried, mt_same(c, &t[k], q, &orig[k], q)); /* m, v untouched */
  }
  ON_BOTH(c, "adamw_multi", dv->ops->adamw_multi(dv->self, tab[i], K, ZBM_ADAMW_COMMIT, DIAG));
  for (int k = 0; k < K; k++)
    for (int q = 0; q < 3; q++)
      committed = fmax(committed, mt_same(c, &t[k], q, &a[k], q));
  record(c, "adamw_multi FULL = adamw (bits)", full, "1, 5000, 100003");
  record(c, "adamw_multi TRY (bits)", tried, "1, 5000, 100003");
  record(c, "adamw_multi TRY+COMMIT (bits)", committed, "1, 5000, 100003");
  for (int k = 0; k < K; k++) {
    cmp(c, "adamw_multi p", &b[k].b[0], lens[k], "1, 5000, 100003");
    cmp(c, "adamw_multi v", &b[k].b[2], lens[k], "1, 5000, 100003");
  }
  for (int s = 0; s < 4; s++)
    for (int k = 0; k < K; k++)
      for (int q = 0; q < 6; q++)
        release(c, &sets[s][k].b[q]);
}

/* ---- memory: copies, zero, accounting, events ---- */

static void test_copies(ctx *c) {
  float *h = rand_floats(c, 7 * 33, 1.0f);
  dbuf src = up(c, h, 7 * 33 * 4), dst = up(c, h, 7 * 33 * 4);
  ON_BOTH(c, "zero", dv->ops->zero(dv->self, dst.p[i], 7 * 33 * 4, DIAG));
  /* 5 rows of 9 floats from pitch 33 floats at column 2 to pitch 11 at column 1 */
  ON_BOTH(c, "copy_2d",
          dv->ops->copy_2d(dv->self, (float *)dst.p[i] + 1, 11 * 4, (float *)src.p[i] + 2, 33 * 4, 9 * 4, 5,
                           DIAG));
  cmp(c, "zero + copy_2d", &dst, 7 * 33, "5 rows x 9 of pitch 33 to pitch 11");
  ON_BOTH(c, "copy D2D", dv->ops->copy(dv->self, dst.p[i], src.p[i], 7 * 33 * 4, ZB_COPY_D2D, DIAG));
  float *got = malloc(7 * 33 * 4), *want = malloc(7 * 33 * 4);
  down(c, &dst, want, got);
  record(c, "copy H2D/D2D/D2H",
         memcmp(got, h, 7 * 33 * 4) == 0 && memcmp(want, h, 7 * 33 * 4) == 0 ? 0.0 : INFINITY,
         "7 x 33 floats, bit-exact");
  release(c, &src);
  release(c, &dst);
  free(h);
  free(got);
  free(want);
}

/* The allocator's figures on the tested device: byte-exact current and
 * peak of the sizes asked for; a freed block is cached and reused, except
 * on the stand-in, where the allocator is exact (docs/model.md, The CPU
 * stand-in): a freed block goes back, nothing is cached. */
static void test_mem(ctx *c) {
  zb_device *d = c->dev[1];
  zb_diag diag = {{0}};
  zb_device_info info;
  d->ops->info(d->self, &info);
  bool exact = info.standin;
  zb_device_mem m0, m;
  d->ops->mem(d->self, &m0);
  d->ops->reset_peak(d->self);
  void *a, *b;
  must(d->ops->alloc(d->self, 1000, &a, &diag), &diag, "alloc", 1);
  must(d->ops->alloc(d->self, 3, &b, &diag), &diag, "alloc", 1);
  zb_device_mem m1;
  d->ops->mem(d->self, &m1);
  bool ok = m1.current == m0.current + 1003 && m1.peak == m0.current + 1003;
  d->ops->free(d->self, a);
  d->ops->mem(d->self, &m);
  ok = ok && m.current == m0.current + 3 && m.peak == m0.current + 1003 &&
       (exact ? m.cached == 0 : m.cached >= m1.cached + 1000);
  void *again;
  must(d->ops->alloc(d->self, 999, &again, &diag), &diag, "alloc", 1);
  d->ops->mem(d->self, &m);
  /* the block just cached came back */
  ok = ok && (exact || again == a) && m.cached == m1.cached && m.current == m0.current + 1002;
  d->ops->free(d->self, again);
  d->ops->free(d->self, b);
  d->ops->reset_peak(d->self);
  d->ops->mem(d->self, &m);
  ok = ok && m.current == m0.current && m.peak == m0.current;
  record(c, "alloc accounting", ok ? 0.0 : INFINITY, "1000 + 3 bytes, free, 999 reuses");
}

/* The GPU's own figures (docs/model.md, Memory accounting): held counts
 * the cuBLAS workspace (sized for the architecture) and the rounding,
 * current does not; a block past the high-water mark raises held_peak by
 * its rounded size and samples cudaMemGetInfo's used bytes beside it. */
static void test_mem_figures(ctx *c) {
  zb_device *d = c->dev[1];
  zb_diag diag = {{0}};
  zb_device_info info;
  d->ops->info(d->self, &info);
  zb_device_mem m0, m;
  d->ops->mem(d->self, &m0);
  int64_t ws = zb_cublas_workspace_bytes(info.cc_major);
  bool ok = m0.workspace == ws && m0.held >= m0.current + m0.cached + ws && m0.held_peak >= m0.held &&
            m0.device_used >= m0.held_peak;
  size_t big =
      (size_t)(m0.held_peak - m0.held) + ((size_t)1 << 20) + 1; /* past the mark, whatever came before */
  void *p;
  must(d->ops->alloc(d->self, big, &p, &diag), &diag, "alloc", 1);
  d->ops->reset_peak(d->self); /* leaves held_peak */
  d->ops->mem(d->self, &m);
  int64_t rounded = m.held - m0.held;
  ok = ok && rounded >= (int64_t)big && rounded <= (int64_t)big + (int64_t)big / 4 && m.held_peak == m.held &&
       m.device_used >= m.held_peak && (!info.standin || m.device_used == m.held_peak) &&
       m.current == m0.current + (int64_t)big;
  d->ops->free(d->self, p);
  d->ops->mem(d->self, &m);
  ok = ok && m.held_peak == m0.held + rounded &&
       m.held == m0.held + (info.standin ? 0 : rounded) /* exact mode gives it back; the cache keeps it */;
  char desc[80];
  snprintf(desc, sizeof desc, "workspace %lld, block %zu held as %lld", (long long)ws, big,
           (long long)rounded);
  record(c, "held: workspace, rounding, used", ok ? 0.0 : INFINITY, desc);
}

static void test_events(ctx *c) {
  zb_device *d = c->dev[1];
  zb_diag diag = {{0}};
  zb_device_event *e0, *e1;
  must(d->ops->event_new(d->self, &e0, &diag), &diag, "event_new", 1);
  must(d->ops->event_new(d->self, &e1, &diag), &diag, "event_new", 1);
  float *h = rand_floats(c, 1 << 16, 1.0f);
  void *buf;
  must(d->ops->alloc(d->self, 4 << 16, &buf, &diag), &diag, "alloc", 1);
  must(d->ops->event_record(d->self, e0, &diag), &diag, "event_record", 1);
  must(d->ops->copy(d->self, buf, h, 4 << 16, ZB_COPY_H2D, &diag), &diag, "copy", 1);
  must(d->ops->scale(d->self, buf, 2.0f, 1 << 16, &diag), &diag, "scale", 1);
  must(d->ops->event_record(d->self, e1, &diag), &diag, "event_record", 1);
  must(d->ops->sync(d->self, &diag), &diag, "sync", 1);
  float ms = -1.0f;
  must(d->ops->event_elapsed_ms(d->self, e0, e1, &ms, &diag), &diag, "event_elapsed_ms", 1);
  record(c, "events", ms >= 0.0f && ms < 60000.0f ? 0.0 : INFINITY, "copy + scale between two events");
  d->ops->free(d->self, buf);
  d->ops->event_free(d->self, e0);
  d->ops->event_free(d->self, e1);
  free(h);
}

/* A second tested device, poisoned by freeing a pointer it never handed
 * out: every later call returns that error. */
static void test_poison(ctx *c) {
  zb_device *d;
  zb_diag diag = {{0}};
  zb_cuda_device_config cfg = {.ordinal = 0, .precision = ZB_PRECISION_FP32};
  must(zb_device_cuda_new(&cfg, &d, &diag), &diag, "zb_device_cuda_new", 1);
  static int not_device;
  d->ops->free(d->self, &not_device);
  zb_err e1 = d->ops->sync(d->self, &diag);
  bool named = strstr(diag.msg, "did not hand out") != NULL;
  void *p = NULL;
  zb_err e2 = d->ops->alloc(d->self, 16, &p, &diag);
  record(c, "poisoned after an error", e1 == ZB_ERR_INVALID_ARG && e2 == e1 && named && !p ? 0.0 : INFINITY,
         "free of a foreign pointer, then sync and alloc");
  zb_device_free(d);
}

/* An error another call left on this thread (here cudaSetDevice(-1); a
 * transport's cudaEventQuery may leave "not ready") is not the failure of
 * the next launch, whose status is read with cudaGetLastError: the ops
 * after it run. */
static void test_stale_error(ctx *c) {
  zb_device *d = c->dev[1];
  zb_diag diag = {{0}};
  float h[4] = {1, 2, 3, 4}, back[4] = {0};
  void *buf;
  must(d->ops->alloc(d->self, sizeof h, &buf, &diag), &diag, "alloc", 1);
  must(d->ops->copy(d->self, buf, h, sizeof h, ZB_COPY_H2D, &diag), &diag, "copy", 1);
  bool left = cudaSetDevice(-1) != cudaSuccess; /* the last error is now set */
  zb_err e1 = d->ops->scale(d->self, buf, 2.0f, 4, &diag);
  zb_gemm g = {.m = 1,
               .n = 1,
               .k = 1,
               .alpha = 3.0f,
               .a = buf,
               .lda = 1,
               .b = buf,
               .ldb = 1,
               .c = (float *)buf + 3,
               .ldc = 1,
               .batch = 1};
  (void)cudaSetDevice(-1);
  zb_err e2 = e1 ? e1 : d->ops->gemm(d->self, &g, &diag);
  zb_err e3 = e2 ? e2 : d->ops->copy(d->self, back, buf, sizeof back, ZB_COPY_D2H, &diag);
  zb_err e4 = e3 ? e3 : d->ops->sync(d->self, &diag);
  if (e4)
    fprintf(stderr, "test_device_ops: after a stale error: %s\n", diag.msg);
  record(c, "stale error not a launch's", left && !e4 && back[0] == 2.0f && back[3] == 12.0f ? 0.0 : INFINITY,
         "cudaSetDevice(-1), then scale, gemm");
  d->ops->free(d->self, buf);
}

/* On a GPU, the shapes a model runs at, beyond the odd small ones: the
 * kernels' grid-stride loops, many blocks per row and several waves only
 * happen there (a GPT-2 124M and a LLaMA-sized row, 8 x 1024 tokens, a
 * GPT-2 vocabulary, T = 1024 attention with 12 heads of 64 and 32 heads on
 * 8 of 128). Too slow for the stand-in, which runs the same code paths at
 * the small shapes. */
static void run_gpu_shapes(ctx *c) {
  static const int rows[] = {768, 4096}, n = 8192;
  for (int i = 0; i < COUNT(rows); i++) {
    test_layernorm(c, n, rows[i]);
    test_bias_gelu(c, n, rows[i]);
    test_llama_rows(c, n, rows[i]);
  }
  test_embed(c, n, 768, 1024, 50304);
  test_rope(c, n, 1024, 32, 128);
  test_xent(c, 1024, 50304);
  test_attention(c, 8, 1024, 12, 12, 64);
  test_attention(c, 1, 1024, 32, 8, 128);
  test_adamw_sumsq(c, (size_t)124 << 20, false);
}

static void run_all(ctx *c) {
  if (c->gpu)
    run_gpu_shapes(c);
  test_gemm(c);
  for (int a = 0; a < COUNT(NS); a++)
    for (int b = 0; b < COUNT(HS); b++) {
      test_layernorm(c, NS[a], HS[b]);
      test_bias_gelu(c, NS[a], HS[b]);
      test_llama_rows(c, NS[a], HS[b]);
      for (int t = 0; t < COUNT(TS); t++)
        for (int v = 0; v < COUNT(VS); v++)
          test_embed(c, NS[a], HS[b], TS[t], VS[v]);
      test_embed_no_pos(c, NS[a], HS[b], 1000);
    }
  for (int t = 0; t < COUNT(TS); t++)
    for (int n = 1; n <= 3; n += 2)
      test_softmax(c, TS[t], n);
  for (int a = 0; a < COUNT(NS); a++)
    for (int t = 0; t < COUNT(TS); t++) {
      test_rope(c, NS[a], TS[t], 1, 2);
      test_rope(c, NS[a], TS[t], 3, 80);
      test_rope(c, NS[a], TS[t], 2, 128);
    }
  for (int a = 0; a < COUNT(NS); a++)
    for (int v = 0; v < COUNT(VS); v++)
      test_xent(c, NS[a], VS[v]);
  /* batch, t, heads, kv_heads, hd: T across the 64-key and 32-query tiles, one head, 80, GQA, T = 1024 */
  static const int attn[][5] = {{1, 1, 1, 1, 8},    {2, 17, 1, 1, 80}, {1, 130, 4, 2, 64},
                                {2, 70, 4, 1, 128}, {3, 33, 3, 1, 12}, {1, 1024, 2, 1, 128}};
  for (int i = 0; i < COUNT(attn); i++)
    test_attention(c, attn[i][0], attn[i][1], attn[i][2], attn[i][3], attn[i][4]);
  static const size_t lens[] = {1, 7, 33 * 129, 100003};
  for (int i = 0; i < COUNT(lens); i++) {
    test_adamw_sumsq(c, lens[i], false);
    test_adamw_sumsq(c, lens[i], true);
  }
  test_sumsq_multi(c, false);
  test_sumsq_multi(c, true);
  test_adamw_multi(c);
  test_determinism(c, 5);
  test_determinism(c, 1000);
  test_copies(c);
  test_mem(c);
  test_mem_figures(c);
  test_events(c);
  test_stale_error(c);
  test_poison(c);
}

int main(void) {
  ctx c = {.rng = 12345};
  zb_diag diag = {{0}};
  zb_cuda_device_config cfg = {.ordinal = 0, .precision = ZB_PRECISION_FP32};
  zb_err err = zb_device_cuda_new(&cfg, &c.dev[1], &diag);
  if (err == ZB_ERR_UNSUPPORTED) {
    printf("test_device_ops: no CUDA device (%s); skipping\n", diag.msg);
    return 77;
  }
  must(err, &diag, "zb_device_cuda_new", 1);
  must(zb_device_host_new(&c.dev[0], &diag), &diag, "zb_device_host_new", 0);
  zb_device_info info;
  c.dev[1]->ops->info(c.dev[1]->self, &info);
  printf("device under test: %s%s (cc %d.%d, driver %d); reference: host\n", info.name,
         info.standin ? " [stand-in]" : "", info.cc_major, info.cc_minor, info.driver_version);
  printf("rule: |got - want| <= %g * max(|want|, 1) per element\n\n", TOL);
  c.gpu = !info.standin;
  run_all(&c);
  int failed = 0;
  printf("%-32s %6s %12s  %s\n", "op", "cases", "max error", "worst case");
  for (int i = 0; i < c.n_stats; i++) {
    stat *s = &c.stats[i];
    bool ok = s->max_err <= TOL;
    failed += !ok;
    printf("%-32s %6d %12.3g  %s%s\n", s->op, s->cases, s->max_err, s->worst, ok ? "" : "  FAIL");
  }
  zb_device_mem m;
  c.dev[1]->ops->mem(c.dev[1]->self, &m);
  if (m.current != 0) {
    printf("the tested device still holds %lld bytes after every buffer went back: FAIL\n",
           (long long)m.current);
    failed++;
  }
  zb_device_free(c.dev[0]);
  zb_device_free(c.dev[1]);
  printf("\n%s: %d of %d ops over the tolerance\n", failed ? "FAIL" : "ok", failed, c.n_stats);
  return failed ? 1 : 0;
}
