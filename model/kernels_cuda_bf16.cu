/* kernels_cuda_bf16.cu — the conversions of bf16 storage on a GPU
 * (zbk_f32_to_bf16, zbk_bf16_to_f32 of zb_cuda_kernels.h; docs/model.md,
 * Mixed precision): the saved activations and the compute copy of the
 * weights are bf16 under `precision: bf16`, and these kernels move values
 * between them and the fp32 the other kernels compute in. The rounding is
 * the hardware's own (__float2bfloat16_rn: to nearest even, NaN
 * canonical), which zbm_bf16_from_f32 (zb_kernel_math.h) reproduces for
 * the host and the CPU stand-in. Kept apart from kernels_cuda.cu so each
 * file stays one idea.
 *
 * Shape: a grid-stride loop over size_t indices, at most 65535 blocks of
 * 256 threads, so any length is covered. A zero count launches nothing.
 */
#include <cuda_bf16.h>
#include <stdint.h>

#include "zb_cuda_kernels.h"

#define ZBK_BF16_THREADS 256
#define ZBK_BF16_MAX_BLOCKS 65535u

namespace {

unsigned blocks_for(size_t len) {
  size_t b = (len + ZBK_BF16_THREADS - 1) / ZBK_BF16_THREADS;
  return b > ZBK_BF16_MAX_BLOCKS ? ZBK_BF16_MAX_BLOCKS : (unsigned)b;
}

__global__ void to_bf16_k(const float *x, __nv_bfloat16 *y, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    y[i] = __float2bfloat16_rn(x[i]);
}

__global__ void from_bf16_k(const __nv_bfloat16 *x, float *y, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    y[i] = __bfloat162float(x[i]);
}

} // namespace

extern "C" {

cudaError_t zbk_f32_to_bf16(cudaStream_t s, const float *x, uint16_t *y, size_t n) {
  if (n == 0)
    return cudaSuccess;
  to_bf16_k<<<blocks_for(n), ZBK_BF16_THREADS, 0, s>>>(x, reinterpret_cast<__nv_bfloat16 *>(y), n);
  return cudaGetLastError();
}

cudaError_t zbk_bf16_to_f32(cudaStream_t s, const uint16_t *x, float *y, size_t n) {
  if (n == 0)
    return cudaSuccess;
  from_bf16_k<<<blocks_for(n), ZBK_BF16_THREADS, 0, s>>>(reinterpret_cast<const __nv_bfloat16 *>(x), y, n);
  return cudaGetLastError();
}

} // extern "C"
