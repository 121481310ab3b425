/* test_safetensors.c — safetensors files (model/zb_safetensors.h): the
 * writer's image read back bit for bit, F16 and BF16 against values
 * worked out by hand, each refusal of a bad header by name, and a sharded
 * checkpoint read back one shard at a time; beneath a --path-root
 * (zb_roots.h), a checkpoint is read only from beneath the root, a
 * symbolic link refused by name. */
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zb_safetensors.h"
#include "zbtest.h"

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* An image of the header text (unpadded) and data_len bytes of data
 * (byte i is i & 0xff). The caller frees it. */
static uint8_t *image(const char *header, size_t data_len, size_t *len) {
  size_t h = strlen(header);
  *len = 8 + h + data_len;
  uint8_t *b = malloc(*len);
  for (int i = 0; i < 8; i++)
    b[i] = (uint8_t)((uint64_t)h >> (8 * i));
  memcpy(b + 8, header, h);
  for (size_t i = 0; i < data_len; i++)
    b[8 + h + i] = (uint8_t)i;
  return b;
}

static int refuses(const uint8_t *b, size_t len, const char *want) {
  zb_st_table *t = (zb_st_table *)1;
  zb_diag d = {{0}};
  zb_err err = zb_st_parse(b, len, &t, &d);
  if (err == ZB_OK || t != NULL) {
    fprintf(stderr, "  accepted a bad file (wanted \"%s\")\n", want);
    zb_st_table_free(t);
    return 0;
  }
  if (!strstr(d.msg, want)) {
    fprintf(stderr, "  message \"%s\" lacks \"%s\"\n", d.msg, want);
    return 0;
  }
  return 1;
}

static int header_refused(const char *header, size_t data_len, const char *want) {
  size_t len;
  uint8_t *b = image(header, data_len, &len);
  int ok = refuses(b, len, want);
  free(b);
  return ok;
}

static void test_round_trip(void) {
  float w[6] = {1.5f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f}; /* 1e-40: an fp32 subnormal */
  float s = 3.25f, bias[3] = {0.1f, 0.2f, 0.3f};
  zb_st_entry e[4] = {
      {.name = "w", .ndim = 2, .shape = {2, 3}, .data = w},
      {.name = "scalar", .ndim = 0, .data = &s},
      {.name = "empty", .ndim = 2, .shape = {0, 4}},
      {.name = "bias", .ndim = 1, .shape = {3}, .data = bias},
  };
  uint8_t *img;
  size_t len;
  zb_diag d = {{0}};
  CHECK_EQ(zb_st_build(e, 4, &img, &len, &d), ZB_OK);
  zb_st_table *t = NULL;
  zb_err err = zb_st_parse(img, len, &t, &d);
  CHECK_MSG(err == ZB_OK, "%s", d.msg);
  CHECK_EQ(t->header_len % 8, 0);
  CHECK_EQ(t->file_len, len);
  CHECK_STREQ(zb_st_meta(t, "format"), "pt");
  CHECK_EQ(t->n, 4);
  /* Sorted by name, data in that order (empty takes no bytes). */
  CHECK_STREQ(t->tensors[0].name, "bias");
  CHECK_STREQ(t->tensors[2].name, "scalar");
  CHECK_EQ(t->tensors[0].offset, 8 + t->header_len);
  CHECK_EQ(t->tensors[1].nbytes, 0);
  const zb_st_tensor *x = zb_st_find(t, "w");
  CHECK(x && x->dtype == ZB_ST_F32 && x->ndim == 2 && x->shape[0] == 2 && x->shape[1] == 3 && x->numel == 6);
  CHECK(zb_st_find(t, "nope") == NULL);
  float back[6];
  CHECK_EQ(zb_st_to_f32(img, len, x, back, 6, &d), ZB_OK);
  for (int i = 0; i < 6; i++)
    CHECK_EQ(f32_bits(back[i]), f32_bits(w[i]));
  CHECK_EQ(zb_st_to_f32(img, len, zb_st_find(t, "scalar"), back, 1, &d), ZB_OK);
  CHECK(back[0] == 3.25f);
  CHECK_EQ(zb_st_to_f32(img, len, x, back, 5, &d), ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "\"w\" has 6 elements, not 5"));
  zb_st_table_free(t);
  free(img);
}

