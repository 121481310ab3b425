/* cublas_standin.c — the CPU stand-in of the cuBLAS calls the cuda device
 * makes (test-only; docs/model.md, The CPU stand-in): handles, streams,
 * math modes, a user workspace and fp32 GEMMs (plain, strided batched,
 * and the Ex form).
 *
 * Semantics are cuBLAS's, column-major: C_i = alpha op(A_i) op(B_i) +
 * beta C_i with op(A) m x k stored as lda x (k or m), and so on. The
 * arguments are checked as cuBLAS documents (CUBLAS_STATUS_INVALID_VALUE
 * for a negative size or batch, a leading dimension below the rows stored,
 * an unknown operation, NULL alpha or beta), and every range a product
 * will touch must lie in device memory (checked at the call, named like
 * the runtime's checks). alpha and beta are host scalars (the default
 * pointer mode), read at the call. beta = 0 does not read C and alpha = 0
 * does not read A or B (NaN there does not propagate), as in BLAS.
 *
 * The product runs on the handle's stream: each element is the sum over
 * p in order, in fp32, of op(A)(i,p) op(B)(p,j). Reduced precision rounds
 * the inputs first: TF32 (10-bit mantissa) for CUBLAS_COMPUTE_32F_FAST_TF32
 * and for the fp32 calls under CUBLAS_TF32_TENSOR_OP_MATH, bf16 for
 * CUBLAS_COMPUTE_32F_FAST_16BF, both round to nearest even. The Ex form
 * also takes bf16 A and B (CUDA_R_16BF) with an fp32 C: each element is
 * widened exactly and the products summed in fp32, as tensor cores do with
 * fp32 accumulation (docs/model.md, Mixed precision).
 *
 * Threads: a handle is used by one thread at a time (as in cuBLAS); the
 * registry of handles has its own mutex.
 */
#include <cublas_v2.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin_internal.h"
#include "zb_kernel_math.h"

#define MAX_HANDLES 64

struct cublasContext {
  cudaStream_t stream;
  void *ws; /* cublasSetWorkspace's; NULL: none given */
  size_t ws_bytes;
  cublasMath_t mode;
};

static pthread_mutex_t g_hmu = PTHREAD_MUTEX_INITIALIZER;
static struct cublasContext *g_handles[MAX_HANDLES];

static bool handle_ok(cublasHandle_t h, const char *what) {
  bool ok = false;
  pthread_mutex_lock(&g_hmu);
  for (int i = 0; i < MAX_HANDLES && h; i++)
    ok = ok || g_handles[i] == h;
  pthread_mutex_unlock(&g_hmu);
  if (!ok)
    standin_error("%s: handle %p is not a live cuBLAS handle", what, (void *)h);
  return ok;
}

cublasStatus_t CUBLASWINAPI cublasCreate(cublasHandle_t *handle) {
  if (standin_inject("cublasCreate", STANDIN_SITE))
    return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!handle)
    return CUBLAS_STATUS_INVALID_VALUE;
  struct cublasContext *c = calloc(1, sizeof *c);
  if (!c)
    return CUBLAS_STATUS_ALLOC_FAILED;
  pthread_mutex_lock(&g_hmu);
  int i = 0;
  while (i < MAX_HANDLES && g_handles[i])
    i++;
  if (i < MAX_HANDLES)
    g_handles[i] = c;
  pthread_mutex_unlock(&g_hmu);
  if (i == MAX_HANDLES) {
    free(c);
    standin_error("cublasCreate: more than %d handles", MAX_HANDLES);
    return CUBLAS_STATUS_ALLOC_FAILED;
  }
  *handle = c;
  return CUBLAS_STATUS_SUCCESS;
}

