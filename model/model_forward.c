/* model_forward.c — F of a model stage: embeddings on the first stage,
 * the blocks, and the loss on the last (zb_model.h), every step an op of
 * the stage's device (docs/model.md, Devices). */
#include <string.h>

#include "model_internal.h"

/* ---- blocks ----------------------------------------------------------- */

/* The norm before attention (k 1) or the MLP (k 2) of block i: the stream
 * st->ws_x into st->ws_a, keeping the normalised input and 1/std (or
 * 1/rms) for B. */
static void block_norm(zb_model_stage *st, mb_state *s, int i, int k, float **xhat, float **rstd) {
  size_t n = (size_t)st->n_tok, h = (size_t)st->cfg.hidden;
  const float *g = bparam(st, i, k == 1 ? ZB_T_NORM1_W : ZB_T_NORM2_W);
  *xhat = model_takef(st, s, n * h);
  *rstd = model_takef(st, s, n);
  if (st->arch.norm == ZB_NORM_RMS)
    MODEL_DEV(st, rmsnorm_fwd, st->ws_x, g, st->ws_a, *xhat, *rstd, st->n_tok, st->cfg.hidden,
              (float)st->arch.norm_eps);
  else
    MODEL_DEV(st, layernorm_fwd, st->ws_x, g, bparam(st, i, k == 1 ? ZB_T_NORM1_B : ZB_T_NORM2_B), st->ws_a,
              *xhat, *rstd, st->n_tok, st->cfg.hidden);
}

/* Rotary positions on the q and k columns of qkv (inverse: the backward,
 * on their gradients). */
void model_rope(zb_model_stage *st, float *qkv, int inverse) {
  const zb_arch *a = &st->arch;
  if (a->pos != ZB_POS_ROPE)
    return;
  int t = st->cfg.seq_len, hd = a->head_dim;
  MODEL_DEV(st, rope, qkv, st->rope_cos, st->rope_sin, st->n_tok, t, a->heads, hd, st->qkv_cols, inverse);
  MODEL_DEV(st, rope, qkv + (size_t)a->heads * hd, st->rope_cos, st->rope_sin, st->n_tok, t, a->kv_heads, hd,
            st->qkv_cols, inverse);
}

/* The MLP of block i from st->ws_a, added to the stream: fc2(gelu(fc1))
 * or down(swiglu(gate, up)). Keeps the pre-activations and the
 * activation for B and W. */
static void block_mlp(zb_model_stage *st, mb_state *s, int i) {
  const zb_arch *a = &st->arch;
  block_state *b = &s->blocks[i];
  size_t n = (size_t)st->n_tok, in = (size_t)a->intermediate;
  int hi = st->cfg.hidden, ii = a->intermediate;
  b->u = model_takef(st, s, n * in);
  b->gel = model_takef(st, s, n * in);
  if (a->mlp == ZB_MLP_SWIGLU) {
    b->up = model_takef(st, s, n * in);
    model_linear_fwd(st, st->ws_a, bparam(st, i, ZB_T_GATE_W), NULL, b->u, hi, ii, 0);
    model_linear_fwd(st, st->ws_a, bparam(st, i, ZB_T_UP_W), NULL, b->up, hi, ii, 0);
    MODEL_DEV(st, swiglu_fwd, b->u, b->up, b->gel, n * in);
  } else {
    model_linear_fwd(st, st->ws_a, bparam(st, i, ZB_T_UP_W), bparam(st, i, ZB_T_UP_B), b->u, hi, ii, 0);
    MODEL_DEV(st, gelu_fwd, b->u, b->gel, n * in);
  }
  model_linear_fwd(st, b->gel, bparam(st, i, ZB_T_DOWN_W), bparam(st, i, ZB_T_DOWN_B), st->ws_x, ii, hi, 1);
}

/* F of block i on the stream st->ws_x, in place. */
static void block_fwd(zb_model_stage *st, mb_state *s, int i) {
  const zb_arch *a = &st->arch;
  block_state *b = &s->blocks[i];
  size_t n = (size_t)st->n_tok, lo = (size_t)a->heads * (size_t)a->head_dim;
  int hi = st->cfg.hidden;

  block_norm(st, s, i, 1, &b->xhat1, &b->rstd1);
  b->qkv = model_takef(st, s, n * (size_t)st->qkv_cols);
  model_linear_fwd(st, st->ws_a, qkv_param(st, i), bparam(st, i, ZB_T_QKV_B), b->qkv, hi, st->qkv_cols, 0);
  model_rope(st, b->qkv, 0);
  b->att = model_takef(st, s, model_attn_state_numel(st));
  b->o = model_takef(st, s, n * lo);
  model_attention_fwd(st, b->qkv, b->att, b->o);
  model_linear_fwd(st, b->o, bparam(st, i, ZB_T_O_W), bparam(st, i, ZB_T_O_B), st->ws_x, (int)lo, hi, 1);

  block_norm(st, s, i, 2, &b->xhat2, &b->rstd2);
  block_mlp(st, s, i);
}

static zb_err check_tokens(const zb_model_stage *st, const int32_t *ids, const char *what, zb_diag *diag) {
  for (int i = 0; i < st->n_tok; i++)
    if (ids[i] < 0 || ids[i] >= st->cfg.vocab)
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "stage %d: %s[%d] = %d is outside the vocab of %d",
                         st->stage, what, i, ids[i], st->cfg.vocab);
  return ZB_OK;
}

