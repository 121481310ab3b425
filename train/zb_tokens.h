/* zb_tokens.h — training data as token windows (docs/model.md, Data):
 * tokenized shards in llm.c's token-file format, or the bytes of one text
 * file, sampled deterministically so that every rank that needs a batch
 * (the first stage its inputs, the last stage its targets) draws the same
 * windows without talking to the others.
 *
 * Shard format (llm.c's, matched exactly): a header of 256 little-endian
 * int32 — [0] magic, [1] version, [2] token count n, the rest unused —
 * then n tokens, little-endian:
 *   magic 20240520, version 1: uint16 tokens (GPT-2 vocabularies);
 *   magic 20240801, version 7: uint32 tokens (LLaMA-3 vocabularies, 128k).
 * Any other magic, or a version other than its magic's, is refused naming
 * both. The file must hold exactly 1024 + n * width bytes.
 *
 * Sampling: with sequence length T, a window is T+1 consecutive tokens of
 * one shard (inputs: the first T, targets: the last T); a shard of n tokens
 * has n - T windows, and windows never cross a shard boundary. Sequence b
 * of microbatch mb of iteration it under seed s is window
 *   r = mix(mix(mix(mix(s) ^ it) ^ (uint32)mb) ^ b) mod W
 * of the W windows of all shards in order (mix: splitmix64's finalizer),
 * so every window of the dataset is equally likely (a shard is drawn in
 * proportion to its window count) and draws are independent across
 * (it, mb, b). It is a pure function of those numbers and the shard
 * sizes. On one text file this is exactly the draw the worker's byte
 * data uses today (worker/backend_cpu_io.c), so moving the worker onto
 * this module changes no run.
 *
 * In order (the job spec's model.order: sequential; llm.c's own reading
 * when it does not shuffle): windows start every T tokens of a shard (a
 * shard of n tokens has floor((n - 1) / T), consecutive ones sharing one
 * token, so each token is a target once per pass), shards in order, W'
 * windows in all; sequence b of microbatch mb of iteration it, with m
 * microbatches of `batch` sequences, is window ((it * m + mb) * batch + b)
 * mod W'. The caller computes that index.
 *
 * Token ids are checked against the vocabulary lazily, in each window
 * handed out (T+1 comparisons on tokens being copied anyway): opening
 * never reads a shard's tokens, so a dataset of many gigabytes opens in
 * the time of its headers. zb_tokens_check_all scans everything when an
 * early answer is worth a full read.
 *
 * This file is pure (no I/O): a dataset over token bytes already in memory
 * (zb_tokens_new, zb_tokens_from_text). zb_tokens_open (tokens_io.c) maps
 * files: a glob of shards, or one text file read as byte tokens.
 *
 * Ownership: a zb_tokens owns its shard table and, when opened from files,
 * its mappings; zb_tokens_new borrows the memory its sources point at
 * (it must outlive the dataset). A dataset is read-only after creation:
 * several threads may draw windows from it at once.
 * Results: zb_err from lib/zb_err.h; ZB_ERR_PARSE (a bad header or token),
 * ZB_ERR_INVALID_ARG (a shard too short, bad arguments) and ZB_ERR_IO
 * (cannot glob, open or map) name the shard, file or pattern.
 */
#ifndef ZB_TOKENS_H
#define ZB_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#include "zb_err.h"
#include "zb_roots.h"

#define ZB_TOKENS_HEADER_INTS 256
#define ZB_TOKENS_HEADER_BYTES (ZB_TOKENS_HEADER_INTS * 4)
#define ZB_TOKENS_MAGIC_GPT2 20240520 /* version 1, uint16 tokens */
#define ZB_TOKENS_VERSION_GPT2 1
#define ZB_TOKENS_MAGIC_LLAMA3 20240801 /* version 7, uint32 tokens */
#define ZB_TOKENS_VERSION_LLAMA3 7

/* What a shard's header says. */
typedef struct zb_tokens_header {
  int32_t magic, version;
  int64_t count; /* tokens after the header */
  int width;     /* bytes per token: 2 or 4 */
} zb_tokens_header;

/* Parses the first ZB_TOKENS_HEADER_BYTES of a shard (len must be at least
 * that) and checks it against the shard's file_size. name (a path) starts
 * every message. */
zb_err zb_tokens_parse_header(const uint8_t *bytes, size_t len, uint64_t file_size, const char *name,
                              zb_tokens_header *out, zb_diag *diag);

/* One source of tokens in memory: count tokens of width bytes (1: bytes of
 * a text, 2 or 4: a shard's little-endian tokens) at data. */
