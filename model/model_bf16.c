/* model_bf16.c — bf16 storage of a model stage (zb_model_config.bf16;
 * docs/model.md, Mixed precision), llm.c's scheme on the model's device:
 *   - weights: the fp32 parameters are the master copy (the optimizer
 *     updates them, with fp32 moments); a bf16 compute copy, refreshed
 *     from them after every change (zb_model_refresh_compute), is what
 *     the products read;
 *   - products: bf16 A and B, fp32 accumulation into an fp32 C (zb_gemm's
 *     a16, b16). An operand that is a parameter is read from the compute
 *     copy; any other is rounded into a bf16 scratch first;
 *   - saved activations: between F, B and W a block's state (what F keeps
 *     for B and W, and what B keeps for W) is stored in bf16, half the
 *     bytes. An op unpacks block i's state into fp32 buffers, runs the
 *     fp32 code of model_forward.c / model_backward.c on it unchanged,
 *     and packs it again, so only one block's state is fp32 at a time.
 *     1/rstd (one float per row) and flash attention's log-sum-exp stay
 *     fp32: they are small and exp(s - lse) would lose two digits;
 *   - element-wise and row ops compute in fp32, as before.
 * Activations and gradients between stages (the _dev forms' x, y, dy, dx:
 * what the ranks send each other) are bf16 too, half the bytes on the
 * wire. The head's and the embedding's state stay fp32 (the last and the first
 * stage: one [N, vocab] and a few [N, h] buffers per microbatch).
 */
#include <stddef.h>
#include <stdint.h>

#include "model_internal.h"

/* The block_state fields stored as bf16 and their sizes in elements. */
static const size_t packed_field[BF16_FIELDS] = {
    offsetof(block_state, xhat1), offsetof(block_state, qkv),   offsetof(block_state, att),
    offsetof(block_state, o),     offsetof(block_state, xhat2), offsetof(block_state, u),
    offsetof(block_state, gel),   offsetof(block_state, up),    offsetof(block_state, da1),
    offsetof(block_state, dqkv),  offsetof(block_state, dproj), offsetof(block_state, da2),
    offsetof(block_state, dfc2)};

static float **field_at(block_state *b, int f) {
  return (float **)((char *)b + packed_field[f]);
}

static size_t field_numel(const zb_model_stage *st, int f) {
  size_t n = (size_t)st->n_tok, h = (size_t)st->cfg.hidden;
  size_t off = packed_field[f];
  if (off == offsetof(block_state, qkv) || off == offsetof(block_state, dqkv))
    return n * (size_t)st->qkv_cols;
  if (off == offsetof(block_state, att))
    return model_attn_state_numel(st);
  if (off == offsetof(block_state, o))
    return n * (size_t)st->arch.heads * (size_t)st->arch.head_dim;
  if (off == offsetof(block_state, u) || off == offsetof(block_state, gel) ||
      off == offsetof(block_state, up))
    return n * (size_t)st->arch.intermediate;
  return n * h;
}

/* flash attention's log-sum-exp is not rounded (see the top) */
static int packs(const zb_model_stage *st, int f) {
  return !(st->flash && packed_field[f] == offsetof(block_state, att));
}

void model_bf16_pack(zb_model_stage *st, mb_state *s, int blk) {
  block_state *b = &s->blocks[blk];
  uint16_t **pk = s->packed + (size_t)blk * BF16_FIELDS;
  for (int f = 0; f < BF16_FIELDS; f++) {
    float **p = field_at(b, f);
    if (!*p || !packs(st, f))
      continue;
    size_t numel = field_numel(st, f);
    pk[f] = model_take(st, s, numel * sizeof(uint16_t));
    MODEL_DEV(st, to_bf16, *p, pk[f], numel);
    model_dropf(st, s, p, numel);
  }
}

void model_bf16_unpack(zb_model_stage *st, mb_state *s, int blk) {
  block_state *b = &s->blocks[blk];
  uint16_t **pk = s->packed + (size_t)blk * BF16_FIELDS;
  for (int f = 0; f < BF16_FIELDS; f++) {
    if (!pk[f])
      continue;
    size_t numel = field_numel(st, f);
    float **p = field_at(b, f);
    *p = model_takef(st, s, numel);
    MODEL_DEV(st, from_bf16, pk[f], *p, numel);
    model_drop(st, s, (void **)&pk[f], numel * sizeof(uint16_t));
  }
}

void model_bf16_drop_block(zb_model_stage *st, mb_state *s, int blk) {
  uint16_t **pk = s->packed + (size_t)blk * BF16_FIELDS;
  for (int f = 0; f < BF16_FIELDS; f++)
    model_drop(st, s, (void **)&pk[f], field_numel(st, f) * sizeof(uint16_t));
}

