/* test_format.c — action strings, CSV in and out (torchtitan files
 * included), and the JSON, Chrome trace, SVG and ASCII writers.
 *
 * The JSON and trace checks run python3, the SVG checks xmllint and
 * rsvg-convert (Debian: python3, libxml2-utils, librsvg2-bin); a missing
 * tool fails the test rather than skipping it.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zb_format.h"
#include "zb_sim.h"
#include "zb_validate.h"
#include "zbtest.h"

/* ---- helpers ---------------------------------------------------------- */

/* Reads a whole file into a malloc'd buffer; NULL on failure. */
static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  size_t cap = 4096, n = 0;
  char *data = malloc(cap);
  size_t got;
  while ((got = fread(data + n, 1, cap - n, f)) > 0) {
    n += got;
    if (n == cap)
      data = realloc(data, cap *= 2);
  }
  fclose(f);
  *len = n;
  return data;
}

/* Writes bytes to a fresh temp file /tmp/zbfmt-<what>-XXXXXX; path
 * receives the name. Returns 0 on success. */
static int write_temp(const char *bytes, size_t n, const char *what, char *path, size_t path_len) {
  snprintf(path, path_len, "/tmp/zbfmt-%s-XXXXXX", what);
  int fd = mkstemp(path);
  if (fd < 0)
    return -1;
  size_t off = 0;
  while (off < n) {
    ssize_t w = write(fd, bytes + off, n - off);
    if (w <= 0) {
      close(fd);
      return -1;
    }
    off += (size_t)w;
  }
  return close(fd);
}

static int have_tool(const char *name) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", name);
  return system(cmd) == 0;
}

/* Runs a python3 snippet with the file as sys.argv[1]; returns its status. */
static int run_python(const char *code, const char *path) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "python3 -c '%s' '%s'", code, path);
  return system(cmd);
}

static int count_substr(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
    n++;
  return n;
}

static int total_compute(const zb_schedule *s) {
  int n = 0;
  for (int r = 0; r < s->p; r++)
    n += zb_schedule_compute_count(s, r);
  return n;
}

static int same_schedule(const zb_schedule *a, const zb_schedule *b) {
  if (a->p != b->p || a->v != b->v || a->m != b->m || a->placement != b->placement)
    return 0;
  for (int r = 0; r < a->p; r++) {
    if (a->ranks[r].n != b->ranks[r].n)
      return 0;
    for (int i = 0; i < a->ranks[r].n; i++) {
      const zb_action *x = &a->ranks[r].actions[i], *y = &b->ranks[r].actions[i];
      if (x->op != y->op || x->peer != y->peer)
        return 0;
      if (x->op != ZB_OP_NONE && (x->stage != y->stage || x->mb != y->mb))
        return 0;
    }
  }
  return 1;
}

/* A sim result built by hand, independent of zb_simulate: times given per
 * rank as (start, end) pairs in list order. */
typedef struct hand_sim {
  zb_sim_result r;
  double *store;
} hand_sim;

static void hand_sim_init(hand_sim *h, const zb_schedule *s, const double *const *times) {
  memset(h, 0, sizeof *h);
  int total = 0;
  for (int k = 0; k < s->p; k++)
    total += s->ranks[k].n;
  h->store = calloc((size_t)(2 * total + 5 * s->p), sizeof(double));
  h->r.start = calloc((size_t)s->p, sizeof(double *));
  h->r.end = calloc((size_t)s->p, sizeof(double *));
  double *q = h->store;
  h->r.busy = q, q += s->p;
  h->r.span_start = q, q += s->p;
  h->r.span_end = q, q += s->p;
  h->r.peak_memory = q, q += s->p;
  h->r.peak_memory_units = q, q += s->p;
  h->r.p = s->p;
  for (int k = 0; k < s->p; k++) {
    h->r.start[k] = q, q += s->ranks[k].n;
    h->r.end[k] = q, q += s->ranks[k].n;
    for (int i = 0; i < s->ranks[k].n; i++) {
      h->r.start[k][i] = times[k][2 * i];
      h->r.end[k][i] = times[k][2 * i + 1];
      if (h->r.end[k][i] > h->r.makespan)
        h->r.makespan = h->r.end[k][i];
    }
  }
}

static void hand_sim_free(hand_sim *h) {
  free(h->store);
  free(h->r.start);
  free(h->r.end);
}

/* ---- action strings ------------------------------------------------------ */

static void test_action_roundtrip(void) {
  static const struct {
    const char *text;
    zb_op op;
    int stage, mb;
  } cases[] = {
      {"0F1", ZB_OP_F, 0, 1},
      {"2I0", ZB_OP_B, 2, 0},
      {"3W1", ZB_OP_W, 3, 1},
      {"1B0", ZB_OP_BW, 1, 0},
      {"1SEND_F0", ZB_OP_SEND_F, 1, 0},
      {"2RECV_F0", ZB_OP_RECV_F, 2, 0},
      {"1SEND_B0", ZB_OP_SEND_B, 1, 0},
      {"0RECV_B0", ZB_OP_RECV_B, 0, 0},
      {"0UNSHARD", ZB_OP_UNSHARD, 0, -1},
      {"0RESHARD", ZB_OP_RESHARD, 0, -1},
      {"0REDUCE_GRAD", ZB_OP_REDUCE_GRAD, 0, -1},
      {"12F345", ZB_OP_F, 12, 345},
      {"7W10", ZB_OP_W, 7, 10},
      {"131071I8388607", ZB_OP_B, ZB_MAX_STAGES, ZB_MAX_MICROBATCHES}, /* the most an action holds */
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    zb_action a;
    zb_diag d = {{0}};
    zb_err e = zb_action_parse(cases[k].text, &a, &d);
    CHECK_MSG(e == ZB_OK, "parse \"%s\": %s", cases[k].text, d.msg);
    CHECK_EQ(a.op, cases[k].op);
    CHECK_EQ(a.stage, cases[k].stage);
    CHECK_EQ(a.mb, cases[k].mb);
    CHECK_EQ(a.peer, -1);
    CHECK(!a.batch);
    char buf[64];
    int n = zb_action_format(&a, buf, (int)sizeof buf);
    CHECK_STREQ(buf, cases[k].text);
    CHECK_EQ(n, (int)strlen(cases[k].text));
  }
  /* NONE prints as the empty string (an empty CSV cell). */
  zb_action none = {.op = ZB_OP_NONE, .stage = -1, .mb = -1, .peer = -1};
  char buf[16] = "junk";
  CHECK_EQ(zb_action_format(&none, buf, (int)sizeof buf), 0);
  CHECK_STREQ(buf, "");
  /* snprintf-like truncation: full length returned, output cut and ended. */
  zb_action big = {.op = ZB_OP_SEND_F, .stage = 12, .mb = 345, .peer = 1};
  char small[5];
  CHECK_EQ(zb_action_format(&big, small, (int)sizeof small), 11);
  CHECK_STREQ(small, "12SE");
  CHECK_EQ(zb_action_format(&big, NULL, 0), 11);
}

