/* model_backward.c — B (input gradients) and W (weight gradients) of a
 * model stage, and the fused BW (zb_model.h), every step an op of the
 * stage's device (docs/model.md, Devices). */
#include <math.h>
#include <string.h>

#include "model_internal.h"

/* ---- blocks ----------------------------------------------------------- */

/* B of a norm (k 1 or 2) of block i: dx += the input gradient of the
 * norm whose output gradient is da. */
static void norm_b(zb_model_stage *st, int i, int k, const float *da, const float *xhat, const float *rstd,
                   float *dx) {
  const float *g = bparam(st, i, k == 1 ? ZB_T_NORM1_W : ZB_T_NORM2_W);
  if (st->arch.norm == ZB_NORM_RMS)
    MODEL_DEV(st, rmsnorm_bwd_acc, da, xhat, rstd, g, dx, st->n_tok, st->cfg.hidden);
  else
    MODEL_DEV(st, layernorm_bwd_acc, da, xhat, rstd, g, dx, st->n_tok, st->cfg.hidden);
}

/* B of block i's MLP: from g (the gradient of the block's output) the
 * MLP input's gradient into b->da2; the pre-activations become their
 * gradients in place (u: dfc1 or dgate; up: dup). */
static void mlp_b(zb_model_stage *st, mb_state *s, int i, const float *g) {
  const zb_arch *a = &st->arch;
  block_state *b = &s->blocks[i];
  size_t n = (size_t)st->n_tok, in = (size_t)a->intermediate, h = (size_t)st->cfg.hidden;
  int hi = st->cfg.hidden, ii = a->intermediate;
  float *dgel = st->ws_big;
  model_linear_bwd_input(st, g, bparam(st, i, ZB_T_DOWN_W), dgel, ii, hi, 0);
  b->da2 = model_takef(st, s, n * h);
  if (a->mlp == ZB_MLP_SWIGLU) {
    MODEL_DEV(st, swiglu_bwd_inplace, dgel, b->u, b->up, n * in);
    model_linear_bwd_input(st, b->u, bparam(st, i, ZB_T_GATE_W), b->da2, hi, ii, 0);
    model_linear_bwd_input(st, b->up, bparam(st, i, ZB_T_UP_W), b->da2, hi, ii, 1);
  } else {
    MODEL_DEV(st, gelu_bwd_inplace, dgel, b->u, n * in); /* u is dfc1 from here on */
    model_linear_bwd_input(st, b->u, bparam(st, i, ZB_T_UP_W), b->da2, hi, ii, 0);
  }
}

/* B of block i: st->ws_x holds the gradient of the block's output and
 * becomes that of its input. */
static void block_b(zb_model_stage *st, mb_state *s, int i) {
  const zb_arch *a = &st->arch;
  block_state *b = &s->blocks[i];
  size_t n = (size_t)st->n_tok, h = (size_t)st->cfg.hidden, lo = (size_t)a->heads * (size_t)a->head_dim;
  int hi = st->cfg.hidden;
  float *g = st->ws_x, *dout = st->ws_a;

  b->dfc2 = model_takef(st, s, n * h);
  model_copy(st, b->dfc2, g, n * h * sizeof(float), ZB_COPY_D2D);
  mlp_b(st, s, i, g);
  norm_b(st, i, 2, b->da2, b->xhat2, b->rstd2, g);
  model_dropf(st, s, &b->rstd2, n);

  b->dproj = model_takef(st, s, n * h);
  model_copy(st, b->dproj, g, n * h * sizeof(float), ZB_COPY_D2D);
  model_linear_bwd_input(st, g, bparam(st, i, ZB_T_O_W), dout, (int)lo, hi, 0);
  model_attention_bwd(st, b->qkv, b->att, b->o, dout);
  model_rope(st, b->qkv, 1); /* the gradients of q and k before their rotation */
  b->dqkv = b->qkv;          /* same bytes, now W's */
  b->qkv = NULL;
  model_dropf(st, s, &b->att, model_attn_state_numel(st));
  b->da1 = model_takef(st, s, n * h);
  model_linear_bwd_input(st, b->dqkv, qkv_param(st, i), b->da1, hi, st->qkv_cols, 0);
  norm_b(st, i, 1, b->da1, b->xhat1, b->rstd1, g);
  model_dropf(st, s, &b->rstd1, n);
}

