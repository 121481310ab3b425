/* model_internal.h — the model stage's private layout, shared by the
 * model's source files (the public API is zb_model.h):
 *   model_stage.c     parameters (layout, initialisation), the stage's
 *                     lifetime and its accessors;
 *   model_state.c     per-microbatch state and its memory accounting;
 *   model_math.c      matrix products (through the device, traced),
 *                     linear layers and attention;
 *   model_forward.c   F;
 *   model_backward.c  B (input gradients) and W (weight gradients);
 *   model_bf16.c      bf16 storage: the weights' compute copy, bf16
 *                     products, the blocks' state packed between ops.
 * Every buffer the model computes on is memory of the stage's device and
 * every computation is one of its ops (zb_device.h; docs/model.md,
 * Devices). A device error is sticky within a public call: the first one
 * is kept in st->err / st->ediag, later ops are skipped (MODEL_DEV), and
 * the call returns it.
 *
 * What each op keeps, per block (N = batch * seq_len tokens, h hidden):
 *   F keeps  xhat1, rstd1, qkv, att (flash: each score row's log-sum-exp,
 *            [B, H, T]; unfused: the softmax probabilities, [B, H, T, T]),
 *            o (attention output), xhat2, rstd2, u (fc1 pre-activation),
 *            gel (gelu(u));
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

#include "zb_arch.h"
#include "zb_device.h"
#include "zb_model.h"

enum { PHASE_F = 1, PHASE_B = 2 };

typedef struct block_state {
  float *xhat1, *rstd1, *qkv, *att, *o, *xhat2, *rstd2, *u, *gel; /* from F; att: model_attn_state_numel */
  float *up;                              /* swiglu: the up projection (u is the gate); dup after B */
  float *da1, *dqkv, *dproj, *da2, *dfc2; /* from B; dqkv is qkv's buffer, and u holds dfc1 after B */
} block_state;

/* block_state fields stored as bf16 under bf16 storage (model_bf16.c) */
#define BF16_FIELDS 13

typedef struct cached_buf {
  void *p;
  size_t bytes;
} cached_buf;

typedef struct mb_state {
  int phase;
  int64_t bytes;
  int32_t *tokens, *targets;          /* n_tok ids each, device memory */
  float *dh0;                         /* first stage: gradient of embed + pos_embed (from B) */
  float *xhatf, *rstdf, *probs, *daf; /* last stage; probs holds dlogits after B */
  block_state *blocks;
  uint16_t **packed; /* bf16 storage: [n_layers][BF16_FIELDS] the blocks' state between ops; else NULL */
} mb_state;

struct zb_model_stage {
  zb_model_config cfg;
  zb_device *dev; /* cfg.device, or the private host device */
  int own_dev;    /* dev was created by the stage */
  int host;       /* dev is the host device: mirrors are the device memory */
  zb_err err;     /* the first device error of the current call */
  zb_diag ediag;
  int attn_block; /* rows per causal row block (T when attn_full) */
  int flash;      /* attention is the device's attn_fwd / attn_bwd (docs/model.md, Flash attention (host)) */

  int stage, n_stages, first_layer, n_layers;
  int is_first, is_last;
  int n_tok;  /* N = batch * seq_len */
  int nan_mb; /* a test hook: B of this microbatch starts from NaN (-1: none) */

  zb_arch arch; /* what the stage computes (zb_arch.h); the builtin's from cfg when cfg.arch is NULL */
  int qkv_cols; /* (heads + 2 kv_heads) head_dim: a row of q | k | v */
  zb_model_tensor *tensors;
  int n_tensors;
  float *params, *grads;     /* host: tensors' param/grad; the device buffers or their mirror */
  float *d_params, *d_grads; /* device */
  size_t n_params;
  int t_embed, t_pos, t_lnf, t_lnf_b, t_head; /* table indices; -1 where absent */
  int *t_block;               /* [n_layers][ZB_T_ROLE_COUNT]: table index by role, -1 absent */
  float *rope_cos, *rope_sin; /* device [seq_len, head_dim / 2] (rotary positions) */

  mb_state **mbs; /* indexed by microbatch */
  int mb_cap;
  int64_t state_bytes, peak_bytes, workspace_bytes;
  cached_buf *cache; /* freed state buffers, for reuse */
  int cache_n, cache_cap;
  int64_t cache_bytes;