static void test_action_malformed(void) {
  /* zb_action_parse("") is a parse error: only a CSV cell may be empty. */
  static const char *bad[] = {
      "",          "F1",   "0X1",      "0F",        "-1F0",     "0Fx",           "0SEND_F",
      " 0F1",      "0F1 ", "0F1x",     "01F1",      "0F01",     "0UNSHARD1",     "0REDUCE_GRAD0",
      "0f1",       "0I",   "+0F1",     "0F-1",      "0SEND_X0", "99999999999F0", "0F99999999999",
      "0UNSHARD_", "0,F1", "131072F0", "0F8388608", /* one past what an action's stage and microbatch hold */
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    zb_action a = {.op = ZB_OP_COUNT_, .stage = 77, .mb = 77, .peer = 77, .batch = true};
    zb_diag d = {{0}};
    zb_err e = zb_action_parse(bad[k], &a, &d);
    CHECK_MSG(e == ZB_ERR_PARSE, "\"%s\" parsed (err %d)", bad[k], (int)e);
    CHECK_MSG(a.op == ZB_OP_COUNT_ && a.stage == 77 && a.mb == 77 && a.peer == 77 && a.batch,
              "\"%s\": output touched on failure", bad[k]);
    CHECK_MSG(d.msg[0] != '\0', "\"%s\": no diagnostic", bad[k]);
    if (bad[k][0] && strlen(bad[k]) < 30)
      CHECK_MSG(strstr(d.msg, bad[k]) != NULL, "\"%s\": diagnostic does not name it: %s", bad[k], d.msg);
  }
  zb_action a;
  zb_diag d = {{0}};
  CHECK_EQ(zb_action_parse("0X1", &a, &d), ZB_ERR_PARSE);
  CHECK_MSG(strstr(d.msg, "expected a kind") && strstr(d.msg, "SEND_F"), "%s", d.msg);
  CHECK_EQ(zb_action_parse("0F", &a, &d), ZB_ERR_PARSE);
  CHECK_MSG(strstr(d.msg, "expected a microbatch"), "%s", d.msg);
  CHECK_EQ(zb_action_parse("F1", &a, &d), ZB_ERR_PARSE);
  CHECK_MSG(strstr(d.msg, "expected a stage"), "%s", d.msg);
  CHECK_EQ(zb_action_parse("0UNSHARD1", &a, &d), ZB_ERR_PARSE);
  CHECK_MSG(strstr(d.msg, "no microbatch"), "%s", d.msg);
  CHECK_EQ(zb_action_parse("", &a, &d), ZB_ERR_PARSE);
  CHECK_MSG(strstr(d.msg, "empty"), "%s", d.msg);
  /* past what an action holds: named with the limit, not cut to its low bits */
  CHECK_EQ(zb_action_parse("131073F0", &a, &d), ZB_ERR_PARSE);
  CHECK_MSG(strstr(d.msg, "stage number is too large (at most 131071)"), "%s", d.msg);
  CHECK_EQ(zb_action_parse("0B8388609", &a, &d), ZB_ERR_PARSE);
  CHECK_MSG(strstr(d.msg, "microbatch number is too large (at most 8388607)"), "%s", d.msg);
}

/* ---- CSV ------------------------------------------------------------------ */

static void test_csv_roundtrip_compute(void) {
  /* 1F1B with split backward on 2 ranks, 2 microbatches, built by hand. */
  zb_schedule *s = zb_schedule_new(2, 1, 2, ZB_PLACE_LOOP);
  zb_schedule_push_op(s, 0, ZB_OP_F, 0, 0);
  zb_schedule_push_op(s, 0, ZB_OP_F, 0, 1);
  zb_schedule_push_op(s, 0, ZB_OP_B, 0, 0);
  zb_schedule_push_op(s, 0, ZB_OP_W, 0, 0);
  zb_schedule_push_op(s, 0, ZB_OP_BW, 0, 1);
  zb_schedule_push_op(s, 1, ZB_OP_F, 1, 0);
  zb_schedule_push_op(s, 1, ZB_OP_B, 1, 0);
  zb_schedule_push_op(s, 1, ZB_OP_F, 1, 1);
  zb_schedule_push_op(s, 1, ZB_OP_B, 1, 1);
  zb_schedule_push_op(s, 1, ZB_OP_W, 1, 0);
  zb_schedule_push_op(s, 1, ZB_OP_W, 1, 1);
  zb_buf b = ZB_BUF_INIT;
  zb_csv_write(s, &b);
  const char *want = "0F0,0F1,0I0,0W0,0B1\n1F0,1I0,1F1,1I1,1W0,1W1\n";
  CHECK_STREQ(b.data, want);

  zb_schedule *t = NULL;
  zb_diag d = {{0}};
  CHECK_MSG(zb_csv_parse(b.data, b.len, ZB_PLACE_LOOP, &t, &d) == ZB_OK, "%s", d.msg);
  CHECK(same_schedule(s, t));
  zb_buf b2 = ZB_BUF_INIT;
  zb_csv_write(t, &b2);
  CHECK_EQ(b2.len, b.len);
  CHECK(memcmp(b2.data, b.data, b.len) == 0);
  zb_buf_free(&b);
  zb_buf_free(&b2);
  zb_schedule_free(s);
  zb_schedule_free(t);
}

