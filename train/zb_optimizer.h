/* zb_optimizer.h — AdamW (Loshchilov and Hutter, "Decoupled Weight Decay
 * Regularization"), the optimizer of cpu jobs (docs/model.md), over one flat
 * array of fp32 parameters: a model stage's (zb_model_params), so each rank
 * steps the stages it hosts with no communication.
 *
 * One step t (counted from 1), per parameter p with gradient g, in the
 * order torch.optim.AdamW uses (the same formula, so the two agree to fp32
 * rounding):
 *   p <- p * (1 - lr * weight_decay)        only where decay is on
 *   m <- beta1 * m + (1 - beta1) * g
 *   v <- beta2 * v + (1 - beta2) * g^2
 *   p <- p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
 * m and v are kept in fp32 (as PyTorch keeps them for fp32 parameters);
 * each element's update is computed in double and rounded once, so a step
 * is deterministic and the same on any partition of the parameters.
 * Gradients are used as given: accumulating them over the microbatches
 * (and scaling to the mean) is the model's business (loss_scale = 1/m).
 *
 * Ownership: zb_adamw_new() gives the caller a zb_adamw, freed with
 * zb_adamw_free() (NULL is a no-op). It owns its moments and decay mask;
 * it borrows nothing: params and grads are passed to each step. One thread
 * uses it at a time; nothing blocks but the arithmetic.
 *
 * Results: zb_err from lib/zb_err.h; ZB_ERR_INVALID_ARG names the bad
 * setting or range.
 */
#ifndef ZB_OPTIMIZER_H
#define ZB_OPTIMIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zb_err.h"

typedef struct zb_adamw_config {
  double lr;           /* > 0 */
  double weight_decay; /* >= 0; decoupled (not added to the gradient) */
  double beta1, beta2; /* in [0, 1) */
  double eps;          /* > 0 */
} zb_adamw_config;

typedef struct zb_adamw zb_adamw;

/* Creates an optimizer for n parameters (n may be 0: a stage without
 * parameters steps nothing): moments zero, no step taken, weight decay on
 * for every parameter. *out is the caller's. ZB_ERR_INVALID_ARG for a
 * setting out of the ranges above. */
zb_err zb_adamw_new(const zb_adamw_config *cfg, size_t n, zb_adamw **out, zb_diag *diag);

/* Frees o; NULL is a no-op. */
void zb_adamw_free(zb_adamw *o);

/* Turns weight decay on or off for parameters [offset, offset + count)
 * (the usual choice: on for weight matrices and embeddings, off for biases
 * and LayerNorm gains). ZB_ERR_INVALID_ARG when the range is out of 0..n. */
zb_err zb_adamw_set_decay(zb_adamw *o, size_t offset, size_t count, bool decay, zb_diag *diag);

/* The same for an optimizer over a shard (ZeRO-1, docs/model.md, Data
 * parallelism: ZeRO-1): o's n parameters are elements [shard_off,
 * shard_off + n) of a larger buffer, and [offset, offset + count) is a
 * tensor's range in that buffer. Only the part inside the shard is set,
 * so a shard that starts or ends inside a tensor decays each element as
 * the unsharded optimizer does; a range outside the shard sets nothing. */
void zb_adamw_set_decay_in_shard(zb_adamw *o, size_t shard_off, size_t offset, size_t count, bool decay);

/* Takes one step: updates params[0..n) from grads[0..n) and the moments.
 * params and grads are the caller's and must not overlap. Non-finite
 * gradients are not checked here (they make non-finite parameters). */
void zb_adamw_step(zb_adamw *o, float *params, const float *grads);

/* The same step with every gradient multiplied by scale (in double, not
 * rounded to fp32 first): gradient-norm clipping. Scale 1 is bit for bit
 * zb_adamw_step. */
void zb_adamw_step_scaled(zb_adamw *o, float *params, const float *grads, double scale);

/* The config, and the decay mask: n bytes, 1 where decay is on (borrowed
 * from o, valid until it is freed). A device step (zb_step_device.h)
 * uploads the mask and steps with the same coefficients. */
const zb_adamw_config *zb_adamw_config_of(const zb_adamw *o);
const uint8_t *zb_adamw_decay_mask(const zb_adamw *o);

/* The per-step coefficients of step t (counted from 1), as every AdamW
 * step here computes them, in double: step_size = lr / (1 - beta1^t),
 * sqrt_bc2 = sqrt(1 - beta2^t), shrink = 1 - lr * weight_decay. */
void zb_adamw_coefs(const zb_adamw_config *c, int64_t t, double *step_size, double *sqrt_bc2, double *shrink);

/* The number of parameters, and of steps taken so far. */
size_t zb_adamw_size(const zb_adamw *o);
int64_t zb_adamw_steps(const zb_adamw *o);

/* The state a checkpoint needs: the step count and the first and second
 * moments (n floats each, borrowed from o, valid until it is freed). */
void zb_adamw_state(const zb_adamw *o, int64_t *steps, const float **m, const float **v);

/* Restores a state taken with zb_adamw_state (n floats each; copied).
 * ZB_ERR_INVALID_ARG when n differs from o's size or steps < 0. */
zb_err zb_adamw_set_state(zb_adamw *o, int64_t steps, const float *m, const float *v, size_t n,
                          zb_diag *diag);

#endif
