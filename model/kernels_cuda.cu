/* kernels_cuda.cu — the model's element-wise and row ops on a GPU: the
 * zbk_* launchers of zb_cuda_kernels.h (docs/model.md, Devices). The
 * per-element arithmetic is zb_kernel_math.h's, shared with the host and
 * the CPU stand-in; only how a row is reduced differs here.
 *
 * Shapes of the kernels:
 *   - element-wise ops: a grid-stride loop over size_t indices, at most
 *     ZBK_MAX_BLOCKS blocks, so any length (beyond 2^31 too) is covered;
 *   - row ops (LayerNorm, softmax, cross-entropy): one block per row, rows
 *     taken grid-stride by block (so more than 65535 rows work), reductions
 *     by warp shuffles and one shared-memory pass across warps; the order
 *     of a reduction depends only on the block size, so results are
 *     deterministic;
 *   - column sums (bias and LayerNorm parameter gradients): one block of
 *     8 x 128 threads per 8-column tile walks all rows, and the 128 partial
 *     sums of a column meet in a fixed tree in shared memory;
 *   - embed_bwd_acc: each output element (a token's or a position's row)
 *     is owned by one thread that adds its rows in row order, the host's
 *     order, so the result is the host's bit for bit. Tokens are spread
 *     over ZBK_TOK_GROUPS blocks by id modulo the group count, so the
 *     launch needs no vocabulary size.
 * No kernel uses atomics: every result depends only on its inputs and the
 * launch shape, so two runs agree bit for bit (docs/model.md, Devices).
 *   - sumsq: one block of 1024 threads reduces the whole vector in double,
 *     deterministic and with no scratch memory (the interface passes none);
 *     it reads at one SM's bandwidth, which suits a once-per-step norm.
 *
 * Threads: launchers may be called from any host thread; each enqueues on
 * the given stream and returns cudaGetLastError() after the launch. Errors:
 * a negative count is cudaErrorInvalidValue (the device checks its
 * arguments first); a zero count launches nothing.
 */
#include <cuda_bf16.h>
#include <stdint.h>

#include "zb_cuda_kernels.h"
#include "zb_kernel_math.h"

#define ZBK_THREADS 256
#define ZBK_MAX_BLOCKS 65535u
#define ZBK_COL_TILE 8
#define ZBK_COL_ROWS 128 /* a power of two: the tree halves it */
#define ZBK_SUMSQ_THREADS 1024
#define ZBK_TOK_GROUPS 256 /* a power of two: ids are grouped by their low bits */

/* Flash attention's storage types, read and written as fp32 (below). At
 * namespace scope: an unused specialization then draws no warning. */
template <typename T> struct io;
template <> struct io<float> {
  static __device__ float ld(const float *p, size_t i) {
    return p[i];
  }
  static __device__ void st(float *p, size_t i, float v) {
    p[i] = v;
  }
};
template <> struct io<__nv_bfloat16> {
  static __device__ float ld(const __nv_bfloat16 *p, size_t i) {
    return __bfloat162float(p[i]);
  }
  static __device__ void st(__nv_bfloat16 *p, size_t i, float v) {
    p[i] = __float2bfloat16(v);
  }
};

namespace {

/* ---- launch shapes ---- */

unsigned elementwise_blocks(size_t len) {
  size_t b = (len + ZBK_THREADS - 1) / ZBK_THREADS;
  return b > ZBK_MAX_BLOCKS ? ZBK_MAX_BLOCKS : (unsigned)b;
}

unsigned row_blocks(size_t rows) {
  return rows > ZBK_MAX_BLOCKS ? ZBK_MAX_BLOCKS : (unsigned)rows;
}

/* Threads for a row of `cols`: whole warps, 32 to 256. */
unsigned row_threads(size_t cols) {
  size_t t = (cols + 31) / 32 * 32;
  return t < 32 ? 32 : t > 256 ? 256 : (unsigned)t;
}

__device__ size_t grid_start() {
  return (size_t)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ size_t grid_step() {
  return (size_t)blockDim.x * gridDim.x;
}

/* ---- block reductions: every thread gets the result ---- */

template <typename T> __device__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}

/* sh holds 32 values; the leading barrier keeps a previous reduction's
 * readers ahead of this one's writers. blockDim.x is a multiple of 32. */
template <typename T> __device__ T block_sum(T v, T *sh) {
  v = warp_sum(v);
  unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0)
    sh[warp] = v;
  __syncthreads();
  return warp_sum(lane < (blockDim.x >> 5) ? sh[lane] : (T)0);
}

__device__ float block_max(float v, float *sh) {
  v = warp_max(v);
  unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0)
    sh[warp] = v;
  __syncthreads();
  return warp_max(lane < (blockDim.x >> 5) ? sh[lane] : -INFINITY);
}

/* ---- element-wise ---- */

__global__ void embed_fwd_k(const float *emb, const float *pos, const int32_t *tokens, float *x, size_t len,
                            int h, int t) {
  for (size_t i = grid_start(); i < len; i += grid_step()) {
    size_t r = i / (size_t)h, c = i % (size_t)h;
    float e = emb[(long long)tokens[r] * h + (long long)c];
    x[i] = pos ? e + pos[(r % (size_t)t) * h + c] : e;
  }
}

/* demb[v, :] += dx[r, :] over the rows r whose token v is in group g =
 * v mod ZBK_TOK_GROUPS (grid y), in row order. Every block reads the
 * tokens (one broadcast load per row); only its group's rows of dx. A
 * token's element is owned by one thread, so its sum runs in row order;
 * while the same token repeats it stays in a register. A token that never
 * occurs leaves its row untouched (rows past the vocabulary are addressed
 * only by an id outside it). */
__global__ void embed_bwd_tok_k(const float *dx, const int32_t *tokens, float *demb, int n, int h) {
  int c = blockIdx.x * blockDim.x + threadIdx.x, g = blockIdx.y;
  if (c >= h)
    return;
  float acc = 0.0f, *cur = NULL;
  for (int r = 0; r < n; r++) {
    int32_t v = tokens[r];
    if ((v & (ZBK_TOK_GROUPS - 1)) != g)
      continue;
    float *e = demb + (long long)v * h + c;
    if (e != cur) {
      if (cur)
        *cur = acc;
      cur = e;
      acc = *e;
    }
    acc += dx[(size_t)r * h + c];
  }
  if (cur)
    *cur = acc;
}

