/* The cpu compute backend (worker/zb_backend.h, "cpu"): real math on the
 * worker's data path.
 *   - Pipelined against unpipelined: for every schedule family of libzb
 *     (zb_family, eleven) at p = 2 and 4 ranks, p threads of this process each run their
 *     lowered list through the executor, with a tcp transport on 127.0.0.1
 *     (real sockets) and a cpu backend; the loss and every parameter
 *     gradient of every stage must equal those of the same model and
 *     microbatches computed in one process on one stage (F, B, W per
 *     microbatch): per tensor ||g - g_ref|| / ||g_ref|| <= PIPE_TOL = 1e-5,
 *     and |loss - loss_ref| <= 1e-5 |loss_ref| (fp32).
 *   - A second iteration over the same tokens gives the same loss and
 *     gradients bit for bit (begin_iteration zeroes them), and one over the
 *     next iteration's tokens those of the reference for that data.
 *   - A wrong bytes_per_activation is refused, naming both sizes.
 *   - Peak state bytes per rank follow the simulator's peak memory within
 *     MEM_TOL = 10%, for nine families (not zb-interleaved, dualpipe-v) planned with the model's
 *     profiled memory deltas (profile_memory): between ranks, between each
 *     family and 1f1b rank by rank, and zb-v's highest rank against
 *     1f1b's.
 * A watchdog raises the stop flag, so a hang fails naming "stopped". */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "zb_alloc.h"
#include "zb_backend_cpu.h"
#include "zb_clock.h"
#include "zb_executor.h"
#include "zb_lower.h"
#include "zb_plan.h"
#include "zb_sim.h"
#include "zbtest.h"
#include "zbtest_job.h"

#define PIPE_TOL 1e-5
#define MEM_TOL 0.10
#define MAXP 4
#define MAXV 2
#define ITERS 2
#define WATCHDOG_S 60.0

/* The text the default data source samples windows from. */
static const char corpus[] =
    "A pipeline scheduler is only trustworthy if the pipelined run computes exactly what the unpipelined "
    "one would. Zero-bubble schedules split the backward pass into the gradient with respect to the input "
    "and the gradient with respect to the weights, and fill the bubbles of one-forward-one-backward with "
    "the latter. Every stage keeps what its backward needs from the forward until its weight gradient ran; "
    "the memory a rank holds follows from the order of its operations.";

