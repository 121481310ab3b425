/* test_standin_kernels.c — every zbk_* launcher of the CPU stand-in
 * (tests/standin/kernels_standin.c; docs/model.md, The CPU stand-in)
 * against a direct host loop over model/zb_kernel_math.h, on small odd
 * shapes, through device memory and a stream like device_cuda.c uses them.
 * Sums in the references run in order (the host's way); the stand-in's
 * trees differ in rounding only, so the tolerance is 1e-5 relative; one
 * test pins the tree order itself. Ids outside the table fail on the
 * stream (in child processes: the error poisons the device).
 */
#include <spawn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "standin.h"
#include "zb_cuda_kernels.h"
#include "zbtest.h"

enum { N = 5, H = 7, T = 3, V = 11, CNT = 2, TS = 5, LEN = 13 };

static cudaStream_t s;
static unsigned seed = 12345;

static float rnd(void) {
  seed = seed * 1103515245u + 12345u;
  return (float)(seed >> 16 & 0xffff) / 32768.0f - 1.0f;
}

static void fill(float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    x[i] = rnd();
}

static void *up(const void *h, size_t bytes) {
  void *d = NULL;
  if (cudaMalloc(&d, bytes) != cudaSuccess || cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) != cudaSuccess)
    return NULL;
  return d;
}

/* Waits for the stream, then copies back and frees. */
static void down(void *h, void *d, size_t bytes) {
  cudaStreamSynchronize(s);
  cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost);
  cudaFree(d);
}

static int near(const float *got, const float *want, size_t n) {
  int bad = 0;
  for (size_t i = 0; i < n; i++)
    bad += !(fabsf(got[i] - want[i]) <= 1e-5f * (1.0f + fabsf(want[i])));
  return bad;
}

static void test_setup(void) {
  CHECK(cudaStreamCreate(&s) == cudaSuccess);
}

static void test_embed(void) {
  float emb[V * H], pos[T * H], x[N * H], want[N * H], dx[N * H], demb[V * H], dpos[T * H];
  int32_t tok[N] = {3, 0, 10, 3, 7};
  fill(x, N * H), fill(emb, V * H), fill(pos, T * H), fill(dx, N * H), fill(demb, V * H), fill(dpos, T * H);
  float *demb0 = malloc(sizeof demb), *dpos0 = malloc(sizeof dpos);
  memcpy(demb0, demb, sizeof demb), memcpy(dpos0, dpos, sizeof dpos);
  float *de = up(emb, sizeof emb), *dp = up(pos, sizeof pos), *dxo = up(x, sizeof x),
        *ddx = up(dx, sizeof dx);
  int32_t *dt = up(tok, sizeof tok);
  float *dde = up(demb, sizeof demb), *ddp = up(dpos, sizeof dpos);
  CHECK(zbk_embed_fwd(s, de, dp, dt, dxo, N, H, T) == cudaSuccess);
  CHECK(zbk_embed_bwd_acc(s, ddx, dt, dde, ddp, N, H, T) == cudaSuccess);
  down(x, dxo, sizeof x), down(demb, dde, sizeof demb), down(dpos, ddp, sizeof dpos);
  for (int r = 0; r < N; r++)
    for (int c = 0; c < H; c++) {
      want[r * H + c] = emb[tok[r] * H + c] + pos[(r % T) * H + c];
      demb0[tok[r] * H + c] += dx[r * H + c];
      dpos0[(r % T) * H + c] += dx[r * H + c];
    }
  CHECK_EQ(near(x, want, N * H), 0);
  CHECK_EQ(near(demb, demb0, V * H), 0);
  CHECK_EQ(near(dpos, dpos0, T * H), 0);
  cudaFree(de), cudaFree(dp), cudaFree(ddx), cudaFree(dt);
  free(demb0), free(dpos0);
}

/* Without positions (pos and dpos NULL): x[r] = emb[tok[r]]; ids past a
 * byte (vocabulary 300). */
