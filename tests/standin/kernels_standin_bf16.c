/* kernels_standin_bf16.c — the bf16 conversions of model/zb_cuda_kernels.h
 * (zbk_f32_to_bf16, zbk_bf16_to_f32) as host loops on the CPU stand-in's
 * streams (test-only; docs/model.md, The CPU stand-in). The rounding is
 * zbm_bf16_from_f32 (model/zb_kernel_math.h): to nearest even, NaN
 * canonical, as the GPU's __float2bfloat16_rn, so a bf16 run on the
 * stand-in rounds where and as the hardware would.
 *
 * Like kernels_standin.c's launchers: the device ranges are checked
 * (cudaErrorInvalidValue, named) and translated to the stand-in's views,
 * the loop is enqueued on stream s, and the status is what
 * cudaGetLastError says after the launch; injectable like every launcher.
 */
#include <stdlib.h>

#include "standin_internal.h"
#include "zb_cuda_kernels.h"

typedef struct cvt_job {
  const void *x; /* float or uint16_t, by to_bf16 */
  void *y;
  size_t n;
  int to_bf16;
} cvt_job;

static cudaError_t cvt_run(void *arg) {
  const cvt_job *k = arg;
  if (k->to_bf16) {
    const float *x = k->x;
    uint16_t *y = k->y;
    for (size_t i = 0; i < k->n; i++)
      y[i] = zbm_bf16_from_f32(x[i]);
  } else {
    const uint16_t *x = k->x;
    float *y = k->y;
    for (size_t i = 0; i < k->n; i++)
      y[i] = zbm_f32_from_bf16(x[i]);
  }
  return cudaSuccess;
}

static cudaError_t cvt_launch(cudaStream_t s, const char *api, const void *x, size_t xsize, void *y,
                              size_t ysize, size_t n, int to_bf16) {
  if (n == 0)
    return cudaSuccess;
  if (standin_inject(api, NULL)) /* as a launch that cannot run (standin_fail.c) */
    return standin_set_last(cudaErrorLaunchOutOfResources);
  /* the stand-in's views of the device ranges (standin.h), checked */
  const void *vx = standin_view(x, n * xsize, api);
  void *vy = vx ? standin_view(y, n * ysize, api) : NULL;
  if (!vx || !vy)
    return standin_set_last(cudaErrorInvalidValue);
  cvt_job *j = malloc(sizeof *j);
  if (!j)
    return standin_set_last(cudaErrorMemoryAllocation);
  *j = (cvt_job){.x = vx, .y = vy, .n = n, .to_bf16 = to_bf16};
  cudaError_t e;
  if ((e = standin_enqueue(s, cvt_run, j, free)) != cudaSuccess) {
    free(j);
    return standin_set_last(e);
  }
  return cudaGetLastError();
}

cudaError_t zbk_f32_to_bf16(cudaStream_t s, const float *x, uint16_t *y, size_t n) {
  return cvt_launch(s, "zbk_f32_to_bf16", x, sizeof(float), y, sizeof(uint16_t), n, 1);
}

cudaError_t zbk_bf16_to_f32(cudaStream_t s, const uint16_t *x, float *y, size_t n) {
  return cvt_launch(s, "zbk_bf16_to_f32", x, sizeof(uint16_t), y, sizeof(float), n, 0);
}
