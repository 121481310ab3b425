/* model_internal.h — the model stage's private layout, shared by the
 * model's source files (the public API is zb_model.h):
 *   model_stage.c     parameters (layout, initialisation), the stage's
 *                     lifetime and its accessors;
 *   model_state.c     per-microbatch state and its memory accounting;
 *   model_math.c      matrix products (through CBLAS, traced), linear
 *                     layers and attention;
 *   model_forward.c   F;
 *   model_backward.c  B (input gradients) and W (weight gradients).
 * The element-wise kernels are in kernels_cpu.c.
 *
 * What each op keeps, per block (N = batch * seq_len tokens, h hidden):
 *   F keeps  xhat1, rstd1, qkv, att (softmax probabilities), o (attention
 *            output), xhat2, rstd2, u (fc1 pre-activation), gel (gelu(u));
 *   B frees  rstd1, att, rstd2 (only B needs them), turns qkv and u into
 *            their own gradients dqkv and dfc1 in place, and keeps da1,
 *            dproj, da2, dfc2: the output gradient of every LayerNorm and
 *            linear;
 *   W reads  xhat (LayerNorm outputs are recomputed from it: y = xhat*g+b),
 *            o, gel and the gradients, then frees everything.
 * The last stage keeps the final LayerNorm's xhat/rstd and the
 * probabilities (which B turns into the logits' gradient in place); the
 * first keeps the tokens and, from B, the gradient of the embedding sum.
 */
#ifndef ZB_MODEL_INTERNAL_H
#define ZB_MODEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "zb_model.h"

/* A block's tensors, in table order. */
enum {
  BT_LN1_W,
  BT_LN1_B,
  BT_QKV_W,
  BT_QKV_B,
  BT_PROJ_W,
  BT_PROJ_B,
  BT_LN2_W,
  BT_LN2_B,
  BT_FC1_W,
  BT_FC1_B,
  BT_FC2_W,
  BT_FC2_B,
  BT_COUNT
};

/* The names of a block's tensors, indexed by BT_*. */
extern const char *const model_block_tensor_names[BT_COUNT];

enum { PHASE_F = 1, PHASE_B = 2 };

typedef struct block_state {
  float *xhat1, *rstd1, *qkv, *att, *o, *xhat2, *rstd2, *u, *gel; /* from F */
  float *da1, *dqkv, *dproj, *da2, *dfc2; /* from B; dqkv is qkv's buffer, and u holds dfc1 after B */
} block_state;

typedef struct cached_buf {
  void *p;
  size_t bytes;
} cached_buf;

typedef struct mb_state {
  int phase;
  int64_t bytes;
  uint8_t *tokens, *targets;
  float *dh0;                         /* first stage: gradient of embed + pos_embed (from B) */
  float *xhatf, *rstdf, *probs, *daf; /* last stage; probs holds dlogits after B */
  block_state *blocks;
} mb_state;

struct zb_model_stage {
  zb_model_config cfg;
  int stage, n_stages, first_layer, n_layers;
  int is_first, is_last;
  int n_tok;  /* N = batch * seq_len */
  int nan_mb; /* a test hook: B of this microbatch starts from NaN (-1: none) */

  zb_model_tensor *tensors;
  int n_tensors;
  float *params, *grads;
  size_t n_params;
  int t_embed, t_pos, t_block0, t_lnf, t_head; /* table indices; -1 where absent */

  mb_state **mbs; /* indexed by microbatch */
  int mb_cap;
  int64_t state_bytes, peak_bytes, workspace_bytes;
  cached_buf *cache; /* freed state buffers, for reuse */
  int cache_n, cache_cap;
  int64_t cache_bytes;

  float *ws_x;    /* [N, h] the residual stream in F, its gradient in B */
  float *ws_a;    /* [N, h] LayerNorm outputs; the attention output's gradient */
  float *ws_big;  /* [N, 4h] gelu output's gradient */
  float *ws_tt;   /* [T, T] one head's score gradient */
  float *ws_head; /* [T, 3d] one head's dQ | dK | dV */

  zb_model_gemm *trace;
  int trace_cap, trace_n;
};

/* A block's parameter and gradient tensors (k: BT_*). */
static inline float *bparam(const zb_model_stage *st, int blk, int k) {
  return st->tensors[st->t_block0 + blk * BT_COUNT + k].param;
}
static inline float *bgrad(const zb_model_stage *st, int blk, int k) {
  return st->tensors[st->t_block0 + blk * BT_COUNT + k].grad;
}

/* ---- microbatch state (model_state.c) ---- */

/* The state of microbatch mb, or NULL when it has none. */
mb_state *model_mb_get(const zb_model_stage *st, int mb);
/* New empty state for mb; ZB_ERR_INVALID_ARG when mb is out of range or
 * already has state. */
zb_err model_mb_create(zb_model_stage *st, int mb, mb_state **out, zb_diag *diag);
/* Gives back every buffer of mb's state and the state itself. */
void model_mb_destroy(zb_model_stage *st, int mb);
/* A state buffer of s: counted in s's and the stage's bytes. */
void *model_take(zb_model_stage *st, mb_state *s, size_t bytes);
float *model_takef(zb_model_stage *st, mb_state *s, size_t numel);
/* Gives *p (numel floats; NULL is a no-op) back and sets it to NULL. */
void model_dropf(zb_model_stage *st, mb_state *s, float **p, size_t numel);

/* ---- matrix products, linear layers, attention (model_math.c) ---- */

void model_mm(zb_model_stage *st, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc);
void model_linear_fwd(zb_model_stage *st, const float *x, const float *w, const float *b, float *y, int in,
                      int out, int accumulate);
void model_linear_bwd_input(zb_model_stage *st, const float *dy, const float *w, float *dx, int in, int out);
void model_linear_bwd_weight(zb_model_stage *st, const float *dy, const float *x, float *dw, float *db,
                             int in, int out);
void model_attention_fwd(zb_model_stage *st, const float *qkv, float *att, float *o);
void model_attention_bwd(zb_model_stage *st, float *qkv, const float *att, const float *dout);

#endif
