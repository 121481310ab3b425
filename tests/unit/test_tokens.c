/* test_tokens.c — train/zb_tokens.h: llm.c token shards written here in
 * llm.c's layout (256 int32 header, uint16 or uint32 tokens) to a temporary
 * directory, opened by glob, and windows drawn from them: the same windows
 * for the same (seed, iteration, microbatch, sequence) on separately opened
 * datasets, inside one shard each, and every refusal naming its cause;
 * beneath a --path-root (zb_roots.h), the glob and the text file open
 * only what lies beneath the root, refusing a symbolic link by name. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zb_tokens.h"
#include "zbtest.h"

enum { T = 8 };

static char dir[64];

/* A fresh temporary directory for one test (removed at its end). */
static void fresh(void) {
  snprintf(dir, sizeof dir, "/tmp/zb_test_tokens.XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    exit(1);
  }
}

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

/* Writes dir/name: header (magic, version, header_count) then n tokens of
 * width bytes, little-endian as llm.c's writer on x86. */
static void write_shard(const char *name, int32_t magic, int32_t version, int32_t header_count,
                        const uint32_t *tok, int n, int width) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) {
    perror(path);
    exit(1);
  }
  uint8_t h[ZB_TOKENS_HEADER_BYTES] = {0};
  put32(h, (uint32_t)magic);
  put32(h + 4, (uint32_t)version);
  put32(h + 8, (uint32_t)header_count);
  fwrite(h, 1, sizeof h, f);
  for (int i = 0; i < n; i++) {
    uint8_t b[4];
    put32(b, tok[i]);
    fwrite(b, 1, (size_t)width, f);
  }
  fclose(f);
}

/* A GPT-2-format shard whose token i is base + i (so a window shows where
 * it came from). */
static void write_gpt2(const char *name, uint32_t base, int n) {
  uint32_t *tok = malloc((size_t)n * sizeof *tok);
  for (int i = 0; i < n; i++)
    tok[i] = base + (uint32_t)i;
  write_shard(name, ZB_TOKENS_MAGIC_GPT2, ZB_TOKENS_VERSION_GPT2, n, tok, n, 2);
  free(tok);
}

static const char *pat(const char *glob) {
  static char p[512];
  snprintf(p, sizeof p, "%s/%s", dir, glob);
  return p;
}

/* Three shards of 40, 100 and 25 tokens, plus a file the glob leaves out. */
static void write_three(void) {
  write_gpt2("tok_b.bin", 2000, 100);
  write_gpt2("tok_a.bin", 1000, 40);
  write_gpt2("tok_c.bin", 3000, 25);
  write_gpt2("other.bin", 9000, 50);
}

static void test_glob_several_shards(void) {
  fresh();
  write_three();
  zb_tokens *ds;
  zb_diag d = {{0}};
  CHECK_EQ(zb_tokens_open(ZB_TOKENS_SHARDS, pat("tok_*.bin"), T, 50257, &ds, &d), ZB_OK);
  CHECK_EQ(zb_tokens_shards(ds), 3);
  CHECK(strstr(zb_tokens_shard_name(ds, 0), "tok_a.bin")); /* sorted by path */
  CHECK(strstr(zb_tokens_shard_name(ds, 2), "tok_c.bin"));
  CHECK_EQ(zb_tokens_shard_count(ds, 1), 100);
  CHECK_EQ(zb_tokens_windows(ds), (40 - T) + (100 - T) + (25 - T));
  zb_tokens_free(ds);
  zbt_remove_dir(dir);
}

