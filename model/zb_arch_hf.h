/* zb_arch_hf.h — an architecture from a Hugging Face config.json
 * (docs/model.md, Architectures). model_type gpt2 and llama are read;
 * every key of the file is used, known to change nothing zb computes
 * (metadata such as torch_dtype or token ids), accepted but not applied
 * (dropout rates, listed in notes), or refused with an error that names
 * it, as is every value zb would compute differently from transformers
 * (an activation other than the architecture's, biases on llama, a rope
 * scaling type other than default, linear or llama3). Pure: the caller
 * reads the file. */
#ifndef ZB_ARCH_HF_H
#define ZB_ARCH_HF_H

#include <stddef.h>

#include "zb_arch.h"
#include "zb_json.h"

/* Fills *a from the parsed config cfg and checks it (zb_arch_check).
 * notes (NULL, or notes_len bytes) receives what was accepted but is not
 * applied, "" when nothing. ZB_ERR_UNSUPPORTED for a key or value zb does
 * not compute, ZB_ERR_INVALID_ARG for a malformed one; diag names it. */
zb_err zb_arch_from_hf(const zb_json *cfg, zb_arch *a, char *notes, size_t notes_len, zb_diag *diag);

/* The same from the file's text (len bytes; need not be NUL-terminated). */
zb_err zb_arch_from_hf_text(const char *text, size_t len, zb_arch *a, char *notes, size_t notes_len,
                            zb_diag *diag);

#endif