/* ---- activations between stages ---- */

void model_act_in(zb_model_stage *st, float *ws, const float *src, zb_copy_kind io) {
  size_t numel = zb_model_act_numel(st);
  if (st->cfg.bf16 && io == ZB_COPY_D2D)
    MODEL_DEV(st, from_bf16, (const uint16_t *)(const void *)src, ws, numel);
  else
    model_copy(st, ws, src, numel * sizeof(float), io);
}

void model_act_out(zb_model_stage *st, float *dst, const float *ws, zb_copy_kind io) {
  size_t numel = zb_model_act_numel(st);
  if (st->cfg.bf16 && io == ZB_COPY_D2D)
    MODEL_DEV(st, to_bf16, ws, (uint16_t *)(void *)dst, numel);
  else
    model_copy(st, dst, ws, numel * sizeof(float), io == ZB_COPY_H2D ? ZB_COPY_D2H : ZB_COPY_D2D);
}

size_t zb_model_act_bytes(const zb_model_stage *st) {
  return zb_model_act_numel(st) * (st->cfg.bf16 ? sizeof(uint16_t) : sizeof(float));
}

/* ---- products ---- */

/* Elements from an operand's first to its last: rows x cols row-major
 * with leading dimension ld, batch of them stride apart. */
static size_t operand_span(int rows, int cols, int ld, int64_t stride, int batch) {
  if (rows == 0 || cols == 0)
    return 0;
  return (size_t)(batch - 1) * (size_t)stride + (size_t)(rows - 1) * (size_t)ld + (size_t)cols;
}

/* The bf16 form of operand p: the compute copy's for a parameter, else
 * p's span rounded into scratch slot k (grown as needed). */
static const uint16_t *operand16(zb_model_stage *st, const float *p, size_t span, int k) {
  uintptr_t at = (uintptr_t)p, base = (uintptr_t)st->d_params; /* p may be in another buffer */
  if (at >= base && at < base + st->n_params * sizeof(float))
    return st->d_params16 + (at - base) / sizeof(float);
  if (span > st->ws16_cap[k]) {
    if (st->ws16[k])
      st->dev->ops->free(st->dev->self, st->ws16[k]); /* stream-ordered (zb_device.h) */
    st->workspace_bytes -= (int64_t)(st->ws16_cap[k] * sizeof(uint16_t));
    st->ws16[k] = NULL;
    st->ws16_cap[k] = 0;
    void *q = NULL;
    MODEL_DEV(st, alloc, span * sizeof(uint16_t), &q);
    if (st->err != ZB_OK)
      return NULL;
    st->ws16[k] = q;
    st->ws16_cap[k] = span;
    st->workspace_bytes += (int64_t)(span * sizeof(uint16_t));
  }
  MODEL_DEV(st, to_bf16, p, st->ws16[k], span);
  return st->ws16[k];
}

void model_bf16_gemm(zb_model_stage *st, zb_gemm *g) {
  if (g->m == 0 || g->n == 0 || g->k == 0) /* nothing to read: C = beta C, left to the fp32 path */
    return;
  size_t sa = g->trans_a ? operand_span(g->k, g->m, g->lda, g->stride_a, g->batch)
                         : operand_span(g->m, g->k, g->lda, g->stride_a, g->batch);
  size_t sb = g->trans_b ? operand_span(g->n, g->k, g->ldb, g->stride_b, g->batch)
                         : operand_span(g->k, g->n, g->ldb, g->stride_b, g->batch);
  g->a16 = operand16(st, g->a, sa, 0);
  g->b16 = operand16(st, g->b, sb, 1);
}

/* ---- the compute copy ---- */

void model_bf16_init(zb_model_stage *st) {
  if (!st->cfg.bf16 || st->err != ZB_OK)
    return;
  void *p = NULL;
  MODEL_DEV(st, alloc, (st->n_params ? st->n_params : 1) * sizeof(uint16_t), &p);
  st->d_params16 = p;
  MODEL_DEV(st, to_bf16, st->d_params, st->d_params16, st->n_params);
}

void model_bf16_free(zb_model_stage *st) {
  void *bufs[] = {st->d_params16, st->ws16[0], st->ws16[1]};
  for (int i = 0; i < 3; i++)
    if (bufs[i])
      st->dev->ops->free(st->dev->self, bufs[i]);
}

zb_err zb_model_refresh_compute(zb_model_stage *st, zb_diag *diag) {
  if (!st->cfg.bf16)
    return ZB_OK;
  model_begin(st);
  MODEL_DEV(st, to_bf16, st->d_params, st->d_params16, st->n_params);
  return model_end(st, diag);
}
