/* tokens.c — the pure part of zb_tokens.h: llm.c shard headers, the
 * window table over sources in memory, and the deterministic draw of a
 * window for (seed, iteration, microbatch, sequence). No I/O here; files
 * are tokens_io.c's. */
#include <stdlib.h>
#include <string.h>

#include "tokens_internal.h"
#include "zb_alloc.h"

static int32_t le32(const uint8_t *p) {
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

zb_err zb_tokens_parse_header(const uint8_t *bytes, size_t len, uint64_t file_size, const char *name,
                              zb_tokens_header *out, zb_diag *diag) {
  if (len < ZB_TOKENS_HEADER_BYTES || file_size < ZB_TOKENS_HEADER_BYTES)
    return zb_diag_set(diag, ZB_ERR_PARSE, "%s: %llu bytes, shorter than a token shard's %d-byte header",
                       name, (unsigned long long)(file_size < len ? file_size : len), ZB_TOKENS_HEADER_BYTES);
  zb_tokens_header h = {.magic = le32(bytes), .version = le32(bytes + 4), .count = le32(bytes + 8)};
  int want;
  if (h.magic == ZB_TOKENS_MAGIC_GPT2) {
    want = ZB_TOKENS_VERSION_GPT2;
    h.width = 2;
  } else if (h.magic == ZB_TOKENS_MAGIC_LLAMA3) {
    want = ZB_TOKENS_VERSION_LLAMA3;
    h.width = 4;
  } else {
    return zb_diag_set(diag, ZB_ERR_PARSE,
                       "%s: bad magic %d: not an llm.c token shard (%d version %d: uint16 tokens, "
                       "%d version %d: uint32 tokens)",
                       name, h.magic, ZB_TOKENS_MAGIC_GPT2, ZB_TOKENS_VERSION_GPT2, ZB_TOKENS_MAGIC_LLAMA3,
                       ZB_TOKENS_VERSION_LLAMA3);
  }
  if (h.version != want)
    return zb_diag_set(diag, ZB_ERR_PARSE, "%s: version %d of magic %d is not supported (only version %d)",
                       name, h.version, h.magic, want);
  if (h.count < 0)
    return zb_diag_set(diag, ZB_ERR_PARSE, "%s: header gives a negative token count %lld", name,
                       (long long)h.count);
  uint64_t expect = ZB_TOKENS_HEADER_BYTES + (uint64_t)h.count * (uint64_t)h.width;
  if (file_size != expect)
    return zb_diag_set(diag, ZB_ERR_PARSE,
                       "%s: %llu bytes, but its header's %lld tokens of %d bytes need %llu (1024-byte header "
                       "included)",
                       name, (unsigned long long)file_size, (long long)h.count, h.width,
                       (unsigned long long)expect);
  *out = h;
  return ZB_OK;
}

zb_err zb_tokens_new(const zb_tokens_source *src, int n, int seq_len, int64_t vocab, zb_tokens **out,
                     zb_diag *diag) {
  *out = NULL;
  /* Ids are handed out as int32: a vocabulary of at most 2^31. */
  if (!src || n < 1 || seq_len < 1 || vocab < 1 || vocab > ((int64_t)1 << 31))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "tokens: need >= 1 source, seq_len >= 1, 1 <= vocab <= 2^31 (%d, %d, %lld)", n,
                       seq_len, (long long)vocab);
  for (int i = 0; i < n; i++) {
    const char *name = src[i].name ? src[i].name : "(unnamed)";
    if (src[i].width != 1 && src[i].width != 2 && src[i].width != 4)
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "%s: token width %d (1, 2 or 4)", name, src[i].width);
    if (src[i].count < (int64_t)seq_len + 1)
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "%s: %lld tokens; seq_len %d needs at least %d", name,
                         (long long)src[i].count, seq_len, seq_len + 1);
  }
  zb_tokens *ds = zb_calloc(1, sizeof *ds);
  ds->n = n;
  ds->seq_len = seq_len;
  ds->vocab = vocab;
  ds->src = zb_calloc((size_t)n, sizeof *ds->src);
  ds->first = zb_calloc((size_t)n + 1, sizeof *ds->first);
  ds->first_in_order = zb_calloc((size_t)n + 1, sizeof *ds->first_in_order);
  for (int i = 0; i < n; i++) {
    ds->src[i] = src[i];
    ds->src[i].name = zb_strdup(src[i].name ? src[i].name : "(unnamed)");
    /* Offsets 0 .. count-seq_len-1 leave room for the last target. */
    ds->first[i + 1] = ds->first[i] + (src[i].count - seq_len);
    ds->first_in_order[i + 1] = ds->first_in_order[i] + (src[i].count - 1) / seq_len;
  }
  *out = ds;
  return ZB_OK;
}

zb_err zb_tokens_from_text(const uint8_t *text, size_t len, const char *name, int seq_len, int64_t vocab,
                           zb_tokens **out, zb_diag *diag) {
  zb_tokens_source s = {.name = name, .data = text, .count = (int64_t)len, .width = 1};
  return zb_tokens_new(&s, 1, seq_len, vocab, out, diag);
}

void zb_tokens_free(zb_tokens *ds) {
  if (!ds)
    return;
  if (ds->release)
    ds->release(ds->ctx);
  for (int i = 0; i < ds->n; i++)
    free((char *)ds->src[i].name);
  free(ds->src);
  free(ds->first);
  free(ds->first_in_order);
  free(ds);
}