static void test_csv_roundtrip_comm(void) {
  /* Lowered-looking 2-rank schedule with FSDP actions and empty cells. */
  const char *text = "0UNSHARD,0F0,0SEND_F0,,0RECV_B0,0I0,0W0,0RESHARD,0REDUCE_GRAD\n"
                     "1RECV_F0,1F0,1I0,1SEND_B0,1W0,,\n";
  zb_schedule *s = NULL;
  zb_diag d = {{0}};
  CHECK_MSG(zb_csv_parse(text, strlen(text), ZB_PLACE_LOOP, &s, &d) == ZB_OK, "%s", d.msg);
  CHECK_EQ(s->p, 2);
  CHECK_EQ(s->v, 1);
  CHECK_EQ(s->m, 1);
  CHECK_EQ(s->ranks[0].n, 9);
  CHECK_EQ(s->ranks[1].n, 7);
  CHECK_EQ(s->ranks[0].actions[3].op, ZB_OP_NONE);
  CHECK_EQ(s->ranks[1].actions[5].op, ZB_OP_NONE);
  CHECK_EQ(s->ranks[1].actions[6].op, ZB_OP_NONE);
  CHECK_EQ(s->ranks[0].actions[0].op, ZB_OP_UNSHARD);
  CHECK_EQ(s->ranks[0].actions[8].op, ZB_OP_REDUCE_GRAD);
  /* peers from placement */
  CHECK_EQ(s->ranks[0].actions[2].op, ZB_OP_SEND_F);
  CHECK_EQ(s->ranks[0].actions[2].peer, 1);
  CHECK_EQ(s->ranks[0].actions[4].op, ZB_OP_RECV_B);
  CHECK_EQ(s->ranks[0].actions[4].peer, 1);
  CHECK_EQ(s->ranks[1].actions[0].op, ZB_OP_RECV_F);
  CHECK_EQ(s->ranks[1].actions[0].peer, 0);
  CHECK_EQ(s->ranks[1].actions[3].op, ZB_OP_SEND_B);
  CHECK_EQ(s->ranks[1].actions[3].peer, 0);
  CHECK(zb_schedule_has_comm(s));
  zb_buf b = ZB_BUF_INIT;
  zb_csv_write(s, &b);
  CHECK_EQ(b.len, strlen(text));
  CHECK_STREQ(b.data, text);
  zb_buf_free(&b);

  /* A schedule built in code with comm actions writes and reads back. */
  zb_schedule *h = zb_schedule_new(2, 1, 1, ZB_PLACE_LOOP);
  zb_schedule_push_op(h, 0, ZB_OP_F, 0, 0);
  zb_schedule_push(h, 0, (zb_action){.op = ZB_OP_SEND_F, .stage = 0, .mb = 0, .peer = 1});
  zb_schedule_push(h, 0, (zb_action){.op = ZB_OP_RECV_B, .stage = 0, .mb = 0, .peer = 1});
  zb_schedule_push_op(h, 0, ZB_OP_BW, 0, 0);
  zb_schedule_push(h, 1, (zb_action){.op = ZB_OP_RECV_F, .stage = 1, .mb = 0, .peer = 0});
  zb_schedule_push_op(h, 1, ZB_OP_F, 1, 0);
  zb_schedule_push_op(h, 1, ZB_OP_BW, 1, 0);
  zb_schedule_push(h, 1, (zb_action){.op = ZB_OP_SEND_B, .stage = 1, .mb = 0, .peer = 0});
  zb_csv_write(h, &b);
  CHECK_STREQ(b.data, "0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n");
  zb_schedule *h2 = NULL;
  CHECK_MSG(zb_csv_parse(b.data, b.len, ZB_PLACE_LOOP, &h2, &d) == ZB_OK, "%s", d.msg);
  CHECK(same_schedule(h, h2));
  zb_buf b2 = ZB_BUF_INIT;
  zb_csv_write(h2, &b2);
  CHECK_STREQ(b2.data, b.data);
  zb_buf_free(&b);
  zb_buf_free(&b2);
  zb_schedule_free(h);
  zb_schedule_free(h2);
  zb_schedule_free(s);
}