static void test_same_windows_across_opens(void) {
  fresh();
  write_three();
  zb_tokens *a, *b;
  zb_diag d = {{0}};
  CHECK_EQ(zb_tokens_open(ZB_TOKENS_SHARDS, pat("tok_*.bin"), T, 50257, &a, &d), ZB_OK);
  CHECK_EQ(zb_tokens_open(ZB_TOKENS_SHARDS, pat("tok_*.bin"), T, 50257, &b, &d), ZB_OK);
  enum { B = 6 };
  int32_t ta[B * T], ga[B * T], tb[B * T], gb[B * T], tc[B * T], gc[B * T];
  int differ = 0;
  for (int it = 0; it < 5; it++)
    for (int mb = 0; mb < 4; mb++) {
      CHECK_EQ(zb_tokens_fill(a, 42, it, mb, B, ta, ga, &d), ZB_OK);
      CHECK_EQ(zb_tokens_fill(b, 42, it, mb, B, tb, gb, &d), ZB_OK);
      CHECK(memcmp(ta, tb, sizeof ta) == 0);
      CHECK(memcmp(ga, gb, sizeof ga) == 0);
      CHECK_EQ(zb_tokens_fill(b, 43, it, mb, B, tc, gc, &d), ZB_OK);
      differ += memcmp(ta, tc, sizeof ta) != 0;
    }
  CHECK_EQ(differ, 20); /* another seed, other windows (every batch here) */
  zb_tokens_free(a);
  zb_tokens_free(b);
  zbt_remove_dir(dir);
}

/* Every window lies inside one shard, its tokens are that shard's at the
 * located offset, its targets are its tokens shifted by one, and shards
 * are drawn about in proportion to their window counts. */
static void test_windows_inside_shards(void) {
  fresh();
  write_three();
  zb_tokens *ds;
  zb_diag d = {{0}};
  CHECK_EQ(zb_tokens_open(ZB_TOKENS_SHARDS, pat("tok_*.bin"), T, 50257, &ds, &d), ZB_OK);
  int hits[3] = {0};
  for (int it = 0; it < 100; it++)
    for (int b = 0; b < 30; b++) {
      int s;
      int64_t off;
      zb_tokens_locate(ds, 7, it, 1, b, &s, &off);
      CHECK(s >= 0 && s < 3);
      CHECK(off >= 0 && off + T + 1 <= zb_tokens_shard_count(ds, s));
      hits[s]++;
      int32_t tok[T], tgt[T];
      CHECK_EQ(zb_tokens_window(ds, 7, it, 1, b, tok, tgt, &d), ZB_OK);
      for (int i = 0; i < T; i++) {
        CHECK_EQ(tok[i], 1000 * (s + 1) + off + i);
        CHECK_EQ(tgt[i], tok[i] + 1);
      }
    }
  /* 3000 draws over windows 32 : 92 : 17 (expected 681, 1957, 362). */
  CHECK(hits[0] > 550 && hits[0] < 810);
  CHECK(hits[1] > 1800 && hits[1] < 2100);
  CHECK(hits[2] > 270 && hits[2] < 460);
  zb_tokens_free(ds);
  zbt_remove_dir(dir);
}

/* LLaMA-3's version: uint32 tokens beyond 65535. */
static void test_llama3_uint32(void) {
  fresh();
  uint32_t tok[20];
  for (int i = 0; i < 20; i++)
    tok[i] = 128000u + (uint32_t)i;
  write_shard("llama.bin", ZB_TOKENS_MAGIC_LLAMA3, ZB_TOKENS_VERSION_LLAMA3, 20, tok, 20, 4);
  zb_tokens *ds;
  zb_diag d = {{0}};
  CHECK_EQ(zb_tokens_open(ZB_TOKENS_SHARDS, pat("llama.bin"), T, 128256, &ds, &d), ZB_OK);
  int32_t t[T], g[T];
  CHECK_EQ(zb_tokens_window(ds, 1, 0, 0, 0, t, g, &d), ZB_OK);
  CHECK(t[0] >= 128000 && t[0] <= 128000 + 20 - T - 1);
  CHECK_EQ(g[T - 1], t[0] + T);
  zb_tokens_free(ds);
  zbt_remove_dir(dir);
}

