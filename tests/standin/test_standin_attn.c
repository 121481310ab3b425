/* test_standin_attn.c — the stand-in's flash attention launchers
 * (zbk_attn_fwd, zbk_attn_bwd: tests/standin/attn_standin.c, the host twins
 * of kernels_cuda.cu's kernels; docs/model.md, Flash attention (CUDA))
 * against the unfused attention in double (tests/attn_ref.h), through
 * device memory and a stream as device_cuda.c uses them:
 *   - o, lse, dQ, dK, dV within ATTN_TOL of each tensor's norm on odd
 *     shapes: T = 1, T = 17, 70 and 130 against the 64-key and 32-query
 *     tiles, one head, head dimensions 80, 128 and 64, grouped-query
 *     attention (4 heads on 2 and on 1), batch > 1, padded rows, whose
 *     padding the launchers leave as it was;
 *   - bad shapes (a head dimension over 128 included), ranges outside
 *     device memory and dqkv over qkv are refused at launch.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attn_ref.h"
#include "standin.h"
#include "zb_cuda_kernels.h"
#include "zbtest.h"

#define ATTN_TOL 2e-6
#define PAD_VALUE 12345.0f

static cudaStream_t s;

static void test_setup(void) {
  CHECK(cudaStreamCreate(&s) == cudaSuccess);
}

static float *up(const float *h, size_t n) {
  float *d = NULL;
  if (cudaMalloc((void **)&d, n * sizeof(float)) != cudaSuccess ||
      cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
    return NULL;
  return d;
}

static void down(float *h, float *d, size_t n) {
  cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(d);
}

static int pad_intact(const float *x, size_t rows, int ld, int from) {
  for (size_t r = 0; r < rows; r++)
    for (int c = from; c < ld; c++)
      if (x[r * ld + c] != PAD_VALUE)
        return 0;
  return 1;
}

/* Host buffers of one case. */
typedef struct bufs {
  float *qkv, *o, *lse, *dout, *dqkv;
} bufs;

static bufs make(const zbk_attn *a, int k) {
  size_t rows = (size_t)a->batch * a->t;
  bufs h = {malloc(rows * a->ld * sizeof(float)), malloc(rows * a->lo * sizeof(float)),
            malloc(rows * a->heads * sizeof(float)), malloc(rows * a->lo * sizeof(float)),
            malloc(rows * a->ld * sizeof(float))};
  for (size_t i = 0; i < rows * a->ld; i++) {
    h.qkv[i] = 2.0f * zbt_urand(300 + (uint64_t)k, i);
    h.dqkv[i] = PAD_VALUE;
  }
  for (size_t i = 0; i < rows * a->lo; i++) {
    h.dout[i] = zbt_urand(400 + (uint64_t)k, i);
    h.o[i] = PAD_VALUE;
  }
  return h;
}