static void test_csv_peers_by_placement(void) {
  /* p = 2, v = 2. Loop: stages 0,2 on rank 0 and 1,3 on rank 1.
   * V: stages 0,3 on rank 0 and 1,2 on rank 1. */
  const char *text =
      "0F0,2SEND_F0,2RECV_B0,2SEND_B0,0RECV_F0\n1F0,3RECV_F0,1SEND_F0,1RECV_B0,3SEND_B0,3SEND_F0\n";
  zb_schedule *l = NULL, *v = NULL;
  zb_diag d = {{0}};
  CHECK_MSG(zb_csv_parse(text, strlen(text), ZB_PLACE_LOOP, &l, &d) == ZB_OK, "%s", d.msg);
  CHECK_MSG(zb_csv_parse(text, strlen(text), ZB_PLACE_V, &v, &d) == ZB_OK, "%s", d.msg);
  CHECK_EQ(l->v, 2);
  CHECK_EQ(v->placement, ZB_PLACE_V);
  /* loop */
  CHECK_EQ(l->ranks[0].actions[1].peer, 1);  /* SEND_F s2 -> s3 on rank 1 */
  CHECK_EQ(l->ranks[0].actions[2].peer, 1);  /* RECV_B s2 <- s3 on rank 1 */
  CHECK_EQ(l->ranks[0].actions[3].peer, 1);  /* SEND_B s2 -> s1 on rank 1 */
  CHECK_EQ(l->ranks[0].actions[4].peer, -1); /* RECV_F s0: no stage before */
  CHECK_EQ(l->ranks[1].actions[1].peer, 0);  /* RECV_F s3 <- s2 on rank 0 */
  CHECK_EQ(l->ranks[1].actions[2].peer, 0);  /* SEND_F s1 -> s2 on rank 0 */
  CHECK_EQ(l->ranks[1].actions[3].peer, 0);  /* RECV_B s1 <- s2 on rank 0 */
  CHECK_EQ(l->ranks[1].actions[4].peer, 0);  /* SEND_B s3 -> s2 on rank 0 */
  CHECK_EQ(l->ranks[1].actions[5].peer, -1); /* SEND_F s3: no stage after */
  /* V */
  CHECK_EQ(v->ranks[0].actions[1].peer, 0);  /* SEND_F s2 -> s3 on rank 0 */
  CHECK_EQ(v->ranks[0].actions[2].peer, 0);  /* RECV_B s2 <- s3 on rank 0 */
  CHECK_EQ(v->ranks[0].actions[3].peer, 1);  /* SEND_B s2 -> s1 on rank 1 */
  CHECK_EQ(v->ranks[0].actions[4].peer, -1); /* RECV_F s0: no stage before */
  CHECK_EQ(v->ranks[1].actions[1].peer, 1);  /* RECV_F s3 <- s2 on rank 1 */
  CHECK_EQ(v->ranks[1].actions[2].peer, 1);  /* SEND_F s1 -> s2 on rank 1 */
  CHECK_EQ(v->ranks[1].actions[3].peer, 1);  /* RECV_B s1 <- s2 on rank 1 */
  CHECK_EQ(v->ranks[1].actions[4].peer, 1);  /* SEND_B s3 -> s2 on rank 1 */
  CHECK_EQ(v->ranks[1].actions[5].peer, -1); /* SEND_F s3: no stage after */
  /* The writer does not depend on peers: both write the same text. */
  zb_buf bl = ZB_BUF_INIT, bv = ZB_BUF_INIT;
  zb_csv_write(l, &bl);
  zb_csv_write(v, &bv);
  CHECK_STREQ(bl.data, text);
  CHECK_STREQ(bv.data, text);
  zb_buf_free(&bl);
  zb_buf_free(&bv);
  zb_schedule_free(l);
  zb_schedule_free(v);
}

static void test_csv_line_endings(void) {
  const char *lf = "0F0,0I0,0W0\n1F0,1I0,1W0\n";
  const char *crlf = "0F0,0I0,0W0\r\n1F0,1I0,1W0\r\n";
  const char *nofinal = "0F0,0I0,0W0\n1F0,1I0,1W0";
  const char *spaced = "0F0, 0I0 ,\t0W0\n1F0,1I0,1W0\n";
  zb_schedule *a = NULL, *b = NULL, *c = NULL, *e = NULL;
  zb_diag d = {{0}};
  CHECK_MSG(zb_csv_parse(lf, strlen(lf), ZB_PLACE_LOOP, &a, &d) == ZB_OK, "%s", d.msg);
  CHECK_MSG(zb_csv_parse(crlf, strlen(crlf), ZB_PLACE_LOOP, &b, &d) == ZB_OK, "%s", d.msg);
  CHECK_MSG(zb_csv_parse(nofinal, strlen(nofinal), ZB_PLACE_LOOP, &c, &d) == ZB_OK, "%s", d.msg);
  CHECK_MSG(zb_csv_parse(spaced, strlen(spaced), ZB_PLACE_LOOP, &e, &d) == ZB_OK, "%s", d.msg);
  CHECK_EQ(a->p, 2);
  CHECK(same_schedule(a, b));
  CHECK(same_schedule(a, c));
  CHECK(same_schedule(a, e));
  /* The writer always uses '\n' after every row. */
  zb_buf w = ZB_BUF_INIT;
  zb_csv_write(b, &w);
  CHECK_STREQ(w.data, lf);
  zb_buf_free(&w);
  zb_csv_write(c, &w);
  CHECK_STREQ(w.data, lf);
  zb_buf_free(&w);
  /* len bounds the text: the parser must not read past it. */
  zb_schedule *f = NULL;
  CHECK_MSG(zb_csv_parse(lf, 12, ZB_PLACE_LOOP, &f, &d) == ZB_OK, "%s", d.msg);
  CHECK_EQ(f->p, 1);
  CHECK_EQ(f->ranks[0].n, 3);
  zb_schedule_free(a);
  zb_schedule_free(b);
  zb_schedule_free(c);
  zb_schedule_free(e);
  zb_schedule_free(f);
}

/* Shapes past the CSV limits are refused before anything is allocated for
 * them (each of these once aborted on allocation). */
static void test_csv_too_large(void) {
  static const char *const texts[] = {"2147483646F0\n", "0F2147483646\n", "0F0,1F1048576\n"};
  for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
    zb_schedule *s = NULL;
    zb_diag d = {{0}};
    CHECK_EQ(zb_csv_parse(texts[k], strlen(texts[k]), ZB_PLACE_INFER, &s, &d), ZB_ERR_PARSE);
    CHECK_MSG(strstr(d.msg, "too large") != NULL, "%s: %s", texts[k], d.msg);
    CHECK(s == NULL);
  }
  /* 5000 rows, one action each */
  size_t n = 5000 * 16;
  char *many = malloc(n);
  size_t len = 0;
  for (int r = 0; r < 5000; r++)
    len += (size_t)snprintf(many + len, n - len, "%dF0\n", r);
  zb_schedule *s = NULL;
  zb_diag d = {{0}};
  CHECK_EQ(zb_csv_parse(many, len, ZB_PLACE_INFER, &s, &d), ZB_ERR_PARSE);
  CHECK_MSG(strstr(d.msg, "5000 rows") != NULL, "%s", d.msg);
  free(many);
}