/* Opens pattern expecting err with both words in the message. */
static int refused(const char *glob, int64_t vocab, zb_err err, const char *w1, const char *w2) {
  zb_tokens *ds = (zb_tokens *)1;
  zb_diag d = {{0}};
  zb_err got = zb_tokens_open(ZB_TOKENS_SHARDS, pat(glob), T, vocab, &ds, &d);
  if (got != err || ds != NULL || !strstr(d.msg, w1) || !strstr(d.msg, w2)) {
    fprintf(stderr, "  %s: got %d '%s'\n", glob, got, d.msg);
    return 0;
  }
  return 1;
}

static void test_refusals(void) {
  fresh();
  uint32_t tok[40] = {0};
  write_shard("magic.bin", 12345, 1, 40, tok, 40, 2);
  CHECK(refused("magic.bin", 100, ZB_ERR_PARSE, "magic.bin", "bad magic 12345"));
  write_shard("ver.bin", ZB_TOKENS_MAGIC_GPT2, 2, 40, tok, 40, 2);
  CHECK(refused("ver.bin", 100, ZB_ERR_PARSE, "ver.bin", "version 2 of magic 20240520"));
  write_shard("ver7.bin", ZB_TOKENS_MAGIC_LLAMA3, 1, 40, tok, 40, 4);
  CHECK(refused("ver7.bin", 100, ZB_ERR_PARSE, "ver7.bin", "version 1 of magic 20240801"));
  write_shard("size.bin", ZB_TOKENS_MAGIC_GPT2, 1, 40, tok, 39, 2);
  CHECK(refused("size.bin", 100, ZB_ERR_PARSE, "size.bin", "1102 bytes, but its header's 40 tokens"));
  write_shard("neg.bin", ZB_TOKENS_MAGIC_GPT2, 1, -3, tok, 0, 2);
  CHECK(refused("neg.bin", 100, ZB_ERR_PARSE, "neg.bin", "negative token count -3"));
  write_shard("short.bin", ZB_TOKENS_MAGIC_GPT2, 1, T, tok, T, 2);
  CHECK(refused("short.bin", 100, ZB_ERR_INVALID_ARG, "short.bin", "8 tokens; seq_len 8 needs at least 9"));
  CHECK(refused("nothing_*.bin", 100, ZB_ERR_IO, "no file matches", "nothing_*.bin"));
  FILE *f = fopen(pat("tiny.bin"), "wb");
  fputs("hello", f);
  fclose(f);
  CHECK(refused("tiny.bin", 100, ZB_ERR_PARSE, "tiny.bin", "5 bytes, shorter than a token shard's 1024"));
  /* a bad shard among good ones is named */
  write_three();
  write_shard("tok_d.bin", ZB_TOKENS_MAGIC_GPT2, 7, 40, tok, 40, 2);
  CHECK(refused("tok_*.bin", 50257, ZB_ERR_PARSE, "tok_d.bin", "version 7 of magic 20240520"));
  remove(pat("tok_d.bin"));
  zbt_remove_dir(dir);
}

/* A token >= vocab: in the window that holds it, and in a full scan. */
static void test_token_beyond_vocab(void) {
  fresh();
  uint32_t tok[T + 1];
  for (int i = 0; i <= T; i++)
    tok[i] = (uint32_t)i;
  tok[T] = 300; /* the only window's last target */
  write_shard("vocab.bin", ZB_TOKENS_MAGIC_GPT2, 1, T + 1, tok, T + 1, 2);
  zb_tokens *ds;
  zb_diag d = {{0}};
  CHECK_EQ(zb_tokens_open(ZB_TOKENS_SHARDS, pat("vocab.bin"), T, 256, &ds, &d), ZB_OK); /* lazy */
  int32_t t[T], g[T];
  CHECK_EQ(zb_tokens_window(ds, 3, 0, 0, 0, t, g, &d), ZB_ERR_PARSE);
  CHECK_MSG(strstr(d.msg, "vocab.bin: token 8 is 300, not below the vocabulary size 256"), "%s", d.msg);
  memset(&d, 0, sizeof d);
  CHECK_EQ(zb_tokens_check_all(ds, &d), ZB_ERR_PARSE);
  CHECK_MSG(strstr(d.msg, "vocab.bin: token 8 is 300"), "%s", d.msg);
  zb_tokens_free(ds);
  CHECK_EQ(zb_tokens_open(ZB_TOKENS_SHARDS, pat("vocab.bin"), T, 301, &ds, &d), ZB_OK);
  CHECK_EQ(zb_tokens_check_all(ds, &d), ZB_OK);
  CHECK_EQ(zb_tokens_window(ds, 3, 0, 0, 0, t, g, &d), ZB_OK);
  CHECK_EQ(g[T - 1], 300);
  zb_tokens_free(ds);
  zbt_remove_dir(dir);
}