int zb_tokens_shards(const zb_tokens *ds) {
  return ds->n;
}
const char *zb_tokens_shard_name(const zb_tokens *ds, int shard) {
  return ds->src[shard].name;
}
int64_t zb_tokens_shard_count(const zb_tokens *ds, int shard) {
  return ds->src[shard].count;
}
int64_t zb_tokens_windows(const zb_tokens *ds) {
  return ds->first[ds->n];
}
int64_t zb_tokens_windows_in_order(const zb_tokens *ds) {
  return ds->first_in_order[ds->n];
}

/* The last source whose first window (in table first, n + 1 entries) is
 * <= r. */
static int source_of(const int64_t *first, int n, int64_t r) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    int mid = lo + (hi - lo + 1) / 2;
    if (first[mid] <= r)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

/* splitmix64's finalizer; the same mix as the worker's byte data. */
static uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

void zb_tokens_locate(const zb_tokens *ds, uint64_t seed, int64_t it, int mb, int b, int *shard,
                      int64_t *offset) {
  uint64_t key = mix(mix(mix(seed) ^ (uint64_t)it) ^ (uint64_t)(uint32_t)mb);
  /* The modulo's bias is below W / 2^64: nothing a run could see. */
  int64_t r = (int64_t)(mix(key ^ (uint64_t)b) % (uint64_t)ds->first[ds->n]);
  *shard = source_of(ds->first, ds->n, r);
  *offset = r - ds->first[*shard];
}

void zb_tokens_locate_in_order(const zb_tokens *ds, int64_t k, int *shard, int64_t *offset) {
  int64_t w = ds->first_in_order[ds->n];
  int64_t r = k % w;
  *shard = source_of(ds->first_in_order, ds->n, r < 0 ? r + w : r);
  *offset = ((r < 0 ? r + w : r) - ds->first_in_order[*shard]) * ds->seq_len;
}

static uint32_t token_at(const zb_tokens_source *s, int64_t i) {
  const uint8_t *p = s->data + (size_t)i * (size_t)s->width;
  if (s->width == 1)
    return p[0];
  if (s->width == 2)
    return (uint32_t)p[0] | (uint32_t)p[1] << 8;
  return (uint32_t)le32(p);
}

static zb_err bad_token(const zb_tokens *ds, int shard, int64_t i, uint32_t t, zb_diag *diag) {
  return zb_diag_set(diag, ZB_ERR_PARSE, "%s: token %lld is %lu, not below the vocabulary size %lld",
                     ds->src[shard].name, (long long)i, (unsigned long)t, (long long)ds->vocab);
}

/* The window of shard at off into tokens and targets, ids checked. */
static zb_err read_window(const zb_tokens *ds, int shard, int64_t off, int32_t *tokens, int32_t *targets,
                          zb_diag *diag) {
  const zb_tokens_source *s = &ds->src[shard];
  for (int i = 0; i <= ds->seq_len; i++) {
    uint32_t t = token_at(s, off + i);
    if ((uint64_t)t >= (uint64_t)ds->vocab)
      return bad_token(ds, shard, off + i, t, diag);
    if (i < ds->seq_len)
      tokens[i] = (int32_t)t;
    if (i > 0)
      targets[i - 1] = (int32_t)t;
  }
  return ZB_OK;
}

zb_err zb_tokens_window(const zb_tokens *ds, uint64_t seed, int64_t it, int mb, int b, int32_t *tokens,
                        int32_t *targets, zb_diag *diag) {
  int shard;
  int64_t off;
  zb_tokens_locate(ds, seed, it, mb, b, &shard, &off);
  return read_window(ds, shard, off, tokens, targets, diag);
}

zb_err zb_tokens_fill_in_order(const zb_tokens *ds, int64_t first, int batch, int32_t *tokens,
                               int32_t *targets, zb_diag *diag) {
  size_t T = (size_t)ds->seq_len;
  for (int j = 0; j < batch; j++) {
    int shard;
    int64_t off;
    zb_tokens_locate_in_order(ds, first + j, &shard, &off);
    zb_err err = read_window(ds, shard, off, tokens + (size_t)j * T, targets + (size_t)j * T, diag);
    if (err)
      return err;
  }
  return ZB_OK;
}

zb_err zb_tokens_fill(const zb_tokens *ds, uint64_t seed, int64_t it, int mb, int batch, int32_t *tokens,
                      int32_t *targets, zb_diag *diag) {
  size_t T = (size_t)ds->seq_len;
  for (int j = 0; j < batch; j++) {
    zb_err err = zb_tokens_window(ds, seed, it, mb, j, tokens + (size_t)j * T, targets + (size_t)j * T, diag);
    if (err)
      return err;
  }
  return ZB_OK;
}

zb_err zb_tokens_check_all(const zb_tokens *ds, zb_diag *diag) {
  for (int s = 0; s < ds->n; s++)
    for (int64_t i = 0; i < ds->src[s].count; i++) {
      uint32_t t = token_at(&ds->src[s], i);
      if ((uint64_t)t >= (uint64_t)ds->vocab)
        return bad_token(ds, s, i, t, diag);
    }
  return ZB_OK;
}