  /* workspace, device memory */
  float *ws_x;   /* [N, h] the residual stream in F, its gradient in B */
  float *ws_a;   /* [N, max(h, heads head_dim)] norm outputs; the attention output's gradient */
  float *ws_big; /* [N, intermediate] the MLP activation's gradient */
  float *ws_tt;  /* [heads, T, T] one sequence's score gradients (unfused attention; else 1 float) */
  float
      *ws_head; /* dQ | dK | dV laid out as qkv: one sequence's [T, qkv_cols], or (flash) all [N, qkv_cols] */
  double *ws_loss;   /* [N] per-row losses (last stage) */
  double *h_loss;    /* [N] host copy of ws_loss */
  double *loss_rows; /* [loss_cap, N] per-row losses of F calls without a loss pointer (model_loss.c) */
  int loss_cap;

  /* bf16 storage (cfg.bf16; model_bf16.c) */
  uint16_t *d_params16; /* the compute copy of d_params */
  uint16_t *ws16[2];    /* products' A and B rounded to bf16 */
  size_t ws16_cap[2];   /* elements */

  zb_model_gemm *trace;
  int trace_cap, trace_n;
};

/* Tensor i's parameters and gradient in device memory (the host pointers
 * in the table are the mirror; offsets agree). */
static inline float *tparam(const zb_model_stage *st, int i) {
  return st->d_params + (st->tensors[i].param - st->params);
}
static inline float *tgrad(const zb_model_stage *st, int i) {
  return st->d_grads + (st->tensors[i].grad - st->grads);
}
/* Tensor i's parameters / gradient on the device, NULL when i is -1 (a
 * tensor the architecture does not have, e.g. learned positions). */
static inline float *tparam_or_null(const zb_model_stage *st, int i) {
  return i < 0 ? NULL : tparam(st, i);
}
static inline float *tgrad_or_null(const zb_model_stage *st, int i) {
  return i < 0 ? NULL : tgrad(st, i);
}

/* A block's parameter and gradient tensors on the device by role; NULL
 * where the architecture has no such tensor (a bias of llama). q, k and v
 * are laid out one after another, so Q_W is the fused [q; k; v] weight. */
static inline float *bparam(const zb_model_stage *st, int blk, zb_tensor_role r) {
  int t = st->t_block[blk * ZB_T_ROLE_COUNT + r];
  return t < 0 ? NULL : tparam(st, t);
}
static inline float *bgrad(const zb_model_stage *st, int blk, zb_tensor_role r) {
  int t = st->t_block[blk * ZB_T_ROLE_COUNT + r];
  return t < 0 ? NULL : tgrad(st, t);
}
/* The fused q|k|v projection weight and gradient of block blk. */
static inline float *qkv_param(const zb_model_stage *st, int blk) {
  float *w = bparam(st, blk, ZB_T_QKV_W);
  return w ? w : bparam(st, blk, ZB_T_Q_W);
}
static inline float *qkv_grad(const zb_model_stage *st, int blk) {
  float *w = bgrad(st, blk, ZB_T_QKV_W);
  return w ? w : bgrad(st, blk, ZB_T_Q_W);
}

/* Issues device op `op` unless an earlier one of this call failed; the
 * first error stays in st->err and st->ediag. */
#define MODEL_DEV(st, op, ...)                                                                               \
  do {                                                                                                       \
    if ((st)->err == ZB_OK)                                                                                  \
      (st)->err = (st)->dev->ops->op((st)->dev->self, __VA_ARGS__, &(st)->ediag);                            \
  } while (0)

/* Starts a public call's error scope / ends it: returns st->err, with its
 * message in diag. */
static inline void model_begin(zb_model_stage *st) {
  st->err = ZB_OK;
  st->ediag.msg[0] = 0;
}
static inline zb_err model_end(zb_model_stage *st, zb_diag *diag) {
  return st->err == ZB_OK ? ZB_OK : zb_diag_set(diag, st->err, "%s", st->ediag.msg);
}

/* ---- microbatch state (model_state.c) ---- */