/* The worker's byte-mode draw today (worker/backend_cpu_io.c), restated:
 * TEXT_BYTES must give the same windows. */
static uint64_t worker_mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

static void test_text_bytes_as_worker(void) {
  fresh();
  char text[300];
  for (int i = 0; i < 300; i++)
    text[i] = (char)('a' + (i * 7 + i / 26) % 26);
  FILE *f = fopen(pat("text.txt"), "wb");
  fwrite(text, 1, sizeof text, f);
  fclose(f);
  zb_tokens *ds, *mem;
  zb_diag d = {{0}};
  CHECK_EQ(zb_tokens_open(ZB_TOKENS_TEXT_BYTES, pat("text.txt"), T, 256, &ds, &d), ZB_OK);
  CHECK_EQ(zb_tokens_from_text((const uint8_t *)text, sizeof text, "text", T, 256, &mem, &d), ZB_OK);
  CHECK_EQ(zb_tokens_windows(ds), 300 - T);
  for (int it = 0; it < 4; it++)
    for (int mb = 0; mb < 3; mb++)
      for (int j = 0; j < 5; j++) {
        uint64_t key = worker_mix(worker_mix(worker_mix(99) ^ (uint64_t)it) ^ (uint64_t)(uint32_t)mb);
        int64_t want = (int64_t)(worker_mix(key ^ (uint64_t)j) % (uint64_t)(300 - T));
        int s;
        int64_t off;
        zb_tokens_locate(ds, 99, it, mb, j, &s, &off);
        CHECK_EQ(off, want);
        int32_t t1[T], g1[T], t2[T], g2[T];
        CHECK_EQ(zb_tokens_window(ds, 99, it, mb, j, t1, g1, &d), ZB_OK);
        CHECK_EQ(zb_tokens_window(mem, 99, it, mb, j, t2, g2, &d), ZB_OK);
        CHECK(memcmp(t1, t2, sizeof t1) == 0 && memcmp(g1, g2, sizeof g1) == 0);
        CHECK_EQ(t1[0], (unsigned char)text[want]);
        CHECK_EQ(g1[T - 1], (unsigned char)text[want + T]);
      }
  zb_tokens_free(ds);
  zb_tokens_free(mem);
  f = fopen(pat("short.txt"), "wb");
  fputs("12345678", f); /* T bytes: no window */
  fclose(f);
  CHECK_EQ(zb_tokens_open(ZB_TOKENS_TEXT_BYTES, pat("short.txt"), T, 256, &ds, &d), ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "short.txt: 8 tokens; seq_len 8 needs at least 9"), "%s", d.msg);
  CHECK_EQ(zb_tokens_from_text((const uint8_t *)text, sizeof text, "text", T, (int64_t)1 << 32, &ds, &d),
           ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "1 <= vocab <= 2^31") && strstr(d.msg, "4294967296"), "%s", d.msg);
  CHECK_EQ(zb_tokens_open(ZB_TOKENS_TEXT_BYTES, pat("absent.txt"), T, 256, &ds, &d), ZB_ERR_IO);
  CHECK_MSG(strstr(d.msg, "absent.txt: cannot open"), "%s", d.msg);
  zbt_remove_dir(dir);
}

/* The shards tools/zb-tokenize made from Debian's GPL-3 text
 * (tests/data/tokens/README). */