static void sleep_s(double s) {
  struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

/* ---- data and parameters -------------------------------------------- */

static zb_cpu_text text_source(void) {
  return (zb_cpu_text){.text = (const uint8_t *)corpus, .len = sizeof corpus - 1, .seed = 17};
}

/* A data source that reads the text at iteration 0 whatever the iteration:
 * every iteration sees the same tokens. */
static zb_err same_tokens_fill(void *ud, int64_t iteration, int mb, int batch, int seq_len, uint8_t *tokens,
                               uint8_t *targets, zb_diag *diag) {
  (void)iteration;
  return zb_backend_cpu_text_fill(ud, 0, mb, batch, seq_len, tokens, targets, diag);
}

/* Sets every parameter of st from (tensor name, index) alone, so each
 * partition holds the same model: weights ~ U(-0.2, 0.2), biases ~
 * U(-0.05, 0.05), LayerNorm gains ~ 1 + U(-0.2, 0.2). Non-zero biases and
 * non-unit gains leave no gradient term hidden behind a 0 or a 1. */
static void randomize(zb_model_stage *st) {
  for (int i = 0; i < zb_model_n_tensors(st); i++) {
    const zb_model_tensor *t = zb_model_tensor_at(st, i);
    uint64_t key = 0xcbf29ce484222325ULL;
    for (const char *c = t->name; *c; c++)
      key = (key ^ (uint8_t)*c) * 0x100000001b3ULL;
    int is_ln = strstr(t->name, "ln") != NULL, is_bias = strstr(t->name, ".bias") != NULL;
    for (size_t k = 0; k < t->numel; k++) {
      float r = zbt_urand(key, k);
      t->param[k] = is_bias ? 0.05f * r : is_ln ? 1.0f + 0.2f * r : 0.2f * r;
    }
  }
}

static zb_model_config tiny_model(int layers, int m) {
  return (zb_model_config){.hidden = 16,
                           .heads = 2,
                           .layers = layers,
                           .seq_len = 8,
                           .batch = 2,
                           .seed = 5,
                           .loss_scale = 1.0f / (float)m};
}

/* ---- the unpipelined reference --------------------------------------- */

typedef struct reference {
  zb_model_stage *st; /* one stage: the whole model */
  double loss;        /* mean over the microbatches */
} reference;

/* The same model (randomize) and microbatches (data at `iteration`) on one
 * stage: F, B, W of each microbatch in turn, the gradients accumulating in
 * the stage. Returns false (after printing why) when an op fails. */
static bool reference_make(reference *r, const zb_model_config *cfg, const zb_cpu_data *data,
                           int64_t iteration, int m) {
  zb_diag d = {{0}};
  memset(r, 0, sizeof *r);
  if (zb_model_stage_new(cfg, 0, 1, &r->st, &d) != ZB_OK) {
    fprintf(stderr, "  reference: %s\n", d.msg);
    return false;
  }
  randomize(r->st);
  size_t nt = (size_t)cfg->batch * (size_t)cfg->seq_len;
  uint8_t *tok = zb_malloc(nt), *tgt = zb_malloc(nt);
  int32_t *ids = zb_malloc(2 * nt * sizeof *ids); /* tokens, then targets, as the backend widens them */
  bool ok = true;
  for (int i = 0; i < m && ok; i++) {
    float loss = 0;
    ok = data->fill(data->ud, iteration, i, cfg->batch, cfg->seq_len, tok, tgt, &d) == ZB_OK;
    for (size_t k = 0; ok && k < nt; k++)
      ids[k] = tok[k], ids[nt + k] = tgt[k];
    ok = ok && zb_model_forward(r->st, i, ids, NULL, ids + nt, NULL, &loss, &d) == ZB_OK &&
         zb_model_backward_b(r->st, i, NULL, NULL, &d) == ZB_OK && zb_model_backward_w(r->st, i, &d) == ZB_OK;
    r->loss += (double)loss;
  }
  r->loss /= m;
  if (!ok)
    fprintf(stderr, "  reference: %s\n", d.msg);
  free(tok);
  free(tgt);
  free(ids);
  return ok;
}

static void reference_free(reference *r) {
  zb_model_stage_free(r->st);
  r->st = NULL;
}

static double max_rel_seen; /* over every comparison, for the summary line */

/* Compares every tensor of b's stages with the reference; returns the
 * number of mismatches (printed) and adds the tensors seen to *n_tensors. */
static int compare_grads(zb_backend *b, const reference *r, const char *label, int *n_tensors) {
  int bad = 0;
  for (int i = 0; i < zb_backend_cpu_n_stages(b); i++) {
    int s;
    zb_model_stage *st = zb_backend_cpu_stage(b, i, &s);
    for (int k = 0; k < zb_model_n_tensors(st); k++) {
      const zb_model_tensor *t = zb_model_tensor_at(st, k), *rt = zb_model_find_tensor(r->st, t->name);
      double rel = rt && rt->numel == t->numel
                       ? zbt_norm2(t->grad, rt->grad, t->numel) / zbt_norm2(rt->grad, NULL, t->numel)
                       : INFINITY;
      max_rel_seen = rel > max_rel_seen ? rel : max_rel_seen;
      if (!(rel <= PIPE_TOL)) {
        fprintf(stderr, "  %s: %s on stage %d: |g - g_ref| / |g_ref| = %.3e\n", label, t->name, s, rel);
        bad++;
      }
      (*n_tensors)++;
    }
  }
  return bad;
}

/* ---- ranks as threads --------------------------------------------------- */

typedef struct rank_ctx {
  int rank, p;
  const zbt_job *j;
  zb_transport *t;
  zb_backend *b;
  const char *const *addrs;
  size_t bpa;
  int iterations;
  atomic_bool *stop;
  atomic_int *finished;
  zb_err err;
  zb_diag diag;
  int done;
  zb_rank_iteration it[ITERS];
  float *grads[ITERS]; /* every hosted stage's gradients after each iteration, in stage order */
  size_t n_grads;
  double loss[ITERS];
  int loss_count[ITERS];
} rank_ctx;

/* Copies every hosted stage's gradients into one array; caller frees. */
static float *snapshot_grads(zb_backend *b, size_t *n) {
  size_t total = 0;
  for (int i = 0; i < zb_backend_cpu_n_stages(b); i++)
    total += zb_model_n_params(zb_backend_cpu_stage(b, i, NULL));
  float *g = zb_malloc(sizeof(float) * (total ? total : 1)), *at = g;
  for (int i = 0; i < zb_backend_cpu_n_stages(b); i++) {
    zb_model_stage *st = zb_backend_cpu_stage(b, i, NULL);
    memcpy(at, zb_model_grads(st), sizeof(float) * zb_model_n_params(st));
    at += zb_model_n_params(st);
  }
  *n = total;
  return g;
}

/* One rank: connect, then one iteration at a time (begin_iteration first,
 * as the worker will), keeping what each iteration left. */
static void *rank_main(void *arg) {
  rank_ctx *c = arg;
  const zb_rank_list *l = &c->j->lowered->ranks[c->rank];
  bool peers[MAXP];
  zb_executor_peers(l->actions, l->n, c->p, peers);
  zb_executor *e = NULL;
  c->err = zb_transport_connect(c->t, (const char *const *)c->addrs, peers, 10.0, &c->diag);
  if (!c->err) {
    zb_executor_config cfg = {.rank = c->rank,
                              .nranks = c->p,
                              .actions = l->actions,
                              .n_actions = l->n,
                              .costs = c->j->costs,
                              .bytes_per_activation = c->bpa,
                              .stop = c->stop};
    c->err = zb_executor_new(&cfg, c->b, c->t, &e, &c->diag);
  }
  for (int k = 0; !c->err && k < c->iterations; k++) {
    c->err = zb_backend_cpu_begin_iteration(c->b, k, &c->diag);
    if (!c->err)
      c->err = zb_executor_run_iteration(e, k, &c->it[k], &c->diag);
    if (c->err)
      break;
    c->grads[k] = snapshot_grads(c->b, &c->n_grads);
    c->loss_count[k] = -1;
    if (zb_backend_cpu_find_stage(c->b, c->j->S - 1))
      zb_backend_cpu_loss(c->b, &c->loss[k], &c->loss_count[k], NULL);
    c->done++;
  }
  zb_executor_free(e);
  atomic_fetch_add(c->finished, 1);
  return NULL;
}

typedef struct ranks {
  int p;
  rank_ctx c[MAXP];
  char addr[MAXP][96];
  const char *addrs[MAXP];
  atomic_bool stop;
  atomic_int finished;
  bool watchdog_fired;
} ranks;

/* Creates p tcp transports on 127.0.0.1:0 and cpu backends for j's
 * placement over model `cfg` with data `data`, each stage's parameters set
 * by randomize. The executors get bytes_per_activation bpa. */
static bool ranks_init(ranks *rs, const zbt_job *j, const zb_model_config *cfg, zb_cpu_data data, size_t bpa,
                       int iterations) {
  memset(rs, 0, sizeof *rs);
  rs->p = j->p;
  atomic_init(&rs->stop, false);
  atomic_init(&rs->finished, 0);
  for (int r = 0; r < j->p; r++) {
    rank_ctx *c = &rs->c[r];
    zb_diag d = {{0}};
    int stages[MAXP * MAXV];
    zb_tcp_config tc = {.rank = r, .nranks = j->p, .listen = "127.0.0.1:0", .session = 7, .stop = &rs->stop};
    zb_cpu_backend_config bc = {.rank = r,
                                .stages = stages,
                                .n_stages = zbt_job_stages(j, r, stages),
                                .total_stages = j->S,
                                .model = *cfg,
                                .data = data,
                                .stop = &rs->stop};
    if (zb_transport_tcp_new(&tc, &c->t, &d) != ZB_OK || zb_backend_cpu_new(&bc, &c->b, &d) != ZB_OK) {
      fprintf(stderr, "  rank %d: %s\n", r, d.msg);
      return false;
    }
    for (int i = 0; i < zb_backend_cpu_n_stages(c->b); i++)
      randomize(zb_backend_cpu_stage(c->b, i, NULL));
    snprintf(rs->addr[r], sizeof rs->addr[r], "%s", zb_transport_address(c->t));
    rs->addrs[r] = rs->addr[r];
    c->rank = r;
    c->p = j->p;
    c->j = j;
    c->addrs = rs->addrs;
    c->bpa = bpa;
    c->iterations = iterations;
    c->stop = &rs->stop;
    c->finished = &rs->finished;
  }
  return true;
}

/* Runs every rank to its end; the watchdog raises the stop flag after
 * WATCHDOG_S. */
static void ranks_run(ranks *rs) {
  pthread_t th[MAXP];
  for (int r = 0; r < rs->p; r++)
    pthread_create(&th[r], NULL, rank_main, &rs->c[r]);
  double t0 = zb_clock_s();
  while (atomic_load(&rs->finished) < rs->p) {
    if (zb_clock_s() - t0 >= WATCHDOG_S && !rs->watchdog_fired) {
      rs->watchdog_fired = true;
      atomic_store(&rs->stop, true);
    }
    sleep_s(0.002);
  }
  for (int r = 0; r < rs->p; r++)
    pthread_join(th[r], NULL);
}

static void ranks_free(ranks *rs) {
  for (int r = 0; r < rs->p; r++) {
    zb_transport_free(rs->c[r].t);
    zb_backend_free(rs->c[r].b);
    for (int k = 0; k < ITERS; k++)
      free(rs->c[r].grads[k]);
  }
  memset(rs, 0, sizeof *rs); /* a later ranks_free (after a failed setup) finds nothing to free */
}

/* Whether every rank completed its iterations (prints the first failure). */
static bool ranks_ok(const ranks *rs) {
  bool ok = !rs->watchdog_fired;
  for (int r = 0; r < rs->p; r++)
    if (rs->c[r].err != ZB_OK || rs->c[r].done != rs->c[r].iterations) {
      fprintf(stderr, "  rank %d: %s (%d iterations done)\n", r, rs->c[r].diag.msg, rs->c[r].done);
      ok = false;
    }
  return ok;
}

/* The rank that hosts the last stage. */
static int last_rank(const zbt_job *j) {
  return zb_placement_rank(j->placement, j->p, j->v, j->S - 1);
}

/* ---- the data source ----------------------------------------------------- */

static void test_text_source(void) {
  zb_cpu_text t = text_source();
  uint8_t tok[2][4 * 8], tgt[2][4 * 8];
  zb_diag d = {{0}};
  CHECK(zb_backend_cpu_text_fill(&t, 3, 1, 4, 8, tok[0], tgt[0], NULL) == ZB_OK);
  CHECK(zb_backend_cpu_text_fill(&t, 3, 1, 4, 8, tok[1], tgt[1], NULL) == ZB_OK);
  CHECK(memcmp(tok[0], tok[1], sizeof tok[0]) == 0 && memcmp(tgt[0], tgt[1], sizeof tgt[0]) == 0);
  for (int j = 0; j < 4; j++) { /* a window of the text; targets: the next byte of each */
    const uint8_t *w = tok[0] + 8 * j;
    const char *at = NULL;
    for (size_t off = 0; off + 9 <= t.len && !at; off++)
      if (memcmp(corpus + off, w, 8) == 0 && memcmp(corpus + off + 1, tgt[0] + 8 * j, 8) == 0)
        at = corpus + off;
    CHECK_MSG(at, "sequence %d is not a window of the text with its next bytes as targets", j);
  }
  /* another iteration, microbatch or seed samples elsewhere */
  int differ = 0;
  CHECK(zb_backend_cpu_text_fill(&t, 4, 1, 4, 8, tok[1], tgt[1], NULL) == ZB_OK);
  differ += memcmp(tok[0], tok[1], sizeof tok[0]) != 0;
  CHECK(zb_backend_cpu_text_fill(&t, 3, 2, 4, 8, tok[1], tgt[1], NULL) == ZB_OK);
  differ += memcmp(tok[0], tok[1], sizeof tok[0]) != 0;
  t.seed++;
  CHECK(zb_backend_cpu_text_fill(&t, 3, 1, 4, 8, tok[1], tgt[1], NULL) == ZB_OK);
  differ += memcmp(tok[0], tok[1], sizeof tok[0]) != 0;
  CHECK_EQ(differ, 3);
  t.len = 8; /* a window of 8 needs 9 bytes */
  CHECK(zb_backend_cpu_text_fill(&t, 0, 0, 1, 8, tok[0], tgt[0], &d) == ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "8 bytes") != NULL);
  t.len = 9;
  CHECK(zb_backend_cpu_text_fill(&t, 0, 0, 1, 8, tok[0], tgt[0], NULL) == ZB_OK);
  CHECK(memcmp(tok[0], corpus, 8) == 0 && memcmp(tgt[0], corpus + 1, 8) == 0);
}