/* dpos[p, :] += dx[r, :] over the rows r = p, p + t, ... (position p of
 * every sequence), in row order. */
__global__ void embed_bwd_pos_k(const float *dx, float *dpos, int n, int h, int t) {
  size_t len = (size_t)t * h;
  for (size_t i = grid_start(); i < len; i += grid_step()) {
    size_t p = i / (size_t)h, c = i % (size_t)h;
    float acc = dpos[i];
    for (size_t r = p; r < (size_t)n; r += (size_t)t)
      acc += dx[r * h + c];
    dpos[i] = acc;
  }
}

/* y = x * g + b per column, x * g without b (RMSNorm), or x + b without g
 * (bias_add: in place, y == x). */
__global__ void affine_k(const float *x, const float *g, const float *b, float *y, size_t len, int cols) {
  for (size_t i = grid_start(); i < len; i += grid_step()) {
    size_t c = i % (size_t)cols;
    y[i] = !g ? x[i] + b[c] : b ? x[i] * g[c] + b[c] : x[i] * g[c];
  }
}

__global__ void gelu_fwd_k(const float *u, float *out, size_t len) {
  for (size_t i = grid_start(); i < len; i += grid_step())
    out[i] = zbm_gelu(u[i]);
}

__global__ void gelu_bwd_k(const float *dout, float *u, size_t len) {
  for (size_t i = grid_start(); i < len; i += grid_step())
    u[i] = zbm_gelu_grad(u[i], dout[i]);
}

__global__ void xent_bwd_k(float *probs, const int32_t *targets, size_t len, int v, float scale) {
  for (size_t i = grid_start(); i < len; i += grid_step()) {
    size_t r = i / (size_t)v, j = i % (size_t)v;
    probs[i] = zbm_xent_grad(probs[i], j == (size_t)targets[r], scale);
  }
}

__global__ void adamw_k(float *p, float *m, float *v, const float *g, const uint8_t *decay, size_t len,
                        zbm_adamw_step step) {
  for (size_t i = grid_start(); i < len; i += grid_step())
    zbm_adamw(&p[i], &m[i], &v[i], g[i], decay[i] != 0, &step);
}

__global__ void add_k(float *y, const float *x, float alpha, size_t len) {
  for (size_t i = grid_start(); i < len; i += grid_step())
    y[i] += alpha * x[i];
}

__global__ void scale_k(float *x, float alpha, size_t len) {
  for (size_t i = grid_start(); i < len; i += grid_step())
    x[i] *= alpha;
}

/* ---- row ops: one block per row ---- */

__global__ void layernorm_fwd_k(const float *x, const float *g, const float *b, float *y, float *xhat,
                                float *rstd, int n, int h) {
  __shared__ float sh[32];
  for (int r = blockIdx.x; r < n; r += gridDim.x) {
    const float *xr = x + (size_t)r * h;
    float *hr = xhat + (size_t)r * h, *yr = y + (size_t)r * h;
    float s = 0.0f;
    for (int c = threadIdx.x; c < h; c += blockDim.x)
      s += xr[c];
    float mean = block_sum(s, sh) / (float)h;
    /* centre first: the variance of centred values does not cancel */
    float q = 0.0f;
    for (int c = threadIdx.x; c < h; c += blockDim.x) {
      float d = xr[c] - mean;
      q += d * d;
    }
    float rs = zbm_ln_rstd(block_sum(q, sh), h);
    if (threadIdx.x == 0)
      rstd[r] = rs;
    for (int c = threadIdx.x; c < h; c += blockDim.x) {
      float xh = (xr[c] - mean) * rs;
      hr[c] = xh;
      yr[c] = xh * g[c] + b[c];
    }
  }
}

__global__ void layernorm_bwd_acc_k(const float *dy, const float *xhat, const float *rstd, const float *g,
                                    float *dx, int n, int h) {
  __shared__ float sh[32];
  for (int r = blockIdx.x; r < n; r += gridDim.x) {
    const float *dr = dy + (size_t)r * h, *hr = xhat + (size_t)r * h;
    float *xr = dx + (size_t)r * h;
    float s1 = 0.0f, s2 = 0.0f;
    for (int c = threadIdx.x; c < h; c += blockDim.x) {
      float dxh = dr[c] * g[c];
      s1 += dxh;
      s2 += dxh * hr[c];
    }
    float m1 = block_sum(s1, sh) / (float)h;
    float m2 = block_sum(s2, sh) / (float)h;
    float rs = rstd[r];
    for (int c = threadIdx.x; c < h; c += blockDim.x)
      xr[c] += zbm_ln_dx(dr[c], g[c], hr[c], rs, m1, m2);
  }
}

/* ---- llama's row ops: one block per row ---- */

__global__ void rmsnorm_fwd_k(const float *x, const float *g, float *y, float *xhat, float *rstd, int n,
                              int h, float eps) {
  __shared__ float sh[32];
  for (int r = blockIdx.x; r < n; r += gridDim.x) {
    const float *xr = x + (size_t)r * h;
    float *hr = xhat + (size_t)r * h, *yr = y + (size_t)r * h;
    float q = 0.0f;
    for (int c = threadIdx.x; c < h; c += blockDim.x)
      q += xr[c] * xr[c];
    float rs = zbm_rms_rstd(block_sum(q, sh), h, eps);
    if (threadIdx.x == 0)
      rstd[r] = rs;
    for (int c = threadIdx.x; c < h; c += blockDim.x) {
      float xh = xr[c] * rs;
      hr[c] = xh;
      yr[c] = xh * g[c];
    }
  }
}

__global__ void rmsnorm_bwd_acc_k(const float *dy, const float *xhat, const float *rstd, const float *g,
                                  float *dx, int n, int h) {
  __shared__ float sh[32];
  for (int r = blockIdx.x; r < n; r += gridDim.x) {
    const float *dr = dy + (size_t)r * h, *hr = xhat + (size_t)r * h;
    float *xr = dx + (size_t)r * h;
    float s2 = 0.0f;
    for (int c = threadIdx.x; c < h; c += blockDim.x)
      s2 += dr[c] * g[c] * hr[c];
    float m2 = block_sum(s2, sh) / (float)h, rs = rstd[r];
    for (int c = threadIdx.x; c < h; c += blockDim.x)
      xr[c] += zbm_rms_dx(dr[c], g[c], hr[c], rs, m2);
  }
}

