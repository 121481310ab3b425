/* model_forward.c — F of a model stage: embeddings on the first stage,
 * the blocks, and the loss on the last (zb_model.h). */
#include <string.h>

#include "kernels_cpu.h"
#include "model_internal.h"

/* ---- blocks ----------------------------------------------------------- */

/* LayerNorm of the stream st->ws_x into st->ws_a with block i's gain and
 * shift (tensors w, b), keeping the normalised input and 1/std for B. */
static void block_layernorm(zb_model_stage *st, mb_state *s, int i, int w, int b, float **xhat,
                            float **rstd) {
  size_t n = (size_t)st->n_tok, h = (size_t)st->cfg.hidden;
  *xhat = model_takef(st, s, n * h);
  *rstd = model_takef(st, s, n);
  kernels_cpu_layernorm_fwd(st->ws_x, bparam(st, i, w), bparam(st, i, b), st->ws_a, *xhat, *rstd, st->n_tok,
                            st->cfg.hidden);
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
  kernels_cpu_gelu_fwd(b->u, b->gel, n * 4 * h);
  model_linear_fwd(st, b->gel, bparam(st, i, BT_FC2_W), bparam(st, i, BT_FC2_B), x, 4 * hi, hi, 1);
}

static zb_err check_tokens(const zb_model_stage *st, const uint8_t *ids, const char *what, zb_diag *diag) {
  for (int i = 0; i < st->n_tok; i++)
    if (ids[i] >= st->cfg.vocab)
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "stage %d: %s[%d] = %d is outside the vocab of %d",
                         st->stage, what, i, ids[i], st->cfg.vocab);
  return ZB_OK;
}

zb_err zb_model_forward(zb_model_stage *st, int mb, const uint8_t *tokens, const float *x,
                        const uint8_t *targets, float *y, float *loss, zb_diag *diag) {
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
  mb_state *s = NULL;
  if ((err = model_mb_create(st, mb, &s, diag)) != ZB_OK)
    return err;

  const zb_model_config *c = &st->cfg;
  size_t n = (size_t)st->n_tok, h = (size_t)c->hidden;
  float *xs = st->ws_x;
  if (st->is_first) {
    s->tokens = model_take(st, s, n);
    memcpy(s->tokens, tokens, n);
    const float *emb = st->tensors[st->t_embed].param, *pos = st->tensors[st->t_pos].param;
    for (size_t r = 0; r < n; r++) {
      const float *e = emb + tokens[r] * h, *p = pos + (r % (size_t)c->seq_len) * h;
      for (size_t k = 0; k < h; k++)
        xs[r * h + k] = e[k] + p[k];
    }
  } else {
    memcpy(xs, x, n * h * sizeof(float));
  }
  for (int i = 0; i < st->n_layers; i++)
    block_fwd(st, s, i);
  if (st->is_last) {
    s->xhatf = model_takef(st, s, n * h);
    s->rstdf = model_takef(st, s, n);
    kernels_cpu_layernorm_fwd(xs, st->tensors[st->t_lnf].param, st->tensors[st->t_lnf + 1].param, st->ws_a,
                              s->xhatf, s->rstdf, st->n_tok, c->hidden);
    s->probs = model_takef(st, s, n * (size_t)c->vocab);
    model_mm(st, 0, 1, st->n_tok, c->vocab, c->hidden, 1.0f, st->ws_a, c->hidden,
             st->tensors[st->t_head].param, c->hidden, 0.0f, s->probs, c->vocab);
    s->targets = model_take(st, s, n);
    memcpy(s->targets, targets, n);
    *loss = (float)(kernels_cpu_softmax_xent_fwd(s->probs, targets, st->n_tok, c->vocab) / (double)n);
  } else {
    memcpy(y, xs, n * h * sizeof(float));
  }
  s->phase = PHASE_F;
  return ZB_OK;
}
