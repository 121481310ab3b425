/* model_backward.c — B (input gradients) and W (weight gradients) of a
 * model stage, and the fused BW (zb_model.h), every step an op of the
 * stage's device (docs/model.md, Devices). */
#include <math.h>
#include <string.h>

#include "model_internal.h"

/* ---- blocks ----------------------------------------------------------- */

/* B of block i: st->ws_x holds the gradient of the block's output and
 * becomes that of its input. */
static void block_b(zb_model_stage *st, mb_state *s, int i) {
  const zb_model_config *c = &st->cfg;
  block_state *b = &s->blocks[i];
  size_t n = (size_t)st->n_tok, h = (size_t)c->hidden;
  size_t att = (size_t)c->batch * (size_t)c->heads * (size_t)c->seq_len * (size_t)c->seq_len;
  int hi = c->hidden;
  float *g = st->ws_x, *dout = st->ws_a, *dgel = st->ws_big;

  b->dfc2 = model_takef(st, s, n * h);
  model_copy(st, b->dfc2, g, n * h * sizeof(float), ZB_COPY_D2D);
  model_linear_bwd_input(st, g, bparam(st, i, BT_FC2_W), dgel, 4 * hi, hi);
  MODEL_DEV(st, gelu_bwd_inplace, dgel, b->u, n * 4 * h); /* u is dfc1 from here on */
  b->da2 = model_takef(st, s, n * h);
  model_linear_bwd_input(st, b->u, bparam(st, i, BT_FC1_W), b->da2, hi, 4 * hi);
  MODEL_DEV(st, layernorm_bwd_acc, b->da2, b->xhat2, b->rstd2, bparam(st, i, BT_LN2_W), g, st->n_tok, hi);
  model_dropf(st, s, &b->rstd2, n);

  b->dproj = model_takef(st, s, n * h);
  model_copy(st, b->dproj, g, n * h * sizeof(float), ZB_COPY_D2D);
  model_linear_bwd_input(st, g, bparam(st, i, BT_PROJ_W), dout, hi, hi);
  model_attention_bwd(st, b->qkv, b->att, dout);
  b->dqkv = b->qkv; /* same bytes, now W's */
  b->qkv = NULL;
  model_dropf(st, s, &b->att, att);
  b->da1 = model_takef(st, s, n * h);
  model_linear_bwd_input(st, b->dqkv, bparam(st, i, BT_QKV_W), b->da1, hi, 3 * hi);
  MODEL_DEV(st, layernorm_bwd_acc, b->da1, b->xhat1, b->rstd1, bparam(st, i, BT_LN1_W), g, st->n_tok, hi);
  model_dropf(st, s, &b->rstd1, n);
}

/* W of block i: adds its parameter gradients. */
static void block_w(zb_model_stage *st, mb_state *s, int i) {
  block_state *b = &s->blocks[i];
  int h = st->cfg.hidden, n = st->n_tok;
  float *a = st->ws_a;

  MODEL_DEV(st, layernorm_affine, b->xhat1, bparam(st, i, BT_LN1_W), bparam(st, i, BT_LN1_B), a, n, h);
  model_linear_bwd_weight(st, b->dqkv, a, bgrad(st, i, BT_QKV_W), bgrad(st, i, BT_QKV_B), h, 3 * h);
  model_linear_bwd_weight(st, b->dproj, b->o, bgrad(st, i, BT_PROJ_W), bgrad(st, i, BT_PROJ_B), h, h);
  MODEL_DEV(st, layernorm_param_grads_acc, b->da1, b->xhat1, bgrad(st, i, BT_LN1_W), bgrad(st, i, BT_LN1_B),
            n, h);
  MODEL_DEV(st, layernorm_affine, b->xhat2, bparam(st, i, BT_LN2_W), bparam(st, i, BT_LN2_B), a, n, h);
  model_linear_bwd_weight(st, b->u, a, bgrad(st, i, BT_FC1_W), bgrad(st, i, BT_FC1_B), h, 4 * h);
  model_linear_bwd_weight(st, b->dfc2, b->gel, bgrad(st, i, BT_FC2_W), bgrad(st, i, BT_FC2_B), 4 * h, h);
  MODEL_DEV(st, layernorm_param_grads_acc, b->da2, b->xhat2, bgrad(st, i, BT_LN2_W), bgrad(st, i, BT_LN2_B),
            n, h);
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
    model_copy(st, g, dy, n * h * sizeof(float), io);
  for (int i = st->n_layers - 1; i >= 0; i--)
    block_b(st, s, i);
  if (st->is_first) {
    s->dh0 = model_takef(st, s, n * h);
    model_copy(st, s->dh0, g, n * h * sizeof(float), ZB_COPY_D2D);
  } else {
    model_copy(st, dx, g, n * h * sizeof(float), io == ZB_COPY_H2D ? ZB_COPY_D2H : ZB_COPY_D2D);
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
    int lw = st->t_lnf, lb = lw + 1;
    MODEL_DEV(st, layernorm_affine, s->xhatf, tparam(st, lw), tparam(st, lb), st->ws_a, st->n_tok, c->hidden);
    model_linear_bwd_weight(st, s->probs, st->ws_a, tgrad(st, st->t_head), NULL, c->hidden, c->vocab);
    MODEL_DEV(st, layernorm_param_grads_acc, s->daf, s->xhatf, tgrad(st, lw), tgrad(st, lb), st->n_tok,
              c->hidden);
  }
  for (int i = st->n_layers - 1; i >= 0; i--)
    block_w(st, s, i);
  if (st->is_first)
    MODEL_DEV(st, embed_bwd_acc, s->dh0, s->tokens, tgrad(st, st->t_embed), tgrad(st, st->t_pos), st->n_tok,
              c->hidden, c->seq_len);
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