/* The last stage's head: final norm, logits over the vocabulary (a
 * padded embedding's extra rows are not multiplied), and the loss. Per-row
 * losses are computed on the device; with a loss pointer they are copied
 * to the host (one sync) and summed there in row order, in double; without
 * one they stay in mb's slot until zb_model_losses (model_loss.c). */
static void head_fwd(zb_model_stage *st, mb_state *s, int mb, const int32_t *targets, float *loss) {
  const zb_model_config *c = &st->cfg;
  size_t n = (size_t)st->n_tok, h = (size_t)c->hidden;
  s->xhatf = model_takef(st, s, n * h);
  s->rstdf = model_takef(st, s, n);
  if (st->arch.norm == ZB_NORM_RMS)
    MODEL_DEV(st, rmsnorm_fwd, st->ws_x, tparam(st, st->t_lnf), st->ws_a, s->xhatf, s->rstdf, st->n_tok,
              c->hidden, (float)st->arch.norm_eps);
  else
    MODEL_DEV(st, layernorm_fwd, st->ws_x, tparam(st, st->t_lnf), tparam(st, st->t_lnf_b), st->ws_a, s->xhatf,
              s->rstdf, st->n_tok, c->hidden);
  s->probs = model_takef(st, s, n * (size_t)c->vocab);
  model_mm(st, 0, 1, st->n_tok, c->vocab, c->hidden, 1.0f, st->ws_a, c->hidden, tparam(st, st->t_head),
           c->hidden, 0.0f, s->probs, c->vocab);
  s->targets = model_take(st, s, n * sizeof(int32_t));
  model_copy(st, s->targets, targets, n * sizeof(int32_t), ZB_COPY_H2D);
  if (!loss) {
    double *rows = model_loss_slot(st, mb);
    MODEL_DEV(st, xent_fwd, s->probs, s->targets, rows, st->n_tok, c->vocab);
    return;
  }
  MODEL_DEV(st, xent_fwd, s->probs, s->targets, st->ws_loss, st->n_tok, c->vocab);
  model_copy(st, st->h_loss, st->ws_loss, n * sizeof(double), ZB_COPY_D2H);
  if (st->err == ZB_OK)
    st->err = st->dev->ops->sync(st->dev->self, &st->ediag);
  if (st->err != ZB_OK)
    return;
  double sum = 0.0;
  for (size_t r = 0; r < n; r++)
    sum += st->h_loss[r];
  *loss = (float)(sum / (double)n);
}

static zb_err check_forward_args(const zb_model_stage *st, const int32_t *tokens, const float *x,
                                 const int32_t *targets, const float *y, const float *loss, zb_diag *diag) {
  if (st->is_first ? !tokens || x : tokens || !x)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "stage %d: F takes %s", st->stage,
                       st->is_first ? "tokens, not x" : "x, not tokens");
  if (st->is_last ? !targets || y : targets || loss || !y)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "stage %d: F %s", st->stage,
                       st->is_last ? "takes targets, not y" : "returns y, takes no targets");
  zb_err err;
  if ((tokens && (err = check_tokens(st, tokens, "tokens", diag)) != ZB_OK) ||
      (targets && (err = check_tokens(st, targets, "targets", diag)) != ZB_OK))
    return err;
  return ZB_OK;
}

/* F with x and y in memory of kind `io` relative to the device: host
 * (ZB_COPY_H2D: the public API) or device (ZB_COPY_D2D). */
static zb_err forward(zb_model_stage *st, int mb, const int32_t *tokens, const float *x,
                      const int32_t *targets, float *y, float *loss, zb_copy_kind io, zb_diag *diag) {
  zb_err err = check_forward_args(st, tokens, x, targets, y, loss, diag);
  mb_state *s = NULL;
  if (err != ZB_OK || (err = model_mb_create(st, mb, &s, diag)) != ZB_OK)
    return err;
  model_begin(st);
  const zb_model_config *c = &st->cfg;
  size_t n = (size_t)st->n_tok;
  if (st->is_first) {
    s->tokens = model_take(st, s, n * sizeof(int32_t));
    model_copy(st, s->tokens, tokens, n * sizeof(int32_t), ZB_COPY_H2D);
    MODEL_DEV(st, embed_fwd, tparam(st, st->t_embed), tparam_or_null(st, st->t_pos), s->tokens, st->ws_x,
              st->n_tok, c->hidden, c->seq_len);
  } else {
    model_act_in(st, st->ws_x, x, io);
  }
  for (int i = 0; i < st->n_layers; i++) {
    block_fwd(st, s, i);
    if (s->packed)
      model_bf16_pack(st, s, i);
  }
  if (st->is_last) {
    head_fwd(st, s, mb, targets, loss);
  } else {
    model_act_out(st, y, st->ws_x, io);
    if (io == ZB_COPY_H2D && !st->host && st->err == ZB_OK)
      st->err = st->dev->ops->sync(st->dev->self, &st->ediag);
  }
  if (st->err != ZB_OK) {
    model_mb_destroy(st, mb);
    return model_end(st, diag);
  }
  s->phase = PHASE_F;
  return ZB_OK;
}

zb_err zb_model_forward(zb_model_stage *st, int mb, const int32_t *tokens, const float *x,
                        const int32_t *targets, float *y, float *loss, zb_diag *diag) {
  return forward(st, mb, tokens, x, targets, y, loss, ZB_COPY_H2D, diag);
}

zb_err zb_model_forward_dev(zb_model_stage *st, int mb, const int32_t *tokens, const float *x,
                            const int32_t *targets, float *y, float *loss, zb_diag *diag) {
  return forward(st, mb, tokens, x, targets, y, loss, ZB_COPY_D2D, diag);
}