/* W of a norm of block i (k 1 or 2): recomputes its output into st->ws_a
 * from xhat (y = xhat g + b, or xhat g) and adds its gain's (and bias')
 * gradient from its output gradient da. */
static void norm_w(zb_model_stage *st, int i, int k, const float *xhat, const float *da) {
  zb_tensor_role w = k == 1 ? ZB_T_NORM1_W : ZB_T_NORM2_W, bb = k == 1 ? ZB_T_NORM1_B : ZB_T_NORM2_B;
  int h = st->cfg.hidden, n = st->n_tok;
  MODEL_DEV(st, layernorm_affine, xhat, bparam(st, i, w), bparam(st, i, bb), st->ws_a, n, h);
  MODEL_DEV(st, layernorm_param_grads_acc, da, xhat, bgrad(st, i, w), bgrad(st, i, bb), n, h);
}

/* W of block i: adds its parameter gradients. */
static void block_w(zb_model_stage *st, mb_state *s, int i) {
  const zb_arch *a = &st->arch;
  block_state *b = &s->blocks[i];
  int h = st->cfg.hidden, ii = a->intermediate, lo = a->heads * a->head_dim;
  float *x = st->ws_a;

  norm_w(st, i, 1, b->xhat1, b->da1);
  model_linear_bwd_weight(st, b->dqkv, x, qkv_grad(st, i), bgrad(st, i, ZB_T_QKV_B), h, st->qkv_cols);
  model_linear_bwd_weight(st, b->dproj, b->o, bgrad(st, i, ZB_T_O_W), bgrad(st, i, ZB_T_O_B), lo, h);
  norm_w(st, i, 2, b->xhat2, b->da2);
  if (a->mlp == ZB_MLP_SWIGLU) {
    model_linear_bwd_weight(st, b->u, x, bgrad(st, i, ZB_T_GATE_W), NULL, h, ii);
    model_linear_bwd_weight(st, b->up, x, bgrad(st, i, ZB_T_UP_W), NULL, h, ii);
  } else {
    model_linear_bwd_weight(st, b->u, x, bgrad(st, i, ZB_T_UP_W), bgrad(st, i, ZB_T_UP_B), h, ii);
  }
  model_linear_bwd_weight(st, b->dfc2, b->gel, bgrad(st, i, ZB_T_DOWN_W), bgrad(st, i, ZB_T_DOWN_B), ii, h);
}

/* ---- the stage -------------------------------------------------------- */

/* The last stage's head: the logits' gradient (in place over the
 * probabilities), the final LayerNorm's output gradient, and into st->ws_x
 * the gradient of the stage's last block output. */
static void head_b(zb_model_stage *st, mb_state *s, int mb) {
  const zb_model_config *c = &st->cfg;
  size_t n = (size_t)st->n_tok, h = (size_t)c->hidden;
  /* Mean over the microbatch's tokens, times the caller's scale. */
  float scale = mb == st->nan_mb ? NAN : c->loss_scale / (float)n;
  MODEL_DEV(st, xent_bwd, s->probs, s->targets, st->n_tok, c->vocab, scale);
  s->daf = model_takef(st, s, n * h);
  model_mm(st, 0, 0, st->n_tok, c->hidden, c->vocab, 1.0f, s->probs, c->vocab, tparam(st, st->t_head),
           c->hidden, 0.0f, s->daf, c->hidden);
  MODEL_DEV(st, zero, st->ws_x, n * h * sizeof(float));
  if (st->arch.norm == ZB_NORM_RMS)
    MODEL_DEV(st, rmsnorm_bwd_acc, s->daf, s->xhatf, s->rstdf, tparam(st, st->t_lnf), st->ws_x, st->n_tok,
              c->hidden);
  else
    MODEL_DEV(st, layernorm_bwd_acc, s->daf, s->xhatf, s->rstdf, tparam(st, st->t_lnf), st->ws_x, st->n_tok,
              c->hidden);
  model_dropf(st, s, &s->rstdf, n);
}