/* The reference writer's layout, byte for byte, for one tensor. */
static void test_writer_layout(void) {
  float v[2] = {1.0f, -2.0f};
  zb_st_entry e = {.name = "a.weight", .ndim = 1, .shape = {2}, .data = v};
  uint8_t *img;
  size_t len;
  CHECK_EQ(zb_st_build(&e, 1, &img, &len, NULL), ZB_OK);
  const char *want = "{\"__metadata__\":{\"format\":\"pt\"},\"a.weight\":{\"dtype\":\"F32\",\"shape\":[2],"
                     "\"data_offsets\":[0,8]}}";
  size_t h = strlen(want), padded = (h + 7) / 8 * 8;
  CHECK_EQ(len, 8 + padded + 8);
  CHECK_EQ(img[0], padded);
  CHECK(memcmp(img + 8, want, h) == 0);
  for (size_t i = h; i < padded; i++)
    CHECK_EQ(img[8 + i], ' ');
  static const uint8_t data[8] = {0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0}; /* 1.0f, -2.0f little-endian */
  CHECK(memcmp(img + 8 + padded, data, 8) == 0);
  free(img);
}

static void test_writer_refusals(void) {
  float v = 1;
  zb_st_entry e[2] = {{.name = "x", .ndim = 0, .data = &v}, {.name = "x", .ndim = 0, .data = &v}};
  uint8_t *img = (uint8_t *)1;
  size_t len;
  zb_diag d = {{0}};
  CHECK_EQ(zb_st_build(e, 2, &img, &len, &d), ZB_ERR_INVALID_ARG);
  CHECK(img == NULL && strstr(d.msg, "two tensors are called \"x\""));
  e[1].name = "__metadata__";
  CHECK_EQ(zb_st_build(e, 2, &img, &len, &d), ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "__metadata__"));
  e[1].name = "bad\xff";
  CHECK_EQ(zb_st_build(e, 2, &img, &len, &d), ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "invalid UTF-8"));
  e[1].name = "y";
  e[1].ndim = 9;
  CHECK_EQ(zb_st_build(e, 2, &img, &len, &d), ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "\"y\": 9 dimensions"));
  e[1].ndim = 1;
  e[1].shape[0] = 2;
  e[1].data = NULL;
  CHECK_EQ(zb_st_build(e, 2, &img, &len, &d), ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "\"y\" has no data"));
}

static void test_half_conversions(void) {
  CHECK(zb_st_f16_to_f32(0x3c00) == 1.0f);
  CHECK(zb_st_f16_to_f32(0xc000) == -2.0f);
  CHECK(zb_st_f16_to_f32(0x7bff) == 65504.0f);              /* largest finite */
  CHECK(zb_st_f16_to_f32(0x0400) == ldexpf(1, -14));        /* smallest normal */
  CHECK(zb_st_f16_to_f32(0x0001) == ldexpf(1, -24));        /* smallest subnormal */
  CHECK(zb_st_f16_to_f32(0x83ff) == -ldexpf(1023, -24));    /* largest subnormal, negative */
  CHECK_EQ(f32_bits(zb_st_f16_to_f32(0x3555)), 0x3eaaa000); /* 0.333251953125 */
  CHECK_EQ(f32_bits(zb_st_f16_to_f32(0x8000)), 0x80000000); /* -0 */
  CHECK_EQ(f32_bits(zb_st_f16_to_f32(0x7c00)), 0x7f800000); /* +inf */
  CHECK_EQ(f32_bits(zb_st_f16_to_f32(0xfc00)), 0xff800000); /* -inf */
  CHECK_EQ(f32_bits(zb_st_f16_to_f32(0x7e00)), 0x7fc00000); /* quiet NaN */
  CHECK_EQ(f32_bits(zb_st_f16_to_f32(0x7c01)), 0x7f802000); /* NaN payload kept */
  CHECK(zb_st_bf16_to_f32(0x3f80) == 1.0f);
  CHECK(zb_st_bf16_to_f32(0xc040) == -3.0f);
  CHECK(zb_st_bf16_to_f32(0x4049) == 3.140625f);
  CHECK_EQ(f32_bits(zb_st_bf16_to_f32(0x0001)), 0x00010000); /* a subnormal */
  CHECK_EQ(f32_bits(zb_st_bf16_to_f32(0x8000)), 0x80000000);
  CHECK_EQ(f32_bits(zb_st_bf16_to_f32(0xff80)), 0xff800000);
  CHECK(isnan(zb_st_bf16_to_f32(0x7fc0)));
}

