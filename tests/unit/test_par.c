/* test_par — the threads runner (util/zb_par_threads.h) and the planner
 * with and without it: every piece runs exactly once, pieces really run
 * at once, and a plan is the same either way. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "zb_par_threads.h"
#include "zb_planner.h"
#include "zbtest.h"

typedef struct count_job {
  atomic_int runs[16];
} count_job;

static void count_piece(void *arg, int k) {
  count_job *j = arg;
  atomic_fetch_add(&j->runs[k], 1);
}

/* n pieces, more or fewer than the width (waves), each once. */
static void test_every_piece_once(void) {
  for (int width = 1; width <= 4; width++)
    for (int n = 0; n <= 9; n++) {
      count_job j;
      memset(&j, 0, sizeof j);
      zb_par par = zb_par_threads(width);
      zb_par_run(&par, count_piece, &j, n);
      for (int k = 0; k < 16; k++)
        CHECK_MSG(atomic_load(&j.runs[k]) == (k < n), "width %d n %d: piece %d ran %d times", width, n, k,
                  atomic_load(&j.runs[k]));
    }
  CHECK(zb_par_cpus() >= 1);
  CHECK_EQ(zb_par_width(NULL), 1);
  zb_par one = zb_par_threads(1);
  CHECK_EQ(zb_par_width(&one), 1);
}

/* Two pieces that each wait for the other to have started: they finish
 * only when run at once (a runner taking them in turn times out: 10 s,
 * ample on a loaded machine). */
typedef struct meet_job {
  atomic_int here;
  atomic_int met;
  int wait_ms; /* how long a piece waits for the other */
} meet_job;

static void meet_piece(void *arg, int k) {
  (void)k;
  meet_job *j = arg;
  atomic_fetch_add(&j->here, 1);
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do {
    if (atomic_load(&j->here) == 2) {
      atomic_fetch_add(&j->met, 1);
      return;
    }
    clock_gettime(CLOCK_MONOTONIC, &t);
  } while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < j->wait_ms);
}

static void test_pieces_run_at_once(void) {
  meet_job j = {.wait_ms = 10000};
  zb_par par = zb_par_threads(2);
  zb_par_run(&par, meet_piece, &j, 2);
  CHECK_EQ(atomic_load(&j.met), 2);
  meet_job serial = {.wait_ms = 200};
  zb_par_run(NULL, meet_piece, &serial, 2); /* in turn: only the second meets */
  CHECK_EQ(atomic_load(&serial.met), 1);
}

/* The planner with a runner gives the same lists and figures (interleaved
 * 1F1B with 4 chunks: its generator writes the ranks' lists in shares). */
static void test_planner_same_with_threads(void) {
  static const zb_family fams[] = {ZB_FAMILY_ZB_V, ZB_FAMILY_ZB_H1, ZB_FAMILY_DUALPIPE_V,
                                   ZB_FAMILY_INTERLEAVED_1F1B};
  zb_par par = zb_par_threads(3);
  for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++) {
    zb_planner_request req = {.family = fams[f], .p = 64, .m = 2048, .rank = zb_rank_costs_default()};
    req.v = fams[f] == ZB_FAMILY_INTERLEAVED_1F1B ? 4 : 0;
    req.rank.t_comm = 0.05;
    zb_planner_result a, b;
    zb_diag d = {{0}};
    CHECK_EQ(zb_planner_run(&req, &a, &d), ZB_OK);
    req.par = &par;
    CHECK_EQ(zb_planner_run(&req, &b, &d), ZB_OK);
    CHECK(a.sim->makespan == b.sim->makespan && a.sim->bubble_ratio == b.sim->bubble_ratio);
    CHECK(a.sim->max_span == b.sim->max_span);
    for (int r = 0; r < a.p; r++) {
      CHECK_EQ(a.lowered->ranks[r].n, b.lowered->ranks[r].n);
      for (int i = 0; i < a.lowered->ranks[r].n; i++) {
        const zb_action *x = &a.lowered->ranks[r].actions[i], *y = &b.lowered->ranks[r].actions[i];
        CHECK(x->op == y->op && x->stage == y->stage && x->mb == y->mb && x->peer == y->peer &&
              x->batch == y->batch && x->overlap == y->overlap);
      }
      CHECK(memcmp(a.sim->start[r], b.sim->start[r], sizeof(double) * (size_t)a.lowered->ranks[r].n) == 0);
    }
    CHECK_EQ(b.violation.kind, ZB_VIOL_NONE);
    zb_planner_result_free(&a);
    zb_planner_result_free(&b);
  }
}

ZBT_MAIN(ZBT(test_every_piece_once), ZBT(test_pieces_run_at_once), ZBT(test_planner_same_with_threads))