static void test_csv_errors(void) {
  static const struct {
    const char *text;
    zb_placement pl;
    const char *need1, *need2;
  } cases[] = {
      {"0F0,0X1\n", ZB_PLACE_LOOP, "row 1, column 2", "0X1"},
      {"0F0,0I0\n1F0,1I0,1Q0\n", ZB_PLACE_LOOP, "row 2, column 3", "1Q0"},
      {"0F0\r\n1F0\r\n2F0,,2F\r\n", ZB_PLACE_LOOP, "row 3, column 3", "expected a microbatch"},
      {"0F0\n1F0\n2F0,3F0\n", ZB_PLACE_LOOP, "not a multiple", "3 rows"},
      {"0F0\n1F0\n", ZB_PLACE_V, "V placement needs 2", NULL},
      {"", ZB_PLACE_LOOP, "empty", NULL},
      {",,\n,\n", ZB_PLACE_LOOP, "no actions", NULL},
      {"0UNSHARD\n1UNSHARD\n", ZB_PLACE_LOOP, "microbatch", NULL},
      {"0F0,\"0F1\"\n", ZB_PLACE_LOOP, "row 1, column 2", NULL},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    zb_schedule dummy;
    zb_schedule *sentinel = &dummy, *out = sentinel;
    zb_diag d = {{0}};
    zb_err e = zb_csv_parse(cases[k].text, strlen(cases[k].text), cases[k].pl, &out, &d);
    CHECK_MSG(e == ZB_ERR_PARSE, "case %zu parsed (err %d)", k, (int)e);
    CHECK_MSG(out == sentinel, "case %zu: output touched on failure", k);
    CHECK_MSG(strstr(d.msg, cases[k].need1), "case %zu: \"%s\" not in: %s", k, cases[k].need1, d.msg);
    if (cases[k].need2)
      CHECK_MSG(strstr(d.msg, cases[k].need2), "case %zu: \"%s\" not in: %s", k, cases[k].need2, d.msg);
  }
  zb_schedule *out = NULL;
  CHECK_EQ(zb_csv_parse("0F0\n", 4, ZB_PLACE_LOOP, NULL, NULL), ZB_ERR_INVALID_ARG);
  CHECK_EQ(zb_csv_parse(NULL, 4, ZB_PLACE_LOOP, &out, NULL), ZB_ERR_INVALID_ARG);
  CHECK(out == NULL);
}

/* ---- torchtitan files ---------------------------------------------------- */

static void check_torchtitan(const char *name, int p, int v, int m) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", ZB_TEST_DATA_DIR, name);
  size_t len = 0;
  char *text = read_file(path, &len);
  CHECK_MSG(text != NULL, "cannot read %s", path);
  /* These files end every row with '\n', so the round trip is exact. */
  CHECK_MSG(len > 0 && text[len - 1] == '\n', "%s: expected a final newline", name);
  zb_schedule *s = NULL;
  zb_diag d = {{0}};
  zb_err e = zb_csv_parse(text, len, ZB_PLACE_LOOP, &s, &d);
  if (e != ZB_OK) {
    free(text);
    ZBT_FAIL("%s: %s", name, d.msg);
  }
  CHECK_EQ(s->p, p);
  CHECK_EQ(s->v, v);
  CHECK_EQ(s->m, m);
  CHECK(!zb_schedule_has_comm(s));
  CHECK(zb_schedule_splits_w(s));
  CHECK_EQ(total_compute(s), 3 * p * v * m);
  zb_buf b = ZB_BUF_INIT;
  zb_csv_write(s, &b);
  int same = b.len == len && memcmp(b.data, text, len) == 0;
  zb_buf_free(&b);
  free(text);
  CHECK_MSG(same, "%s: CSV written back differs from the file", name);

  zb_violation viol;
  memset(&viol, 0, sizeof viol);
  e = zb_validate(s, NULL, &viol);
  char vbuf[256] = "";
  if (e != ZB_OK)
    zb_violation_format(&viol, vbuf, (int)sizeof vbuf);
  CHECK_MSG(e == ZB_OK && viol.kind == ZB_VIOL_NONE, "%s: %s", name, vbuf);

  zb_rank_costs rc = zb_rank_costs_default();
  zb_costs *c = zb_costs_from_rank_share(p, v, &rc, 0);
  zb_sim_result *sim = NULL;
  e = zb_simulate(s, c, &sim, &d);
  CHECK_MSG(e == ZB_OK, "%s: simulate: %s", name, d.msg);
  CHECK(sim->makespan >= m * 3.0 - 1e-9);
  CHECK(sim->bubble_ratio >= 0 && sim->bubble_ratio < 1);
  zb_sim_result_free(sim);
  zb_costs_free(c);
  zb_schedule_free(s);
}

static void test_torchtitan_2rank(void) {
  check_torchtitan("2-rank.csv", 2, 2, 8);
}
static void test_torchtitan_4rank(void) {
  check_torchtitan("4-rank.csv", 4, 2, 6);
}
static void test_torchtitan_8rank(void) {
  check_torchtitan("8-rank.csv", 8, 1, 10);
}

/* ---- JSON, trace, SVG, ASCII ---------------------------------------------- */

