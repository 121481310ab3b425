/* bench_gpu.h — the parts of zb_bench_gpu (bench_gpu.c) shared by its
 * sections: the options, the model stage's measured op times, and one
 * function per section (docs/model.md, Devices and Transports).
 *
 *   bench_gpu.c        options, the device, the cuBLAS shape table (--shapes)
 *   bench_gpu_model.c  F, B and W of one model stage beside cuBLAS replaying
 *                      the products each op issued
 *   bench_gpu_nccl.c   the nccl transport beside a plain ncclSend/ncclRecv
 *                      loop, two ranks as two threads on two GPUs
 *   bench_gpu_pipe.c   zb-v against 1f1b: predicted from the measured op
 *                      times, and measured with the executor over the cuda
 *                      backend and the nccl transport (ranks as threads)
 *   bench_gpu_mfu.c    model FLOPs and MFU of a GPT-2 124M-shaped and a
 *                      LLaMA-shaped middle stage; the table of known peaks
 *   bench_gpu_flash.c  flash attention (the device's attn_fwd / attn_bwd)
 *                      beside the unfused products and softmax: TFLOP/s and
 *                      the allocator's peak bytes
 *   bench_gpu_syncs.c  host syncs per iteration of one rank holding every
 *                      stage, for m = 4, 8 and 16
 *
 * Threads: main's thread runs every section; the nccl and pipeline
 * sections start one thread per rank and join them before returning.
 * Errors: a device, NCCL or planner failure prints what failed and exits 1
 * (gpu_die); a slow result is printed, never a failure.
 */
#ifndef ZB_BENCH_GPU_H
#define ZB_BENCH_GPU_H

#include <stdbool.h>

#include "zb_device.h"
#include "zb_model.h"

typedef struct gpu_opts {
  int gpu, hidden, heads, seq, batch, vocab, layers, reps, nccl_max_mib;
  int attn_block; /* query rows per causal attention block; 0: the device's */
  zb_precision precision;
  bool shapes; /* print the per-shape cuBLAS table too */
  /* MFU section: blocks of the middle stage, sequences and tokens per
   * microbatch, and query heads (0: the model's; fewer scale the width
   * down at the same head dimension and GQA ratio) */
  int mfu_layers, mfu_batch, mfu_seq, mfu_heads;
  const char *sections; /* comma-separated names of the sections to run */
} gpu_opts;

/* Seconds of F, B and W of one transformer block (a middle stage's time
 * over its blocks), as measured on the device. */
typedef struct gpu_block_times {
  double f, b, w;
} gpu_block_times;

/* Prints "zb_bench_gpu: what: msg" to stderr and exits 1. */
_Noreturn void gpu_die(const char *what, const zb_diag *diag);

/* n floats of device memory filled from a fixed non-zero pattern (the
 * power a product draws depends on its data); synchronises. Exits on
 * failure. The caller frees with dev->ops->free. */
float *gpu_dev_floats(zb_device *dev, size_t n);

/* Visible CUDA devices (probed from ordinal 0 up; 0 without any). */
int gpu_count(void);

/* Whether section `name` ("model", "nccl", "pipeline", "mfu", "flash",
 * "syncs") is in o->sections. */
bool gpu_section_on(const gpu_opts *o, const char *name);

/* Device calls that exit 1 through gpu_die on failure. */
void gpu_record(zb_device *dev, zb_device_event *e);
double gpu_elapsed_s(zb_device *dev, zb_device_event *a, zb_device_event *b);
void gpu_sync(zb_device *dev);
zb_device_event *gpu_event(zb_device *dev);

/* "fp32 (TF32 off)", "tf32" or "bf16". */
const char *gpu_precision_name(zb_precision p);

/* Section 1: F, B, W of a middle and a last stage of o->layers blocks on
 * dev beside the cuBLAS replay of their products; fills *block. */
void gpu_bench_model(zb_device *dev, const gpu_opts *o, gpu_block_times *block);

/* Best seconds of F, B and W of stage `stage` of 3 of the model cfg
 * describes (on cfg->device), one microbatch, over reps rounds after a
 * warm-up round. */
void gpu_time_stage(const zb_model_config *cfg, int stage, int reps, double best[3]);

/* Section 2: needs GPUs o->gpu and o->gpu + 1 (n_gpus visible). */
void gpu_bench_nccl(const gpu_opts *o, int n_gpus);

/* Section 3: zb-v against 1f1b, predicted from *block; measured when
 * n_gpus >= 2 (one rank per GPU). */
void gpu_bench_pipeline(const gpu_opts *o, int n_gpus, const gpu_block_times *block);

/* Dense peak TFLOP/s of the device called `name` at precision p, from the
 * table in bench_gpu_mfu.c; 0 when the device is not in it. */
double gpu_peak_tflops(const char *name, zb_precision p);

/* Section 4: MFU of a GPT-2 124M-shaped and a LLaMA-shaped middle stage. */
void gpu_bench_mfu(zb_device *dev, const gpu_opts *o);

/* Section 5: flash attention beside the unfused path (or why not). */
void gpu_bench_flash(zb_device *dev, const gpu_opts *o);

/* Section 6: host syncs per iteration for m = 4, 8 and 16. */
void gpu_bench_syncs(zb_device *dev, const gpu_opts *o);

#endif