/* A hand-made file with F16, BF16 and I64 tensors, in reverse name
 * order and with a padded header. */
static void test_hand_made_file(void) {
  const char *h = "{\"z\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]},"
                  "\"b\":{\"dtype\":\"BF16\",\"shape\":[1,2],\"data_offsets\":[6,10]},"
                  "\"ids\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[10,18]},"
                  "\"__metadata__\":{\"k\":\"v\"}}      ";
  size_t len;
  uint8_t *img = image(h, 18, &len);
  static const uint8_t data[18] = {0x00, 0x3c, 0x01, 0x00, 0x00, 0xfc, /* F16 1, 2^-24, -inf */
                                   0x49, 0x40, 0x00, 0x80,             /* BF16 3.140625, -0 */
                                   7,    0,    0,    0,    0,    0,    0, 0};
  memcpy(img + len - 18, data, 18);
  zb_st_table *t = NULL;
  zb_diag d = {{0}};
  CHECK_MSG(zb_st_parse(img, len, &t, &d) == ZB_OK, "%s", d.msg);
  CHECK_STREQ(zb_st_meta(t, "k"), "v");
  CHECK_STREQ(t->tensors[0].name, "z");
  float out[3];
  CHECK_EQ(zb_st_to_f32(img, len, zb_st_find(t, "z"), out, 3, &d), ZB_OK);
  CHECK(out[0] == 1.0f && out[1] == ldexpf(1, -24) && isinf(out[2]) && out[2] < 0);
  CHECK_EQ(zb_st_to_f32(img, len, zb_st_find(t, "b"), out, 2, &d), ZB_OK);
  CHECK(out[0] == 3.140625f && f32_bits(out[1]) == 0x80000000);
  const zb_st_tensor *ids = zb_st_find(t, "ids");
  CHECK(ids && ids->ndim == 0 && ids->numel == 1 && ids->dtype == ZB_ST_I64);
  CHECK_EQ(zb_st_to_f32(img, len, ids, out, 1, &d), ZB_ERR_UNSUPPORTED);
  CHECK(strstr(d.msg, "\"ids\": dtype I64 does not convert"));
  zb_st_table_free(t);
  free(img);
}

static void test_refusals_length(void) {
  uint8_t small[5] = {0};
  CHECK(refuses(small, 5, "too short"));
  uint8_t b[24] = {0xe8, 0x03}; /* N = 1000 */
  CHECK(refuses(b, 24, "header length 1000 runs past the end of the file (24 bytes)"));
  uint8_t big[16] = {0x01, 0xe1, 0xf5, 0x05}; /* N = 100000001 */
  CHECK(refuses(big, 16, "exceeds the limit of 100000000"));
  uint8_t huge[16] = {0, 0, 0, 0, 0, 0, 0, 0x80};
  CHECK(refuses(huge, 16, "exceeds the limit"));
}