/* ---- one rank, every stage local: the hand-offs without a transport ----- */

/* S = 3 stages on one backend, driven by submit directly in a GPipe-like
 * order with BW on the middle stage: F of stage s reads s-1's output and B
 * of s reads s+1's dx in place. Against the reference, then again after
 * begin_iteration. */
static void test_local_handoff(void) {
  const int m = 3, S = 3;
  zb_model_config cfg = tiny_model(4, m);
  zb_cpu_text t = text_source();
  zb_cpu_data data = {zb_backend_cpu_text_fill, &t, NULL};
  int stages[3] = {2, 0, 1}; /* any order */
  zb_cpu_backend_config bc = {.stages = stages, .n_stages = S, .total_stages = S, .model = cfg, .data = data};
  zb_backend *b = NULL;
  zb_diag d = {{0}};
  CHECK_MSG(zb_backend_cpu_new(&bc, &b, &d) == ZB_OK, "%s", d.msg);
  CHECK_EQ(zb_backend_cpu_n_stages(b), 3);
  CHECK_STREQ(zb_backend_name(b), "cpu");
  for (int i = 0; i < S; i++) {
    int s = -1;
    zb_model_stage *st = zb_backend_cpu_stage(b, i, &s);
    CHECK_EQ(s, i); /* ascending */
    CHECK(st == zb_backend_cpu_find_stage(b, i));
    randomize(st);
  }
  CHECK(zb_backend_cpu_find_stage(b, 3) == NULL);
  for (int iteration = 0; iteration < 2; iteration++) {
    reference ref;
    CHECK(reference_make(&ref, &cfg, &data, iteration, m));
    CHECK(zb_backend_cpu_begin_iteration(b, iteration, &d) == ZB_OK);
    for (int i = 0; i < m; i++)
      for (int s = 0; s < S; s++)
        CHECK_MSG(zb_backend_submit(b, ZB_OP_F, s, i, &d) == ZB_OK, "%s", d.msg);
    for (int i = m - 1; i >= 0; i--) {
      CHECK_MSG(zb_backend_submit(b, ZB_OP_B, 2, i, &d) == ZB_OK, "%s", d.msg);
      CHECK_MSG(zb_backend_submit(b, ZB_OP_BW, 1, i, &d) == ZB_OK, "%s", d.msg);
      CHECK_MSG(zb_backend_submit(b, ZB_OP_B, 0, i, &d) == ZB_OK, "%s", d.msg);
    }
    for (int i = 0; i < m; i++) {
      CHECK(zb_backend_submit(b, ZB_OP_W, 0, i, &d) == ZB_OK);
      CHECK(zb_backend_submit(b, ZB_OP_W, 2, i, &d) == ZB_OK);
    }
    CHECK(zb_backend_sync(b, &d) == ZB_OK);
    double loss;
    int count, n_tensors = 0;
    CHECK(zb_backend_cpu_loss(b, &loss, &count, &d) == ZB_OK);
    CHECK_EQ(count, m);
    CHECK_MSG(fabs(loss - ref.loss) <= PIPE_TOL * fabs(ref.loss), "loss %.9g, reference %.9g", loss,
              ref.loss);
    CHECK_EQ(compare_grads(b, &ref, "local hand-off", &n_tensors), 0);
    CHECK_EQ(n_tensors, zb_model_n_tensors(ref.st));
    zb_backend_stats bs;
    zb_backend_take_stats(b, &bs);
    CHECK(bs.busy_f > 0 && bs.busy_b > 0 && bs.busy_w > 0);
    CHECK_EQ(bs.mem_bytes, 0);
    CHECK(bs.peak_bytes > 0);
    zb_cpu_backend_mem mem;
    CHECK(zb_backend_cpu_mem(b, &mem, &d) == ZB_OK);
    CHECK_EQ(mem.state_bytes, 0);
    CHECK(mem.peak_state_bytes >= bs.peak_bytes);
    /* the hand-offs read the producer's SEND slots (stages 0-1 for F, 1-2
     * for B): no RECV slot was needed */
    CHECK_EQ(mem.slot_bytes, 4 * m * (int64_t)zb_backend_cpu_bytes_per_activation(&cfg));
    CHECK(mem.param_bytes > 0 && mem.workspace_bytes > 0);
    reference_free(&ref);
  }
  zb_backend_free(b);
}

