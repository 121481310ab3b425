/* zb_arch.h — a model architecture as data (docs/model.md, Architectures):
 * which norm, position encoding, MLP and attention a decoder uses, its
 * sizes, and the list of its parameter tensors with the names Hugging Face
 * transformers gives them, so that loading, saving, partitioning and the
 * ops all read one description instead of comparing architecture names.
 *
 * Three architectures are described:
 *   builtin  the worker's quick-start model (zb_model.h): learned
 *            positions, LayerNorm with bias, tanh-GeLU MLP of 4h, biases
 *            everywhere, separate embedding and head, fused qkv;
 *   gpt2     GPT-2: the same blocks, with the head tied to the token
 *            embedding and HF's Conv1D layout (weights stored [in, out]);
 *   llama    LLaMA: RMSNorm (weight only), rotary position embeddings,
 *            SwiGLU MLP of `intermediate` units, grouped-query attention
 *            (kv_heads <= heads), no biases, head tied or not.
 *
 * A stage of a partition holds the blocks zb_model_layer_range gives it;
 * the first stage also holds the embeddings, the last the final norm and
 * the head. A tied head on a partition of more than one stage is held by
 * both the first and the last stage (ZB_ARCH_TIED_COPY on the last): one
 * logical weight, whose two gradients the job adds before each step.
 *
 * Pure: no I/O, no globals. Results are zb_err with a zb_diag naming the
 * field at fault.
 */
#ifndef ZB_ARCH_H
#define ZB_ARCH_H

#include <stddef.h>
#include <stdint.h>

#include "zb_err.h"

typedef enum zb_arch_kind { ZB_ARCH_BUILTIN, ZB_ARCH_GPT2, ZB_ARCH_LLAMA, ZB_ARCH_KIND_COUNT } zb_arch_kind;
typedef enum zb_norm_kind { ZB_NORM_LAYER, ZB_NORM_RMS } zb_norm_kind;
typedef enum zb_pos_kind { ZB_POS_LEARNED, ZB_POS_ROPE } zb_pos_kind;
typedef enum zb_mlp_kind { ZB_MLP_GELU_TANH, ZB_MLP_SWIGLU } zb_mlp_kind;

/* How rotary frequencies are rescaled for long contexts (HF rope_scaling). */
typedef enum zb_rope_scaling { ZB_ROPE_NONE, ZB_ROPE_LINEAR, ZB_ROPE_LLAMA3 } zb_rope_scaling;

typedef struct zb_rope {
  double theta; /* base of the frequencies (rope_theta) */
  zb_rope_scaling scaling;
  double factor;              /* LINEAR and LLAMA3 */
  double low_freq_factor;     /* LLAMA3 */
  double high_freq_factor;    /* LLAMA3 */
  int original_max_positions; /* LLAMA3 */
} zb_rope;

typedef struct zb_arch {
  zb_arch_kind kind;
  int vocab;         /* token ids 0..vocab-1 */
  int vocab_padded;  /* rows of the embedding and head as stored on the device (>= vocab; gpt2: a
                        multiple of 128); rows past vocab stay zero and never win the softmax */
  int hidden;        /* h */
  int heads;         /* query heads */
  int kv_heads;      /* key/value heads: heads (multi-head) or a divisor of it (grouped-query) */
  int head_dim;      /* per head; heads * head_dim need not equal hidden (llama's head_dim key) */
  int layers;        /* blocks */
  int intermediate;  /* MLP units: 4h for gelu, intermediate_size for swiglu */
  int max_positions; /* longest sequence: learned positions' rows, or rope's trained length */
  zb_norm_kind norm;
  double norm_eps;
  zb_pos_kind pos;
  zb_rope rope; /* ZB_POS_ROPE */
  zb_mlp_kind mlp;
  int biases;    /* linear layers and norms carry biases */
  int tied;      /* the head is the token embedding */
  int conv1d;    /* HF stores linear weights [in, out] (GPT-2's Conv1D), not [out, in] */
  int fused_qkv; /* one qkv projection tensor (builtin, gpt2) or q, k and v apart (llama) */
} zb_arch;

/* The name an architecture has in a job spec ("builtin", "gpt2",
 * "llama"); and back (ZB_ERR_INVALID_ARG naming the choices). */
const char *zb_arch_kind_name(zb_arch_kind k);
zb_err zb_arch_kind_parse(const char *name, zb_arch_kind *out, zb_diag *diag);

/* The builtin model's architecture (zb_model.h) at these sizes: vocab
 * 256 unless given, learned positions for max_positions tokens, an MLP of
 * 4h, LayerNorm eps 1e-5. */