static void test_embed_no_pos(void) {
  enum { VW = 300 };
  static float emb[VW * H], demb[VW * H], want[VW * H];
  float x[N * H], dx[N * H];
  int32_t tok[N] = {299, 0, 256, 299, 7};
  fill(emb, VW * H), fill(demb, VW * H), fill(dx, N * H);
  memcpy(want, demb, sizeof demb);
  float *de = up(emb, sizeof emb), *dxo = up(x, sizeof x), *ddx = up(dx, sizeof dx),
        *dde = up(demb, sizeof demb);
  int32_t *dt = up(tok, sizeof tok);
  CHECK(zbk_embed_fwd(s, de, NULL, dt, dxo, N, H, T) == cudaSuccess);
  CHECK(zbk_embed_bwd_acc(s, ddx, dt, dde, NULL, N, H, T) == cudaSuccess);
  down(x, dxo, sizeof x), down(demb, dde, sizeof demb);
  int bad = 0;
  for (int r = 0; r < N; r++)
    for (int c = 0; c < H; c++) {
      bad += x[r * H + c] != emb[tok[r] * H + c];
      want[tok[r] * H + c] += dx[r * H + c];
    }
  CHECK_EQ(bad, 0);
  CHECK_EQ(near(demb, want, VW * H), 0);
  cudaFree(de), cudaFree(ddx), cudaFree(dt);
}

static void test_layernorm(void) {
  float x[N * H], g[H], b[H], y[N * H], xh[N * H], rs[N], wy[N * H], wxh[N * H], wrs[N];
  fill(x, N * H), fill(g, H), fill(b, H), fill(y, N * H), fill(xh, N * H), fill(rs, N);
  for (int r = 0; r < N; r++) {
    double sum = 0, sq = 0;
    for (int c = 0; c < H; c++)
      sum += x[r * H + c];
    float mean = (float)(sum / H);
    for (int c = 0; c < H; c++)
      sq += (double)(x[r * H + c] - mean) * (x[r * H + c] - mean);
    wrs[r] = zbm_ln_rstd((float)sq, H);
    for (int c = 0; c < H; c++) {
      wxh[r * H + c] = (x[r * H + c] - mean) * wrs[r];
      wy[r * H + c] = wxh[r * H + c] * g[c] + b[c];
    }
  }
  float *dx = up(x, sizeof x), *dg = up(g, sizeof g), *db = up(b, sizeof b);
  float *dy = up(y, sizeof y), *dxh = up(xh, sizeof xh), *drs = up(rs, sizeof rs), *dy2 = up(y, sizeof y);
  CHECK(zbk_layernorm_fwd(s, dx, dg, db, dy, dxh, drs, N, H) == cudaSuccess);
  CHECK(zbk_layernorm_affine(s, dxh, dg, db, dy2, N, H) == cudaSuccess);
  float y2[N * H];
  down(y, dy, sizeof y), down(xh, dxh, sizeof xh), down(rs, drs, sizeof rs), down(y2, dy2, sizeof y2);
  CHECK_EQ(near(y, wy, N * H), 0);
  CHECK_EQ(near(xh, wxh, N * H), 0);
  CHECK_EQ(near(rs, wrs, N), 0);
  CHECK_EQ(near(y2, wy, N * H), 0);
  cudaFree(dx), cudaFree(dg), cudaFree(db);
}