/* ---- waiting for a CPU --------------------------------------------------- */

static atomic_bool spin_on;

static void *spin(void *arg) {
  (void)arg;
  while (atomic_load(&spin_on))
    ;
  return NULL;
}

/* Runs F then BW of m microbatches on a one-stage backend; *bs: the stats
 * after. */
static void run_ops(zb_backend *b, int m, int iteration, zb_backend_stats *bs) {
  zb_diag d = {{0}};
  memset(bs, 0, sizeof *bs);
  CHECK(zb_backend_cpu_begin_iteration(b, iteration, &d) == ZB_OK);
  for (int i = 0; i < m; i++)
    CHECK_MSG(zb_backend_submit(b, ZB_OP_F, 0, i, &d) == ZB_OK, "%s", d.msg);
  for (int i = 0; i < m; i++)
    CHECK_MSG(zb_backend_submit(b, ZB_OP_BW, 0, i, &d) == ZB_OK, "%s", d.msg);
  CHECK(zb_backend_sync(b, &d) == ZB_OK);
  zb_backend_take_stats(b, bs);
}

/* Host syncs per iteration are a constant, not one per microbatch: F
 * leaves each loss on the device and the loss read takes them all at once
 * (docs/model.md, Host syncs). Counted over F, BW, the end sync and the
 * loss read of m = 2 and m = 6 on one stage that holds the head. */
static void syncs_of_iteration(zb_backend *b, int m, int iteration, int64_t *syncs) {
  zb_diag d = {{0}};
  *syncs = -1;
  zb_backend_stats bs;
  zb_backend_take_stats(b, &bs); /* a fresh interval */
  CHECK(zb_backend_cpu_begin_iteration(b, iteration, &d) == ZB_OK);
  for (int i = 0; i < m; i++)
    CHECK_MSG(zb_backend_submit(b, ZB_OP_F, 0, i, &d) == ZB_OK, "%s", d.msg);
  for (int i = 0; i < m; i++)
    CHECK_MSG(zb_backend_submit(b, ZB_OP_BW, 0, i, &d) == ZB_OK, "%s", d.msg);
  CHECK(zb_backend_sync(b, &d) == ZB_OK);
  double loss;
  int count = 0;
  CHECK_MSG(zb_backend_cpu_loss(b, &loss, &count, &d) == ZB_OK, "%s", d.msg);
  CHECK_EQ(count, m);
  zb_backend_take_stats(b, &bs);
  *syncs = bs.host_syncs;
}

static void test_host_syncs_constant(void) {
  zb_model_config cfg = tiny_model(2, 6);
  zb_cpu_text t = text_source();
  int stage = 0;
  zb_cpu_backend_config bc = {.stages = &stage,
                              .n_stages = 1,
                              .total_stages = 1,
                              .model = cfg,
                              .data = {zb_backend_cpu_text_fill, &t, NULL}};
  zb_backend *b = NULL;
  zb_diag d = {{0}};
  CHECK_MSG(zb_backend_cpu_new(&bc, &b, &d) == ZB_OK, "%s", d.msg);
  if (!b)
    return;
  int64_t two, six;
  syncs_of_iteration(b, 2, 0, &two);
  syncs_of_iteration(b, 6, 1, &six);
  CHECK_MSG(two == six && two >= 1 && two <= 2, "host syncs: %lld with m = 2, %lld with m = 6",
            (long long)two, (long long)six);
  zb_backend_free(b);
}

/* The ops' wall time less their thread CPU time is reported as cpu_wait, a
 * part of the busy time: within it always, and most of it when twice as
 * many spinning threads as cores compete with the ops for the CPU. */