/* Loads a torchtitan file and simulates it with unit costs. */
static int load_and_simulate(const char *name, zb_schedule **s, zb_costs **c, zb_sim_result **sim) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", ZB_TEST_DATA_DIR, name);
  size_t len = 0;
  char *text = read_file(path, &len);
  if (!text)
    return -1;
  zb_diag d = {{0}};
  zb_err e = zb_csv_parse(text, len, ZB_PLACE_LOOP, s, &d);
  free(text);
  if (e != ZB_OK)
    return -1;
  zb_rank_costs rc = zb_rank_costs_default();
  *c = zb_costs_from_rank_share((*s)->p, (*s)->v, &rc, 0);
  if (zb_simulate(*s, *c, sim, &d) != ZB_OK) {
    zb_schedule_free(*s);
    zb_costs_free(*c);
    return -1;
  }
  return 0;
}

static void test_json_report(void) {
  CHECK_MSG(have_tool("python3"), "python3 not found: needed to check JSON");
  zb_schedule *s;
  zb_costs *c;
  zb_sim_result *sim;
  CHECK_MSG(load_and_simulate("4-rank.csv", &s, &c, &sim) == 0, "load/simulate 4-rank.csv");
  zb_rank_costs rc = zb_rank_costs_default();
  zb_plan_report with = {.schedule = "torchtitan \"4-rank\"",
                         .sched = s,
                         .costs = c,
                         .rank_costs = &rc,
                         .mem_limit_units = 2.5,
                         .sim = sim,
                         .generation_seconds = 0.25};
  zb_plan_report bare = {.schedule = NULL, .sched = s};
  zb_buf b = ZB_BUF_INIT, b2 = ZB_BUF_INIT;
  zb_json_write(&with, &b);
  zb_json_write(&bare, &b2);
  char path[64], path2[64];
  CHECK(write_temp(b.data, b.len, "json", path, sizeof path) == 0);
  CHECK(write_temp(b2.data, b2.len, "json", path2, sizeof path2) == 0);
  int rc1 =
      run_python("import json,sys\n"
                 "d = json.load(open(sys.argv[1]))\n"
                 "assert d[\"schedule\"] == \"torchtitan \\\"4-rank\\\"\", d[\"schedule\"]\n"
                 "assert (d[\"ranks\"], d[\"chunks\"], d[\"microbatches\"]) == (4, 2, 6)\n"
                 "assert d[\"placement\"] == \"loop\"\n"
                 "assert d[\"costs\"] == {\"t_f\": 1, \"t_b\": 1, \"t_w\": 1, \"m_f\": 1, \"m_b\": -0.5,"
                 " \"m_w\": -0.5, \"t_comm\": 0}, d[\"costs\"]\n"
                 "assert d[\"mem_limit\"] == 2.5\n"
                 "assert d[\"makespan\"] > 0 and 0 <= d[\"bubble_ratio\"] < 1\n"
                 "assert isinstance(d[\"bubble_ratio_paper\"], (int, float))\n"
                 "assert len(d[\"peak_memory\"]) == 4 and all(x > 0 for x in d[\"peak_memory\"])\n"
                 "assert d[\"generation_seconds\"] == 0.25\n"
                 "assert len(d[\"actions\"]) == 4 and d[\"actions\"][0][:2] == [\"0F0\", \"0F1\"]\n"
                 "assert sum(len(r) for r in d[\"actions\"]) == 3 * 4 * 2 * 6\n"
                 "assert d[\"actions\"][3][-1] == \"7W5\"\n",
                 path);
  int rc2 =
      run_python("import json,sys\n"
                 "d = json.load(open(sys.argv[1]))\n"
                 "assert d[\"schedule\"] is None and d[\"costs\"] is None and d[\"mem_limit\"] is None\n"
                 "assert d[\"makespan\"] is None and d[\"peak_memory\"] is None\n"
                 "assert len(d[\"actions\"]) == 4\n",
                 path2);
  /* The report's numbers must agree with the simulation. */
  char expect[64];
  snprintf(expect, sizeof expect, "\"makespan\": %.12g", sim->makespan);
  int has_makespan = strstr(b.data, expect) != NULL;
  remove(path);
  remove(path2);
  zb_buf_free(&b);
  zb_buf_free(&b2);
  zb_sim_result_free(sim);
  zb_costs_free(c);
  zb_schedule_free(s);
  CHECK_MSG(rc1 == 0, "full JSON report failed python's checks");
  CHECK_MSG(rc2 == 0, "bare JSON report failed python's checks");
  CHECK_MSG(has_makespan, "makespan missing or wrong: want %s", expect);
}

static void test_trace(void) {
  CHECK_MSG(have_tool("python3"), "python3 not found: needed to check JSON");
  zb_schedule *s;
  zb_costs *c;
  zb_sim_result *sim;
  CHECK_MSG(load_and_simulate("2-rank.csv", &s, &c, &sim) == 0, "load/simulate 2-rank.csv");
  zb_buf b = ZB_BUF_INIT;
  zb_trace_write(s, sim, &b);
  char path[64];
  CHECK(write_temp(b.data, b.len, "json", path, sizeof path) == 0);
  char code[1024];
  snprintf(code, sizeof code,
           "import json,sys\n"
           "d = json.load(open(sys.argv[1]))\n"
           "ev = d[\"traceEvents\"]\n"
           "x = [e for e in ev if e[\"ph\"] == \"X\"]\n"
           "assert len(x) == %d, len(x)\n"
           "names = sorted(e[\"args\"][\"name\"] for e in ev if e[\"name\"] == \"thread_name\")\n"
           "assert names == [\"rank 0\", \"rank 1\"], names\n"
           "assert all(e[\"pid\"] == 0 and e[\"tid\"] in (0, 1) for e in x)\n"
           "assert all(e[\"ts\"] >= 0 and e[\"dur\"] > 0 for e in x)\n"
           "assert max(e[\"ts\"] + e[\"dur\"] for e in x) == %.12g\n"
           "f = [e for e in x if e[\"args\"][\"action\"] == \"2I3\"]\n"
           "assert len(f) == 1 and f[0][\"name\"] == \"B s2 mb3\" and f[0][\"tid\"] == 0, f\n"
           "assert f[0][\"dur\"] == 500, f\n",
           total_compute(s), sim->makespan * 1000.0);
  int rc = run_python(code, path);
  remove(path);
  zb_buf_free(&b);
  /* Without a simulation the trace is still valid JSON, with no events. */
  zb_trace_write(s, NULL, &b);
  CHECK(write_temp(b.data, b.len, "json", path, sizeof path) == 0);
  int rc_empty =
      run_python("import json,sys\nassert json.load(open(sys.argv[1]))[\"traceEvents\"] == []\n", path);
  remove(path);
  zb_buf_free(&b);
  zb_sim_result_free(sim);
  zb_costs_free(c);
  zb_schedule_free(s);
  CHECK_MSG(rc == 0, "trace failed python's checks");
  CHECK_MSG(rc_empty == 0, "empty trace is not valid JSON");
}

