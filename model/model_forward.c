/* model_forward.c — F of a model stage: embeddings on the first stage,
 * the blocks, and the loss on the last (zb_model.h), every step an op of
 * the stage's device (docs/model.md, Devices). */
#include <string.h>

#include "model_internal.h"

/* ---- blocks ----------------------------------------------------------- */

/* LayerNorm of the stream st->ws_x into st->ws_a with block i's gain and
 * shift (tensors w, b), keeping the normalised input and 1/std for B. */
static void block_layernorm(zb_model_stage *st, mb_state *s, int i, int w, int b, float **xhat,
                            float **rstd) {
  size_t n = (size_t)st->n_tok, h = (size_t)st->cfg.hidden;
  *xhat = model_takef(st, s, n * h);
  *rstd = model_takef(st, s, n);
  MODEL_DEV(st, layernorm_fwd, st->ws_x, bparam(st, i, w), bparam(st, i, b), st->ws_a, *xhat, *rstd,
            st->n_tok, st->cfg.hidden);
}

/* F of block i on the stream st->ws_x, in place. */
static void block_fwd(zb_model_stage *st, mb_state *s, int i) {
  const zb_model_config *c = &st->cfg;
  block_state *b = &s->blocks[i];
  size_t n = (size_t)st->n_tok, h = (size_t)c->hidden;
  size_t att = (size_t)c->batch * (size_t)c->heads * (size_t)c->seq_len * (size_t)c->seq_len;
  int hi = c->hidden;
  float *x = st->ws_x, *a = st->ws_a;

  block_layernorm(st, s, i, BT_LN1_W, BT_LN1_B, &b->xhat1, &b->rstd1);
  b->qkv = model_takef(st, s, n * 3 * h);
  model_linear_fwd(st, a, bparam(st, i, BT_QKV_W), bparam(st, i, BT_QKV_B), b->qkv, hi, 3 * hi, 0);
  b->att = model_takef(st, s, att);
  b->o = model_takef(st, s, n * h);
  model_attention_fwd(st, b->qkv, b->att, b->o);
  model_linear_fwd(st, b->o, bparam(st, i, BT_PROJ_W), bparam(st, i, BT_PROJ_B), x, hi, hi, 1);

  block_layernorm(st, s, i, BT_LN2_W, BT_LN2_B, &b->xhat2, &b->rstd2);
  b->u = model_takef(st, s, n * 4 * h);
  model_linear_fwd(st, a, bparam(st, i, BT_FC1_W), bparam(st, i, BT_FC1_B), b->u, hi, 4 * hi, 0);
  b->gel = model_takef(st, s, n * 4 * h);
  MODEL_DEV(st, gelu_fwd, b->u, b->gel, n * 4 * h);
  model_linear_fwd(st, b->gel, bparam(st, i, BT_FC2_W), bparam(st, i, BT_FC2_B), x, 4 * hi, hi, 1);
}

static zb_err check_tokens(const zb_model_stage *st, const int32_t *ids, const char *what, zb_diag *diag) {
  for (int i = 0; i < st->n_tok; i++)
    if (ids[i] < 0 || ids[i] >= st->cfg.vocab)
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "stage %d: %s[%d] = %d is outside the vocab of %d",
                         st->stage, what, i, ids[i], st->cfg.vocab);
  return ZB_OK;
}

/* The last stage's head: final LayerNorm, logits, and the loss. Per-row
 * losses are computed on the device, copied to the host (one sync) and
 * summed there in row order, in double. */
static void head_fwd(zb_model_stage *st, mb_state *s, const int32_t *targets, float *loss) {
  const zb_model_config *c = &st->cfg;
  size_t n = (size_t)st->n_tok, h = (size_t)c->hidden;
  s->xhatf = model_takef(st, s, n * h);
  s->rstdf = model_takef(st, s, n);
  MODEL_DEV(st, layernorm_fwd, st->ws_x, tparam(st, st->t_lnf), tparam(st, st->t_lnf + 1), st->ws_a, s->xhatf,
            s->rstdf, st->n_tok, c->hidden);
  s->probs = model_takef(st, s, n * (size_t)c->vocab);
  model_mm(st, 0, 1, st->n_tok, c->vocab, c->hidden, 1.0f, st->ws_a, c->hidden, tparam(st, st->t_head),
           c->hidden, 0.0f, s->probs, c->vocab);
  s->targets = model_take(st, s, n * sizeof(int32_t));
  model_copy(st, s->targets, targets, n * sizeof(int32_t), ZB_COPY_H2D);
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
  if (st->is_last ? !targets || !loss || y : targets || loss || !y)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "stage %d: F %s", st->stage,
                       st->is_last ? "takes targets and returns a loss, not y"
                                   : "returns y, takes no targets");
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
  size_t n = (size_t)st->n_tok, h = (size_t)c->hidden;
  if (st->is_first) {
    s->tokens = model_take(st, s, n * sizeof(int32_t));
    model_copy(st, s->tokens, tokens, n * sizeof(int32_t), ZB_COPY_H2D);
    MODEL_DEV(st, embed_fwd, tparam(st, st->t_embed), tparam(st, st->t_pos), s->tokens, st->ws_x, st->n_tok,
              c->hidden, c->seq_len);
  } else {
    model_copy(st, st->ws_x, x, n * h * sizeof(float), io);
  }
  for (int i = 0; i < st->n_layers; i++)
    block_fwd(st, s, i);
  if (st->is_last) {
    head_fwd(st, s, targets, loss);
  } else {
    model_copy(st, y, st->ws_x, n * h * sizeof(float), io == ZB_COPY_H2D ? ZB_COPY_D2H : ZB_COPY_D2D);
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