static void test_refusals_header(void) {
  CHECK(header_refused("[{\"a\":1}]", 0, "not a JSON object"));
  CHECK(header_refused("  {}", 0, "not a JSON object"));
  CHECK(header_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]", 0, "safetensors header: JSON at byte"));
  CHECK(header_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "\"a\": missing data_offsets"));
  CHECK(header_refused("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "\"a\": missing dtype"));
  CHECK(header_refused("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "\"a\": missing shape"));
  CHECK(header_refused("{\"a\":{\"dtype\":\"F128\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
                       "\"a\": unknown dtype \"F128\""));
  CHECK(header_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
                       "\"a\": shape of 3 F32 elements needs 12 bytes but data_offsets span 8"));
  CHECK(header_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,8]}}", 8,
                       "shape[0] is not a non-negative integer"));
  CHECK(header_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
                       "9 dimensions, more than 8"));
  CHECK(header_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
                       "data_offsets [8, 0] end before they begin"));
  CHECK(header_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8,
                       "data_offsets is not [begin, end]"));
  CHECK(header_refused("{\"a\":[1]}", 0, "tensor \"a\": an array, not an object"));
  CHECK(header_refused("{\"__metadata__\":{\"k\":1}}", 0, "__metadata__ \"k\" is a number, not a string"));
  CHECK(header_refused("{\"__metadata__\":[]}", 0, "__metadata__ is an array, not an object"));
}

static void test_refusals_coverage(void) {
  CHECK(header_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                       12, "tensor \"b\" (data_offsets from 4) overlaps tensor \"a\""));
  CHECK(header_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                       "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                       12, "hole in the data: bytes [4, 8) before tensor \"b\""));
  CHECK(header_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
                       "hole in the data: bytes [0, 4)"));
  CHECK(header_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12,
                       "the tensors cover 8 bytes of data but the file holds 12"));
  CHECK(header_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4,
                       "the tensors cover 8 bytes of data but the file holds 4"));
  /* Two empty tensors at one offset tile nothing and are fine. */
  size_t len;
  uint8_t *b = image("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                     "\"b\":{\"dtype\":\"BF16\",\"shape\":[3,0],\"data_offsets\":[0,0]}}",
                     0, &len);
  zb_st_table *t = NULL;
  CHECK_EQ(zb_st_parse(b, len, &t, NULL), ZB_OK);
  CHECK(t && t->n == 2);
  zb_st_table_free(t);
  free(b);
}

static void test_index(void) {
  const char *text = "{\"metadata\":{\"total_size\":40},\"weight_map\":{\"a\":\"s1.safetensors\","
                     "\"c\":\"s2.safetensors\",\"b\":\"s1.safetensors\"}}";
  zb_st_index *ix = NULL;
  zb_diag d = {{0}};
  CHECK_EQ(zb_st_index_parse(text, strlen(text), &ix, &d), ZB_OK);
  CHECK_EQ(ix->n, 3);
  CHECK_EQ(ix->n_files, 2);
  CHECK_STREQ(ix->shard_files[1], "s2.safetensors");
  CHECK_STREQ(zb_st_index_file(ix, "b"), "s1.safetensors");
  CHECK(zb_st_index_file(ix, "d") == NULL);
  zb_st_index_free(ix);
  static const struct {
    const char *text, *want;
  } bad[] = {
      {"{\"weight_map\":{\"a\":\"../x.safetensors\"}}",
       "\"a\": \"../x.safetensors\" is not a plain file name"},
      {"{\"weight_map\":{\"a\":\"/etc/x\"}}", "is not a plain file name"},
      {"{\"weight_map\":{\"a\":3}}", "weight_map \"a\" is a number"},
      {"{\"metadata\":{}}", "missing weight_map"},
      {"{\"weight_map\":[]}", "weight_map is not an object"},
      {"[]", "not an object"},
      {"{\"weight_map\":{\"a\":\"x\",\"a\":\"y\"}}", "duplicate key \"a\""},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ix = (zb_st_index *)1;
    CHECK_EQ(zb_st_index_parse(bad[i].text, strlen(bad[i].text), &ix, &d), ZB_ERR_PARSE);
    CHECK(ix == NULL);
    CHECK_MSG(strstr(d.msg, bad[i].want), "\"%s\" lacks \"%s\"", d.msg, bad[i].want);
  }
}