static void test_committed_shards(void) {
  zb_tokens *ds;
  zb_diag d = {{0}};
  CHECK_MSG(zb_tokens_open(ZB_TOKENS_SHARDS, ZB_TEST_DATA_DIR "/tokens/gpl3_*.bin", 64, 512, &ds, &d) ==
                ZB_OK,
            "%s", d.msg);
  CHECK_EQ(zb_tokens_shards(ds), 4);
  CHECK_EQ(zb_tokens_shard_count(ds, 0), 4096);
  CHECK_EQ(zb_tokens_shard_count(ds, 3), 15150 - 3 * 4096);
  CHECK_EQ(zb_tokens_check_all(ds, &d), ZB_OK);
  int32_t t[64], g[64];
  CHECK_EQ(zb_tokens_window(ds, 5, 0, 0, 0, t, g, &d), ZB_OK);
  zb_tokens_free(ds);
}

/* In order: windows every T tokens of each shard, shards in glob order,
 * sharing one token with the next, wrapping after the last; a shard's
 * tail shorter than T + 1 tokens is never read. */
static void test_in_order(void) {
  fresh();
  write_three(); /* tok_a 40, tok_b 100, tok_c 25 tokens */
  zb_tokens *ds = NULL;
  zb_diag d = {{0}};
  CHECK_EQ(zb_tokens_open(ZB_TOKENS_SHARDS, pat("tok_*.bin"), T, 65536, &ds, &d), ZB_OK);
  /* (40-1)/8 = 4, (100-1)/8 = 12, (25-1)/8 = 3 */
  CHECK_EQ(zb_tokens_windows_in_order(ds), 19);
  const uint32_t starts[] = {1000, 1008, 1016, 1024, 2000, 2008};
  int32_t t[6 * T], g[6 * T];
  CHECK_EQ(zb_tokens_fill_in_order(ds, 0, 6, t, g, &d), ZB_OK);
  for (int j = 0; j < 6; j++)
    for (int i = 0; i < T; i++) {
      CHECK_EQ(t[j * T + i], (int32_t)(starts[j] + (uint32_t)i));
      CHECK_EQ(g[j * T + i], (int32_t)(starts[j] + (uint32_t)i + 1));
    }
  /* the last window of tok_c starts at 16 and ends at its token 24; the
   * next index wraps to the first window of all */
  CHECK_EQ(zb_tokens_fill_in_order(ds, 18, 2, t, g, &d), ZB_OK);
  CHECK_EQ(t[0], 3016);
  CHECK_EQ(g[T - 1], 3024);
  CHECK_EQ(t[T], 1000);
  int shard;
  int64_t off;
  zb_tokens_locate_in_order(ds, 19 * 5 + 4, &shard, &off);
  CHECK_EQ(shard, 1);
  CHECK_EQ(off, 0);
  zb_tokens_free(ds);
  zbt_remove_dir(dir);
}

/* Opens pattern beneath roots expecting err with both words (w2 may be
 * NULL) in the message. */
static int refused_in(const zb_roots *rs, zb_tokens_kind kind, const char *pattern, zb_err err,
                      const char *w1, const char *w2) {
  zb_tokens *ds = (zb_tokens *)1;
  zb_diag d = {{0}};
  zb_err got = zb_tokens_open_in(rs, kind, pattern, T, 50257, &ds, &d);
  if (got != err || ds != NULL || !strstr(d.msg, w1) || (w2 && !strstr(d.msg, w2))) {
    fprintf(stderr, "  %s: got %d '%s'\n", pattern, got, d.msg);
    return 0;
  }
  return 1;
}

/* With a --path-root: shards and a text beneath it open, and give the
 * windows the plain open gives; a link among the shards, a text that is
 * a link, a path under no root and wildcards in a directory are refused
 * naming the path. */