static void check_case(zbk_attn a, int k) {
  size_t rows = (size_t)a.batch * a.t, nq = rows * a.ld, no = rows * a.lo, nl = rows * a.heads;
  bufs h = make(&a, k);
  float *qkv = up(h.qkv, nq), *o = up(h.o, no), *lse = up(h.lse, nl), *dout = up(h.dout, no),
        *dqkv = up(h.dqkv, nq);
  CHECK(qkv && o && lse && dout && dqkv);
  CHECK(zbk_attn_fwd(s, qkv, o, lse, a) == cudaSuccess);
  CHECK(zbk_attn_bwd(s, qkv, o, lse, dout, dqkv, a) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  down(h.o, o, no), down(h.lse, lse, nl), down(h.dqkv, dqkv, nq);
  cudaFree(qkv), cudaFree(dout);
  ref_attn ra = {a.batch, a.t, a.heads, a.kv_heads, a.hd, a.ld, a.lo, a.scale};
  ref_out r;
  ref_attn_run(h.qkv, h.dout, &ra, &r);
  CHECK(r.o && r.lse && r.dqkv);
  double e[5];
  ref_errors(h.o, h.lse, h.dqkv, &r, &ra, e);
  static const char *const names[5] = REF_NAMES;
  for (int i = 0; i < 5; i++)
    CHECK_MSG(e[i] <= ATTN_TOL, "case %d (batch %d, t %d, heads %d on %d, hd %d): %s off by %.3g", k, a.batch,
              a.t, a.heads, a.kv_heads, a.hd, names[i], e[i]);
  CHECK_MSG(pad_intact(h.o, rows, a.lo, a.heads * a.hd) &&
                pad_intact(h.dqkv, rows, a.ld, (a.heads + 2 * a.kv_heads) * a.hd),
            "case %d: the launchers wrote into the rows' padding", k);
  printf("    batch %d t %3d heads %d/%d hd %3d: o %.1e lse %.1e dQ %.1e dK %.1e dV %.1e\n", a.batch, a.t,
         a.heads, a.kv_heads, a.hd, e[0], e[1], e[2], e[3], e[4]);
  ref_attn_free(&r);
  free(h.qkv), free(h.o), free(h.lse), free(h.dout), free(h.dqkv);
}

static void test_attn_matches_reference(void) {
  /* batch, t, heads, kv_heads, hd, row padding of qkv, of o */
  static const int cases[][7] = {{1, 1, 1, 1, 8, 0, 0},    {2, 17, 1, 1, 16, 3, 1}, {1, 70, 4, 2, 80, 0, 0},
                                 {2, 70, 4, 1, 128, 5, 2}, {3, 17, 4, 2, 80, 0, 0}, {1, 130, 2, 2, 64, 1, 0},
                                 {2, 65, 3, 1, 12, 0, 4},  {1, 33, 1, 1, 80, 2, 3}};
  for (int k = 0; k < (int)(sizeof cases / sizeof cases[0]); k++) {
    const int *c = cases[k];
    zbk_attn a = {.batch = c[0], .t = c[1], .heads = c[2], .kv_heads = c[3], .hd = c[4]};
    a.ld = (a.heads + 2 * a.kv_heads) * a.hd + c[5];
    a.lo = a.heads * a.hd + c[6];
    a.scale = 1.0f / sqrtf((float)a.hd);
    check_case(a, k);
  }
}

static void test_attn_refusals(void) {
  zbk_attn good = {.batch = 1, .t = 4, .heads = 2, .kv_heads = 1, .hd = 4, .ld = 16, .lo = 8, .scale = 0.5f};
  float *qkv = NULL, *o = NULL, *lse = NULL, *dqkv = NULL;
  CHECK(cudaMalloc((void **)&qkv, 64 * sizeof(float)) == cudaSuccess);
  CHECK(cudaMalloc((void **)&o, 32 * sizeof(float)) == cudaSuccess);
  CHECK(cudaMalloc((void **)&lse, 8 * sizeof(float)) == cudaSuccess);
  CHECK(cudaMalloc((void **)&dqkv, 64 * sizeof(float)) == cudaSuccess);
  CHECK(cudaMemset(qkv, 0, 64 * sizeof(float)) == cudaSuccess);
  CHECK(zbk_attn_fwd(s, qkv, o, lse, good) == cudaSuccess);
  CHECK(zbk_attn_bwd(s, qkv, o, lse, o, dqkv, good) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  zbk_attn bad[5] = {good, good, good, good, good};
  bad[0].kv_heads = 3; /* 2 heads do not split into groups of 3 */
  bad[1].ld = 15;
  bad[2].lo = 7;
  bad[3].t = 0;
  bad[4].hd = 129, bad[4].ld = 4 * 129, bad[4].lo = 2 * 129; /* over ZBK_ATTN_MAX_HD */
  for (int i = 0; i < 5; i++) {
    CHECK_MSG(zbk_attn_fwd(s, qkv, o, lse, bad[i]) == cudaErrorInvalidValue, "case %d", i);
    CHECK_MSG(zbk_attn_bwd(s, qkv, o, lse, o, dqkv, bad[i]) == cudaErrorInvalidValue, "case %d", i);
  }
  zbk_attn longer = good;
  longer.t = 5; /* qkv is 4 rows: the fifth is outside its allocation */
  CHECK(zbk_attn_fwd(s, qkv, o, lse, longer) == cudaErrorInvalidValue);
  CHECK(zbk_attn_bwd(s, qkv, o, lse, o, qkv + 8, good) == cudaErrorInvalidValue); /* overlaps qkv */
  (void)cudaGetLastError();
  cudaFree(qkv), cudaFree(o), cudaFree(lse), cudaFree(dqkv);
}

static void test_teardown(void) {
  CHECK(cudaStreamDestroy(s) == cudaSuccess);
}

ZBT_MAIN(ZBT(test_setup), ZBT(test_attn_matches_reference), ZBT(test_attn_refusals), ZBT(test_teardown))