static zb_err backward_b(zb_model_stage *st, int mb, const float *dy, float *dx, zb_copy_kind io,
                         zb_diag *diag) {
  if (st->is_last ? dy != NULL : dy == NULL)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "stage %d: B %s dy", st->stage,
                       st->is_last ? "starts from the loss, takes no" : "needs");
  if (st->is_first ? dx != NULL : dx == NULL)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "stage %d: B %s dx", st->stage,
                       st->is_first ? "has tokens as input, returns no" : "needs");
  mb_state *s = model_mb_get(st, mb);
  if (!s || s->phase != PHASE_F)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "stage %d: B of microbatch %d %s", st->stage, mb,
                       s ? "ran already" : "before its F");

  model_begin(st);
  size_t n = (size_t)st->n_tok, h = (size_t)st->cfg.hidden;
  float *g = st->ws_x;
  if (st->is_last)
    head_b(st, s, mb);
  else
    model_act_in(st, g, dy, io);
  for (int i = st->n_layers - 1; i >= 0; i--) {
    if (s->packed)
      model_bf16_unpack(st, s, i);
    block_b(st, s, i);
    if (s->packed)
      model_bf16_pack(st, s, i);
  }
  if (st->is_first) {
    s->dh0 = model_takef(st, s, n * h);
    model_copy(st, s->dh0, g, n * h * sizeof(float), ZB_COPY_D2D);
  } else {
    model_act_out(st, dx, g, io);
    if (io == ZB_COPY_H2D && !st->host && st->err == ZB_OK)
      st->err = st->dev->ops->sync(st->dev->self, &st->ediag);
  }
  if (st->err != ZB_OK) { /* the state is half-updated: drop it */
    model_mb_destroy(st, mb);
    return model_end(st, diag);
  }
  s->phase = PHASE_B;
  return ZB_OK;
}

zb_err zb_model_backward_b(zb_model_stage *st, int mb, const float *dy, float *dx, zb_diag *diag) {
  return backward_b(st, mb, dy, dx, ZB_COPY_H2D, diag);
}

zb_err zb_model_backward_b_dev(zb_model_stage *st, int mb, const float *dy, float *dx, zb_diag *diag) {
  return backward_b(st, mb, dy, dx, ZB_COPY_D2D, diag);
}

zb_err zb_model_backward_w(zb_model_stage *st, int mb, zb_diag *diag) {
  mb_state *s = model_mb_get(st, mb);
  if (!s || s->phase != PHASE_B)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "stage %d: W of microbatch %d before its B", st->stage, mb);
  model_begin(st);
  const zb_model_config *c = &st->cfg;
  if (st->is_last) {
    int lw = st->t_lnf, lb = st->t_lnf_b;
    MODEL_DEV(st, layernorm_affine, s->xhatf, tparam(st, lw), tparam_or_null(st, lb), st->ws_a, st->n_tok,
              c->hidden);
    model_linear_bwd_weight(st, s->probs, st->ws_a, tgrad(st, st->t_head), NULL, c->hidden, c->vocab);
    MODEL_DEV(st, layernorm_param_grads_acc, s->daf, s->xhatf, tgrad(st, lw), tgrad_or_null(st, lb),
              st->n_tok, c->hidden);
  }
  for (int i = st->n_layers - 1; i >= 0; i--) {
    if (s->packed)
      model_bf16_unpack(st, s, i);
    block_w(st, s, i);
    if (s->packed) /* one block's fp32 state at a time */
      model_block_drop(st, s, i);
  }
  if (st->is_first)
    MODEL_DEV(st, embed_bwd_acc, s->dh0, s->tokens, tgrad(st, st->t_embed), tgrad_or_null(st, st->t_pos),
              st->n_tok, c->hidden, c->seq_len);
  model_mb_destroy(st, mb);
  return model_end(st, diag);
}

zb_err zb_model_backward_bw(zb_model_stage *st, int mb, const float *dy, float *dx, zb_diag *diag) {
  zb_err err = zb_model_backward_b(st, mb, dy, dx, diag);
  return err != ZB_OK ? err : zb_model_backward_w(st, mb, diag);
}

void zb_model_inject_nan(zb_model_stage *st, int mb) {
  st->nan_mb = mb;
}