zb_arch zb_arch_builtin(int vocab, int hidden, int heads, int layers, int max_positions);

/* Every size of *a consistent and in range (hidden a multiple of heads
 * where head_dim is implied, kv_heads dividing heads, positive sizes,
 * finite eps and theta, tensor sizes that fit in memory indices): ZB_OK,
 * or ZB_ERR_INVALID_ARG naming the first field at fault. */
zb_err zb_arch_check(const zb_arch *a, zb_diag *diag);

/* Blocks of stage `stage` of n_stages for a model of `layers` blocks:
 * contiguous and balanced (counts differ by at most one, later stages take
 * the extra ones, since early stages hold the most microbatches in flight
 * under 1F1B-like schedules). ZB_ERR_INVALID_ARG when stage is out of
 * range or layers < 0. */
zb_err zb_arch_layer_range(int layers, int n_stages, int stage, int *first, int *count);

/* The inverse frequencies of rotary embeddings for a head of hd (even):
 * inv[i] = theta^(-2i/hd), i < hd/2, in fp32 as transformers computes
 * them, then rescaled: linear divides by factor; llama3 divides the low
 * frequencies (wavelength past original_max_positions / low_freq_factor)
 * by factor, keeps the high ones (below .../high_freq_factor) and blends
 * between. */
void zb_rope_freqs(const zb_rope *r, int hd, float *inv);

/* What one tensor is for; the ops find their weights by role. */
typedef enum zb_tensor_role {
  ZB_T_EMBED,   /* token embedding [vocab, h] */
  ZB_T_POS,     /* learned positions [max_positions, h] */
  ZB_T_NORM1_W, /* norm before attention */
  ZB_T_NORM1_B,
  ZB_T_QKV_W, /* fused q|k|v [(heads + 2 kv_heads) head_dim, h] */
  ZB_T_QKV_B,
  ZB_T_Q_W, /* [heads head_dim, h] */
  ZB_T_K_W, /* [kv_heads head_dim, h] */
  ZB_T_V_W, /* [kv_heads head_dim, h] */
  ZB_T_O_W, /* attention output [h, heads head_dim] */
  ZB_T_O_B,
  ZB_T_NORM2_W, /* norm before the MLP */
  ZB_T_NORM2_B,
  ZB_T_UP_W, /* gelu: fc1 [intermediate, h]; swiglu: up */
  ZB_T_UP_B,
  ZB_T_GATE_W, /* swiglu's gate [intermediate, h] */
  ZB_T_DOWN_W, /* gelu: fc2; swiglu: down [h, intermediate] */
  ZB_T_DOWN_B,
  ZB_T_NORM_F_W, /* final norm */
  ZB_T_NORM_F_B,
  ZB_T_HEAD, /* LM head [vocab, h]; absent when tied */
  ZB_T_ROLE_COUNT
} zb_tensor_role;

enum { ZB_ARCH_NAME_MAX = 64 };

/* One parameter tensor as zb computes with it: row-major [rows, cols]
 * with a linear layer's weight [out, in]; hf_name and the HF shape
 * (transposed when hf_transposed) are how transformers stores it. */
typedef struct zb_arch_tensor {
  char hf_name[ZB_ARCH_NAME_MAX];
  zb_tensor_role role;
  int layer;            /* block index, -1 outside blocks */
  int rows, cols;       /* a vector: rows = 1 */
  int hf_rows, hf_cols; /* rows used by the HF tensor: vocab where the device pads to vocab_padded */
  int hf_transposed;    /* HF stores it [cols, rows] (Conv1D) */
  int hf_vector;        /* HF stores it with one dimension */
  int tied_copy;        /* a second holder of the tied embedding (the last stage's head) */
} zb_arch_tensor;

/* The tensors stage `stage` of n_stages holds, in the order it lays them
 * out: embeddings, its blocks' tensors (by role order), final norm, head.
 * Writes up to cap entries into out and the full count into *n (call with
 * cap 0 to size). ZB_ERR_INVALID_ARG for a bad stage or an arch that
 * fails zb_arch_check. */
zb_err zb_arch_stage_tensors(const zb_arch *a, int stage, int n_stages, zb_arch_tensor *out, int cap, int *n,
                             zb_diag *diag);

/* The stage of n_stages that holds the tensor HF calls hf_name (for a
 * tied embedding: the first). ZB_ERR_INVALID_ARG for a name the
 * architecture does not have. */
zb_err zb_arch_tensor_stage(const zb_arch *a, int n_stages, const char *hf_name, int *stage, zb_diag *diag);

/* Parameters in the whole model (the tied weight once, at vocab rows). */
int64_t zb_arch_param_count(const zb_arch *a);

#endif