typedef struct zb_tokens_source {
  const char *name;    /* for messages; copied */
  const uint8_t *data; /* borrowed; any alignment */
  int64_t count;
  int width;
} zb_tokens_source;

typedef struct zb_tokens zb_tokens;

/* A dataset over n >= 1 sources in the given order, windows of seq_len+1
 * tokens, ids below vocab (1 .. 2^31: ids are int32). A source with fewer than seq_len + 1
 * tokens is refused naming it. */
zb_err zb_tokens_new(const zb_tokens_source *src, int n, int seq_len, int64_t vocab, zb_tokens **out,
                     zb_diag *diag);

/* A dataset over the bytes of one text (tokens 0..255; vocab >= 256 for a
 * check that can never fail): the worker's byte mode. */
zb_err zb_tokens_from_text(const uint8_t *text, size_t len, const char *name, int seq_len, int64_t vocab,
                           zb_tokens **out, zb_diag *diag);

typedef enum zb_tokens_kind {
  ZB_TOKENS_SHARDS,     /* a glob of llm.c token shards */
  ZB_TOKENS_TEXT_BYTES, /* one text file, its bytes as tokens 0..255 */
} zb_tokens_kind;

/* Opens a dataset from files (tokens_io.c). SHARDS: every file matching
 * the glob pattern, in strcmp order of their paths (the same order on
 * every rank, whatever the locale), each header validated; a pattern that
 * matches nothing is refused naming it. TEXT_BYTES: pattern is the text
 * file's path, taken as it is. Files are opened read-only and mapped, by
 * their plain paths (symbolic links followed). */
zb_err zb_tokens_open(zb_tokens_kind kind, const char *pattern, int seq_len, int64_t vocab, zb_tokens **out,
                      zb_diag *diag);

/* The same beneath a worker's --path-root (roots borrowed for the call;
 * NULL or empty: zb_tokens_open). With roots on, paths must be absolute
 * and under a root; the glob's directory and every file are opened beneath
 * it following no symbolic link (a link, or a path under no root, fails
 * with ZB_ERR_IO naming the path), and only the pattern's last component
 * may hold wildcards (ZB_ERR_INVALID_ARG otherwise). */
zb_err zb_tokens_open_in(const zb_roots *roots, zb_tokens_kind kind, const char *pattern, int seq_len,
                         int64_t vocab, zb_tokens **out, zb_diag *diag);

/* Frees the dataset and its mappings. NULL is a no-op. */
void zb_tokens_free(zb_tokens *ds);

/* Sizes, for logs and tests. */
int zb_tokens_shards(const zb_tokens *ds);
const char *zb_tokens_shard_name(const zb_tokens *ds, int shard);
int64_t zb_tokens_shard_count(const zb_tokens *ds, int shard); /* tokens */
int64_t zb_tokens_windows(const zb_tokens *ds);                /* W, over all shards */

/* W' (see the header comment): windows read in order. */
int64_t zb_tokens_windows_in_order(const zb_tokens *ds);

/* Where in-order window k (taken mod W') lies: its shard and the offset
 * of its first token. */
void zb_tokens_locate_in_order(const zb_tokens *ds, int64_t k, int *shard, int64_t *offset);

/* Fills batch sequences from in-order windows first, first + 1, ... (mod
 * W'), laid out as zb_tokens_fill lays them. Errors as zb_tokens_window. */
zb_err zb_tokens_fill_in_order(const zb_tokens *ds, int64_t first, int batch, int32_t *tokens,
                               int32_t *targets, zb_diag *diag);

/* Where sequence b of microbatch mb of iteration it under seed lies: its
 * shard and the offset of its first token (see the header comment). */
void zb_tokens_locate(const zb_tokens *ds, uint64_t seed, int64_t it, int mb, int b, int *shard,
                      int64_t *offset);

/* Fills tokens[0..T) and targets[0..T) (T = seq_len) with that window.
 * ZB_ERR_PARSE names the shard, the offset and the id of a token >= vocab. */
zb_err zb_tokens_window(const zb_tokens *ds, uint64_t seed, int64_t it, int mb, int b, int32_t *tokens,
                        int32_t *targets, zb_diag *diag);

/* The batch of microbatch mb: batch windows, sequence j at j * seq_len of
 * tokens and targets (batch * seq_len int32 each). */
zb_err zb_tokens_fill(const zb_tokens *ds, uint64_t seed, int64_t it, int mb, int batch, int32_t *tokens,
                      int32_t *targets, zb_diag *diag);

/* Reads every token of every shard and refuses the first id >= vocab,
 * naming the shard and the offset. */
zb_err zb_tokens_check_all(const zb_tokens *ds, zb_diag *diag);

#endif
