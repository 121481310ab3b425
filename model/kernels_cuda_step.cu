/* kernels_cuda_step.cu — the optimizer step's fused kernels on a GPU
 * (zbk_adamw_multi, zbk_sumsq_multi of zb_cuda_kernels.h; docs/model.md,
 * Optimizer and step): one launch steps every hosted stage's arrays, and
 * the gradient norm runs on many blocks instead of one. Kept apart from
 * kernels_cuda.cu so each file stays one idea.
 *
 * Tables: a launch takes up to ZBK_MULTI_MAX arrays by value (kernel
 * parameters, no device table to upload and no host wait); a launcher
 * given more launches once per group of them.
 *
 * sumsq: zb_kernel_math.h's order, which the host device and the stand-in
 * follow with zbm_norm_block. Pass 1: a block of ZBM_NORM_LANES threads per
 * chunk of ZBM_NORM_CHUNK elements (chunks taken grid-stride by block);
 * thread l adds x[l], x[l + 256], ... in double, the block's sum is a warp
 * butterfly then a butterfly over the warps' sums, written to the chunk's
 * slot. Pass 2: a block per array sums its chunks' slots by the same rule.
 * Products and sums are __dmul_rn / __dadd_rn, which nvcc never fuses, so
 * the result is the host's bit for bit; no atomics, no timing dependence.
 */
#include <stdint.h>

#include "zb_cuda_kernels.h"
#include "zb_kernel_math.h"

#define ZBK_STEP_MAX_BLOCKS 65535u
#define ZBK_ADAMW_CHUNK 4096 /* elements per block and round of the AdamW grid */

namespace {

struct adamw_table {
  zbm_adamw_tensor t[ZBK_MULTI_MAX];
  size_t first[ZBK_MULTI_MAX + 1]; /* first chunk of each array; first[count] = all */
  int count, mode;
};

struct norm_table {
  const float *x[ZBK_MULTI_MAX];
  size_t n[ZBK_MULTI_MAX];
  size_t first[ZBK_MULTI_MAX + 1];
  int count;
};

/* The array that chunk c belongs to (tables are short: a linear walk). */
__device__ int table_find(const size_t *first, int count, size_t c) {
  int k = 0;
  while (k + 1 < count && c >= first[k + 1])
    k++;
  return k;
}

__global__ void adamw_multi_k(adamw_table tab) {
  for (size_t c = blockIdx.x; c < tab.first[tab.count]; c += gridDim.x) {
    int k = table_find(tab.first, tab.count, c);
    const zbm_adamw_tensor *t = &tab.t[k];
    size_t at = (c - tab.first[k]) * ZBK_ADAMW_CHUNK, end = at + ZBK_ADAMW_CHUNK;
    end = end < t->n ? end : t->n;
    for (size_t i = at + threadIdx.x; i < end; i += blockDim.x)
      zbm_adamw_at(t, i, tab.mode);
  }
}

/* The block's sum of v (ZBM_NORM_LANES threads) in zbm_lanes_total's order. */
__device__ double lanes_total(double v, double *sh) {
  for (int o = 16; o > 0; o >>= 1)
    v = __dadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0)
    sh[warp] = v;
  __syncthreads();
  v = lane < ZBM_NORM_LANES / 32 ? sh[lane] : 0.0;
  for (int o = ZBM_NORM_LANES / 64; o > 0; o >>= 1)
    v = __dadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__global__ void __launch_bounds__(ZBM_NORM_LANES) norm_chunks_k(norm_table tab, double *part, int *part_bad) {
  __shared__ double sh[ZBM_NORM_LANES / 32];
  __shared__ int bad;
  for (size_t c = blockIdx.x; c < tab.first[tab.count]; c += gridDim.x) {
    int k = table_find(tab.first, tab.count, c);
    size_t at = (c - tab.first[k]) * ZBM_NORM_CHUNK, end = at + ZBM_NORM_CHUNK;
    end = end < tab.n[k] ? end : tab.n[k];
    if (threadIdx.x == 0)
      bad = 0;
    __syncthreads();
    double s = 0.0;
    int nf = 0;
    for (size_t i = at + threadIdx.x; i < end; i += ZBM_NORM_LANES) {
      float x = tab.x[k][i];
      nf |= !isfinite(x);
      s = __dadd_rn(s, __dmul_rn((double)x, (double)x));
    }
    if (nf)
      bad = 1; /* benign race: every writer stores 1 */
    double total = lanes_total(s, sh); /* its barriers order the writes of bad before the read */
    if (threadIdx.x == 0) {
      part[c] = total;
      part_bad[c] = bad;
    }
  }
}

/* One block per array: its chunks' sums by the same rule, its flags or'ed. */
__global__ void __launch_bounds__(ZBM_NORM_LANES)
    norm_arrays_k(norm_table tab, const double *part, const int *part_bad, double *sums, int *bads) {
  __shared__ double sh[ZBM_NORM_LANES / 32];
  __shared__ int bad;
  int k = blockIdx.x;
  if (threadIdx.x == 0)
    bad = 0;
  __syncthreads();
  double s = 0.0;
  int nf = 0;
  for (size_t c = tab.first[k] + threadIdx.x; c < tab.first[k + 1]; c += ZBM_NORM_LANES) {
    s = __dadd_rn(s, part[c]);
    nf |= part_bad[c];
  }
  if (nf)
    bad = 1;
  double total = lanes_total(s, sh);
  if (threadIdx.x == 0) {
    sums[k] = total;
    bads[k] = bad;
  }
}

unsigned grid_for(size_t chunks) {
  return chunks > ZBK_STEP_MAX_BLOCKS ? ZBK_STEP_MAX_BLOCKS : (unsigned)chunks;
}

} // namespace