/* one thread per rotated pair: len = n * heads * hd/2 */
__global__ void rope_k(float *x, const float *cos, const float *sin, size_t len, int t, int heads, int hd,
                       int ld, float sign) {
  int half = hd / 2;
  for (size_t i = grid_start(); i < len; i += grid_step()) {
    size_t r = i / ((size_t)heads * half);
    int k = (int)(i / (size_t)half % (size_t)heads), j = (int)(i % (size_t)half);
    size_t tab = (r % (size_t)t) * (size_t)half + (size_t)j;
    float *xh = x + r * (size_t)ld + (size_t)k * hd;
    zbm_rope_pair(&xh[j], &xh[j + half], cos[tab], sign * sin[tab]);
  }
}

__global__ void swiglu_fwd_k(const float *gate, const float *up, float *out, size_t len) {
  for (size_t i = grid_start(); i < len; i += grid_step())
    out[i] = zbm_swiglu(gate[i], up[i]);
}

__global__ void swiglu_bwd_k(const float *dout, float *gate, float *up, size_t len) {
  for (size_t i = grid_start(); i < len; i += grid_step())
    zbm_swiglu_grad(gate[i], up[i], dout[i], &gate[i], &up[i]);
}

/* Row `row` of length len: e^(x - max) in place, scaled by 1/sum; returns
 * the sum and the max (every thread). */
__device__ float softmax_row(float *row, int len, float *sh, float *max_out) {
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < len; j += blockDim.x)
    mx = row[j] > mx ? row[j] : mx;
  mx = block_max(mx, sh);
  float s = 0.0f;
  for (int j = threadIdx.x; j < len; j += blockDim.x) {
    float e = zbm_exp(row[j] - mx);
    row[j] = e;
    s += e;
  }
  float sum = block_sum(s, sh), inv = 1.0f / sum;
  for (int j = threadIdx.x; j < len; j += blockDim.x)
    row[j] *= inv;
  *max_out = mx;
  return sum;
}

/* rows = count * t rows of t; row i of its matrix keeps i + 1 entries */
__global__ void softmax_causal_k(float *s, int t, size_t rows) {
  __shared__ float sh[32];
  for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float *row = s + r * (size_t)t;
    int keep = (int)(r % (size_t)t) + 1;
    float mx;
    softmax_row(row, keep, sh, &mx);
    for (int j = keep + threadIdx.x; j < t; j += blockDim.x)
      row[j] = 0.0f;
  }
}

__global__ void softmax_causal_bwd_k(const float *p, float *dp, int t, size_t rows) {
  __shared__ float sh[32];
  for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float *pr = p + r * (size_t)t;
    float *dr = dp + r * (size_t)t;
    int keep = (int)(r % (size_t)t) + 1;
    float s = 0.0f;
    for (int j = threadIdx.x; j < keep; j += blockDim.x)
      s += pr[j] * dr[j];
    float dot = block_sum(s, sh);
    for (int j = threadIdx.x; j < t; j += blockDim.x)
      dr[j] = j < keep ? zbm_softmax_bwd(pr[j], dr[j], dot) : 0.0f;
  }
}

__global__ void xent_fwd_k(float *logits, const int32_t *targets, double *row_loss, int n, int v) {
  __shared__ float sh[32];
  for (int r = blockIdx.x; r < n; r += gridDim.x) {
    float *row = logits + (size_t)r * v;
    /* thread 0 alone needs the target's logit; it reads it before the
     * first barrier of softmax_row, so before any thread overwrites it */
    float target_logit = 0.0f;
    if (threadIdx.x == 0) {
      int tg = targets[r];
      target_logit = tg >= 0 && tg < v ? row[tg] : NAN; /* a target out of range: NaN loss */
    }
    float mx, sum = softmax_row(row, v, sh, &mx);
    if (threadIdx.x == 0)
      row_loss[r] = zbm_xent_loss(sum, target_logit - mx);
  }
}

/* ---- column sums: 32-column tiles x ZBK_COL_CHUNK-row chunks ---- */

/* db[c] += sum_r dy[r, c], and dg[c] += sum_r dy[r, c] xhat[r, c] when xhat
 * is given. Block (ZBK_COL_TILE, ZBK_COL_ROWS), one per tile of columns:
 * thread y sums rows y, y + ZBK_COL_ROWS, ... (a warp reads 4 rows of 8
 * adjacent floats, whole 32-byte sectors), then the partials of a column
 * meet in a fixed tree in shared memory. Narrow tiles give h / 8 blocks,
 * enough to fill the GPU without splitting rows across blocks (which
 * would need atomics or scratch). */
__global__ void __launch_bounds__(ZBK_COL_TILE *ZBK_COL_ROWS)
    col_sums_k(const float *dy, const float *xhat, float *dg, float *db, int n, int cols) {
  __shared__ float sd[ZBK_COL_ROWS][ZBK_COL_TILE + 1], sg[ZBK_COL_ROWS][ZBK_COL_TILE + 1];
  int x = threadIdx.x, y = threadIdx.y, c = blockIdx.x * ZBK_COL_TILE + x;
  float d = 0.0f, gsum = 0.0f;
  if (c < cols)
    for (int r = y; r < n; r += ZBK_COL_ROWS) {
      size_t i = (size_t)r * cols + c;
      d += dy[i];
      if (xhat)
        gsum += dy[i] * xhat[i];
    }
  sd[y][x] = d;
  sg[y][x] = gsum;
  __syncthreads();
  for (int half = ZBK_COL_ROWS / 2; half > 0; half /= 2) {
    if (y < half) {
      sd[y][x] += sd[y + half][x];
      sg[y][x] += sg[y + half][x];
    }
    __syncthreads();
  }
  if (y == 0 && c < cols) {
    if (db)
      db[c] += sd[0][x];
    if (xhat)
      dg[c] += sg[0][x];
  }
}

/* ---- sumsq: one block, double ---- */

/* __launch_bounds__: a launch of 1024 threads fails
 * (cudaErrorLaunchOutOfResources) if the kernel uses more than 64
 * registers; this holds the compiler to that whatever the flags (18 today,
 * 48 under -G). */
