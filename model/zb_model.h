/* zb_model.h — the worker's built-in model (see docs/model.md): a decoder stack of
 * transformer-style blocks split into pipeline stages, with the backward
 * pass split into B (input gradient) and W (weight gradient). fp32, on a
 * device (zb_device.h): the host (CBLAS and kernels_cpu.c) unless the
 * config names another. Every buffer the model computes on is memory of
 * that device and every computation one of its ops.
 *
 * The model, over all stages:
 *   h0 = embed[token] + pos_embed[t]                       (first stage)
 *   per block:  x += proj(attn(ln1(x)))    causal multi-head self-attention
 *               x += fc2(gelu(fc1(ln2(x))))  MLP h -> 4h -> h
 *   loss = mean cross-entropy(head(ln_f(x)), target)        (last stage)
 * LayerNorm has eps 1e-5; GeLU is the tanh approximation
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), evaluated in the equal
 * form x / (1 + e^(-2 sqrt(2/pi) (x + 0.044715 x^3))) with a vectorised exp
 * (relative error about 1.5e-7 against expf; the softmaxes use it too).
 * The embedding and the LM head are separate tensors (not tied), so no
 * parameter lives on two stages. Linear layers compute y = x W^T + b with W
 * stored [out, in] row-major. Causal attention computes, per block of
 * query rows, only the products on and below the diagonal (attn_full: the
 * whole T x T products, for comparison); on a device with flash attention
 * (zb_device.h's attn_fwd, the host) it is fused and keeps no T x T
 * probabilities. Results are deterministic on the
 * host device: an op computes the same bits on any partition and at -O0
 * as at -O3 (the kernels neither reassociate nor contract); accumulated
 * gradients depend on the order of the W ops only through fp32 rounding.
 *
 * Ops on (stage, microbatch), each microbatch's state independent of the
 * others (keyed by mb, any number in flight):
 *   F  runs the stage forward and keeps what backward needs;
 *   B  computes the gradient w.r.t. the stage input only, frees what only B
 *      needed and keeps what W needs (the output gradient of every linear
 *      and LayerNorm);
 *   W  computes every parameter gradient of the stage from what F and B
 *      kept, adds it to the stage's gradient buffers, and frees the state;
 *   BW is B then W.
 * Gradients accumulate over microbatches until zb_model_zero_grads().
 *
 * Ownership: a zb_model_stage is created by zb_model_stage_new() and owned
 * by the caller, who frees it with zb_model_stage_free() (NULL is a no-op).
 * It owns its parameters, gradients, per-microbatch states and workspace
 * (device memory); pointers it hands out (tensors, parameter arrays) stay
 * valid until it is freed. It borrows cfg->device (which must outlive it)
 * and no caller memory after a call returns: F copies what it keeps from
 * its inputs.
 *
 * Host access. Tensors' param/grad and zb_model_params/zb_model_grads are
 * host memory: on the host device they are the device buffers themselves;
 * on another device they are a mirror, filled by zb_model_pull() and sent
 * back by zb_model_push_params(). Inputs and outputs of F and B (tokens,
 * x, targets, y, dy, dx) are host memory; on an asynchronous device F and
 * B wait for the outputs they copy out (y, dx), and the last stage's F
 * synchronises once, for the loss. One thread uses a stage at a time (different
 * stages may run on different threads at once); no function blocks other
 * than for its own computation.
 *
 * Results: zb_err from lib/zb_err.h. ZB_ERR_INVALID_ARG: a bad shape or
 * argument, or an op out of order for its microbatch (F on a microbatch
 * that already has state, B without F, W without B).
 */
#ifndef ZB_MODEL_H
#define ZB_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "zb_err.h"

typedef struct zb_device zb_device; /* zb_device.h */