/* Waits for the handle's work first, as cuBLAS does. */
cublasStatus_t CUBLASWINAPI cublasDestroy(cublasHandle_t handle) {
  if (!handle_ok(handle, "cublasDestroy"))
    return CUBLAS_STATUS_NOT_INITIALIZED;
  cudaStreamSynchronize(handle->stream);
  pthread_mutex_lock(&g_hmu);
  for (int i = 0; i < MAX_HANDLES; i++)
    if (g_handles[i] == handle)
      g_handles[i] = NULL;
  pthread_mutex_unlock(&g_hmu);
  free(handle);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSetStream(cublasHandle_t handle, cudaStream_t streamId) {
  if (standin_inject("cublasSetStream", STANDIN_SITE))
    return CUBLAS_STATUS_INTERNAL_ERROR;
  if (!handle_ok(handle, "cublasSetStream"))
    return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = streamId;
  return CUBLAS_STATUS_SUCCESS;
}

/* A user workspace (cuBLAS 11+): device memory of at least the bytes
 * given, or NULL and 0 to go back to cuBLAS's own. The GEMMs check it is
 * still live (gemm_submit); the stand-in needs no scratch of its own. */
cublasStatus_t CUBLASWINAPI cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace, size_t bytes) {
  if (standin_inject("cublasSetWorkspace", STANDIN_SITE))
    return CUBLAS_STATUS_INTERNAL_ERROR;
  if (!handle_ok(handle, "cublasSetWorkspace"))
    return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!workspace != !bytes) {
    standin_error("cublasSetWorkspace: workspace %p with %zu bytes (NULL goes with 0 only)", workspace,
                  bytes);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (workspace && standin_check_device(workspace, bytes, "cublasSetWorkspace"))
    return CUBLAS_STATUS_INVALID_VALUE;
  handle->ws = workspace;
  handle->ws_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasGetStream(cublasHandle_t handle, cudaStream_t *streamId) {
  if (!handle_ok(handle, "cublasGetStream"))
    return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!streamId)
    return CUBLAS_STATUS_INVALID_VALUE;
  *streamId = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (standin_inject("cublasSetMathMode", STANDIN_SITE))
    return CUBLAS_STATUS_INTERNAL_ERROR;
  if (!handle_ok(handle, "cublasSetMathMode"))
    return CUBLAS_STATUS_NOT_INITIALIZED;
  unsigned base = (unsigned)mode & ~(unsigned)CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
  if (base != CUBLAS_DEFAULT_MATH && base != CUBLAS_TENSOR_OP_MATH && base != CUBLAS_PEDANTIC_MATH &&
      base != CUBLAS_TF32_TENSOR_OP_MATH && base != CUBLAS_FP32_EMULATED_BF16X9_MATH) {
    standin_error("cublasSetMathMode: %d is not a math mode the stand-in knows", (int)mode);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  handle->mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode) {
  if (!handle_ok(handle, "cublasGetMathMode"))
    return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!mode)
    return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->mode;
  return CUBLAS_STATUS_SUCCESS;
}

/* ---- GEMM ---- */

typedef enum rounding { ROUND_NONE, ROUND_TF32, ROUND_BF16 } rounding;

typedef struct gemm_job {
  const char *api;
  cublasOperation_t ta, tb;
  int m, n, k, batch;
  float alpha, beta;
  const void *a, *b; /* fp32, or bf16 (uint16_t) when ab_bf16 */
  float *c;
  int lda, ldb, ldc;
  long long sa, sb, sc;
  rounding round;
  bool ab_bf16; /* CUDA_R_16BF A and B (the Ex form): read exactly, products summed in fp32 */
} gemm_job;

/* Rounds to `keep` mantissa bits, to nearest even; Inf and NaN unchanged. */
static float round_mantissa(float x, int keep) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u)
    return x;
  int drop = 23 - keep;
  uint32_t half = (1u << (drop - 1)) - 1, lsb = (u >> drop) & 1u;
  u = (u + half + lsb) & ~((1u << drop) - 1);
  memcpy(&x, &u, sizeof x);
  return x;
}

static float rnd(float x, rounding r) {
  return r == ROUND_TF32 ? round_mantissa(x, 10) : r == ROUND_BF16 ? round_mantissa(x, 7) : x;
}

