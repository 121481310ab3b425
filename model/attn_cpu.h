/* attn_cpu.h — causal flash attention on the host: the compute behind the
 * host device's attn_fwd and attn_bwd ops (zb_device.h has their
 * contracts and the zb_attn shape; docs/model.md, Flash attention
 * (host)). Internal to zbmodel.
 *
 * Queries and keys are walked in tiles with an online softmax, so no T x T
 * buffer exists: F keeps only o and one log-sum-exp per query row, and B
 * recomputes the scores tile by tile from q, k and that log-sum-exp.
 * Products of tiles go to CBLAS; the softmax loops are 8-lane, vectorised
 * with ZB_VEC (kernels_cpu.h).
 *
 * The caller owns every buffer, scratch included (its size from
 * kernels_cpu_attn_scratch); nothing here allocates, blocks or fails.
 * Shapes are checked by the device op, not here.
 */
#ifndef ATTN_CPU_H
#define ATTN_CPU_H

#include <stddef.h>

#include "zb_device.h"

/* Floats of scratch either kernel needs for shape a. */
size_t kernels_cpu_attn_scratch(const zb_attn *a);

/* o [batch t, lo] and lse [batch, heads, t] from qkv (zb_device.h's attn_fwd). */
void kernels_cpu_attn_fwd(const float *qkv, float *o, float *lse, const zb_attn *a, float *scratch);

/* dqkv (laid out as qkv, all of it written) from qkv, o, lse and dout
 * (zb_device.h's attn_bwd); dqkv must not overlap qkv. */
void kernels_cpu_attn_bwd(const float *qkv, const float *o, const float *lse, const float *dout, float *dqkv,
                          const zb_attn *a, float *scratch);

#endif