/* The whole model's shape; every stage of a partition gets the same one. */
typedef struct zb_model_config {
  int vocab;         /* token ids 0..vocab-1; 0 means 256 (bytes) */
  int hidden;        /* h; a multiple of heads */
  int heads;         /* attention heads */
  int layers;        /* transformer blocks over all stages (0 allowed) */
  int seq_len;       /* T: tokens per sequence */
  int batch;         /* sequences per microbatch */
  uint64_t seed;     /* parameter initialisation, per global tensor */
  float loss_scale;  /* dL/dloss that the last stage's B starts from; 0 means 1
                        (1/m makes the accumulated gradient that of the mean over m microbatches) */
  zb_device *device; /* borrowed, outlives the stage; NULL: the stage creates and owns a host device */
  const struct zb_arch *arch; /* borrowed during zb_model_stage_new; NULL: the builtin model at the sizes
                                 above. Else its sizes replace vocab, hidden, heads and layers (zb_arch.h) */
  int attn_full;              /* benchmarks and tests only: compute attention's full T x T products */
  int attn_block;             /* benchmarks and tests only: query rows per causal block; 0: the device's */
  int attn_unfused; /* benchmarks and tests only: attention from products and a softmax (keeping the T x T
                       probabilities) even where the device has flash attention (attn_full implies it) */
  int bf16;         /* bf16 storage (the job's `precision: bf16`; docs/model.md, Mixed precision): products
                       in bf16 with fp32 accumulation from a bf16 compute copy of the fp32 parameters, the
                       blocks' saved state in bf16. Needs a device with bf16 (cuda); ZB_ERR_UNSUPPORTED
                       otherwise */
} zb_model_config;

typedef struct zb_model_stage zb_model_stage;

/* One parameter tensor of a stage and its gradient, row-major. */
typedef struct zb_model_tensor {
  char name[64];  /* global name: "embed.weight", "layer3.attn.qkv.weight", or transformers' for gpt2/llama */
  int rows, cols; /* a vector has rows = 1 */
  size_t numel;
  float *param; /* owned by the stage */
  float *grad;  /* owned by the stage */
} zb_model_tensor;

/* Bytes a stage holds: per-microbatch state (the activations the schedule's
 * memory model counts) and its fixed workspace. */
typedef struct zb_model_mem {
  int64_t state_bytes;      /* held now by all microbatch states */
  int64_t peak_state_bytes; /* highest state_bytes since creation or zb_model_reset_peak() */
  int64_t workspace_bytes;  /* scratch reused by every op; not per microbatch */
  int64_t param_bytes;      /* parameters + gradients */
  int64_t cached_bytes;     /* freed state buffers kept for reuse; state + cached <= peak */
} zb_model_mem;

/* One matrix product as issued to the device (row-major), for benchmarks
 * that time the same shapes alone. count: identical consecutive products
 * (a batched product of batch b counts b); batch and the strides are those
 * of each device call (zb_gemm), so count / batch calls replay exactly
 * what the op issued (consecutive calls merge only when all of it agrees). */
typedef struct zb_model_gemm {
  int trans_a, trans_b; /* 0 or 1 */
  int m, n, k, lda, ldb, ldc;
  float alpha, beta;
  int count;
  int batch;                            /* products per device call; count is a multiple of it */
  int64_t stride_a, stride_b, stride_c; /* elements between the products of one call */
} zb_model_gemm;

/* Layers of stage `stage` of n_stages for a model of `layers` blocks:
 * contiguous and balanced (counts differ by at most one, later stages take
 * the extra ones, since early stages hold the most microbatches in flight
 * under 1F1B-like schedules). Writes *first and *count. ZB_ERR_INVALID_ARG
 * when stage is out of range or layers < 0. */
zb_err zb_model_layer_range(int layers, int n_stages, int stage, int *first, int *count);

/* The stage of n_stages that holds the global tensor `name` (a
 * zb_model_tensor name): the embeddings the first, "layerK.*" the stage
 * whose layer range holds K, the final LayerNorm and the head the last.
 * What a change of partition (a schedule update that moves stages between
 * ranks) uses to find a tensor's old home. ZB_ERR_INVALID_ARG for a name
 * the model does not have. */
zb_err zb_model_tensor_stage(int layers, int n_stages, const char *name, int *stage);