static void test_cpu_wait(void) {
  const int m = 4;
  zb_model_config cfg = tiny_model(2, m);
  cfg.hidden = 256; /* ops of tens of ms, longer than a scheduler's time slice */
  cfg.heads = 4;
  cfg.seq_len = 128;
  cfg.batch = 4;
  zb_cpu_text t = text_source();
  int stage = 0;
  zb_cpu_backend_config bc = {.stages = &stage,
                              .n_stages = 1,
                              .total_stages = 1,
                              .model = cfg,
                              .data = {zb_backend_cpu_text_fill, &t}};
  zb_backend *b = NULL;
  zb_diag d = {{0}};
  CHECK_MSG(zb_backend_cpu_new(&bc, &b, &d) == ZB_OK, "%s", d.msg);
  zb_backend_stats quiet, busy_cpu;
  run_ops(b, m, 0, &quiet);
  double busy = quiet.busy_f + quiet.busy_b + quiet.busy_w;
  CHECK_MSG(quiet.cpu_wait >= 0 && quiet.cpu_wait <= busy, "cpu_wait %g of busy %g", quiet.cpu_wait, busy);

  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int n = (int)(cores > 0 && cores < 64 ? 2 * cores : 8);
  pthread_t th[128];
  atomic_store(&spin_on, true);
  for (int i = 0; i < n; i++)
    CHECK(pthread_create(&th[i], NULL, spin, NULL) == 0);
  run_ops(b, m, 1, &busy_cpu);
  atomic_store(&spin_on, false);
  for (int i = 0; i < n; i++)
    pthread_join(th[i], NULL);
  busy = busy_cpu.busy_f + busy_cpu.busy_b + busy_cpu.busy_w;
  printf("cpu_wait: %.4f s of %.4f s busy alone; %.4f s of %.4f s beside %d spinning threads on %ld cores\n",
         quiet.cpu_wait, quiet.busy_f + quiet.busy_b + quiet.busy_w, busy_cpu.cpu_wait, busy, n, cores);
  CHECK_MSG(busy_cpu.cpu_wait > 0.2 * busy && busy_cpu.cpu_wait <= busy, "cpu_wait %g of busy %g",
            busy_cpu.cpu_wait, busy);
  zb_backend_free(b);
}

/* ---- errors ---------------------------------------------------------- */

static void test_errors(void) {
  const int m = 2;
  zb_model_config cfg = tiny_model(2, m);
  size_t bpa = zb_backend_cpu_bytes_per_activation(&cfg);
  CHECK_EQ(bpa, 2 * 8 * 16 * 4);
  zb_diag d = {{0}};
  zb_backend *b = NULL;
  int two[2] = {1, 1}, bad[1] = {4}, mid[1] = {1}, last[1] = {3};
  zb_cpu_backend_config bc = {.rank = 1, .stages = two, .n_stages = 2, .total_stages = 4, .model = cfg};
  CHECK(zb_backend_cpu_new(&bc, &b, &d) == ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "twice") != NULL);
  bc.stages = bad;
  bc.n_stages = 1;
  CHECK(zb_backend_cpu_new(&bc, &b, &d) == ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "stage 4") != NULL);
  bc.stages = last;
  CHECK(zb_backend_cpu_new(&bc, &b, &d) == ZB_ERR_INVALID_ARG); /* the last stage needs targets */
  CHECK(strstr(d.msg, "data source") != NULL);
  bc.model.hidden = 15; /* not a multiple of heads */
  bc.stages = mid;
  CHECK(zb_backend_cpu_new(&bc, &b, &d) == ZB_ERR_INVALID_ARG);
  bc.model = cfg;

  /* a middle stage (no data needed) */
  atomic_bool stop;
  atomic_init(&stop, false);
  bc.stop = &stop;
  CHECK_MSG(zb_backend_cpu_new(&bc, &b, &d) == ZB_OK, "%s", d.msg);
  void *buf = NULL;
  CHECK(zb_backend_buffer(b, ZB_OP_RECV_F, 1, 0, bpa + 4, &buf, &d) == ZB_ERR_INVALID_ARG);
  char want[64], got[64];
  snprintf(want, sizeof want, "%zu", bpa);
  snprintf(got, sizeof got, "%zu", bpa + 4);
  CHECK_MSG(strstr(d.msg, want) && strstr(d.msg, got) && strstr(d.msg, "bytes_per_activation"),
            "message names neither size: %s", d.msg);
  CHECK(zb_backend_buffer(b, ZB_OP_RECV_F, 0, 0, bpa, &buf, &d) == ZB_ERR_INVALID_ARG); /* not hosted */
  CHECK(zb_backend_buffer(b, ZB_OP_F, 1, 0, bpa, &buf, &d) == ZB_ERR_INVALID_ARG);
  CHECK(zb_backend_submit(b, ZB_OP_F, 2, 0, &d) == ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "does not host") != NULL);
  CHECK(zb_backend_submit(b, ZB_OP_SEND_F, 1, 0, &d) == ZB_ERR_INVALID_ARG);
  /* ops before their inputs: F before RECV_F, a send before its op */
  CHECK(zb_backend_submit(b, ZB_OP_F, 1, 0, &d) == ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "RECV_F from stage 0") != NULL, "%s", d.msg);
  CHECK(zb_backend_buffer(b, ZB_OP_SEND_F, 1, 0, bpa, &buf, &d) == ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "before its F") != NULL, "%s", d.msg);
  CHECK(zb_backend_buffer(b, ZB_OP_RECV_F, 1, 0, bpa, &buf, &d) == ZB_OK);
  memset(buf, 0, bpa);
  CHECK_MSG(zb_backend_submit(b, ZB_OP_F, 1, 0, &d) == ZB_OK, "%s", d.msg);
  CHECK(zb_backend_buffer(b, ZB_OP_SEND_F, 1, 0, bpa, &buf, &d) == ZB_OK);
  CHECK(zb_backend_submit(b, ZB_OP_B, 1, 0, &d) == ZB_ERR_INVALID_ARG); /* no RECV_B yet */
  CHECK(zb_backend_submit(b, ZB_OP_W, 1, 0, &d) == ZB_ERR_INVALID_ARG); /* the model: W before B */
  CHECK_MSG(strstr(d.msg, "cpu backend") != NULL, "%s", d.msg);
  /* a new iteration drops the state left in flight; the old RECV_F is stale */
  CHECK(zb_backend_cpu_begin_iteration(b, 1, &d) == ZB_OK);
  zb_cpu_backend_mem mem;
  CHECK(zb_backend_cpu_mem(b, &mem, &d) == ZB_OK);
  CHECK_EQ(mem.state_bytes, 0);
  CHECK_EQ(mem.slot_bytes, 3 * (int64_t)bpa); /* RECV_F, SEND_F, RECV_B of mb 0 */
  CHECK(zb_backend_submit(b, ZB_OP_F, 1, 0, &d) == ZB_ERR_INVALID_ARG);
  double loss;
  CHECK(zb_backend_cpu_loss(b, &loss, NULL, &d) == ZB_ERR_INVALID_ARG); /* not the last stage */
  atomic_store(&stop, true);
  CHECK(zb_backend_buffer(b, ZB_OP_RECV_F, 1, 0, bpa, &buf, &d) == ZB_OK);
  CHECK(zb_backend_submit(b, ZB_OP_F, 1, 0, &d) == ZB_ERR_IO);
  CHECK(strstr(d.msg, "stopped") != NULL);
  zb_backend_free(b);

  /* the getters refuse another backend */
  zb_costs *costs = zb_costs_new(1);
  zb_sim_backend_config sc = {.costs = costs, .bytes_per_activation = 16};
  CHECK(zb_backend_sim_new(&sc, &b, &d) == ZB_OK);
  CHECK(zb_backend_cpu_begin_iteration(b, 0, &d) == ZB_ERR_INVALID_ARG);
  CHECK(zb_backend_cpu_loss(b, &loss, NULL, &d) == ZB_ERR_INVALID_ARG);
  CHECK(zb_backend_cpu_mem(b, &mem, &d) == ZB_ERR_INVALID_ARG);
  CHECK_EQ(zb_backend_cpu_n_stages(b), 0);
  CHECK(zb_backend_cpu_stage(b, 0, NULL) == NULL && zb_backend_cpu_find_stage(b, 0) == NULL);
  zb_backend_free(b);
  zb_costs_free(costs);
  zb_backend_free(NULL);
}