static void test_layernorm_bwd(void) {
  float dy[N * H], xh[N * H], rs[N], g[H], dx[N * H], want[N * H], dg[H], db[H], wdg[H], wdb[H];
  fill(dy, N * H), fill(xh, N * H), fill(rs, N), fill(g, H), fill(dx, N * H), fill(dg, H), fill(db, H);
  memcpy(want, dx, sizeof dx), memcpy(wdg, dg, sizeof dg), memcpy(wdb, db, sizeof db);
  for (int r = 0; r < N; r++) {
    double s1 = 0, s2 = 0;
    for (int c = 0; c < H; c++) {
      s1 += dy[r * H + c] * g[c];
      s2 += dy[r * H + c] * g[c] * xh[r * H + c];
    }
    for (int c = 0; c < H; c++)
      want[r * H + c] +=
          zbm_ln_dx(dy[r * H + c], g[c], xh[r * H + c], rs[r], (float)(s1 / H), (float)(s2 / H));
  }
  for (int c = 0; c < H; c++) {
    double a = 0, b = 0;
    for (int r = 0; r < N; r++)
      a += dy[r * H + c] * xh[r * H + c], b += dy[r * H + c];
    wdg[c] += (float)a, wdb[c] += (float)b;
  }
  float *ddy = up(dy, sizeof dy), *dxh = up(xh, sizeof xh), *drs = up(rs, sizeof rs), *dgm = up(g, sizeof g);
  float *ddx = up(dx, sizeof dx), *ddg = up(dg, sizeof dg), *ddb = up(db, sizeof db);
  CHECK(zbk_layernorm_bwd_acc(s, ddy, dxh, drs, dgm, ddx, N, H) == cudaSuccess);
  CHECK(zbk_layernorm_param_grads_acc(s, ddy, dxh, ddg, ddb, N, H) == cudaSuccess);
  down(dx, ddx, sizeof dx), down(dg, ddg, sizeof dg), down(db, ddb, sizeof db);
  CHECK_EQ(near(dx, want, N * H), 0);
  CHECK_EQ(near(dg, wdg, H), 0);
  CHECK_EQ(near(db, wdb, H), 0);
  cudaFree(ddy), cudaFree(dxh), cudaFree(drs), cudaFree(dgm);
}

static void test_bias_and_col_sums(void) {
  float y[N * H], b[H], wy[N * H], db[H], wdb[H];
  fill(y, N * H), fill(b, H), fill(db, H);
  memcpy(wdb, db, sizeof db);
  for (int r = 0; r < N; r++)
    for (int c = 0; c < H; c++)
      wy[r * H + c] = y[r * H + c] + b[c];
  for (int c = 0; c < H; c++) {
    double a = 0;
    for (int r = 0; r < N; r++)
      a += y[r * H + c];
    wdb[c] += (float)a;
  }
  float *dy = up(y, sizeof y), *dyc = up(y, sizeof y), *dbb = up(b, sizeof b), *ddb = up(db, sizeof db);
  CHECK(zbk_col_sums_acc(s, dyc, ddb, N, H) == cudaSuccess);
  CHECK(zbk_bias_add(s, dy, dbb, N, H) == cudaSuccess);
  down(y, dy, sizeof y), down(db, ddb, sizeof db);
  CHECK_EQ(near(y, wy, N * H), 0);
  CHECK_EQ(near(db, wdb, H), 0);
  cudaFree(dyc), cudaFree(dbb);
}

/* The reduction is a pairwise tree: (1e8 + -1e8) + (1 + 1) = 2, where the
 * host's order ((1e8 + 1) + -1e8) + 1 gives 1. */
static void test_tree_order(void) {
  float dy[4] = {1e8f, 1, -1e8f, 1}, db = 0;
  float *ddy = up(dy, sizeof dy), *ddb = up(&db, sizeof db);
  CHECK(zbk_col_sums_acc(s, ddy, ddb, 4, 1) == cudaSuccess);
  down(&db, ddb, sizeof db);
  CHECK_NEAR(db, 2.0, 0);
  cudaFree(ddy);
}