/* Element idx of operand A or B, as fp32 (bf16 widens exactly), rounded as the compute type says. */
static float ab_at(const gemm_job *g, const void *base, size_t idx) {
  float x = g->ab_bf16 ? zbm_f32_from_bf16(((const uint16_t *)base)[idx]) : ((const float *)base)[idx];
  return rnd(x, g->round);
}

static size_t ab_size(const gemm_job *g) {
  return g->ab_bf16 ? sizeof(uint16_t) : sizeof(float);
}

static int imax(int a, int b) {
  return a > b ? a : b;
}

/* One product: op(A) packed column-major m x k, then for each column j of
 * C, acc[i] = sum_p op(A)(i,p) op(B)(p,j) in order of p. */
static void gemm_one(const gemm_job *g, const char *A, const char *B, float *C, float *ap, float *acc) {
  bool read_ab = g->alpha != 0.0f && g->k > 0;
  if (read_ab)
    for (int p = 0; p < g->k; p++)
      for (int i = 0; i < g->m; i++)
        ap[(size_t)p * g->m + i] =
            ab_at(g, A, g->ta == CUBLAS_OP_N ? i + (size_t)p * g->lda : p + (size_t)i * g->lda);
  for (int j = 0; j < g->n; j++) {
    for (int i = 0; i < g->m; i++)
      acc[i] = 0.0f;
    for (int p = 0; read_ab && p < g->k; p++) {
      float b = ab_at(g, B, g->tb == CUBLAS_OP_N ? p + (size_t)j * g->ldb : j + (size_t)p * g->ldb);
      const float *col = ap + (size_t)p * g->m;
      for (int i = 0; i < g->m; i++)
        acc[i] += col[i] * b;
    }
    float *cj = C + (size_t)j * g->ldc;
    for (int i = 0; i < g->m; i++)
      cj[i] = g->beta == 0.0f ? g->alpha * acc[i] : g->alpha * acc[i] + g->beta * cj[i];
  }
}

static cudaError_t gemm_run(void *arg) {
  const gemm_job *g = arg;
  float *ap = malloc(((size_t)g->m * g->k + g->m) * sizeof *ap);
  if (!ap) {
    standin_error("%s: out of host memory for the product", g->api);
    return cudaErrorMemoryAllocation;
  }
  for (int i = 0; i < g->batch; i++)
    gemm_one(g, (const char *)g->a + i * g->sa * (long long)ab_size(g),
             (const char *)g->b + i * g->sb * (long long)ab_size(g), g->c + i * g->sc, ap,
             ap + (size_t)g->m * g->k);
  free(ap);
  return cudaSuccess;
}

/* Checks that every element a batched operand touches is device memory:
 * `rows` x `cols` column-major with leading dimension ld, batch times at
 * stride apart. */
static bool range_ok(const void *p, size_t size, int rows, int cols, int ld, long long stride, int batch,
                     const char *api, const char *name) {
  long long span = (long long)(cols - 1) * ld + rows; /* elements of one matrix */
  long long lo = stride < 0 ? (long long)(batch - 1) * stride : 0;
  long long hi = (stride > 0 ? (long long)(batch - 1) * stride : 0) + span;
  char what[96];
  snprintf(what, sizeof what, "%s %s", api, name);
  return standin_check_device((const char *)p + lo * (long long)size, (size_t)(hi - lo) * size, what) ==
         cudaSuccess;
}

static bool op_ok(cublasOperation_t op) {
  return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
}