/* The executor with a bytes_per_activation other than the model's: every
 * rank fails at its first exchange, the message names both sizes. */
static void test_wrong_bpa_executor(void) {
  zbt_job j;
  CHECK(zbt_job_make(ZB_FAMILY_1F1B, 2, 2, NULL, &j));
  zb_model_config cfg = tiny_model(2, 2);
  zb_cpu_text t = text_source();
  size_t bpa = zb_backend_cpu_bytes_per_activation(&cfg), wrong = bpa / 2;
  static ranks rs;
  CHECK(ranks_init(&rs, &j, &cfg, (zb_cpu_data){zb_backend_cpu_text_fill, &t, NULL}, wrong, 1));
  ranks_run(&rs);
  CHECK(!rs.watchdog_fired);
  char a[32], b[32];
  snprintf(a, sizeof a, "%zu", bpa);
  snprintf(b, sizeof b, "%zu", wrong);
  int named = 0;
  for (int r = 0; r < 2; r++) {
    CHECK(rs.c[r].err != ZB_OK);
    named += rs.c[r].err == ZB_ERR_INVALID_ARG && strstr(rs.c[r].diag.msg, a) && strstr(rs.c[r].diag.msg, b);
  }
  CHECK_MSG(named >= 1, "rank 0: %s / rank 1: %s", rs.c[0].diag.msg, rs.c[1].diag.msg);
  ranks_free(&rs);
  zbt_job_free(&j);
}

/* ---- pipelined against unpipelined ------------------------------------- */

/* Runs family f at p ranks, m = 2p microbatches, ITERS iterations over the
 * same tokens; checks iteration 0 against the reference and iteration 1
 * against iteration 0. Returns -1 when the family cannot serve the shape,
 * 0 when everything matched, 1 on a failure (printed). */
static int run_family(zb_family f, int p) {
  int m = 2 * p;
  zbt_job j;
  if (!zbt_job_make(f, p, m, NULL, &j)) {
    zbt_job_free(&j);
    return -1;
  }
  zb_model_config cfg = tiny_model(p == 2 ? 2 * j.S : j.S, m);
  zb_cpu_text t = text_source();
  zb_cpu_data data = {same_tokens_fill, &t, NULL};
  static ranks rs;
  reference ref;
  char label[64];
  snprintf(label, sizeof label, "%s p=%d v=%d m=%d", zb_family_name(f), p, j.v, m);
  bool ok = reference_make(&ref, &cfg, &data, 0, m) &&
            ranks_init(&rs, &j, &cfg, data, zb_backend_cpu_bytes_per_activation(&cfg), ITERS);
  if (ok) {
    ranks_run(&rs);
    ok = ranks_ok(&rs);
  }
  int bad = 0, n_tensors = 0;
  double loss = NAN;
  if (ok) {
    const rank_ctx *lc = &rs.c[last_rank(&j)];
    loss = lc->loss[0];
    if (lc->loss_count[0] != m || !(fabs(loss - ref.loss) <= PIPE_TOL * fabs(ref.loss))) {
      fprintf(stderr, "  %s: loss %.9g over %d microbatches, reference %.9g\n", label, loss,
              lc->loss_count[0], ref.loss);
      bad++;
    }
    for (int r = 0; r < p; r++) {
      const rank_ctx *c = &rs.c[r];
      bad += compare_grads(c->b, &ref, label, &n_tensors);
      /* iteration 1 (the live gradients) equals iteration 0, bit for bit */
      if (memcmp(c->grads[0], c->grads[1], sizeof(float) * c->n_grads) != 0 || c->loss[0] != c->loss[1]) {
        fprintf(stderr, "  %s: rank %d: iteration 1 differs from iteration 0 on the same tokens\n", label, r);
        bad++;
      }
      for (int k = 0; k < ITERS; k++) {
        zb_cpu_backend_mem mem;
        zb_backend_cpu_mem(c->b, &mem, NULL);
        if (c->it[k].peak_memory_bytes <= 0 || c->it[k].busy_f_seconds <= 0 || c->it[k].busy_b_seconds <= 0 ||
            c->it[k].busy_w_seconds <= 0 || mem.state_bytes != 0 ||
            c->it[k].peak_memory_bytes > mem.peak_state_bytes) {
          fprintf(stderr, "  %s: rank %d iteration %d: busy %.6f/%.6f/%.6f s, peak %lld bytes, %lld held\n",
                  label, r, k, c->it[k].busy_f_seconds, c->it[k].busy_b_seconds, c->it[k].busy_w_seconds,
                  (long long)c->it[k].peak_memory_bytes, (long long)mem.state_bytes);
          bad++;
        }
      }
    }
    if (n_tensors != zb_model_n_tensors(ref.st)) {
      fprintf(stderr, "  %s: %d tensors over the ranks, the model has %d\n", label, n_tensors,
              zb_model_n_tensors(ref.st));
      bad++;
    }
  }
  if (getenv("ZB_TEST_VERBOSE") || !ok || bad)
    printf("    %-22s layers %2d: loss %.6f (ref %.6f) %s\n", label, cfg.layers, loss, ref.loss,
           ok && !bad ? "equal" : "MISMATCH");
  if (ref.st)
    reference_free(&ref);
  ranks_free(&rs);
  zbt_job_free(&j);
  return ok && bad == 0 ? 0 : 1;
}