/* The state of microbatch mb, or NULL when it has none. */
mb_state *model_mb_get(const zb_model_stage *st, int mb);
/* New empty state for mb; ZB_ERR_INVALID_ARG when mb is out of range or
 * already has state. */
zb_err model_mb_create(zb_model_stage *st, int mb, mb_state **out, zb_diag *diag);
/* Gives back every buffer of mb's state and the state itself. */
void model_mb_destroy(zb_model_stage *st, int mb);
/* Gives back every buffer of block blk's state in s (fp32 and bf16). */
void model_block_drop(zb_model_stage *st, mb_state *s, int blk);
/* A state buffer of s: counted in s's and the stage's bytes. */
void *model_take(zb_model_stage *st, mb_state *s, size_t bytes);
float *model_takef(zb_model_stage *st, mb_state *s, size_t numel);
/* Gives *p (numel floats; NULL is a no-op) back and sets it to NULL. */
void model_dropf(zb_model_stage *st, mb_state *s, float **p, size_t numel);
/* The same for any buffer of `bytes` (bf16 ones). */
void model_drop(zb_model_stage *st, mb_state *s, void **p, size_t bytes);

/* ---- bf16 storage (model_bf16.c; no-ops but under cfg.bf16) ---- */

/* Block blk of s: its fp32 state into bf16 (freeing the fp32), or back. */
void model_bf16_pack(zb_model_stage *st, mb_state *s, int blk);
void model_bf16_unpack(zb_model_stage *st, mb_state *s, int blk);
/* Gives back block blk's bf16 state. */
void model_bf16_drop_block(zb_model_stage *st, mb_state *s, int blk);
/* An activation or gradient between stages, into / out of the fp32
 * workspace ws (n_tok x hidden): copied from / to the caller's memory
 * (io H2D: host, fp32; D2D: device), or under bf16 storage with device
 * io, widened from / rounded to the caller's bf16 (zb_model_act_bytes). */
void model_act_in(zb_model_stage *st, float *ws, const float *src, zb_copy_kind io);
void model_act_out(zb_model_stage *st, float *dst, const float *ws, zb_copy_kind io);
/* Sets g's a16 and b16: the compute copy for a parameter, else a rounded copy. */
void model_bf16_gemm(zb_model_stage *st, zb_gemm *g);
/* The compute copy (allocated and filled from d_params) / its buffers freed. */
void model_bf16_init(zb_model_stage *st);
void model_bf16_free(zb_model_stage *st);

/* ---- losses kept on the device (model_loss.c) ---- */

/* Device rows [N] for microbatch mb's per-row losses, growing the array as
 * needed; NULL with st->err set when the device cannot allocate. */
double *model_loss_slot(zb_model_stage *st, int mb);

/* ---- matrix products, linear layers, attention (model_math.c) ---- */

/* One (batched) product through the device; traced as batch calls. */
void model_gemm(zb_model_stage *st, const zb_gemm *g);
void model_mm(zb_model_stage *st, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc);
void model_linear_fwd(zb_model_stage *st, const float *x, const float *w, const float *b, float *y, int in,
                      int out, int accumulate);
void model_linear_bwd_input(zb_model_stage *st, const float *dy, const float *w, float *dx, int in, int out,
                            int accumulate);
void model_linear_bwd_weight(zb_model_stage *st, const float *dy, const float *x, float *dw, float *db,
                             int in, int out);
/* Copies bytes between device buffers (D2D), or between a device buffer
 * and caller memory (H2D / D2H); sticky like MODEL_DEV. */
void model_copy(zb_model_stage *st, void *dst, const void *src, size_t bytes, zb_copy_kind kind);
/* Floats of a block's att state: B H T (flash's log-sum-exp) or B H T^2. */
size_t model_attn_state_numel(const zb_model_stage *st);
/* F: o from qkv, keeping att; B: qkv becomes dqkv in place from dout. */
void model_attention_fwd(zb_model_stage *st, const float *qkv, float *att, float *o);
void model_attention_bwd(zb_model_stage *st, float *qkv, const float *att, const float *o, const float *dout);
/* Rotary positions on qkv's q and k columns, or their inverse (model_forward.c). */
void model_rope(zb_model_stage *st, float *qkv, int inverse);

#endif