/* The documented argument checks, then the ranges, then the enqueue. */
static cublasStatus_t gemm_submit(cublasHandle_t h, gemm_job g, const float *alpha, const float *beta) {
  if (!handle_ok(h, g.api))
    return CUBLAS_STATUS_NOT_INITIALIZED;
  if (standin_inject(g.api, NULL))
    return CUBLAS_STATUS_EXECUTION_FAILED;
  /* the workspace must outlive its use: cuBLAS would write into freed memory */
  if (h->ws && standin_check_device(h->ws, h->ws_bytes, "the handle's workspace (cublasSetWorkspace)"))
    return CUBLAS_STATUS_EXECUTION_FAILED;
  int arows = g.ta == CUBLAS_OP_N ? g.m : g.k, brows = g.tb == CUBLAS_OP_N ? g.k : g.n;
  const char *bad = !op_ok(g.ta) || !op_ok(g.tb)    ? "unknown cublasOperation_t"
                    : g.m < 0 || g.n < 0 || g.k < 0 ? "negative m, n or k"
                    : g.batch < 0                   ? "negative batchCount"
                    : g.lda < imax(1, arows)        ? "lda below the rows of A as stored"
                    : g.ldb < imax(1, brows)        ? "ldb below the rows of B as stored"
                    : g.ldc < imax(1, g.m)          ? "ldc below m"
                    : !alpha || !beta               ? "NULL alpha or beta"
                    : standin_is_device(alpha) || standin_is_device(beta) ? "alpha or beta in device memory "
                                                                            "(the pointer mode is host)"
                                                                          : NULL;
  if (bad) {
    standin_error("%s: %s (transa %d transb %d m %d n %d k %d lda %d ldb %d ldc %d batch %d)", g.api, bad,
                  (int)g.ta, (int)g.tb, g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.batch);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (g.m == 0 || g.n == 0 || g.batch == 0)
    return CUBLAS_STATUS_SUCCESS;
  g.alpha = *alpha;
  g.beta = *beta;
  g.ta = g.ta == CUBLAS_OP_C ? CUBLAS_OP_T : g.ta; /* real data: conjugate transpose is transpose */
  g.tb = g.tb == CUBLAS_OP_C ? CUBLAS_OP_T : g.tb;
  bool read_ab = g.alpha != 0.0f && g.k > 0;
  if ((read_ab && (!range_ok(g.a, ab_size(&g), arows, g.ta == CUBLAS_OP_N ? g.k : g.m, g.lda, g.sa, g.batch,
                             g.api, "A") ||
                   !range_ok(g.b, ab_size(&g), brows, g.tb == CUBLAS_OP_N ? g.n : g.k, g.ldb, g.sb, g.batch,
                             g.api, "B"))) ||
      !range_ok(g.c, sizeof(float), g.m, g.n, g.ldc, g.sc, g.batch, g.api, "C"))
    return CUBLAS_STATUS_INVALID_VALUE;
  /* the stream thread works through the views (standin.h); A and B unread need none */
  g.a = read_ab ? standin_view(g.a, 0, g.api) : NULL;
  g.b = read_ab ? standin_view(g.b, 0, g.api) : NULL;
  g.c = standin_view(g.c, 0, g.api);
  if ((read_ab && (!g.a || !g.b)) || !g.c)
    return CUBLAS_STATUS_INVALID_VALUE;
  gemm_job *j = malloc(sizeof *j);
  if (!j)
    return CUBLAS_STATUS_ALLOC_FAILED;
  *j = g;
  cudaError_t e = standin_enqueue(h->stream, gemm_run, j, free);
  if (e != cudaSuccess) {
    free(j);
    standin_error("%s: cannot launch on stream %p: %s", g.api, (void *)h->stream, cudaGetErrorName(e));
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  return CUBLAS_STATUS_SUCCESS;
}

/* The fp32 calls use TF32 when the handle's math mode allows it. */
static rounding mode_rounding(cublasHandle_t h) {
  unsigned base = (unsigned)h->mode & ~(unsigned)CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
  return base == CUBLAS_TF32_TENSOR_OP_MATH ? ROUND_TF32 : ROUND_NONE;
}

cublasStatus_t CUBLASWINAPI cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                                        cublasOperation_t transb, int m, int n, int k, const float *alpha,
                                        const float *A, int lda, const float *B, int ldb, const float *beta,
                                        float *C, int ldc) {
  gemm_job g = {.api = "cublasSgemm",
                .ta = transa,
                .tb = transb,
                .m = m,
                .n = n,
                .k = k,
                .batch = 1,
                .a = A,
                .b = B,
                .c = C,
                .lda = lda,
                .ldb = ldb,
                .ldc = ldc};
  if (handle_ok(handle, g.api))
    g.round = mode_rounding(handle);
  return gemm_submit(handle, g, alpha, beta);
}

cublasStatus_t CUBLASWINAPI cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                                      cublasOperation_t transb, int m, int n, int k,
                                                      const float *alpha, const float *A, int lda,
                                                      long long int strideA, const float *B, int ldb,
                                                      long long int strideB, const float *beta, float *C,
                                                      int ldc, long long int strideC, int batchCount) {
  gemm_job g = {.api = "cublasSgemmStridedBatched",
                .ta = transa,
                .tb = transb,
                .m = m,
                .n = n,
                .k = k,
                .batch = batchCount,
                .a = A,
                .b = B,
                .c = C,
                .lda = lda,
                .ldb = ldb,
                .ldc = ldc,
                .sa = strideA,
                .sb = strideB,
                .sc = strideC};
  if (handle_ok(handle, g.api))
    g.round = mode_rounding(handle);
  return gemm_submit(handle, g, alpha, beta);
}