extern "C" {

cudaError_t zbk_adamw_multi(cudaStream_t s, const zbm_adamw_tensor *t, int count, int mode) {
  if (count < 0 || mode < ZBM_ADAMW_FULL || mode > ZBM_ADAMW_COMMIT)
    return cudaErrorInvalidValue;
  for (int g = 0; g < count; g += ZBK_MULTI_MAX) {
    adamw_table tab = {};
    tab.count = count - g < ZBK_MULTI_MAX ? count - g : ZBK_MULTI_MAX;
    tab.mode = mode;
    for (int k = 0; k < tab.count; k++) {
      tab.t[k] = t[g + k];
      tab.first[k + 1] = tab.first[k] + (t[g + k].n + ZBK_ADAMW_CHUNK - 1) / ZBK_ADAMW_CHUNK;
    }
    if (tab.first[tab.count] == 0)
      continue;
    adamw_multi_k<<<grid_for(tab.first[tab.count]), 256, 0, s>>>(tab);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
      return e;
  }
  return cudaSuccess;
}

cudaError_t zbk_sumsq_multi(cudaStream_t s, const float *const *x, const size_t *n, int count, double *part,
                            int *part_bad, double *sums, int *bad) {
  if (count < 0)
    return cudaErrorInvalidValue;
  size_t base = 0; /* chunks of the groups before: their slots come first */
  for (int g = 0; g < count; g += ZBK_MULTI_MAX) {
    norm_table tab = {};
    tab.count = count - g < ZBK_MULTI_MAX ? count - g : ZBK_MULTI_MAX;
    for (int k = 0; k < tab.count; k++) {
      tab.x[k] = x[g + k];
      tab.n[k] = n[g + k];
      tab.first[k + 1] = tab.first[k] + zbm_norm_chunks(n[g + k]);
    }
    if (tab.first[tab.count] > 0)
      norm_chunks_k<<<grid_for(tab.first[tab.count]), ZBM_NORM_LANES, 0, s>>>(tab, part + base,
                                                                                part_bad + base);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) /* an array without chunks still gets 0 and 0 here */
      norm_arrays_k<<<tab.count, ZBM_NORM_LANES, 0, s>>>(tab, part + base, part_bad + base, sums + g, bad + g);
    e = e == cudaSuccess ? cudaGetLastError() : e;
    if (e != cudaSuccess)
      return e;
    base += tab.first[tab.count];
  }
  return cudaSuccess;
}

} // extern "C"