static void test_svg(void) {
  CHECK_MSG(have_tool("xmllint"), "xmllint not found (Debian package libxml2-utils)");
  CHECK_MSG(have_tool("rsvg-convert"), "rsvg-convert not found (Debian package librsvg2-bin)");
  zb_schedule *s;
  zb_costs *c;
  zb_sim_result *sim;
  CHECK_MSG(load_and_simulate("4-rank.csv", &s, &c, &sim) == 0, "load/simulate 4-rank.csv");
  zb_buf b = ZB_BUF_INIT;
  zb_svg_write(s, sim, &b);
  int n_ops = total_compute(s);
  double makespan = sim->makespan;
  zb_sim_result_free(sim);
  zb_costs_free(c);
  zb_schedule_free(s);

  CHECK(strstr(b.data, "<svg xmlns=\"http://www.w3.org/2000/svg\"") != NULL);
  CHECK(strstr(b.data, "viewBox=\"0 0 ") != NULL);
  /* one titled rect per compute op, a lane label per rank, a title line */
  CHECK_EQ(count_substr(b.data, "<title>"), n_ops);
  CHECK_EQ(count_substr(b.data, ">rank "), 4);
  char head[64];
  snprintf(head, sizeof head, "makespan %g", makespan);
  CHECK_MSG(strstr(b.data, head) && strstr(b.data, "bubble_ratio "), "title line lacks headline figures");
  CHECK(strstr(b.data, "PyTorch I") != NULL); /* legend */

  char svg[64];
  CHECK(write_temp(b.data, b.len, "svg", svg, sizeof svg) == 0);
  zb_buf_free(&b);
  char png[80], cmd[512];
  snprintf(png, sizeof png, "%s.png", svg);
  snprintf(cmd, sizeof cmd, "xmllint --noout '%s'", svg);
  int xml_rc = system(cmd);
  snprintf(cmd, sizeof cmd, "rsvg-convert -o '%s' '%s'", png, svg);
  int rsvg_rc = system(cmd);
  size_t png_len = 0;
  char *png_data = read_file(png, &png_len);
  static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  int png_ok = png_data && png_len > 8 && memcmp(png_data, sig, 8) == 0;
  free(png_data);
  remove(svg);
  remove(png);
  CHECK_MSG(xml_rc == 0, "xmllint rejected the SVG");
  CHECK_MSG(rsvg_rc == 0, "rsvg-convert failed");
  CHECK_MSG(png_ok, "rsvg-convert wrote no PNG (%zu bytes)", png_len);
}

static void test_ascii_exact(void) {
  /* p = 2, m = 1, unit times, T_comm = 0, by hand:
   * rank 0: F [0,1)            B [3,4) W [4,5)
   * rank 1:       F [1,2) B [2,3) W [3,4)          */
  zb_schedule *s = zb_schedule_new(2, 1, 1, ZB_PLACE_LOOP);
  zb_schedule_push_op(s, 0, ZB_OP_F, 0, 0);
  zb_schedule_push_op(s, 0, ZB_OP_B, 0, 0);
  zb_schedule_push_op(s, 0, ZB_OP_W, 0, 0);
  zb_schedule_push_op(s, 1, ZB_OP_F, 1, 0);
  zb_schedule_push_op(s, 1, ZB_OP_B, 1, 0);
  zb_schedule_push_op(s, 1, ZB_OP_W, 1, 0);
  static const double t0[] = {0, 1, 3, 4, 4, 5}, t1[] = {1, 2, 2, 3, 3, 4};
  const double *const times[2] = {t0, t1};
  hand_sim h;
  hand_sim_init(&h, s, times);
  h.r.bubble_ratio = 0.4;
  h.r.bubble_ratio_paper = 0.25;
  h.r.peak_memory_units[0] = 1;
  h.r.peak_memory_units[1] = 1;

  zb_buf b = ZB_BUF_INIT;
  zb_ascii_write(s, &h.r, 5, &b);
  const char *want5 = "rank  0 |F..BW|\n"
                      "rank  1 |.FBW.|\n"
                      "         0   5\n";
  CHECK_MSG(strncmp(b.data, want5, strlen(want5)) == 0, "got:\n%s", b.data);
  CHECK(strstr(b.data, "legend: F forward") != NULL);
  CHECK(strstr(b.data, "lowercase") == NULL); /* v = 1 */
  CHECK(strstr(b.data, "makespan 5  bubble_ratio 0.4000 (global)  bubble_ratio_paper 0.2500") != NULL);
  CHECK(strstr(b.data, "peak memory (M_F units): 1 1\n") != NULL);
  zb_buf_free(&b);

  zb_ascii_write(s, &h.r, 10, &b);
  CHECK_MSG(strncmp(b.data, "rank  0 |FF....BBWW|\nrank  1 |..FFBBWW..|\n", 42) == 0, "got:\n%s", b.data);
  zb_buf_free(&b);

  /* Columns not aligned with op boundaries (5 units over 4 columns): each
   * column shows the op running at its midpoint (0.625, 1.875, ...). */
  zb_ascii_write(s, &h.r, 4, &b);
  CHECK_MSG(strncmp(b.data, "rank  0 |F.BW|\nrank  1 |.FW.|\n", 30) == 0, "got:\n%s", b.data);
  zb_buf_free(&b);

  /* width <= 0 means 100 columns */
  zb_ascii_write(s, &h.r, 0, &b);
  const char *nl = strchr(b.data, '\n');
  CHECK(nl != NULL);
  CHECK_EQ(nl - b.data, (long)strlen("rank  0 |") + 100 + 1);
  int f_cols = 0;
  for (const char *p = b.data; *p && strncmp(p, "rank ", 5) == 0; p = strchr(p, '\n') + 1)
    for (const char *q = p; *q != '\n'; q++)
      f_cols += *q == 'F';
  CHECK_EQ(f_cols, 2 * 20); /* one unit of 5 is 20 of 100 columns, per rank */
  zb_buf_free(&b);

  /* The SVG of a hand-made result is well formed too and has 6 boxes. */
  zb_svg_write(s, &h.r, &b);
  CHECK_EQ(count_substr(b.data, "<title>"), 6);
  CHECK(strstr(b.data, "makespan 5, bubble_ratio 0.4000") != NULL);
  zb_buf_free(&b);
  hand_sim_free(&h);
  zb_schedule_free(s);
}