static void test_families(void) {
  static const zb_family required[] = {ZB_FAMILY_GPIPE, ZB_FAMILY_1F1B,  ZB_FAMILY_INTERLEAVED_1F1B,
                                       ZB_FAMILY_ZB_H1, ZB_FAMILY_ZB_H2, ZB_FAMILY_ZB_V};
  bool ran[ZB_FAMILY_COUNT_][MAXP + 1] = {{false}};
  int failures = 0;
  for (int f = 0; f < ZB_FAMILY_COUNT_; f++)
    for (int p = 2; p <= MAXP; p += 2) {
      int rc = run_family((zb_family)f, p);
      ran[f][p] = rc >= 0;
      failures += rc > 0;
    }
  CHECK_EQ(failures, 0);
  for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
    for (int p = 2; p <= MAXP; p += 2)
      CHECK_MSG(ran[required[i]][p], "%s p=%d did not run", zb_family_name(required[i]), p);
  printf("    largest per-tensor |g - g_ref| / |g_ref|: %.3e (bound %.0e)\n", max_rel_seen, PIPE_TOL);
}

/* Iteration 1 with the plain text source samples new tokens: its loss and
 * gradients are the reference's for iteration 1's data (so begin_iteration
 * zeroed the gradients and passed the iteration to the data source). */
static void test_next_iteration_data(void) {
  zbt_job j;
  CHECK(zbt_job_make(ZB_FAMILY_ZB_H1, 2, 4, NULL, &j));
  zb_model_config cfg = tiny_model(4, 4);
  zb_cpu_text t = text_source();
  zb_cpu_data data = {zb_backend_cpu_text_fill, &t, NULL};
  reference ref0, ref1;
  CHECK(reference_make(&ref0, &cfg, &data, 0, 4) && reference_make(&ref1, &cfg, &data, 1, 4));
  static ranks rs;
  CHECK(ranks_init(&rs, &j, &cfg, data, zb_backend_cpu_bytes_per_activation(&cfg), 2));
  ranks_run(&rs);
  CHECK(ranks_ok(&rs));
  const rank_ctx *lc = &rs.c[last_rank(&j)];
  CHECK_MSG(fabs(lc->loss[0] - ref0.loss) <= PIPE_TOL * ref0.loss, "%.9g vs %.9g", lc->loss[0], ref0.loss);
  CHECK_MSG(fabs(lc->loss[1] - ref1.loss) <= PIPE_TOL * ref1.loss, "%.9g vs %.9g", lc->loss[1], ref1.loss);
  CHECK(fabs(ref0.loss - ref1.loss) > 1e-3); /* the data did change */
  int n_tensors = 0;
  for (int r = 0; r < 2; r++)
    CHECK_EQ(compare_grads(rs.c[r].b, &ref1, "zb-h1 iteration 1", &n_tensors), 0);
  CHECK_EQ(n_tensors, zb_model_n_tensors(ref1.st));
  ranks_free(&rs);
  reference_free(&ref0);
  reference_free(&ref1);
  zbt_job_free(&j);
}

/* ---- memory ------------------------------------------------------------ */

/* The shape of the memory test: 32 layers, so every stage of every
 * family's partition (4 or 8 stages) holds blocks, and the last stage's
 * head (its probabilities, N*vocab floats) stays near 5% of a stage's F
 * state. Unfused attention: B frees the T x T probabilities, so M_B < 0 as
 * the plan's memory model requires (lib/zb_schedule.c). With the host's
 * flash attention B frees only a log-sum-exp per row and keeps four [N, h]
 * gradients for W: M_B is positive (+0.27 here) and a plan made from the
 * profile is refused (docs/model.md, Flash attention (host)). */
static zb_model_config memory_model(int m) {
  return (zb_model_config){.hidden = 32,
                           .heads = 4,
                           .layers = 32,
                           .seq_len = 128,
                           .batch = 1,
                           .seed = 3,
                           .loss_scale = 1.0f / (float)m,
                           .attn_unfused = 1};
}

/* The model's memory deltas, profiled as a service would: one microbatch
 * through a stage of blocks only, the state bytes after F (M_F), what B
 * adds (M_B: it frees the attention probabilities and LayerNorm
 * statistics but keeps every linear's output gradient for W; negative
 * here, since H*T > 4h) and what W frees (M_W = -(M_F + M_B)), in units of
 * M_F. The plans below are made with these, as zb-auto and the V families
 * would be from profiled costs; the unit defaults (M_B = M_W = -0.5) put
 * zb-h1's last rank at 0.625 of rank 0 where this model holds 0.74. */