static void test_gelu(void) {
  float u[LEN], out[LEN], dout[LEN], wout[LEN], wgrad[LEN];
  fill(u, LEN), fill(dout, LEN);
  for (int i = 0; i < LEN; i++)
    u[i] *= 4, wout[i] = zbm_gelu(u[i]), wgrad[i] = zbm_gelu_grad(u[i], dout[i]);
  float *du = up(u, sizeof u), *dout_d = up(out, sizeof out), *ddo = up(dout, sizeof dout);
  CHECK(zbk_gelu_fwd(s, du, dout_d, LEN) == cudaSuccess);
  CHECK(zbk_gelu_bwd_inplace(s, ddo, du, LEN) == cudaSuccess);
  down(out, dout_d, sizeof out), down(u, du, sizeof u);
  CHECK_EQ(near(out, wout, LEN), 0);
  CHECK_EQ(near(u, wgrad, LEN), 0);
  cudaFree(ddo);
}

static void test_softmax(void) {
  enum { M = CNT * TS * TS };
  float p[M], want[M], dp[M], wdp[M];
  fill(p, M), fill(dp, M);
  for (int i = 0; i < M; i++)
    p[i] *= 3;
  for (int m = 0; m < CNT; m++)
    for (int i = 0; i < TS; i++) {
      const float *row = p + (m * TS + i) * TS;
      float *w = want + (m * TS + i) * TS, mx = row[0];
      double sum = 0;
      for (int j = 0; j <= i; j++)
        mx = row[j] > mx ? row[j] : mx;
      for (int j = 0; j <= i; j++)
        sum += w[j] = zbm_exp(row[j] - mx);
      for (int j = 0; j < TS; j++)
        w[j] = j <= i ? w[j] * (1.0f / (float)sum) : 0.0f;
    }
  for (int m = 0; m < CNT; m++)
    for (int i = 0; i < TS; i++) {
      const float *pr = want + (m * TS + i) * TS, *dr = dp + (m * TS + i) * TS;
      double dot = 0;
      for (int j = 0; j <= i; j++)
        dot += pr[j] * dr[j];
      for (int j = 0; j < TS; j++)
        wdp[(m * TS + i) * TS + j] = j <= i ? zbm_softmax_bwd(pr[j], dr[j], (float)dot) : 0.0f;
    }
  for (int m = 0; m < CNT; m++) /* above the diagonal is not read */
    for (int i = 0; i < TS; i++)
      for (int j = i + 1; j < TS; j++)
        p[(m * TS + i) * TS + j] = dp[(m * TS + i) * TS + j] = NAN;
  float *dpp = up(p, sizeof p), *ddp = up(dp, sizeof dp);
  CHECK(zbk_softmax_causal(s, dpp, TS, CNT) == cudaSuccess);
  CHECK(zbk_softmax_causal_bwd(s, dpp, ddp, TS, CNT) == cudaSuccess);
  down(p, dpp, sizeof p), down(dp, ddp, sizeof dp);
  CHECK_EQ(near(p, want, M), 0);
  CHECK_EQ(near(dp, wdp, M), 0);
}

