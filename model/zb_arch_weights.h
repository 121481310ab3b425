/* zb_arch_weights.h — a stage's parameters in and out of Hugging Face
 * checkpoints (docs/model.md, Architectures and Hugging Face files): the
 * tensors zb_arch_stage_tensors lists, read from a safetensors checkpoint
 * (one file or sharded) into zb's layout, and written back in
 * transformers' names and layout, with the config.json that makes the
 * directory load with from_pretrained.
 *
 * zb's layout differs from transformers' in two ways, both undone here:
 * GPT-2's Conv1D weights are stored [in, out] (zb computes with [out, in]),
 * and an embedding whose rows are padded (vocab_padded > vocab) has zero
 * rows past the vocabulary that the file does not hold. A tied head's
 * second holder (tied_copy) reads the embedding and is never written.
 *
 * Ownership: the caller owns every buffer; nothing is kept after a call.
 */
#ifndef ZB_ARCH_WEIGHTS_H
#define ZB_ARCH_WEIGHTS_H

#include <stddef.h>

#include "zb_arch.h"
#include "zb_buf.h"
#include "zb_safetensors.h"

/* Reads tensors ts[0..n) from ck into dst[i] (ts[i].rows * ts[i].cols
 * floats, zb's layout; padding rows zeroed). A tensor missing from the
 * checkpoint, or of another shape than the architecture says, is an error
 * naming it and both shapes; dtypes F32, F16 and BF16 convert exactly. */
zb_err zb_arch_read_tensors(const zb_arch_tensor *ts, int n, zb_st_checkpoint *ck, float *const *dst,
                            zb_diag *diag);

/* The entries of a safetensors file for tensors ts[0..n) whose zb-layout
 * data is src[i]: transformers' names and shapes, tied copies left out.
 * Transposed or unpadded data goes to buffers the call allocates; *owned
 * (n pointers, NULL where src[i] is used as it is) must be freed with
 * zb_arch_entries_free. Writes the entry count to *n_out. */
zb_err zb_arch_hf_entries(const zb_arch_tensor *ts, int n, const float *const *src, zb_st_entry *out,
                          size_t *n_out, float ***owned, zb_diag *diag);
void zb_arch_entries_free(float **owned, int n);

/* The shard of stage `stage` of n_stages when a model is saved one shard
 * per stage: "model-<stage+1>-of-<n_stages>.safetensors", five digits
 * each, as transformers names its shards. */
void zb_arch_shard_name(int stage, int n_stages, char *buf, size_t len);

/* model.safetensors.index.json for such a save: every tensor transformers
 * holds (tied copies left out) mapped to its stage's shard, and the
 * metadata's total_size in fp32 bytes. A stage without tensors has no
 * shard and no entry. */
zb_err zb_arch_hf_index(const zb_arch *a, int n_stages, zb_buf *out, zb_diag *diag);

/* config.json for a (model_type, sizes, and every key whose default in
 * transformers differs from zb's choice), as zb_arch_from_hf reads it
 * back to the same architecture. The builtin architecture has none
 * (ZB_ERR_UNSUPPORTED). */
zb_err zb_arch_to_hf_json(const zb_arch *a, zb_buf *out, zb_diag *diag);

#endif