/* Writes n bytes as dir/name. */
static int put_bytes(const char *dir, const char *name, const void *data, size_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f)
    return 0;
  int ok = fwrite(data, 1, n, f) == n;
  return fclose(f) == 0 && ok;
}

static int put_file(const char *dir, const char *name, const char *text) {
  return put_bytes(dir, name, text, strlen(text));
}

static int write_shard(const char *dir, const char *name, const zb_st_entry *e, size_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  zb_diag d = {{0}};
  zb_err err = zb_st_write_file(path, e, n, &d);
  if (err != ZB_OK)
    fprintf(stderr, "  writing %s: %s\n", path, d.msg);
  return err == ZB_OK;
}

/* Two shards and an index; reading c opens only its shard. */
static void test_sharded(void) {
  char dir[] = "/tmp/zb-test-st-XXXXXX";
  CHECK(mkdtemp(dir));
  float a[4] = {1, 2, 3, 4}, b[2] = {-1, -2}, c[3] = {0.5f, 0.25f, 0.125f};
  zb_st_entry s1[2] = {{.name = "a", .ndim = 2, .shape = {2, 2}, .data = a},
                       {.name = "b", .ndim = 1, .shape = {2}, .data = b}};
  zb_st_entry s2[1] = {{.name = "c", .ndim = 1, .shape = {3}, .data = c}};
  CHECK(write_shard(dir, "model-00001-of-00002.safetensors", s1, 2));
  CHECK(write_shard(dir, "model-00002-of-00002.safetensors", s2, 1));
  CHECK(put_file(
      dir, "model.safetensors.index.json",
      "{\"metadata\": {\"total_size\": 36}, \"weight_map\": {"
      "\"a\": \"model-00001-of-00002.safetensors\", \"b\": \"model-00001-of-00002.safetensors\", "
      "\"c\": \"model-00002-of-00002.safetensors\", \"ghost\": \"model-00001-of-00002.safetensors\"}}"));
  zb_st_checkpoint *ck = NULL;
  zb_diag d = {{0}};
  CHECK_MSG(zb_st_checkpoint_open(dir, &ck, &d) == ZB_OK, "%s", d.msg);
  CHECK_EQ(zb_st_checkpoint_open_shards(ck), 0);
  float out[4];
  CHECK_MSG(zb_st_checkpoint_read_f32(ck, "c", out, 3, &d) == ZB_OK, "%s", d.msg);
  CHECK(memcmp(out, c, sizeof c) == 0);
  CHECK_EQ(zb_st_checkpoint_open_shards(ck), 1);
  const zb_st_tensor *x = NULL;
  CHECK_EQ(zb_st_checkpoint_find(ck, "a", &x, &d), ZB_OK);
  CHECK(x && x->ndim == 2 && x->shape[1] == 2);
  CHECK_EQ(zb_st_checkpoint_open_shards(ck), 2);
  CHECK_EQ(zb_st_checkpoint_read_f32(ck, "a", out, 4, &d), ZB_OK);
  CHECK(memcmp(out, a, sizeof a) == 0);
  CHECK_EQ(zb_st_checkpoint_read_f32(ck, "a", out, 3, &d), ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "\"a\" has 4 elements, not 3"));
  CHECK_EQ(zb_st_checkpoint_read_f32(ck, "zzz", out, 1, &d), ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "tensor \"zzz\" is not in the index"));
  CHECK_EQ(zb_st_checkpoint_find(ck, "ghost", &x, &d), ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "no tensor \"ghost\" (the index says it is here)"));
  zb_st_checkpoint_close(ck);
  zbt_remove_dir(dir);
}