cublasStatus_t CUBLASWINAPI cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void *alpha, const void *A, cudaDataType Atype, int lda, long long int strideA, const void *B,
    cudaDataType Btype, int ldb, long long int strideB, const void *beta, void *C, cudaDataType Ctype,
    int ldc, long long int strideC, int batchCount, cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  const char *api = "cublasGemmStridedBatchedEx";
  gemm_job g = {.api = api,
                .ta = transa,
                .tb = transb,
                .m = m,
                .n = n,
                .k = k,
                .batch = batchCount,
                .a = A,
                .b = B,
                .c = C,
                .lda = lda,
                .ldb = ldb,
                .ldc = ldc,
                .sa = strideA,
                .sb = strideB,
                .sc = strideC};
  if (!handle_ok(handle, api))
    return CUBLAS_STATUS_NOT_INITIALIZED;
  /* A and B of one type (fp32, or bf16 with fp32 accumulation), C fp32:
   * the combinations cuBLAS lists for CUBLAS_COMPUTE_32F that zb uses */
  g.ab_bf16 = Atype == CUDA_R_16BF;
  if (Atype != Btype || (Atype != CUDA_R_32F && Atype != CUDA_R_16BF) || Ctype != CUDA_R_32F) {
    standin_error("%s: the stand-in supports A and B both CUDA_R_32F or both CUDA_R_16BF, and C CUDA_R_32F "
                  "(got %d, %d, %d)",
                  api, (int)Atype, (int)Btype, (int)Ctype);
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  switch (computeType) {
  case CUBLAS_COMPUTE_32F: g.round = mode_rounding(handle); break;
  case CUBLAS_COMPUTE_32F_PEDANTIC: g.round = ROUND_NONE; break;
  case CUBLAS_COMPUTE_32F_FAST_TF32: g.round = ROUND_TF32; break;
  case CUBLAS_COMPUTE_32F_FAST_16BF: g.round = ROUND_BF16; break;
  default:
    standin_error("%s: compute type %d is not supported by the stand-in", api, (int)computeType);
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (!((algo >= CUBLAS_GEMM_DEFAULT && algo <= CUBLAS_GEMM_ALGO23) ||
        (algo >= CUBLAS_GEMM_DEFAULT_TENSOR_OP && algo <= CUBLAS_GEMM_ALGO15_TENSOR_OP))) {
    standin_error("%s: algo %d is not a cublasGemmAlgo_t", api, (int)algo);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  return gemm_submit(handle, g, alpha, beta);
}

const char *CUBLASWINAPI cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
  case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
  case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
  case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
  case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
  case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
  case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
  case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char *CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
  case CUBLAS_STATUS_SUCCESS: return "success";
  case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
  case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
  case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
  case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
  case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
  case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
  case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
  case CUBLAS_STATUS_LICENSE_ERROR: return "error detected trying to check the license";
  }
  return "unknown error";
}