__global__ void __launch_bounds__(ZBK_SUMSQ_THREADS)
    sumsq_k(const float *x, size_t len, double *out, int *nonfinite) {
  __shared__ double sh[32];
  __shared__ int bad;
  if (threadIdx.x == 0)
    bad = 0;
  double s = 0.0;
  int nf = 0;
  for (size_t i = threadIdx.x; i < len; i += blockDim.x) {
    float v = x[i];
    nf |= !isfinite(v);
    s += (double)v * (double)v;
  }
  __syncthreads();
  if (nf)
    bad = 1; /* benign race: every writer stores 1 */
  double total = block_sum(s, sh);
  if (threadIdx.x == 0) {
    *out = total;
    *nonfinite = bad;
  }
}

/* Shared by every launcher: the status of the launch just made. */
cudaError_t launched(void) {
  return cudaGetLastError();
}

/* ---- flash attention (zb_cuda_kernels.h; docs/model.md, Flash attention
 * (CUDA)) ----
 * 256 threads as 16 x 16: thread (ty, tx) owns rows ty + 16 i and columns
 * tx + 16 j of every tile and accumulator, so a row's 16 owners are one
 * half-warp and its max and sum are shuffles within it. Tiles sit in
 * dynamic shared memory with rows of D + 1 floats (no bank conflicts when
 * 16 threads read 16 rows at one column); they are zero past the head
 * dimension and past T, so padding adds zeros and no masked entry is ever
 * NaN. Storage type T is read and written through io<T> and accumulated in
 * fp32, so a bf16 variant is one more instantiation of the launch helpers.
 * D (64 or 128) is the compiled head dimension; hd <= D is the real one. */

#define AT_THREADS 256
#define AT_BQ ZBK_ATTN_BQ
#define AT_BK ZBK_ATTN_BK
#define AT_BQB ZBK_ATTN_BQB