/* One model.safetensors, and a shard the index names but that is missing. */
static void test_single_file_dir(void) {
  char dir[] = "/tmp/zb-test-st-XXXXXX";
  CHECK(mkdtemp(dir));
  zb_st_checkpoint *ck = NULL;
  zb_diag d = {{0}};
  CHECK_EQ(zb_st_checkpoint_open(dir, &ck, &d), ZB_ERR_IO);
  CHECK(ck == NULL && strstr(d.msg, "holds neither model.safetensors.index.json nor model.safetensors"));
  float v[2] = {7, 8};
  zb_st_entry e = {.name = "v", .ndim = 1, .shape = {2}, .data = v};
  CHECK(write_shard(dir, "model.safetensors", &e, 1));
  CHECK_EQ(zb_st_checkpoint_open(dir, &ck, &d), ZB_OK);
  float out[2];
  CHECK_EQ(zb_st_checkpoint_read_f32(ck, "v", out, 2, &d), ZB_OK);
  CHECK(out[0] == 7 && out[1] == 8);
  CHECK_EQ(zb_st_checkpoint_read_f32(ck, "w", out, 2, &d), ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "model.safetensors: no tensor \"w\""));
  zb_st_checkpoint_close(ck);
  CHECK(put_file(dir, "model.safetensors.index.json", "{\"weight_map\": {\"v\": \"gone.safetensors\"}}"));
  CHECK_EQ(zb_st_checkpoint_open(dir, &ck, &d), ZB_OK);
  CHECK_EQ(zb_st_checkpoint_read_f32(ck, "v", out, 2, &d), ZB_ERR_IO);
  CHECK(strstr(d.msg, "gone.safetensors: cannot open"));
  zb_st_checkpoint_close(ck);
  zbt_remove_dir(dir);
}

/* A file whose header is bad is refused at open with its path; a tensor
 * of a dtype that does not convert is refused at read. */