/* Sets the number of threads CBLAS uses, process-wide (1 by default: a
 * worker runs one op at a time and its ranks may share a machine). */
void zb_model_set_threads(int n);

/* Creates stage `stage` of n_stages of the model cfg describes, with
 * parameters initialised from cfg->seed (GPT-2 style: weights N(0, 0.02),
 * pos_embed N(0, 0.01), residual projections N(0, 0.02/sqrt(2*layers)),
 * biases 0, LayerNorm gains 1), each element a function of (seed, tensor
 * name, index) alone, so every partition holds the same weights as the
 * one-stage model. Gradients start at zero. The caller owns *out. */
zb_err zb_model_stage_new(const zb_model_config *cfg, int stage, int n_stages, zb_model_stage **out,
                          zb_diag *diag);

/* Frees the stage, its states and buffers. NULL is a no-op. */
void zb_model_stage_free(zb_model_stage *st);

/* The config, with defaults filled in (borrowed from the stage). */
const zb_model_config *zb_model_stage_config(const zb_model_stage *st);

/* True when the stage holds the embedding (takes tokens) / the head (takes
 * targets and returns a loss). */
int zb_model_stage_is_first(const zb_model_stage *st);
int zb_model_stage_is_last(const zb_model_stage *st);

/* Floats in one activation or gradient passed between stages:
 * batch * seq_len * hidden. */
size_t zb_model_act_numel(const zb_model_stage *st);
/* Bytes of one in the _dev forms (what a rank sends): act_numel floats,
 * or act_numel bf16 values under bf16 storage. */
size_t zb_model_act_bytes(const zb_model_stage *st);

/* F of microbatch mb. Inputs (copied where kept; the caller keeps
 * ownership): tokens [batch*seq_len] on the first stage, else x
 * [act_numel]; targets [batch*seq_len] on the last stage; token ids are
 * int32 in [0, vocab) (others: ZB_ERR_INVALID_ARG). Outputs: y
 * [act_numel] on every stage but the last; *loss (mean cross-entropy over
 * the microbatch's tokens) on the last. Arguments that do not apply to the
 * stage must be NULL. On the last stage loss may be NULL too: the loss
 * then stays on the device, without a host sync, until zb_model_losses. */
zb_err zb_model_forward(zb_model_stage *st, int mb, const int32_t *tokens, const float *x,
                        const int32_t *targets, float *y, float *loss, zb_diag *diag);

/* F and B with x, y, dy and dx in memory of the stage's device (tokens
 * and targets stay host memory): no copy through the host and no wait for
 * the outputs, which are ready in stream order. Same as zb_model_forward
 * and zb_model_backward_b on the host device. Under bf16 storage x, y, dy
 * and dx are act_numel bf16 values (uint16_t, zb_model_act_bytes bytes;
 * the pointers' type notwithstanding), as the ranks send them. */
zb_err zb_model_forward_dev(zb_model_stage *st, int mb, const int32_t *tokens, const float *x,
                            const int32_t *targets, float *y, float *loss, zb_diag *diag);
zb_err zb_model_backward_b_dev(zb_model_stage *st, int mb, const float *dy, float *dx, zb_diag *diag);

/* B of microbatch mb: from dy [act_numel] (the gradient of F's output; NULL
 * on the last stage, which starts from loss_scale) computes dx [act_numel],
 * the gradient of F's input (NULL on the first stage, whose input is
 * tokens). Does not touch the gradient buffers. */
zb_err zb_model_backward_b(zb_model_stage *st, int mb, const float *dy, float *dx, zb_diag *diag);

/* W of microbatch mb: adds mb's parameter gradients to the stage's gradient
 * buffers and frees mb's state. */
zb_err zb_model_backward_w(zb_model_stage *st, int mb, zb_diag *diag);

/* BW (fused): B then W. */
zb_err zb_model_backward_bw(zb_model_stage *st, int mb, const float *dy, float *dx, zb_diag *diag);