__device__ float half_warp_max(float v) {
  for (int o = 8; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ float half_warp_sum(float v) {
  for (int o = 8; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* dst [R][D + 1] <- rows 0..n-1 of src (ld apart), columns 0..hd-1; zeros elsewhere. */
template <typename T, int R, int D>
__device__ void at_load(float *dst, const T *src, size_t ld, int n, int hd) {
  for (int i = threadIdx.x; i < R * D; i += AT_THREADS) {
    int r = i / D, c = i % D;
    dst[r * (D + 1) + c] = r < n && c < hd ? io<T>::ld(src, (size_t)r * ld + (size_t)c) : 0.0f;
  }
}

/* Row r of a [.][D + 1] tile dotted with row c of another. */
template <int D> __device__ float at_dot(const float *x, int r, const float *y, int c) {
  float s = 0.0f;
#pragma unroll 16
  for (int k = 0; k < D; k++)
    s += x[r * (D + 1) + k] * y[c * (D + 1) + k];
  return s;
}

template <int D> constexpr size_t at_fwd_smem() {
  return ((size_t)(AT_BQ + AT_BK) * (D + 1) + (size_t)AT_BQ * (AT_BK + 1)) * sizeof(float);
}

/* One online-softmax step of a tile for the thread's rows: s (scores,
 * -inf where masked) becomes P in ps; acc, m, l are rescaled and updated. */
template <int D>
__device__ void at_online(float (&s)[AT_BQ / 16][AT_BK / 16], float (&acc)[AT_BQ / 16][D / 16],
                          float (&m)[AT_BQ / 16], float (&l)[AT_BQ / 16], float *ps, int ty, int tx) {
#pragma unroll
  for (int i = 0; i < AT_BQ / 16; i++) {
    float mx = m[i];
#pragma unroll
    for (int j = 0; j < AT_BK / 16; j++)
      mx = fmaxf(mx, s[i][j]);
    mx = half_warp_max(mx);
    float alpha = l[i] > 0.0f ? zbm_exp(m[i] - mx) : 0.0f, sum = 0.0f;
#pragma unroll
    for (int j = 0; j < AT_BK / 16; j++) {
      float p = s[i][j] == -INFINITY ? 0.0f : zbm_exp(s[i][j] - mx);
      ps[(ty + 16 * i) * (AT_BK + 1) + tx + 16 * j] = p;
      sum += p;
    }
    l[i] = l[i] * alpha + half_warp_sum(sum);
    m[i] = mx;
#pragma unroll
    for (int j = 0; j < D / 16; j++)
      acc[i][j] *= alpha;
  }
}

/* Block (sequence b, query head h, query block qb, heaviest first): o and
 * lse of its rows. Shared: q [BQ], k then v [BK], p [BQ][BK + 1]. */
template <typename T, int D>
__global__ void __launch_bounds__(AT_THREADS) attn_fwd_k(const T *qkv, T *o, float *lse, zbk_attn a) {
  extern __shared__ float at_sm[];
  float *qs = at_sm, *kv = qs + AT_BQ * (D + 1), *ps = kv + AT_BK * (D + 1);
  int nqb = (a.t + AT_BQ - 1) / AT_BQ, ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  int qb = nqb - 1 - (int)(blockIdx.x % (unsigned)nqb), bh = (int)(blockIdx.x / (unsigned)nqb);
  int h = bh % a.heads, b = bh / a.heads, kh = h / (a.heads / a.kv_heads);
  int r0 = qb * AT_BQ, nr = min(AT_BQ, a.t - r0), end = r0 + nr;
  size_t row0 = (size_t)b * a.t, ld = (size_t)a.ld;
  const T *k = qkv + row0 * ld + (size_t)(a.heads + kh) * a.hd, *v = k + (size_t)a.kv_heads * a.hd;
  at_load<T, AT_BQ, D>(qs, qkv + (row0 + r0) * ld + (size_t)h * a.hd, ld, nr, a.hd);
  float acc[AT_BQ / 16][D / 16] = {}, m[AT_BQ / 16], l[AT_BQ / 16], s[AT_BQ / 16][AT_BK / 16];
  for (int i = 0; i < AT_BQ / 16; i++)
    m[i] = -INFINITY, l[i] = 0.0f;
  for (int c0 = 0; c0 < end; c0 += AT_BK) {
    int nc = min(AT_BK, a.t - c0);
    __syncthreads(); /* the last tile's readers of kv and ps are done */
    at_load<T, AT_BK, D>(kv, k + (size_t)c0 * ld, ld, nc, a.hd);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < AT_BQ / 16; i++)
#pragma unroll
      for (int j = 0; j < AT_BK / 16; j++) {
        int r = r0 + ty + 16 * i, c = c0 + tx + 16 * j; /* key c visible to row r: c <= r, c < T */
        s[i][j] = c <= r && c < a.t ? at_dot<D>(qs, ty + 16 * i, kv, tx + 16 * j) * a.scale : -INFINITY;
      }
    at_online<D>(s, acc, m, l, ps, ty, tx);
    __syncthreads(); /* K read, P written */
    at_load<T, AT_BK, D>(kv, v + (size_t)c0 * ld, ld, nc, a.hd);
    __syncthreads();
    for (int kk = 0; kk < nc; kk++)
#pragma unroll
      for (int i = 0; i < AT_BQ / 16; i++) {
        float p = ps[(ty + 16 * i) * (AT_BK + 1) + kk];
#pragma unroll
        for (int j = 0; j < D / 16; j++)
          acc[i][j] += p * kv[kk * (D + 1) + tx + 16 * j];
      }
  }
#pragma unroll
  for (int i = 0; i < AT_BQ / 16; i++) {
    int r = ty + 16 * i;
    if (r >= nr)
      continue;
    float inv = 1.0f / l[i];
    size_t at = (row0 + r0 + r) * (size_t)a.lo + (size_t)h * a.hd;
#pragma unroll
    for (int j = 0; j < D / 16; j++)
      if (tx + 16 * j < a.hd)
        io<T>::st(o, at + tx + 16 * j, acc[i][j] * inv);
    if (tx == 0)
      lse[((size_t)b * a.heads + h) * a.t + r0 + r] = m[i] + logf(l[i]);
  }
}

/* B's shared memory: k, v [BK]; q, dO [BQB]; p, dS [BQB][BK + 1]; lse, D [BQB]. */
template <int D> struct at_bwd_sm {
  float *ks, *vs, *qs, *dos, *ps, *dss, *lse, *dd;
  __device__ explicit at_bwd_sm(float *sm) {
    ks = sm;
    vs = ks + AT_BK * (D + 1);
    qs = vs + AT_BK * (D + 1);
    dos = qs + AT_BQB * (D + 1);
    ps = dos + AT_BQB * (D + 1);
    dss = ps + AT_BQB * (AT_BK + 1);
    lse = dss + AT_BQB * (AT_BK + 1);
    dd = lse + AT_BQB;
  }
};

template <int D> constexpr size_t at_bwd_smem() {
  return ((size_t)2 * (AT_BK + AT_BQB) * (D + 1) + (size_t)2 * AT_BQB * (AT_BK + 1) + 2 * AT_BQB) *
         sizeof(float);
}

/* Loads query head h's rows [q0, q0 + BQB) of q and dO, their lse and
 * D = rowsum(dO o O); ends with a barrier. */
template <typename T, int D>
__device__ void at_bwd_rows(const at_bwd_sm<D> &x, const T *qkv, const T *o, const float *lse, const T *dout,
                            const zbk_attn &a, int b, int h, int q0) {
  int nq = min(AT_BQB, a.t - q0), ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  size_t row = (size_t)b * a.t + q0, lo = (size_t)a.lo, hc = (size_t)h * a.hd;
  __syncthreads(); /* the last tile's readers are done */
  at_load<T, AT_BQB, D>(x.qs, qkv + row * a.ld + hc, (size_t)a.ld, nq, a.hd);
  at_load<T, AT_BQB, D>(x.dos, dout + row * lo + hc, lo, nq, a.hd);
  __syncthreads();
#pragma unroll
  for (int i = 0; i < AT_BQB / 16; i++) {
    int r = ty + 16 * i;
    float part = 0.0f;
    for (int c = tx; c < a.hd && r < nq; c += 16)
      part += x.dos[r * (D + 1) + c] * io<T>::ld(o, (row + r) * lo + hc + c);
    part = half_warp_sum(part);
    if (tx == 0) {
      x.dd[r] = r < nq ? part : 0.0f;
      x.lse[r] = r < nq ? lse[((size_t)b * a.heads + h) * a.t + q0 + r] : 0.0f;
    }
  }
  __syncthreads();
}

/* P and dS of the loaded query rows [q0, ...) against the loaded keys
 * [c0, ...), into ps and dss; ends with a barrier. */
template <int D> __device__ void at_bwd_ds(const at_bwd_sm<D> &x, const zbk_attn &a, int q0, int c0) {
  int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
  for (int i = 0; i < AT_BQB / 16; i++)
#pragma unroll
    for (int j = 0; j < AT_BK / 16; j++) {
      int qi = ty + 16 * i, kj = tx + 16 * j, r = q0 + qi, c = c0 + kj;
      float p = 0.0f, dp = 0.0f;
      if (c <= r && r < a.t && c < a.t) {
        p = zbm_exp(at_dot<D>(x.qs, qi, x.ks, kj) * a.scale - x.lse[qi]);
        dp = at_dot<D>(x.dos, qi, x.vs, kj);
      }
      x.ps[qi * (AT_BK + 1) + kj] = p;
      x.dss[qi * (AT_BK + 1) + kj] = zbm_softmax_bwd(p, dp, x.dd[qi]);
    }
  __syncthreads();
}

/* A key block: dK, dV of key/value head kh's keys [c0, c0 + BK) over its
 * group's query heads and the query tiles from c0 on. */
template <typename T, int D>
__device__ void at_bwd_kv(const at_bwd_sm<D> &x, const T *qkv, const T *o, const float *lse, const T *dout,
                          T *dqkv, const zbk_attn &a, unsigned idx) {
  int nkb = (a.t + AT_BK - 1) / AT_BK, ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  int kb = (int)(idx % (unsigned)nkb), bk = (int)(idx / (unsigned)nkb), kh = bk % a.kv_heads,
      b = bk / a.kv_heads;
  int c0 = kb * AT_BK, nk = min(AT_BK, a.t - c0), g = a.heads / a.kv_heads;
  size_t ld = (size_t)a.ld, krow = ((size_t)b * a.t + c0) * ld, kc = (size_t)(a.heads + kh) * a.hd,
         vc = kc + (size_t)a.kv_heads * a.hd;
  at_load<T, AT_BK, D>(x.ks, qkv + krow + kc, ld, nk, a.hd);
  at_load<T, AT_BK, D>(x.vs, qkv + krow + vc, ld, nk, a.hd);
  float dk[AT_BK / 16][D / 16] = {}, dv[AT_BK / 16][D / 16] = {};
  for (int h = kh * g; h < (kh + 1) * g; h++)
    for (int q0 = c0; q0 < a.t; q0 += AT_BQB) {
      at_bwd_rows<T, D>(x, qkv, o, lse, dout, a, b, h, q0);
      at_bwd_ds<D>(x, a, q0, c0);
      for (int qq = 0; qq < min(AT_BQB, a.t - q0); qq++)
#pragma unroll
        for (int i = 0; i < AT_BK / 16; i++) {
          float p = x.ps[qq * (AT_BK + 1) + ty + 16 * i], ds = x.dss[qq * (AT_BK + 1) + ty + 16 * i];
#pragma unroll
          for (int j = 0; j < D / 16; j++) {
            dv[i][j] += p * x.dos[qq * (D + 1) + tx + 16 * j];
            dk[i][j] += ds * x.qs[qq * (D + 1) + tx + 16 * j];
          }
        }
    }
#pragma unroll
  for (int i = 0; i < AT_BK / 16; i++)
    if (ty + 16 * i < nk)
#pragma unroll
      for (int j = 0; j < D / 16; j++)
        if (tx + 16 * j < a.hd) {
          size_t at = krow + (size_t)(ty + 16 * i) * ld + (size_t)(tx + 16 * j);
          io<T>::st(dqkv, at + kc, dk[i][j] * a.scale);
          io<T>::st(dqkv, at + vc, dv[i][j]);
        }
}

/* A query block (heaviest first): dQ of query head h's rows [q0, q0 + BQB)
 * over the key tiles up to its last row. */
template <typename T, int D>
__device__ void at_bwd_q(const at_bwd_sm<D> &x, const T *qkv, const T *o, const float *lse, const T *dout,
                         T *dqkv, const zbk_attn &a, unsigned idx) {
  int nqb = (a.t + AT_BQB - 1) / AT_BQB, ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  int qb = nqb - 1 - (int)(idx % (unsigned)nqb), bh = (int)(idx / (unsigned)nqb), h = bh % a.heads,
      b = bh / a.heads, kh = h / (a.heads / a.kv_heads);
  int q0 = qb * AT_BQB, nq = min(AT_BQB, a.t - q0);
  size_t ld = (size_t)a.ld, seq = (size_t)b * a.t * ld, kc = (size_t)(a.heads + kh) * a.hd,
         vc = kc + (size_t)a.kv_heads * a.hd;
  float dq[AT_BQB / 16][D / 16] = {};
  at_bwd_rows<T, D>(x, qkv, o, lse, dout, a, b, h, q0);
  for (int c0 = 0; c0 < q0 + nq; c0 += AT_BK) {
    int nk = min(AT_BK, a.t - c0);
    __syncthreads(); /* the last tile's readers of ks, vs, dss are done */
    at_load<T, AT_BK, D>(x.ks, qkv + seq + (size_t)c0 * ld + kc, ld, nk, a.hd);
    at_load<T, AT_BK, D>(x.vs, qkv + seq + (size_t)c0 * ld + vc, ld, nk, a.hd);
    __syncthreads();
    at_bwd_ds<D>(x, a, q0, c0);
    for (int kk = 0; kk < nk; kk++)
#pragma unroll
      for (int i = 0; i < AT_BQB / 16; i++) {
        float ds = x.dss[(ty + 16 * i) * (AT_BK + 1) + kk];
#pragma unroll
        for (int j = 0; j < D / 16; j++)
          dq[i][j] += ds * x.ks[kk * (D + 1) + tx + 16 * j];
      }
  }
#pragma unroll
  for (int i = 0; i < AT_BQB / 16; i++)
    if (ty + 16 * i < nq)
#pragma unroll
      for (int j = 0; j < D / 16; j++)
        if (tx + 16 * j < a.hd)
          io<T>::st(dqkv, seq + (size_t)(q0 + ty + 16 * i) * ld + (size_t)h * a.hd + tx + 16 * j,
                    dq[i][j] * a.scale);
}

/* One launch, two kinds of blocks: the first kv_blocks are key blocks,
 * the rest query blocks. They read only inputs and write disjoint columns
 * of dqkv, so they need no order between them. */
template <typename T, int D>
__global__ void __launch_bounds__(AT_THREADS)
    attn_bwd_k(const T *qkv, const T *o, const float *lse, const T *dout, T *dqkv, zbk_attn a,
               unsigned kv_blocks) {
  extern __shared__ float at_sm[];
  at_bwd_sm<D> x(at_sm);
  if (blockIdx.x < kv_blocks)
    at_bwd_kv<T, D>(x, qkv, o, lse, dout, dqkv, a, blockIdx.x);
  else
    at_bwd_q<T, D>(x, qkv, o, lse, dout, dqkv, a, blockIdx.x - kv_blocks);
}

/* Blocks of `rows` rows per (sequence, head) of `heads` heads; 0 when the
 * grid would not fit. */
size_t at_blocks(const zbk_attn &a, int heads, int rows) {
  size_t n = (size_t)a.batch * (size_t)heads * (size_t)((a.t + rows - 1) / rows);
  return n > 0x7fffffffu ? 0 : n;
}

template <typename T, int D>
cudaError_t at_fwd_launch(cudaStream_t s, const T *qkv, T *o, float *lse, zbk_attn a) {
  size_t blocks = at_blocks(a, a.heads, AT_BQ), smem = at_fwd_smem<D>();
  if (blocks == 0)
    return cudaErrorInvalidValue;
  /* over 48 KiB of shared memory needs the opt-in, per device: set every launch */
  cudaError_t e =
      cudaFuncSetAttribute(attn_fwd_k<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e != cudaSuccess)
    return e;
  attn_fwd_k<T, D><<<(unsigned)blocks, AT_THREADS, smem, s>>>(qkv, o, lse, a);
  return launched();
}

template <typename T, int D>
cudaError_t at_bwd_launch(cudaStream_t s, const T *qkv, const T *o, const float *lse, const T *dout, T *dqkv,
                          zbk_attn a) {
  size_t kv = at_blocks(a, a.kv_heads, AT_BK), q = at_blocks(a, a.heads, AT_BQB), smem = at_bwd_smem<D>();
  if (kv == 0 || q == 0 || kv + q > 0x7fffffffu)
    return cudaErrorInvalidValue;
  cudaError_t e =
      cudaFuncSetAttribute(attn_bwd_k<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e != cudaSuccess)
    return e;
  attn_bwd_k<T, D><<<(unsigned)(kv + q), AT_THREADS, smem, s>>>(qkv, o, lse, dout, dqkv, a, (unsigned)kv);
  return launched();
}

} // namespace

/* ---- launchers ---- */

extern "C" {

cudaError_t zbk_embed_fwd(cudaStream_t s, const float *emb, const float *pos, const int32_t *tokens, float *x,
                          int n, int h, int t) {
  if (n < 0 || h < 0 || t <= 0)
    return cudaErrorInvalidValue;
  size_t len = (size_t)n * (size_t)h;
  if (len == 0)
    return cudaSuccess;
  embed_fwd_k<<<elementwise_blocks(len), ZBK_THREADS, 0, s>>>(emb, pos, tokens, x, len, h, t);
  return launched();
}

cudaError_t zbk_embed_bwd_acc(cudaStream_t s, const float *dx, const int32_t *tokens, float *demb,
                              float *dpos, int n, int h, int t) {
  if (n < 0 || h < 0 || t <= 0)
    return cudaErrorInvalidValue;
  size_t len = (size_t)n * (size_t)h;
  if (len == 0)
    return cudaSuccess;
  dim3 tok_grid((unsigned)((h + ZBK_THREADS - 1) / ZBK_THREADS), ZBK_TOK_GROUPS);
  embed_bwd_tok_k<<<tok_grid, ZBK_THREADS, 0, s>>>(dx, tokens, demb, n, h);
  cudaError_t e = launched();
  if (e != cudaSuccess || !dpos)
    return e;
  embed_bwd_pos_k<<<elementwise_blocks((size_t)t * h), ZBK_THREADS, 0, s>>>(dx, dpos, n, h, t);
  return launched();
}

cudaError_t zbk_layernorm_fwd(cudaStream_t s, const float *x, const float *g, const float *b, float *y,
                              float *xhat, float *rstd, int n, int h) {
  if (n < 0 || h < 0)
    return cudaErrorInvalidValue;
  if (n == 0 || h == 0)
    return cudaSuccess;
  layernorm_fwd_k<<<row_blocks((size_t)n), row_threads((size_t)h), 0, s>>>(x, g, b, y, xhat, rstd, n, h);
  return launched();
}

cudaError_t zbk_layernorm_affine(cudaStream_t s, const float *xhat, const float *g, const float *b, float *y,
                                 int n, int h) {
  if (n < 0 || h < 0)
    return cudaErrorInvalidValue;
  size_t len = (size_t)n * (size_t)h;
  if (len == 0)
    return cudaSuccess;
  affine_k<<<elementwise_blocks(len), ZBK_THREADS, 0, s>>>(xhat, g, b, y, len, h);
  return launched();
}

cudaError_t zbk_layernorm_bwd_acc(cudaStream_t s, const float *dy, const float *xhat, const float *rstd,
                                  const float *g, float *dx, int n, int h) {
  if (n < 0 || h < 0)
    return cudaErrorInvalidValue;
  if (n == 0 || h == 0)
    return cudaSuccess;
  layernorm_bwd_acc_k<<<row_blocks((size_t)n), row_threads((size_t)h), 0, s>>>(dy, xhat, rstd, g, dx, n, h);
  return launched();
}

static cudaError_t col_sums(cudaStream_t s, const float *dy, const float *xhat, float *dg, float *db, int n,
                            int cols) {
  if (n < 0 || cols < 0)
    return cudaErrorInvalidValue;
  if (n == 0 || cols == 0)
    return cudaSuccess;
  col_sums_k<<<(unsigned)((cols + ZBK_COL_TILE - 1) / ZBK_COL_TILE), dim3(ZBK_COL_TILE, ZBK_COL_ROWS), 0,
               s>>>(dy, xhat, dg, db, n, cols);
  return launched();
}

cudaError_t zbk_layernorm_param_grads_acc(cudaStream_t s, const float *dy, const float *xhat, float *dg,
                                          float *db, int n, int h) {
  return col_sums(s, dy, xhat, dg, db, n, h);
}

cudaError_t zbk_rmsnorm_fwd(cudaStream_t s, const float *x, const float *g, float *y, float *xhat,
                            float *rstd, int n, int h, float eps) {
  if (n < 0 || h < 0)
    return cudaErrorInvalidValue;
  if (n == 0 || h == 0)
    return cudaSuccess;
  rmsnorm_fwd_k<<<row_blocks((size_t)n), row_threads((size_t)h), 0, s>>>(x, g, y, xhat, rstd, n, h, eps);
  return launched();
}

cudaError_t zbk_rmsnorm_bwd_acc(cudaStream_t s, const float *dy, const float *xhat, const float *rstd,
                                const float *g, float *dx, int n, int h) {
  if (n < 0 || h < 0)
    return cudaErrorInvalidValue;
  if (n == 0 || h == 0)
    return cudaSuccess;
  rmsnorm_bwd_acc_k<<<row_blocks((size_t)n), row_threads((size_t)h), 0, s>>>(dy, xhat, rstd, g, dx, n, h);
  return launched();
}

cudaError_t zbk_rope(cudaStream_t s, float *x, const float *cos, const float *sin, int n, int t, int heads,
                     int hd, int ld, int inverse) {
  if (n < 0 || t < 1 || heads < 0 || hd < 0 || hd % 2 != 0 || ld < heads * hd)
    return cudaErrorInvalidValue;
  size_t len = (size_t)n * (size_t)heads * (size_t)(hd / 2);
  if (len == 0)
    return cudaSuccess;
  rope_k<<<elementwise_blocks(len), ZBK_THREADS, 0, s>>>(x, cos, sin, len, t, heads, hd, ld,
                                                         inverse ? -1.0f : 1.0f);
  return launched();
}

cudaError_t zbk_swiglu_fwd(cudaStream_t s, const float *gate, const float *up, float *out, size_t len) {
  if (len == 0)
    return cudaSuccess;
  swiglu_fwd_k<<<elementwise_blocks(len), ZBK_THREADS, 0, s>>>(gate, up, out, len);
  return launched();
}

cudaError_t zbk_swiglu_bwd_inplace(cudaStream_t s, const float *dout, float *gate, float *up, size_t len) {
  if (len == 0)
    return cudaSuccess;
  swiglu_bwd_k<<<elementwise_blocks(len), ZBK_THREADS, 0, s>>>(dout, gate, up, len);
  return launched();
}

cudaError_t zbk_bias_add(cudaStream_t s, float *y, const float *b, int n, int cols) {
  if (n < 0 || cols < 0)
    return cudaErrorInvalidValue;
  size_t len = (size_t)n * (size_t)cols;
  if (len == 0)
    return cudaSuccess;
  affine_k<<<elementwise_blocks(len), ZBK_THREADS, 0, s>>>(y, nullptr, b, y, len, cols);
  return launched();
}

cudaError_t zbk_col_sums_acc(cudaStream_t s, const float *dy, float *db, int n, int cols) {
  return col_sums(s, dy, nullptr, nullptr, db, n, cols);
}

cudaError_t zbk_gelu_fwd(cudaStream_t s, const float *u, float *out, size_t len) {
  if (len == 0)
    return cudaSuccess;
  gelu_fwd_k<<<elementwise_blocks(len), ZBK_THREADS, 0, s>>>(u, out, len);
  return launched();
}

cudaError_t zbk_gelu_bwd_inplace(cudaStream_t s, const float *dout, float *u, size_t len) {
  if (len == 0)
    return cudaSuccess;
  gelu_bwd_k<<<elementwise_blocks(len), ZBK_THREADS, 0, s>>>(dout, u, len);
  return launched();
}

cudaError_t zbk_softmax_causal(cudaStream_t s, float *p, int t, int count) {
  if (t < 0 || count < 0)
    return cudaErrorInvalidValue;
  size_t rows = (size_t)count * (size_t)t;
  if (rows == 0)
    return cudaSuccess;
  softmax_causal_k<<<row_blocks(rows), row_threads((size_t)t), 0, s>>>(p, t, rows);
  return launched();
}

cudaError_t zbk_softmax_causal_bwd(cudaStream_t s, const float *p, float *dp, int t, int count) {
  if (t < 0 || count < 0)
    return cudaErrorInvalidValue;
  size_t rows = (size_t)count * (size_t)t;
  if (rows == 0)
    return cudaSuccess;
  softmax_causal_bwd_k<<<row_blocks(rows), row_threads((size_t)t), 0, s>>>(p, dp, t, rows);
  return launched();
}

cudaError_t zbk_xent_fwd(cudaStream_t s, float *logits, const int32_t *targets, double *row_loss, int n,
                         int v) {
  if (n < 0 || v < 0)
    return cudaErrorInvalidValue;
  if (n == 0 || v == 0)
    return cudaSuccess;
  xent_fwd_k<<<row_blocks((size_t)n), row_threads((size_t)v), 0, s>>>(logits, targets, row_loss, n, v);
  return launched();
}

cudaError_t zbk_xent_bwd(cudaStream_t s, float *probs, const int32_t *targets, int n, int v, float scale) {
  if (n < 0 || v < 0)
    return cudaErrorInvalidValue;
  size_t len = (size_t)n * (size_t)v;
  if (len == 0)
    return cudaSuccess;
  xent_bwd_k<<<elementwise_blocks(len), ZBK_THREADS, 0, s>>>(probs, targets, len, v, scale);
  return launched();
}

cudaError_t zbk_adamw(cudaStream_t s, float *p, float *m, float *v, const float *g, const uint8_t *decay,
                      size_t n, zbm_adamw_step step) {
  if (n == 0)
    return cudaSuccess;
  adamw_k<<<elementwise_blocks(n), ZBK_THREADS, 0, s>>>(p, m, v, g, decay, n, step);
  return launched();
}

cudaError_t zbk_add(cudaStream_t s, float *y, const float *x, float alpha, size_t n) {
  if (n == 0)
    return cudaSuccess;
  add_k<<<elementwise_blocks(n), ZBK_THREADS, 0, s>>>(y, x, alpha, n);
  return launched();
}

cudaError_t zbk_scale(cudaStream_t s, float *x, float alpha, size_t n) {
  if (n == 0)
    return cudaSuccess;
  scale_k<<<elementwise_blocks(n), ZBK_THREADS, 0, s>>>(x, alpha, n);
  return launched();
}

/* Both outputs are written whatever n is: for n == 0 by two memsets (no
 * kernel launch). */
cudaError_t zbk_sumsq(cudaStream_t s, const float *x, size_t n, double *out, int *nonfinite) {
  if (n == 0) {
    cudaError_t e = cudaMemsetAsync(out, 0, sizeof *out, s);
    return e != cudaSuccess ? e : cudaMemsetAsync(nonfinite, 0, sizeof *nonfinite, s);
  }
  sumsq_k<<<1, ZBK_SUMSQ_THREADS, 0, s>>>(x, n, out, nonfinite);
  return launched();
}

/* Head dimensions up to 64 run the D = 64 kernels, up to 128 the D = 128
 * ones (zero-padded columns past hd). */
cudaError_t zbk_attn_fwd(cudaStream_t s, const float *qkv, float *o, float *lse, zbk_attn a) {
  if (!zbk_attn_ok(&a))
    return cudaErrorInvalidValue;
  return a.hd <= 64 ? at_fwd_launch<float, 64>(s, qkv, o, lse, a)
                    : at_fwd_launch<float, 128>(s, qkv, o, lse, a);
}

cudaError_t zbk_attn_bwd(cudaStream_t s, const float *qkv, const float *o, const float *lse,
                         const float *dout, float *dqkv, zbk_attn a) {
  if (!zbk_attn_ok(&a))
    return cudaErrorInvalidValue;
  return a.hd <= 64 ? at_bwd_launch<float, 64>(s, qkv, o, lse, dout, dqkv, a)
                    : at_bwd_launch<float, 128>(s, qkv, o, lse, dout, dqkv, a);
}

} // extern "C"