static void test_ascii_chunks(void) {
  zb_schedule *s;
  zb_costs *c;
  zb_sim_result *sim;
  CHECK_MSG(load_and_simulate("2-rank.csv", &s, &c, &sim) == 0, "load/simulate 2-rank.csv");
  zb_buf b = ZB_BUF_INIT;
  zb_ascii_write(s, sim, 120, &b);
  /* chunk 0 (stages 0, 1) upper case, chunk 1 (stages 2, 3) lower case */
  const char *r0 = strstr(b.data, "rank  0 |");
  const char *r1 = strstr(b.data, "rank  1 |");
  CHECK(r0 && r1);
  const char *e0 = strchr(r0, '\n');
  int upper = 0, lower = 0;
  for (const char *p = r0; p < e0; p++) {
    upper += *p == 'F' || *p == 'B' || *p == 'W';
    lower += *p == 'f' || *p == 'b' || *p == 'w';
  }
  CHECK(upper > 0 && lower > 0);
  CHECK(strstr(b.data, "lowercase: chunk >= 1") != NULL);
  zb_buf_free(&b);
  zb_sim_result_free(sim);
  zb_costs_free(c);
  zb_schedule_free(s);
}

/* The drawings from a starts-only simulation (zb_simulate_starts: ends
 * from each op's time, zb_sim_end) are those from a full one, byte for
 * byte, under uneven per-stage costs; and a result with neither ends nor
 * op times draws nothing, as one without times does. */
static void test_drawings_from_starts(void) {
  zb_schedule *s;
  zb_costs *c;
  zb_sim_result *full;
  CHECK_MSG(load_and_simulate("4-rank.csv", &s, &c, &full) == 0, "load/simulate 4-rank.csv");
  zb_sim_result_free(full);
  for (int k = 0; k < c->n_stages; k++)
    c->t_f[k] = 1 + 0.25 * (k % 3), c->t_b[k] = 1.5 + 0.1 * k, c->t_w[k] = 0.7;
  zb_sim_result *starts = NULL;
  CHECK(zb_simulate(s, c, &full, NULL) == ZB_OK && zb_simulate_starts(s, c, &starts, NULL) == ZB_OK);
  CHECK(starts->end == NULL && starts->op_time != NULL);
  for (int kind = 0; kind < 3; kind++) {
    zb_buf a = ZB_BUF_INIT, b = ZB_BUF_INIT;
    void (*draw)(const zb_schedule *, const zb_sim_result *, zb_buf *) =
        kind == 0 ? zb_trace_write : zb_svg_write;
    if (kind == 2) {
      zb_ascii_write(s, full, 90, &a);
      zb_ascii_write(s, starts, 90, &b);
    } else {
      draw(s, full, &a);
      draw(s, starts, &b);
    }
    CHECK_MSG(a.len > 200 && a.len == b.len && memcmp(a.data, b.data, a.len) == 0, "drawing %d differs",
              kind);
    zb_buf_free(&a);
    zb_buf_free(&b);
  }
  free(starts->op_time); /* neither ends nor op times: nothing to draw with */
  starts->op_time = NULL;
  zb_buf t = ZB_BUF_INIT;
  zb_trace_write(s, starts, &t);
  CHECK(strstr(t.data, "\"ph\": \"X\"") == NULL);
  zb_buf_free(&t);
  zb_sim_result_free(starts);
  zb_sim_result_free(full);
  zb_costs_free(c);
  zb_schedule_free(s);
}

ZBT_MAIN(ZBT(test_drawings_from_starts), ZBT(test_csv_too_large), ZBT(test_action_roundtrip),
         ZBT(test_action_malformed), ZBT(test_csv_roundtrip_compute), ZBT(test_csv_roundtrip_comm),
         ZBT(test_csv_peers_by_placement), ZBT(test_csv_line_endings), ZBT(test_csv_errors),
         ZBT(test_torchtitan_2rank), ZBT(test_torchtitan_4rank), ZBT(test_torchtitan_8rank),
         ZBT(test_json_report), ZBT(test_trace), ZBT(test_svg), ZBT(test_ascii_exact), ZBT(test_ascii_chunks))
