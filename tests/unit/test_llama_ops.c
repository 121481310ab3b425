/* test_llama_ops.c — the host device's llama ops (model/zb_device.h:
 * rmsnorm_fwd, rmsnorm_bwd_acc, rope, swiglu_fwd, swiglu_bwd_inplace)
 * against forwards written here in double, independently of
 * zb_kernel_math.h: each forward within fp32 rounding of its double twin,
 * each backward against central differences of that twin (so a gradient
 * is checked against the function, not against another copy of its own
 * formula), and the inverse rotation as the rotation's adjoint.
 * test_device_ops then holds every other device to the host. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "zb_device.h"
#include "zbtest.h"

enum { N = 5, H = 24 };

static uint64_t rng = 99;
static double urand(void) { /* in [-1, 1) */
  rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
  return (double)(rng >> 11) / (double)(1ULL << 52) - 1.0;
}
static void fill(float *x, size_t n, double scale) {
  for (size_t i = 0; i < n; i++)
    x[i] = (float)(scale * urand());
}

static zb_device *host(void) {
  zb_device *d = NULL;
  zb_diag diag;
  return zb_device_host_new(&d, &diag) == ZB_OK ? d : NULL;
}

/* <dy, rmsnorm(x)> of one row in double: the function whose gradient
 * rmsnorm_bwd_acc must give. */
static double rms_dot(const double *x, const float *g, const float *dy, int h, double eps) {
  double ss = 0;
  for (int c = 0; c < h; c++)
    ss += x[c] * x[c];
  double inv = 1.0 / sqrt(ss / h + eps), dot = 0;
  for (int c = 0; c < h; c++)
    dot += (double)dy[c] * x[c] * inv * g[c];
  return dot;
}

static void test_rmsnorm_against_double(void) {
  zb_device *d = host();
  CHECK(d);
  float x[N * H], g[H], y[N * H], xhat[N * H], rstd[N], dy[N * H], dx[N * H] = {0};
  fill(x, N * H, 2);
  fill(g, H, 1.5);
  fill(dy, N * H, 1);
  const float eps = 1e-5f;
  CHECK_EQ(d->ops->rmsnorm_fwd(d->self, x, g, y, xhat, rstd, N, H, eps, NULL), ZB_OK);
  float again[N * H]; /* W recomputes the output from xhat: the same bits */
  CHECK_EQ(d->ops->layernorm_affine(d->self, xhat, g, NULL, again, N, H, NULL), ZB_OK);
  CHECK(memcmp(again, y, sizeof y) == 0);
  CHECK_EQ(d->ops->rmsnorm_bwd_acc(d->self, dy, xhat, rstd, g, dx, N, H, NULL), ZB_OK);
  for (int r = 0; r < N; r++) {
    double xd[H], ss = 0;
    for (int c = 0; c < H; c++)
      ss += (xd[c] = x[r * H + c]) * x[r * H + c];
    double inv = 1.0 / sqrt(ss / H + eps);
    for (int c = 0; c < H; c++)
      CHECK_NEAR(y[r * H + c], xd[c] * inv * g[c], 2e-6 * (fabs(xd[c] * inv * g[c]) + 1));
    for (int c = 0; c < H; c++) { /* d<dy, y>/dx[c] by central differences in double */
      double e = 1e-5, keep = xd[c];
      xd[c] = keep + e;
      double up = rms_dot(xd, g, dy + r * H, H, eps);
      xd[c] = keep - e;
      double down = rms_dot(xd, g, dy + r * H, H, eps);
      xd[c] = keep;
      double want = (up - down) / (2 * e);
      CHECK_NEAR(dx[r * H + c], want, 1e-5 * (fabs(want) + 1));
    }
  }
  zb_device_free(d);
}

static double swiglu_d(double g, double u) {
  return g / (1 + exp(-g)) * u;
}