static zb_rank_costs profile_memory(void) {
  zb_model_config cfg = memory_model(1);
  zb_model_stage *st = NULL;
  zb_rank_costs rc = zb_rank_costs_default();
  zb_diag d = {{0}};
  if (zb_model_stage_new(&cfg, 1, 4, &st, &d) != ZB_OK) {
    fprintf(stderr, "  profile: %s\n", d.msg);
    zbt_failed_checks++;
    return rc;
  }
  size_t n = zb_model_act_numel(st);
  float *x = zb_malloc(sizeof(float) * n), *y = zb_malloc(sizeof(float) * n),
        *dx = zb_malloc(sizeof(float) * n);
  for (size_t i = 0; i < n; i++)
    x[i] = y[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
  int64_t after_f = -1, after_b = -1;
  if (zb_model_forward(st, 0, NULL, x, NULL, dx, NULL, &d) == ZB_OK) {
    after_f = zb_model_mb_bytes(st, 0);
    if (zb_model_backward_b(st, 0, y, dx, &d) == ZB_OK)
      after_b = zb_model_mb_bytes(st, 0);
  }
  /* (CHECK returns from the function: count failures by hand here) */
  if (!(after_f > 0 && after_b > 0 && zb_model_backward_w(st, 0, &d) == ZB_OK &&
        zb_model_mb_bytes(st, 0) == 0)) {
    fprintf(stderr, "  profile: F %lld B, then B %lld B, W: %s\n", (long long)after_f, (long long)after_b,
            d.msg);
    zbt_failed_checks++;
  } else {
    rc.m_f = 1.0;
    rc.m_b = (double)(after_b - after_f) / (double)after_f;
    rc.m_w = -(double)after_b / (double)after_f;
  }
  free(x);
  free(y);
  free(dx);
  zb_model_stage_free(st);
  return rc;
}

/* Runs f at p = 4, m = 8 on memory_model, planned with the memory deltas
 * mem, and writes each rank's measured peak state bytes (iteration 0, the
 * executor's peak_memory_bytes) and the simulator's peak (in units of the
 * rank's M_F). */
static bool run_memory(zb_family f, const zb_rank_costs *mem, int64_t *peak, double *sim_units) {
  const int p = 4, m = 8;
  zbt_job j;
  if (!zbt_job_make(f, p, m, mem, &j)) {
    zbt_job_free(&j);
    return false;
  }
  zb_model_config cfg = memory_model(m);
  zb_cpu_text t = text_source();
  static ranks rs;
  bool ok = ranks_init(&rs, &j, &cfg, (zb_cpu_data){zb_backend_cpu_text_fill, &t, NULL},
                       zb_backend_cpu_bytes_per_activation(&cfg), 1);
  if (ok) {
    ranks_run(&rs);
    ok = ranks_ok(&rs);
  }
  for (int r = 0; ok && r < p; r++) {
    peak[r] = rs.c[r].it[0].peak_memory_bytes;
    sim_units[r] = j.sim->peak_memory_units[r];
  }
  ranks_free(&rs);
  zbt_job_free(&j);
  return ok;
}

/* Measured peaks follow the plan's within MEM_TOL, for every family at
 * p = 4, m = 8: between ranks (rank r's peak / rank 0's), and between
 * schedules (rank r's peak / 1f1b's rank r; a rank's M_F is the same
 * layers under every family: 8 of 32). zb-v's highest rank is within
 * MEM_TOL of 1f1b's, as the plan says (both p units). */
static void test_memory_follows_plan(void) {
  static const zb_family fams[] = {ZB_FAMILY_1F1B,  ZB_FAMILY_GPIPE,  ZB_FAMILY_INTERLEAVED_1F1B,
                                   ZB_FAMILY_ZB_H1, ZB_FAMILY_ZB_H2,  ZB_FAMILY_ZB_AUTO,
                                   ZB_FAMILY_ZB_V,  ZB_FAMILY_V_HALF, ZB_FAMILY_V_MIN};
  enum { NF = sizeof fams / sizeof fams[0] };
  zb_rank_costs mem = profile_memory();
  zb_model_config cfg = memory_model(8);
  printf("    peak state bytes per rank (h %d, %d heads, %d layers, T %d, batch %d; p 4, m 8; profiled M_B "
         "%.3f, "
         "M_W %.3f): measured / plan, as a ratio to rank 0 and to 1f1b's same rank\n",
         cfg.hidden, cfg.heads, cfg.layers, cfg.seq_len, cfg.batch, mem.m_b, mem.m_w);
  int64_t peak[NF][4];
  double sim[NF][4], worst = 0;
  for (int i = 0; i < (int)NF; i++) {
    const char *name = zb_family_name(fams[i]);
    if (!run_memory(fams[i], &mem, peak[i], sim[i])) {
      fprintf(stderr, "  %s: did not run\n", name);
      zbt_failed_checks++;
      return;
    }
    printf("      %-16s", name);
    for (int r = 0; r < 4; r++) {
      double between = ((double)peak[i][r] / (double)peak[i][0]) / (sim[i][r] / sim[i][0]);
      double across = ((double)peak[i][r] / (double)peak[0][r]) / (sim[i][r] / sim[0][r]);
      printf(" r%d %9lld B %.3f/%.3f %.3f/%.3f", r, (long long)peak[i][r],
             (double)peak[i][r] / (double)peak[i][0], sim[i][r] / sim[i][0],
             (double)peak[i][r] / (double)peak[0][r], sim[i][r] / sim[0][r]);
      CHECK_MSG(fabs(between - 1.0) <= MEM_TOL, "%s rank %d / rank 0: measured / plan = %.3f", name, r,
                between);
      CHECK_MSG(fabs(across - 1.0) <= MEM_TOL, "%s rank %d / 1f1b rank %d: measured / plan = %.3f", name, r,
                r, across);
      worst = fmax(worst, fmax(fabs(between - 1.0), fabs(across - 1.0)));
    }
    printf("\n");
  }
  int64_t max_1f1b = 0, max_zbv = 0;
  for (int r = 0; r < 4; r++) {
    max_1f1b = peak[0][r] > max_1f1b ? peak[0][r] : max_1f1b;
    max_zbv = peak[6][r] > max_zbv ? peak[6][r] : max_zbv;
  }
  printf("      largest deviation from the plan: %.1f%%; highest rank: zb-v / 1f1b = %.3f\n", 100 * worst,
         (double)max_zbv / (double)max_1f1b);
  CHECK_MSG(fabs((double)max_zbv / (double)max_1f1b - 1.0) <= MEM_TOL, "zb-v's peak %lld, 1f1b's %lld",
            (long long)max_zbv, (long long)max_1f1b);
}

ZBT_MAIN(ZBT(test_text_source), ZBT(test_local_handoff), ZBT(test_host_syncs_constant), ZBT(test_errors),
         ZBT(test_wrong_bpa_executor), ZBT(test_families), ZBT(test_next_iteration_data),
         ZBT(test_memory_follows_plan), ZBT(test_cpu_wait))