static void test_xent(void) {
  float lg[N * V], probs[N * V], want[N * V], wgrad[N * V];
  double loss[N], wloss[N];
  int32_t tg[N] = {0, 10, 4, 4, 7};
  fill(lg, N * V);
  memset(loss, 0, sizeof loss);
  for (int r = 0; r < N; r++) {
    const float *row = lg + r * V;
    float mx = row[0];
    double sum = 0;
    for (int j = 0; j < V; j++)
      mx = row[j] > mx ? row[j] : mx;
    for (int j = 0; j < V; j++)
      sum += want[r * V + j] = zbm_exp(row[j] - mx);
    for (int j = 0; j < V; j++) {
      want[r * V + j] *= 1.0f / (float)sum;
      wgrad[r * V + j] = zbm_xent_grad(want[r * V + j], j == tg[r], 0.2f);
    }
    wloss[r] = zbm_xent_loss((float)sum, row[tg[r]] - mx);
  }
  float *dl = up(lg, sizeof lg);
  int32_t *dt = up(tg, sizeof tg);
  double *dloss = up(loss, sizeof loss);
  CHECK(zbk_xent_fwd(s, dl, dt, dloss, N, V) == cudaSuccess);
  cudaStreamSynchronize(s);
  CHECK(cudaMemcpy(probs, dl, sizeof probs, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(zbk_xent_bwd(s, dl, dt, N, V, 0.2f) == cudaSuccess);
  down(lg, dl, sizeof lg), down(loss, dloss, sizeof loss);
  CHECK_EQ(near(probs, want, N * V), 0);
  CHECK_EQ(near(lg, wgrad, N * V), 0);
  for (int r = 0; r < N; r++)
    CHECK_NEAR(loss[r], wloss[r], 1e-5 * (1 + fabs(wloss[r])));
  cudaFree(dt);
}

static void test_adamw_and_vector_ops(void) {
  float p[LEN], m[LEN], v[LEN], g[LEN], wp[LEN], wm[LEN], wv[LEN], y[LEN], x[LEN], wy[LEN];
  uint8_t decay[LEN];
  fill(p, LEN), fill(m, LEN), fill(g, LEN), fill(y, LEN), fill(x, LEN);
  for (int i = 0; i < LEN; i++)
    v[i] = fabsf(rnd()), decay[i] = (uint8_t)(i % 3 == 0);
  zbm_adamw_step st = {.beta1 = 0.9,
                       .beta2 = 0.999,
                       .eps = 1e-8,
                       .step_size = 1e-3 / (1 - 0.9 * 0.9),
                       .sqrt_bc2 = sqrt(1 - 0.999 * 0.999),
                       .shrink = 1 - 1e-3 * 0.1,
                       .grad_scale = 0.5};
  memcpy(wp, p, sizeof p), memcpy(wm, m, sizeof m), memcpy(wv, v, sizeof v);
  for (int i = 0; i < LEN; i++) {
    zbm_adamw(&wp[i], &wm[i], &wv[i], g[i], decay[i], &st);
    wy[i] = (y[i] + -0.75f * x[i]) * 3.0f;
  }
  float *dp = up(p, sizeof p), *dm = up(m, sizeof m), *dv = up(v, sizeof v), *dg = up(g, sizeof g);
  uint8_t *dd = up(decay, sizeof decay);
  float *dy = up(y, sizeof y), *dx = up(x, sizeof x);
  CHECK(zbk_adamw(s, dp, dm, dv, dg, dd, LEN, st) == cudaSuccess);
  CHECK(zbk_add(s, dy, dx, -0.75f, LEN) == cudaSuccess);
  CHECK(zbk_scale(s, dy, 3.0f, LEN) == cudaSuccess);
  down(p, dp, sizeof p), down(m, dm, sizeof m), down(v, dv, sizeof v), down(y, dy, sizeof y);
  CHECK_EQ(near(p, wp, LEN), 0);
  CHECK_EQ(near(m, wm, LEN), 0);
  CHECK_EQ(near(v, wv, LEN), 0);
  CHECK_EQ(near(y, wy, LEN), 0);
  cudaFree(dg), cudaFree(dd), cudaFree(dx);
}

static void test_sumsq(void) {
  float x[LEN];
  fill(x, LEN);
  double want = 0, out = -1;
  int nf = -1;
  for (int i = 0; i < LEN; i++)
    want += (double)x[i] * x[i];
  float *dx = up(x, sizeof x);
  double *dout = up(&out, sizeof out);
  int *dnf = up(&nf, sizeof nf);
  CHECK(zbk_sumsq(s, dx, LEN, dout, dnf) == cudaSuccess);
  cudaStreamSynchronize(s);
  cudaMemcpy(&out, dout, sizeof out, cudaMemcpyDeviceToHost);
  cudaMemcpy(&nf, dnf, sizeof nf, cudaMemcpyDeviceToHost);
  CHECK_NEAR(out, want, 1e-12 * want);
  CHECK_EQ(nf, 0);
  x[5] = INFINITY;
  cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice);
  CHECK(zbk_sumsq(s, dx, LEN, dout, dnf) == cudaSuccess);
  down(&nf, dnf, sizeof nf), down(&out, dout, sizeof out);
  CHECK_EQ(nf, 1);
  CHECK(zbk_sumsq(s, dx, 0, NULL, NULL) == cudaErrorInvalidValue); /* outputs are device memory */
  cudaFree(dx);
  cudaGetLastError();
}

/* One launch with a bad id (ZB_STANDIN_BAD_ID names which) on a fresh
 * stream: it fails on the stream with cudaErrorIllegalAddress, and the
 * message names the id. */
static void bad_id_child(const char *which) {
  float emb[V * H], lg[N * V];
  fill(emb, V * H), fill(lg, N * V);
  int32_t ids[N] = {1, 2, 3, 4, 5};
  int neg = strstr(which, "neg") != NULL;
  /* past the table: far past it for the embedding, where the stand-in
   * sees an address outside every allocation (its only check there) */
  ids[3] = neg ? -1 : (strstr(which, "xent") ? V : 1 << 24);
  float *de = up(emb, sizeof emb), *dl = up(lg, sizeof lg), *dx = up(lg, (size_t)N * H * sizeof(float));
  int32_t *dt = up(ids, sizeof ids);
  double *dloss = up(lg, N * sizeof(double));
  cudaError_t e = cudaErrorUnknown;
  if (!strncmp(which, "embed_fwd", 9))
    e = zbk_embed_fwd(s, de, NULL, dt, dx, N, H, T);
  else if (!strncmp(which, "embed_bwd", 9))
    e = zbk_embed_bwd_acc(s, dx, dt, de, NULL, N, H, T);
  else if (!strncmp(which, "xent_fwd", 8))
    e = zbk_xent_fwd(s, dl, dt, dloss, N, V);
  else if (!strncmp(which, "xent_bwd", 8))
    e = zbk_xent_bwd(s, dl, dt, N, V, 1.0f);
  /* the launch is fine; the id fails as it runs, which may be before the
   * launcher reads the last error */
  CHECK(e == cudaSuccess || e == cudaErrorIllegalAddress);
  CHECK(cudaStreamSynchronize(s) == cudaErrorIllegalAddress);
  char want[32];
  snprintf(want, sizeof want, strstr(which, "xent") ? "target %d " : "token %d ", ids[3]);
  CHECK_MSG(strstr(standin_last_error(), want), "%s: %s", which, standin_last_error());
}

static void test_bad_ids(void) {
  const char *which = getenv("ZB_STANDIN_BAD_ID");
  if (which) {
    bad_id_child(which);
    return;
  }
  static const char *cases[] = {"embed_fwd_neg", "embed_fwd_past", "embed_bwd_neg", "embed_bwd_past",
                                "xent_fwd_neg",  "xent_fwd_past",  "xent_bwd_neg",  "xent_bwd_past"};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char env[64];
    snprintf(env, sizeof env, "ZB_STANDIN_BAD_ID=%s", cases[i]);
    char *argv[] = {"/proc/self/exe", "test_setup", "test_bad_ids", NULL}, *envp[] = {env, NULL};
    pid_t pid;
    int st;
    CHECK(posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, envp) == 0);
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "bad id child %s failed (status %d)", cases[i], st);
  }
}

static void test_teardown(void) {
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(cudaStreamDestroy(s) == cudaSuccess);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
}

ZBT_MAIN(ZBT(test_setup), ZBT(test_embed), ZBT(test_embed_no_pos), ZBT(test_layernorm),
         ZBT(test_layernorm_bwd), ZBT(test_bias_and_col_sums), ZBT(test_tree_order), ZBT(test_gelu),
         ZBT(test_softmax), ZBT(test_xent), ZBT(test_adamw_and_vector_ops), ZBT(test_sumsq),
         ZBT(test_bad_ids), ZBT(test_teardown))
