/* The checkpoint file (train/zb_checkpoint.h): a save read back gives
 * every bit and the header; a file of another job, stage or shape, a torn
 * (truncated) file and a flipped byte are refused with the file's name;
 * a failed save leaves the previous checkpoint in place. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zb_checkpoint.h"
#include "zb_file.h"
#include "zbtest.h"

static char dir[256], path[300];

static void setup(void) {
  snprintf(dir, sizeof dir, "/tmp/zb-test-ckpt-%d/job/x", (int)getpid());
  snprintf(path, sizeof path, "%s/rank0-stage1.ckpt", dir);
}

static const uint64_t sizes[2] = {3, 2};

static zb_ckpt make(float *p, float *m, float *v) {
  zb_ckpt c = {.stage = 1, .iteration = 5, .steps = 6, .n_tensors = 2, .sizes = sizes, .n = 5};
  snprintf(c.job_id, sizeof c.job_id, "job-1");
  c.params = p;
  c.m = m;
  c.v = v;
  return c;
}

static void test_round_trip(void) {
  setup();
  zb_diag d = {{0}};
  CHECK_EQ(zb_file_mkdirs("checkpoint", dir, &d), ZB_OK);
  float p[5] = {1, -2, 3.5f, 1e-30f, -0.0f}, m[5] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f}, v[5] = {1, 2, 3, 4, 5};
  zb_ckpt c = make(p, m, v);
  CHECK_EQ(zb_ckpt_save(NULL, path, &c, &d), ZB_OK);
  float p2[5], m2[5], v2[5];
  zb_ckpt r = make(p2, m2, v2);
  r.iteration = -1;
  r.steps = -1;
  CHECK_EQ(zb_ckpt_load(NULL, path, &r, &d), ZB_OK);
  CHECK_EQ(r.iteration, 5);
  CHECK_EQ(r.steps, 6);
  CHECK(memcmp(p, p2, sizeof p) == 0 && memcmp(m, m2, sizeof m) == 0 && memcmp(v, v2, sizeof v) == 0);

  /* not the checkpoint expected: another stage, another shape */
  r.stage = 2;
  CHECK_EQ(zb_ckpt_load(NULL, path, &r, &d), ZB_ERR_PARSE);
  CHECK(strstr(d.msg, path) && strstr(d.msg, "stage"));
  r.stage = 1;
  const uint64_t other[2] = {3, 3};
  r.sizes = other;
  CHECK_EQ(zb_ckpt_load(NULL, path, &r, &d), ZB_ERR_PARSE);
  CHECK(strstr(d.msg, path) && strstr(d.msg, "elements"));
  r.sizes = sizes;

  /* one flipped byte in the parameters: the checksum refuses it */
  FILE *f = fopen(path, "r+b");
  CHECK(f);
  fseek(f, -30, SEEK_END);
  int ch = fgetc(f);
  fseek(f, -30, SEEK_END);
  fputc(ch ^ 0x40, f);
  fclose(f);
  CHECK_EQ(zb_ckpt_load(NULL, path, &r, &d), ZB_ERR_PARSE);
  CHECK(strstr(d.msg, path) && strstr(d.msg, "corrupt"));

  /* torn: a prefix of the file */
  CHECK_EQ(zb_ckpt_save(NULL, path, &c, &d), ZB_OK);
  CHECK_EQ(truncate(path, 150), 0);
  CHECK_EQ(zb_ckpt_load(NULL, path, &r, &d), ZB_ERR_PARSE);
  CHECK(strstr(d.msg, path) && strstr(d.msg, "truncated"));
  CHECK_EQ(zb_ckpt_save(NULL, path, &c, &d), ZB_OK);

  /* a save that cannot complete (its directory is gone) leaves nothing
   * half-written under the final name */
  char missing[400];
  snprintf(missing, sizeof missing, "%s/nodir/rank0-stage1.ckpt", dir);
  CHECK_EQ(zb_ckpt_save(NULL, missing, &c, &d), ZB_ERR_IO);
  CHECK_EQ(zb_ckpt_load(NULL, path, &r, &d), ZB_OK);

  /* not a checkpoint at all */
  f = fopen(path, "wb");
  fputs("hello", f);
  fclose(f);
  CHECK_EQ(zb_ckpt_load(NULL, path, &r, &d), ZB_ERR_PARSE);
  CHECK(strstr(d.msg, "magic"));
  unlink(path);
}

ZBT_MAIN(ZBT(test_round_trip))