static void test_file_refusals(void) {
  char dir[] = "/tmp/zb-test-st-XXXXXX";
  CHECK(mkdtemp(dir));
  CHECK(put_file(dir, "short.safetensors", "abc"));
  static const uint8_t bad[10] = {0x10, 0x01, 0, 0, 0, 0, 0, 0, '{', '}'}; /* N = 272 */
  CHECK(put_bytes(dir, "bad.safetensors", bad, sizeof bad));
  char path[512];
  zb_st_file *f = NULL;
  zb_diag d = {{0}};
  snprintf(path, sizeof path, "%s/short.safetensors", dir);
  CHECK_EQ(zb_st_file_open(path, &f, &d), ZB_ERR_PARSE);
  CHECK(f == NULL && strstr(d.msg, "short.safetensors: safetensors: the file is 3 bytes, too short"));
  snprintf(path, sizeof path, "%s/bad.safetensors", dir);
  CHECK_EQ(zb_st_file_open(path, &f, &d), ZB_ERR_PARSE);
  CHECK(strstr(d.msg, "bad.safetensors: safetensors: header length 272 runs past the end"));
  size_t len;
  uint8_t *img = image("{\"i\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, &len);
  CHECK(put_bytes(dir, "i32.safetensors", img, len));
  free(img);
  snprintf(path, sizeof path, "%s/i32.safetensors", dir);
  CHECK_MSG(zb_st_file_open(path, &f, &d) == ZB_OK, "%s", d.msg);
  float out;
  CHECK_EQ(zb_st_file_read_f32(f, &f->table->tensors[0], &out, 1, &d), ZB_ERR_UNSUPPORTED);
  CHECK(strstr(d.msg, "tensor \"i\": dtype I32 does not convert"));
  zb_st_file_close(f);
  zbt_remove_dir(dir);
}

/* Reads tensor v of the checkpoint in dir beneath rs; err and a message
 * holding want (NULL: none) when it fails. */
static bool read_in(const zb_roots *rs, const char *dir, zb_err err, const char *want) {
  zb_st_checkpoint *ck = NULL;
  zb_diag d = {{0}};
  float out[2] = {0};
  zb_err got = zb_st_checkpoint_open_in(rs, dir, &ck, &d);
  if (got == ZB_OK)
    got = zb_st_checkpoint_read_f32(ck, "v", out, 2, &d);
  zb_st_checkpoint_close(ck);
  bool ok = got == err && (err != ZB_OK || (out[0] == 7 && out[1] == 8)) && (!want || strstr(d.msg, want));
  if (!ok)
    fprintf(stderr, "  %s: got %s '%s', want %s '%s'\n", dir, zb_strerror(got), d.msg, zb_strerror(err),
            want ? want : "");
  return ok;
}

/* Beneath a root: a checkpoint there (one file, or an index and its
 * shard) reads; a weights file, a shard or a directory that is a link out
 * of the root, and a directory under no root, are refused naming them. */
static void test_beneath_root(void) {
  char top[] = "/tmp/zb-test-st-XXXXXX";
  CHECK(mkdtemp(top));
  char root[300], ok[300], sharded[300], linked[300], outside[300], escape[300], target[400], link[400];
  snprintf(root, sizeof root, "%s/root", top);
  snprintf(ok, sizeof ok, "%s/root/ok", top);
  snprintf(sharded, sizeof sharded, "%s/root/sharded", top);
  snprintf(linked, sizeof linked, "%s/root/linked", top);
  snprintf(outside, sizeof outside, "%s/outside", top);
  snprintf(escape, sizeof escape, "%s/root/escape", top);
  const char *dirs[5] = {root, ok, sharded, linked, outside};
  for (int i = 0; i < 5; i++)
    CHECK_EQ(mkdir(dirs[i], 0755), 0);
  float v[2] = {7, 8};
  zb_st_entry e = {.name = "v", .ndim = 1, .shape = {2}, .data = v};
  CHECK(write_shard(ok, "model.safetensors", &e, 1));
  CHECK(write_shard(outside, "model.safetensors", &e, 1));
  CHECK(write_shard(sharded, "s1.safetensors", &e, 1));
  CHECK(put_file(sharded, "model.safetensors.index.json", "{\"weight_map\": {\"v\": \"s1.safetensors\"}}"));
  snprintf(target, sizeof target, "%s/model.safetensors", outside);
  snprintf(link, sizeof link, "%s/model.safetensors", linked);
  CHECK_EQ(symlink(target, link), 0);
  CHECK_EQ(symlink(outside, escape), 0);
  zb_roots rs = {0};
  zb_diag d = {{0}};
  CHECK_MSG(zb_roots_add(&rs, root, &d) == ZB_OK, "%s", d.msg);
  CHECK(read_in(&rs, ok, ZB_OK, NULL));
  CHECK(read_in(&rs, sharded, ZB_OK, NULL));
  CHECK(read_in(NULL, linked, ZB_OK, NULL)); /* no roots: links are followed */
  CHECK(read_in(&rs, linked, ZB_ERR_IO, "linked/model.safetensors: cannot open"));
  CHECK(read_in(&rs, linked, ZB_ERR_IO, "symbolic link"));
  CHECK(read_in(&rs, escape, ZB_ERR_IO, "escape: cannot open"));
  CHECK(read_in(&rs, outside, ZB_ERR_IO, "outside: cannot open"));
  /* a shard of the index that is a link */
  CHECK_EQ(unlink(link), 0);
  snprintf(link, sizeof link, "%s/s2.safetensors", linked);
  CHECK_EQ(symlink(target, link), 0);
  CHECK(put_file(linked, "model.safetensors.index.json", "{\"weight_map\": {\"v\": \"s2.safetensors\"}}"));
  CHECK(read_in(&rs, linked, ZB_ERR_IO, "linked/s2.safetensors: cannot open"));
  zb_roots_close(&rs);
  CHECK_EQ(unlink(escape), 0);
  zbt_remove_dir(linked);
  zbt_remove_dir(sharded);
  zbt_remove_dir(ok);
  zbt_remove_dir(root);
  zbt_remove_dir(outside);
  zbt_remove_dir(top);
}

ZBT_MAIN(ZBT(test_round_trip), ZBT(test_writer_layout), ZBT(test_writer_refusals), ZBT(test_half_conversions),
         ZBT(test_hand_made_file), ZBT(test_refusals_length), ZBT(test_refusals_header),
         ZBT(test_refusals_coverage), ZBT(test_index), ZBT(test_sharded), ZBT(test_single_file_dir),
         ZBT(test_file_refusals), ZBT(test_beneath_root))