static void test_swiglu_against_double(void) {
  zb_device *d = host();
  CHECK(d);
  enum { L = 64 };
  float gate[L], up[L], out[L], dout[L];
  fill(gate, L, 6); /* both tails of the logistic */
  fill(up, L, 2);
  fill(dout, L, 1);
  float g0[L], u0[L];
  for (int i = 0; i < L; i++) {
    g0[i] = gate[i];
    u0[i] = up[i];
  }
  CHECK_EQ(d->ops->swiglu_fwd(d->self, gate, up, out, L, NULL), ZB_OK);
  CHECK_EQ(d->ops->swiglu_bwd_inplace(d->self, dout, gate, up, L, NULL), ZB_OK);
  for (int i = 0; i < L; i++) {
    double want = swiglu_d(g0[i], u0[i]), e = 1e-6;
    CHECK_NEAR(out[i], want, 1e-6 * (fabs(want) + 1));
    double dg = dout[i] * (swiglu_d(g0[i] + e, u0[i]) - swiglu_d(g0[i] - e, u0[i])) / (2 * e);
    double du = dout[i] * (swiglu_d(g0[i], u0[i] + e) - swiglu_d(g0[i], u0[i] - e)) / (2 * e);
    CHECK_NEAR(gate[i], dg, 1e-5 * (fabs(dg) + 1));
    CHECK_NEAR(up[i], du, 1e-5 * (fabs(du) + 1));
  }
  zb_device_free(d);
}

/* transformers' x cos + rotate_half(x) sin, rotate_half(x) = (-x2, x1),
 * with the angle's table repeated over both halves; and the inverse as
 * the adjoint: <rope(x), y> = <x, rope^-1(y)>. */
static void test_rope_is_rotate_half_and_its_adjoint(void) {
  zb_device *d = host();
  CHECK(d);
  enum { T = 3, HEADS = 2, HD = 6, LD = HEADS * HD + 1, ROWS = 7, HALF = HD / 2 };
  float x[ROWS * LD], y[ROWS * LD], cs[T * HALF], sn[T * HALF];
  double ang[T * HALF];
  fill(x, ROWS * LD, 1);
  fill(y, ROWS * LD, 1);
  for (int k = 0; k < T * HALF; k++) {
    ang[k] = 3 * urand();
    cs[k] = (float)cos(ang[k]);
    sn[k] = (float)sin(ang[k]);
  }
  float rx[ROWS * LD], iy[ROWS * LD];
  for (int i = 0; i < ROWS * LD; i++) {
    rx[i] = x[i];
    iy[i] = y[i];
  }
  CHECK_EQ(d->ops->rope(d->self, rx, cs, sn, ROWS, T, HEADS, HD, LD, 0, NULL), ZB_OK);
  CHECK_EQ(d->ops->rope(d->self, iy, cs, sn, ROWS, T, HEADS, HD, LD, 1, NULL), ZB_OK);
  double lhs = 0, rhs = 0;
  for (int r = 0; r < ROWS; r++) {
    for (int k = 0; k < HEADS; k++)
      for (int j = 0; j < HD; j++) {
        int i = r * LD + k * HD + j, a = (r % T) * HALF + j % HALF;
        double rot = j < HALF ? -x[i + HALF] : x[i - HALF];
        double want = x[i] * cos(ang[a]) + rot * sin(ang[a]);
        CHECK_NEAR(rx[i], want, 1e-6);
      }
    CHECK(rx[r * LD + LD - 1] == x[r * LD + LD - 1]); /* the padding column is not touched */
    for (int c = 0; c < LD; c++) {
      lhs += (double)rx[r * LD + c] * y[r * LD + c];
      rhs += (double)x[r * LD + c] * iy[r * LD + c];
    }
  }
  CHECK_NEAR(lhs, rhs, 1e-5);
  zb_diag diag = {{0}};
  CHECK_EQ(d->ops->rope(d->self, rx, cs, sn, ROWS, T, HEADS, 5, LD, 0, &diag), ZB_ERR_INVALID_ARG);
  zb_device_free(d);
}

ZBT_MAIN(ZBT(test_rmsnorm_against_double), ZBT(test_swiglu_against_double),
         ZBT(test_rope_is_rotate_half_and_its_adjoint))