/* The losses of microbatches 0..n_mb-1 whose F ran without a loss pointer
 * (the last stage only): out[mb] as F would have returned it. One copy and
 * one host sync for all of them; a slot whose F did not run since the
 * stage was made holds garbage, which the caller must not use.
 * ZB_ERR_INVALID_ARG on another stage or past the slots F filled. */
zb_err zb_model_losses(zb_model_stage *st, int n_mb, float *out, zb_diag *diag);

/* A testing aid (the job spec's model.inject_nan): on the last stage, B of
 * microbatch mb starts from a NaN loss gradient, which then flows through
 * every B and W upstream; -1 turns it off. A no-op on other stages. */
void zb_model_inject_nan(zb_model_stage *st, int mb);

/* Drops every microbatch state (an aborted iteration); gradients stay. */
void zb_model_drop_states(zb_model_stage *st);

/* Parameter tensors of the stage, in a fixed order (embeddings, blocks in
 * layer order, final LayerNorm, head). */
int zb_model_n_tensors(const zb_model_stage *st);
const zb_model_tensor *zb_model_tensor_at(const zb_model_stage *st, int i);
/* The tensor named `name`, or NULL when the stage does not hold it. */
const zb_model_tensor *zb_model_find_tensor(const zb_model_stage *st, const char *name);

/* All parameters (and gradients) of the stage as one contiguous array, in
 * tensor order; n_params floats each. Host memory (the mirror on a
 * non-host device: see Host access above). */
size_t zb_model_n_params(const zb_model_stage *st);
float *zb_model_params(zb_model_stage *st);
float *zb_model_grads(zb_model_stage *st);

/* The same arrays in the stage's device memory (on the host device, the
 * same pointers as zb_model_params / zb_model_grads): what a device-side
 * optimizer step (train/zb_step_device.h) updates in place. */
float *zb_model_device_params(zb_model_stage *st);
float *zb_model_device_grads(zb_model_stage *st);

/* Copies all parameters out of the device / into the mirror and the
 * device (n must be n_params). */
zb_err zb_model_get_params(const zb_model_stage *st, float *dst, size_t n);
zb_err zb_model_set_params(zb_model_stage *st, const float *src, size_t n);

/* Sets every gradient to zero (device and mirror). */
void zb_model_zero_grads(zb_model_stage *st);

/* The device the stage computes on (cfg->device or its own host device). */
zb_device *zb_model_device(const zb_model_stage *st);

/* Non-host devices: device parameters and gradients -> the host mirror,
 * waiting for the copies (zb_model_pull); mirror parameters -> device
 * (zb_model_push_params, after a host-side update). No-ops on the host
 * device. A device failure is ZB_ERR_IO with its message. */
zb_err zb_model_pull(zb_model_stage *st, zb_diag *diag);
zb_err zb_model_push_params(zb_model_stage *st, zb_diag *diag);

/* bf16 storage: refreshes the bf16 compute copy from the device's fp32
 * parameters (after an optimizer step updated them in place; set_params
 * and push_params refresh it themselves). Stream-ordered, no wait. A no-op
 * without bf16. */
zb_err zb_model_refresh_compute(zb_model_stage *st, zb_diag *diag);

/* Memory held now and at the peak. */
void zb_model_mem_stats(const zb_model_stage *st, zb_model_mem *out);
/* Bytes mb's state holds now (0 when it has none). */
int64_t zb_model_mb_bytes(const zb_model_stage *st, int mb);
/* Restarts the peak at the current state_bytes. */
void zb_model_reset_peak(zb_model_stage *st);
/* Frees the buffers that microbatch states gave back. The stage keeps them
 * to reuse (same sizes every iteration) rather than fault fresh pages in on
 * every F; call this when the stage goes idle for long. */
void zb_model_release_cache(zb_model_stage *st);

/* Records the stage's matrix products into buf (cap entries; further ones
 * are counted but dropped) until called again with buf NULL. Returns the
 * number of entries recorded since the previous call (for a stop, the
 * number the buffer needed). */
int zb_model_trace_gemms(zb_model_stage *st, zb_model_gemm *buf, int cap);

#endif
