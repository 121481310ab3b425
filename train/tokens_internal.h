/* tokens_internal.h — the dataset struct behind zb_tokens.h, shared by
 * the pure part (tokens.c) and the file part (tokens_io.c) only. */
#ifndef ZB_TOKENS_INTERNAL_H
#define ZB_TOKENS_INTERNAL_H

#include "zb_tokens.h"

struct zb_tokens {
  int n; /* sources */
  int seq_len;
  int64_t vocab;
  zb_tokens_source *src;   /* n; names owned (copied), data borrowed */
  int64_t *first;          /* n + 1: windows before source i; first[n] = W */
  int64_t *first_in_order; /* n + 1: the same for windows every seq_len tokens */
  /* Set by tokens_io.c: frees what the sources' data point into (the
   * mappings); called by zb_tokens_free. */
  void (*release)(void *ctx);
  void *ctx;
};

#endif