static void test_beneath_root(void) {
  fresh();
  CHECK_EQ(mkdir(pat("root"), 0755), 0);
  write_gpt2("root/tok_b.bin", 2000, 100);
  write_gpt2("root/tok_a.bin", 1000, 40);
  write_gpt2("outside.bin", 9000, 50);
  FILE *f = fopen(pat("root/text.txt"), "wb");
  for (int i = 0; i < 100; i++)
    fputc('a' + i % 26, f);
  fclose(f);
  zb_roots rs = {0};
  zb_diag d = {{0}};
  CHECK_MSG(zb_roots_add(&rs, pat("root"), &d) == ZB_OK, "%s", d.msg);
  char glob[512];
  snprintf(glob, sizeof glob, "%s", pat("root/tok_*.bin"));
  zb_tokens *in, *plain;
  CHECK_MSG(zb_tokens_open_in(&rs, ZB_TOKENS_SHARDS, glob, T, 50257, &in, &d) == ZB_OK, "%s", d.msg);
  CHECK_EQ(zb_tokens_open(ZB_TOKENS_SHARDS, glob, T, 50257, &plain, &d), ZB_OK);
  CHECK_EQ(zb_tokens_shards(in), 2);
  CHECK(strstr(zb_tokens_shard_name(in, 0), "root/tok_a.bin") != NULL); /* strcmp order */
  CHECK_EQ(zb_tokens_windows(in), zb_tokens_windows(plain));
  int32_t t1[T], g1[T], t2[T], g2[T];
  CHECK_EQ(zb_tokens_window(in, 5, 1, 2, 3, t1, g1, &d), ZB_OK);
  CHECK_EQ(zb_tokens_window(plain, 5, 1, 2, 3, t2, g2, &d), ZB_OK);
  CHECK(memcmp(t1, t2, sizeof t1) == 0 && memcmp(g1, g2, sizeof g1) == 0);
  zb_tokens_free(in);
  zb_tokens_free(plain);
  char text[512];
  snprintf(text, sizeof text, "%s", pat("root/text.txt"));
  CHECK_MSG(zb_tokens_open_in(&rs, ZB_TOKENS_TEXT_BYTES, text, T, 256, &in, &d) == ZB_OK, "%s", d.msg);
  CHECK_EQ(zb_tokens_windows(in), 100 - T);
  zb_tokens_free(in);
  /* a link among the shards, to a shard outside: named, even though a
   * plain open would follow it */
  char out[512];
  snprintf(out, sizeof out, "%s", pat("outside.bin"));
  CHECK_EQ(symlink(out, pat("root/tok_c.bin")), 0);
  CHECK(refused_in(&rs, ZB_TOKENS_SHARDS, glob, ZB_ERR_IO, "root/tok_c.bin: cannot open", "symbolic link"));
  CHECK_EQ(symlink(out, pat("root/link.txt")), 0);
  CHECK(refused_in(&rs, ZB_TOKENS_TEXT_BYTES, pat("root/link.txt"), ZB_ERR_IO, "root/link.txt",
                   "symbolic link"));
  CHECK(refused_in(&rs, ZB_TOKENS_SHARDS, pat("outside.bin"), ZB_ERR_IO, "cannot list", NULL));
  CHECK(
      refused_in(&rs, ZB_TOKENS_TEXT_BYTES, pat("outside.bin"), ZB_ERR_IO, "outside.bin: cannot open", NULL));
  CHECK(refused_in(&rs, ZB_TOKENS_SHARDS, pat("root/../root/tok_*.bin"), ZB_ERR_IO, "cannot list", NULL));
  CHECK(
      refused_in(&rs, ZB_TOKENS_SHARDS, pat("r*/tok_*.bin"), ZB_ERR_INVALID_ARG, "only the file name", NULL));
  CHECK(refused_in(&rs, ZB_TOKENS_SHARDS, pat("root/none_*.bin"), ZB_ERR_IO, "no file matches", NULL));
  zb_roots_close(&rs);
  zbt_remove_dir(pat("root"));
  zbt_remove_dir(dir);
}

ZBT_MAIN(ZBT(test_glob_several_shards), ZBT(test_in_order), ZBT(test_same_windows_across_opens),
         ZBT(test_windows_inside_shards), ZBT(test_llama3_uint32), ZBT(test_refusals),
         ZBT(test_token_beyond_vocab), ZBT(test_text_bytes_as_worker), ZBT(test_committed_shards),
         ZBT(test_beneath_root))
