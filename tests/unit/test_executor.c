/* The worker's data plane (worker/zb_executor.h, zb_transport.h,
 * zb_backend.h): p ranks as threads of this process, each with its own tcp
 * transport on 127.0.0.1 (real sockets) and sim backend, run lowered
 * schedules from libzb; the measurements are checked against the plan and
 * the simulator. Also the failure paths: a wrong tag, a peer that dies, the
 * stop flag, connect retries and deadlines, and a large batched exchange.
 * Timing assertions are lower bounds only (sleeps are at least as long as
 * configured); a watchdog raises the stop flag so a hang becomes a failure
 * naming "stopped" instead of a stuck test. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "zb_alloc.h"
#include "zb_clock.h"
#include "zb_executor.h"
#include "zb_lower.h"
#include "zb_plan.h"
#include "zb_sim.h"
#include "zbtest.h"
#include "zbtest_job.h"

#define MAXP 8
#define ITERS 2
#define WATCHDOG_S 30.0

static void sleep_s(double s) {
  struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

static zb_rank_costs test_costs(double t_f, double t_b, double t_w) {
  zb_rank_costs rc = zb_rank_costs_default();
  rc.t_f = t_f;
  rc.t_b = t_b;
  rc.t_w = t_w;
  rc.t_comm = 0;
  return rc;
}

/* ---- ranks as threads ---- */

typedef struct rank_ctx {
  int rank, p;
  const zbt_job *j;
  zb_transport *t;
  zb_backend *b;
  const char *const *addrs;
  size_t bpa;
  int iterations;
  int truncate;          /* > 0: run only this many actions, then drop the transport (the rank "dies") */
  int edit_send_mb;      /* >= 0: the first SEND_F carries this microbatch instead (a wrong tag) */
  bool stop_after_first; /* the iteration callback asks to stop after iteration 0 */
  atomic_bool *stop;
  atomic_int *finished;
  zb_err err;
  zb_diag diag;
  zb_rank_iteration it[ITERS];
  int done;
} rank_ctx;

static bool rank_record(void *ud, const zb_rank_iteration *it) {
  rank_ctx *c = ud;
  if (it->iteration >= 0 && it->iteration < ITERS)
    c->it[it->iteration] = *it;
  return !c->stop_after_first;
}

static void *rank_main(void *arg) {
  rank_ctx *c = arg;
  const zb_rank_list *l = &c->j->lowered->ranks[c->rank];
  zb_action *acts = zb_calloc((size_t)l->n + 1, sizeof *acts);
  memcpy(acts, l->actions, sizeof *acts * (size_t)l->n);
  int n = c->truncate > 0 && c->truncate < l->n ? c->truncate : l->n;
  for (int i = 0; c->edit_send_mb >= 0 && i < n; i++)
    if (acts[i].op == ZB_OP_SEND_F) {
      acts[i].mb = c->edit_send_mb;
      break;
    }
  bool peers[MAXP];
  zb_executor_peers(acts, l->n, c->p, peers);
  zb_executor *e = NULL;
  c->err = zb_transport_connect(c->t, (const char *const *)c->addrs, peers, 10.0, &c->diag);
  if (!c->err) {
    zb_executor_config cfg = {.rank = c->rank,
                              .nranks = c->p,
                              .actions = acts,
                              .n_actions = n,
                              .costs = c->j->costs,
                              .bytes_per_activation = c->bpa,
                              .stop = c->stop};
    c->err = zb_executor_new(&cfg, c->b, c->t, &e, &c->diag);
  }
  if (!c->err)
    c->err = zb_executor_run(e, 0, c->iterations, rank_record, c, &c->done, &c->diag);
  if (c->truncate > 0) { /* die: close every connection mid-iteration */
    zb_transport_free(c->t);
    c->t = NULL;
  }
  zb_executor_free(e);
  free(acts);
  atomic_fetch_add(c->finished, 1);
  return NULL;
}

typedef struct ranks {
  int p;
  rank_ctx c[MAXP];
  char addr[MAXP][96];
  const char *addrs[MAXP];
  atomic_bool stop;     /* every rank's, but see own_rank */
  atomic_bool own_stop; /* rank own_rank's alone, when own_rank >= 0 */
  int own_rank;
  atomic_int finished;
  bool watchdog_fired;
} ranks;

/* Creates p transports on 127.0.0.1:0 and sim backends for zbt_job j. Rank
 * own_rank (-1: none) gets a stop flag of its own. */
static bool ranks_init(ranks *rs, const zbt_job *j, size_t bpa, int own_rank) {
  memset(rs, 0, sizeof *rs);
  rs->p = j->p;
  rs->own_rank = own_rank;
  atomic_init(&rs->stop, false);
  atomic_init(&rs->own_stop, false);
  atomic_init(&rs->finished, 0);
  for (int r = 0; r < j->p; r++) {
    rank_ctx *c = &rs->c[r];
    atomic_bool *stop = r == own_rank ? &rs->own_stop : &rs->stop;
    zb_diag d = {{0}};
    zb_tcp_config tc = {.rank = r, .nranks = j->p, .listen = "127.0.0.1:0", .session = 42, .stop = stop};
    zb_sim_backend_config bc = {.costs = j->costs,
                                .rank_mf = zb_costs_rank_mf(j->costs, j->placement, j->p, j->v, r),
                                .bytes_per_activation = bpa,
                                .stop = stop};
    if (zb_transport_tcp_new(&tc, &c->t, &d) != ZB_OK || zb_backend_sim_new(&bc, &c->b, &d) != ZB_OK) {
      fprintf(stderr, "  rank %d: %s\n", r, d.msg);
      return false;
    }
    snprintf(rs->addr[r], sizeof rs->addr[r], "%s", zb_transport_address(c->t));
    rs->addrs[r] = rs->addr[r];
    *c = (rank_ctx){.rank = r,
                    .p = j->p,
                    .j = j,
                    .t = c->t,
                    .b = c->b,
                    .addrs = rs->addrs,
                    .bpa = bpa,
                    .iterations = ITERS,
                    .edit_send_mb = -1,
                    .stop = stop,
                    .finished = &rs->finished};
  }
  return true;
}

/* Runs every rank to its end; raises the stop flag at stop_after_s (<= 0:
 * never; only own_rank's when there is one) and every flag, as a watchdog,
 * after WATCHDOG_S. */
static void ranks_run(ranks *rs, double stop_after_s) {
  pthread_t th[MAXP];
  for (int r = 0; r < rs->p; r++)
    pthread_create(&th[r], NULL, rank_main, &rs->c[r]);
  double t0 = zb_clock_s();
  while (atomic_load(&rs->finished) < rs->p) {
    double el = zb_clock_s() - t0;
    if (stop_after_s > 0 && el >= stop_after_s)
      atomic_store(rs->own_rank >= 0 ? &rs->own_stop : &rs->stop, true);
    if (el >= WATCHDOG_S) {
      rs->watchdog_fired = true;
      atomic_store(&rs->stop, true);
      atomic_store(&rs->own_stop, true);
    }
    sleep_s(0.005);
  }
  for (int r = 0; r < rs->p; r++)
    pthread_join(th[r], NULL);
}

static void ranks_free(ranks *rs) {
  for (int r = 0; r < rs->p; r++) {
    zb_transport_free(rs->c[r].t);
    zb_backend_free(rs->c[r].b);
  }
}

/* ---- the schedules run end to end ---- */

static void check_run(const zbt_job *j, const ranks *rs, size_t bpa) {
  CHECK(!rs->watchdog_fired);
  for (int r = 0; r < j->p; r++)
    CHECK_MSG(rs->c[r].err == ZB_OK && rs->c[r].done == ITERS, "rank %d: %s (%d iterations)", r,
              rs->c[r].diag.msg, rs->c[r].done);
  for (int k = 0; k < ITERS; k++) {
    double first_start = INFINITY, last_end = -INFINITY;
    for (int r = 0; r < j->p; r++) {
      const zb_rank_iteration *it = &rs->c[r].it[k];
      const zb_rank_list *l = &j->lowered->ranks[r];
      int sends = 0;
      double cf = 0, cb = 0, cw = 0;
      for (int i = 0; i < l->n; i++) {
        const zb_action *a = &l->actions[i];
        sends += a->op == ZB_OP_SEND_F || a->op == ZB_OP_SEND_B;
        if (a->op == ZB_OP_F)
          cf += j->costs->t_f[a->stage];
        if (a->op == ZB_OP_B || a->op == ZB_OP_BW)
          cb += j->costs->t_b[a->stage];
        if (a->op == ZB_OP_W || a->op == ZB_OP_BW)
          cw += j->costs->t_w[a->stage];
      }
      CHECK_EQ(it->rank, r);
      CHECK_EQ(it->iteration, k);
      CHECK(sends > 0);
      CHECK_EQ(it->bytes_sent, (int64_t)sends * (int64_t)bpa);
      /* sleeps last at least their configured time: lower bounds */
      CHECK_MSG(it->busy_f_seconds >= cf - 1e-6, "rank %d busy F %.6f < %.6f", r, it->busy_f_seconds, cf);
      CHECK_MSG(it->busy_b_seconds >= cb - 1e-6, "rank %d busy B %.6f < %.6f", r, it->busy_b_seconds, cb);
      CHECK_MSG(it->busy_w_seconds >= cw - 1e-6, "rank %d busy W %.6f < %.6f", r, it->busy_w_seconds, cw);
      double busy = it->busy_f_seconds + it->busy_b_seconds + it->busy_w_seconds;
      CHECK(it->wall_seconds >= busy);
      CHECK_NEAR(it->idle_seconds, it->wall_seconds - busy, 1e-9);
      CHECK_NEAR(it->bubble_ratio, it->idle_seconds / it->wall_seconds, 1e-12);
      CHECK_NEAR(it->end_seconds - it->start_seconds, it->wall_seconds, 1e-6);
      CHECK(it->comm_seconds >= 0 && it->comm_seconds <= it->wall_seconds);
      /* memory: the plan's accounting equals the simulator's peak */
      CHECK_NEAR(it->peak_memory, j->sim->peak_memory_units[r], 1e-9);
      CHECK_EQ(it->peak_memory_bytes, llround(j->sim->peak_memory_units[r] * (double)bpa));
      if (it->start_seconds < first_start)
        first_start = it->start_seconds;
      if (it->end_seconds > last_end)
        last_end = it->end_seconds;
    }
    /* every op waits for its inputs and sleeps at least its time, so the
     * iteration (first rank start to last rank end) is no shorter than the
     * simulated makespan */
    CHECK_MSG(last_end - first_start >= j->sim->makespan - 1e-6, "iteration %d took %.6f s, makespan %.6f s",
              k, last_end - first_start, j->sim->makespan);
  }
}

static void run_family(zb_family f) {
  zb_rank_costs rc = test_costs(0.002, 0.003, 0.002);
  const size_t bpa = 65536;
  zbt_job j;
  ranks rs;
  if (!zbt_job_make(f, 4, 8, &rc, &j)) {
    zbt_job_free(&j);
    CHECK(!"plan");
  }
  if (!ranks_init(&rs, &j, bpa, -1)) {
    ranks_free(&rs);
    zbt_job_free(&j);
    CHECK(!"ranks");
  }
  ranks_run(&rs, 0);
  check_run(&j, &rs, bpa);
  printf("  %-6s p=4 m=8: makespan %.1f ms, rank 0 wall %.1f/%.1f ms, peaks", zb_family_name(f),
         j.sim->makespan * 1e3, rs.c[0].it[0].wall_seconds * 1e3, rs.c[0].it[1].wall_seconds * 1e3);
  for (int r = 0; r < 4; r++)
    printf(" %.2g", rs.c[r].it[ITERS - 1].peak_memory);
  printf("\n");
  ranks_free(&rs);
  zbt_job_free(&j);
}

static void test_1f1b_p4_m8(void) {
  run_family(ZB_FAMILY_1F1B);
}
static void test_zb_h1_p4_m8(void) {
  run_family(ZB_FAMILY_ZB_H1);
}
static void test_zb_v_p4_m8(void) {
  run_family(ZB_FAMILY_ZB_V);
}

/* The iteration callback can stop a run cleanly between iterations. */
static void test_callback_stops_between_iterations(void) {
  zb_rank_costs rc = test_costs(0.001, 0.001, 0.001);
  zbt_job j;
  ranks rs;
  CHECK(zbt_job_make(ZB_FAMILY_ZB_H1, 2, 4, &rc, &j));
  CHECK(ranks_init(&rs, &j, 1024, -1));
  for (int r = 0; r < 2; r++)
    rs.c[r].stop_after_first = true;
  ranks_run(&rs, 0);
  zb_err e0 = rs.c[0].err, e1 = rs.c[1].err;
  int d0 = rs.c[0].done, d1 = rs.c[1].done;
  ranks_free(&rs);
  zbt_job_free(&j);
  CHECK_EQ(e0, ZB_OK);
  CHECK_EQ(e1, ZB_OK);
  CHECK_EQ(d0, 1);
  CHECK_EQ(d1, 1);
}

/* ---- failures ---- */

/* Rank 0 sends microbatch 1 where rank 1 expects 0: rank 1 fails naming
 * both tags and the peer; rank 0 fails too (the poisoned transport closes
 * its connections) instead of hanging. */
static void test_wrong_tag_named(void) {
  zb_rank_costs rc = test_costs(0.001, 0.001, 0.001);
  zbt_job j;
  ranks rs;
  CHECK(zbt_job_make(ZB_FAMILY_1F1B, 2, 4, &rc, &j));
  CHECK(ranks_init(&rs, &j, 4096, -1));
  rs.c[0].edit_send_mb = 1;
  ranks_run(&rs, 0);
  rank_ctx c0 = rs.c[0], c1 = rs.c[1];
  bool fired = rs.watchdog_fired;
  ranks_free(&rs);
  zbt_job_free(&j);
  printf("  rank 1: %s\n  rank 0: %s\n", c1.diag.msg, c0.diag.msg);
  CHECK(!fired);
  CHECK_EQ(c1.err, ZB_ERR_INVALID_SCHEDULE);
  CHECK(strstr(c1.diag.msg, "got message F s0 mb1") && strstr(c1.diag.msg, "expected F s0 mb0"));
  CHECK(strstr(c1.diag.msg, "peer rank 0") && strstr(c1.diag.msg, "RECV_F"));
  CHECK(c0.err != ZB_OK);
  CHECK(!strstr(c0.diag.msg, "stopped"));
}

/* Rank 1 runs half its list and closes its transport: its neighbours fail
 * promptly naming it, rank 3 names rank 2 (whose failure closed its
 * connections); nobody waits for the watchdog. */
static void test_peer_death_reported(void) {
  zb_rank_costs rc = test_costs(0.002, 0.002, 0.002);
  zbt_job j;
  ranks rs;
  CHECK(zbt_job_make(ZB_FAMILY_1F1B, 4, 8, &rc, &j));
  CHECK(ranks_init(&rs, &j, 65536, -1));
  rs.c[1].truncate = j.lowered->ranks[1].n / 2;
  rs.c[1].iterations = 1;
  ranks_run(&rs, 0);
  rank_ctx c[4];
  memcpy(c, rs.c, sizeof c);
  bool fired = rs.watchdog_fired;
  ranks_free(&rs);
  zbt_job_free(&j);
  for (int r = 0; r < 4; r++)
    printf("  rank %d: %s\n", r, r == 1 ? "(died)" : c[r].diag.msg);
  CHECK(!fired);
  for (int r = 0; r < 4; r++) {
    if (r == 1)
      continue;
    CHECK_MSG(c[r].err == ZB_ERR_IO, "rank %d: %s", r, c[r].diag.msg);
    CHECK_MSG(!strstr(c[r].diag.msg, "stopped"), "rank %d waited for the stop flag", r);
  }
  CHECK(strstr(c[0].diag.msg, "peer rank 1"));
  CHECK(strstr(c[2].diag.msg, "peer rank 1"));
  CHECK(strstr(c[3].diag.msg, "peer rank 2"));
}

/* The stop flag ends a running iteration on every rank (long ops, so it
 * is raised mid-iteration). */
static void test_stop_mid_iteration(void) {
  zb_rank_costs rc = test_costs(0.05, 0.05, 0.05);
  zbt_job j;
  ranks rs;
  CHECK(zbt_job_make(ZB_FAMILY_ZB_H1, 4, 8, &rc, &j));
  CHECK(ranks_init(&rs, &j, 1024, -1));
  double t0 = zb_clock_s();
  ranks_run(&rs, 0.15);
  double took = zb_clock_s() - t0;
  int stopped = 0, failed = 0, done = 0;
  for (int r = 0; r < 4; r++) {
    failed += rs.c[r].err == ZB_ERR_IO;
    stopped += strstr(rs.c[r].diag.msg, "stopped") != NULL;
    done += rs.c[r].done;
    printf("  rank %d: %s\n", r, rs.c[r].diag.msg);
  }
  double makespan = j.sim->makespan;
  bool fired = rs.watchdog_fired;
  ranks_free(&rs);
  zbt_job_free(&j);
  CHECK(!fired);
  CHECK(makespan > 0.5); /* so 0.15 s is mid-iteration */
  CHECK(took >= 0.15);
  CHECK_EQ(failed, 4);
  CHECK(stopped >= 1);
  CHECK_EQ(done, 0);
}

/* Only rank 2 is told to stop: its executor aborts the transport, so the
 * others fail promptly naming their peer instead of waiting for a stop of
 * their own. */
static void test_one_rank_stopped_others_fail(void) {
  zb_rank_costs rc = test_costs(0.05, 0.05, 0.05);
  zbt_job j;
  ranks rs;
  CHECK(zbt_job_make(ZB_FAMILY_1F1B, 4, 8, &rc, &j));
  CHECK(ranks_init(&rs, &j, 1024, 2));
  ranks_run(&rs, 0.15);
  rank_ctx c[4];
  memcpy(c, rs.c, sizeof c);
  bool fired = rs.watchdog_fired;
  ranks_free(&rs);
  zbt_job_free(&j);
  for (int r = 0; r < 4; r++)
    printf("  rank %d: %s\n", r, c[r].diag.msg);
  CHECK(!fired);
  CHECK(strstr(c[2].diag.msg, "stopped"));
  for (int r = 0; r < 4; r++) {
    CHECK_MSG(c[r].err == ZB_ERR_IO, "rank %d: %s", r, c[r].diag.msg);
    CHECK_MSG(r == 2 || !strstr(c[r].diag.msg, "stopped"), "rank %d waited for the stop flag", r);
  }
  CHECK(strstr(c[1].diag.msg, "peer rank 2") && strstr(c[3].diag.msg, "peer rank 2"));
  CHECK(strstr(c[0].diag.msg, "peer rank 1"));
}

/* ---- the transport on its own ---- */

typedef struct pair {
  zb_transport *t[2];
  atomic_bool stop;
  char addr[2][96];
  const char *addrs[2];
  pthread_t watchdog;
  atomic_bool over;
  bool watchdog_fired;
} pair;

/* Raises the pair's stop flag after WATCHDOG_S unless the test is over. */
static void *pair_watchdog(void *arg) {
  pair *pr = arg;
  double t0 = zb_clock_s();
  while (!atomic_load(&pr->over)) {
    if (zb_clock_s() - t0 >= WATCHDOG_S) {
      pr->watchdog_fired = true;
      atomic_store(&pr->stop, true);
      break;
    }
    sleep_s(0.005);
  }
  return NULL;
}

typedef struct connect_arg {
  pair *pr;
  int rank;
  double timeout_s;
  zb_err err;
  zb_diag diag;
} connect_arg;

static void *connect_main(void *arg) {
  connect_arg *a = arg;
  a->err = zb_transport_connect(a->pr->t[a->rank], a->pr->addrs, NULL, a->timeout_s, &a->diag);
  return NULL;
}

/* Two tcp transports (ranks 0 and 1 of 2) on 127.0.0.1:0, not connected,
 * and a watchdog; pair_free() ends both. */
static bool pair_new(pair *pr, const char *listen1) {
  memset(pr, 0, sizeof *pr);
  atomic_init(&pr->stop, false);
  atomic_init(&pr->over, false);
  pthread_create(&pr->watchdog, NULL, pair_watchdog, pr);
  for (int r = 0; r < 2; r++) {
    zb_diag d = {{0}};
    zb_tcp_config tc = {.rank = r,
                        .nranks = 2,
                        .listen = r == 1 && listen1 ? listen1 : "127.0.0.1:0",
                        .session = 7,
                        .stop = &pr->stop};
    if (zb_transport_tcp_new(&tc, &pr->t[r], &d) != ZB_OK) {
      fprintf(stderr, "  %s\n", d.msg);
      return false;
    }
    snprintf(pr->addr[r], sizeof pr->addr[r], "%s", zb_transport_address(pr->t[r]));
    pr->addrs[r] = pr->addr[r];
  }
  return true;
}

/* Connects both ends concurrently. */
static bool pair_connect(pair *pr) {
  connect_arg a[2] = {{.pr = pr, .rank = 0, .timeout_s = 10}, {.pr = pr, .rank = 1, .timeout_s = 10}};
  pthread_t th;
  pthread_create(&th, NULL, connect_main, &a[1]);
  connect_main(&a[0]);
  pthread_join(th, NULL);
  if (a[0].err || a[1].err)
    fprintf(stderr, "  connect: %s / %s\n", a[0].diag.msg, a[1].diag.msg);
  return !a[0].err && !a[1].err;
}

static void pair_free(pair *pr) {
  atomic_store(&pr->over, true);
  pthread_join(pr->watchdog, NULL);
  zb_transport_free(pr->t[0]);
  zb_transport_free(pr->t[1]);
}

typedef struct xchg_arg {
  pair *pr;
  int rank, rounds;
  size_t len;
  unsigned char *out, *in;
  bool content_ok;
  zb_err err;
  zb_diag diag;
} xchg_arg;

static unsigned char pattern(int rank, int round, size_t i) {
  return (unsigned char)(i * 7u + (size_t)rank * 31u + (size_t)round);
}

/* Both ranks post their send first, then the receive, in one group. */
static void *xchg_main(void *arg) {
  xchg_arg *a = arg;
  zb_transport *t = a->pr->t[a->rank];
  int peer = 1 - a->rank;
  a->content_ok = true;
  for (int k = 0; k < a->rounds && !a->err; k++) {
    for (size_t i = 0; i < a->len; i++)
      a->out[i] = pattern(a->rank, k, i);
    zb_transport_group_start(t);
    zb_tag mine = {.kind = ZB_OP_F, .stage = a->rank, .mb = k},
           theirs = {.kind = ZB_OP_F, .stage = peer, .mb = k};
    a->err = zb_transport_send(t, peer, mine, a->out, a->len, &a->diag);
    if (!a->err)
      a->err = zb_transport_recv(t, peer, theirs, a->in, a->len, &a->diag);
    zb_err e = zb_transport_group_end(t, &a->diag);
    if (!a->err)
      a->err = e;
    for (size_t i = 0; !a->err && i < a->len; i++)
      if (a->in[i] != pattern(peer, k, i)) {
        a->content_ok = false;
        break;
      }
  }
  return NULL;
}

/* 4 MiB each way, both ranks sending first: far beyond the socket buffers,
 * so this deadlocks unless a group's send and receive progress together. */
static void test_large_batched_exchange(void) {
  pair pr;
  CHECK(pair_new(&pr, NULL));
  CHECK(pair_connect(&pr));
  const size_t len = 4u << 20;
  xchg_arg a[2];
  for (int r = 0; r < 2; r++)
    a[r] = (xchg_arg){
        .pr = &pr, .rank = r, .rounds = 3, .len = len, .out = zb_malloc(len), .in = zb_malloc(len)};
  pthread_t th;
  pthread_create(&th, NULL, xchg_main, &a[1]);
  xchg_main(&a[0]);
  pthread_join(th, NULL);
  zb_transport_stats s0, s1;
  zb_transport_stats_get(pr.t[0], &s0);
  zb_transport_stats_get(pr.t[1], &s1);
  for (int r = 0; r < 2; r++) {
    free(a[r].out);
    free(a[r].in);
  }
  bool fired = pr.watchdog_fired;
  pair_free(&pr);
  CHECK(!fired);
  CHECK_MSG(a[0].err == ZB_OK && a[1].err == ZB_OK, "%s / %s", a[0].diag.msg, a[1].diag.msg);
  CHECK(a[0].content_ok && a[1].content_ok);
  CHECK_EQ(s0.bytes_sent, 3 * (int64_t)len);
  CHECK_EQ(s0.bytes_received, 3 * (int64_t)len);
  CHECK_EQ(s1.bytes_sent, 3 * (int64_t)len);
  CHECK_EQ(s0.messages_sent, 3);
  CHECK_EQ(s1.messages_received, 3);
}

typedef struct send_arg {
  zb_transport *t;
  int rank;
  size_t len;
  zb_err err;
  zb_diag diag;
} send_arg;

static void *send_main(void *arg) {
  send_arg *a = arg;
  unsigned char *buf = zb_calloc(a->len, 1);
  a->err = zb_transport_send(a->t, 1 - a->rank, (zb_tag){.kind = ZB_OP_F, .stage = a->rank}, buf, a->len,
                             &a->diag);
  free(buf);
  return NULL;
}

/* The case groups exist for, done wrong: both ranks send 64 MiB outside a
 * group (blocking), more than the socket buffers hold, so neither send can
 * finish; the stop flag ends both. */
static void test_stop_cancels_blocked_sends(void) {
  pair pr;
  CHECK(pair_new(&pr, NULL));
  CHECK(pair_connect(&pr));
  send_arg a[2] = {{.t = pr.t[0], .rank = 0, .len = 64u << 20}, {.t = pr.t[1], .rank = 1, .len = 64u << 20}};
  pthread_t th[2];
  for (int r = 0; r < 2; r++)
    pthread_create(&th[r], NULL, send_main, &a[r]);
  sleep_s(0.3);
  atomic_store(&pr.stop, true);
  for (int r = 0; r < 2; r++)
    pthread_join(th[r], NULL);
  pair_free(&pr);
  printf("  %s\n", a[0].diag.msg);
  for (int r = 0; r < 2; r++) {
    CHECK_EQ(a[r].err, ZB_ERR_IO);
    CHECK_MSG(strstr(a[r].diag.msg, "stopped") && strstr(a[r].diag.msg, "send"), "%s", a[r].diag.msg);
  }
}

typedef struct recv_arg {
  zb_transport *t;
  int peer;
  size_t len;
  zb_err err;
  zb_diag diag;
  double took;
} recv_arg;

static void *recv_main(void *arg) {
  recv_arg *a = arg;
  unsigned char *buf = zb_malloc(a->len ? a->len : 1);
  double t0 = zb_clock_s();
  a->err =
      zb_transport_recv(a->t, a->peer, (zb_tag){.kind = ZB_OP_B, .stage = 1, .mb = 0}, buf, a->len, &a->diag);
  a->took = zb_clock_s() - t0;
  free(buf);
  return NULL;
}

/* A receive that nothing will satisfy returns once the stop flag rises. */
static void test_stop_cancels_blocked_recv(void) {
  pair pr;
  CHECK(pair_new(&pr, NULL));
  CHECK(pair_connect(&pr));
  recv_arg a = {.t = pr.t[0], .peer = 1, .len = 16};
  pthread_t th;
  pthread_create(&th, NULL, recv_main, &a);
  sleep_s(0.2);
  atomic_store(&pr.stop, true);
  pthread_join(th, NULL);
  /* the transport is poisoned now: later calls repeat the failure at once */
  zb_diag d = {{0}};
  zb_err again = zb_transport_send(pr.t[0], 1, (zb_tag){.kind = ZB_OP_F, .stage = 0, .mb = 0}, "x", 1, &d);
  pair_free(&pr);
  printf("  %s\n", a.diag.msg);
  CHECK_EQ(a.err, ZB_ERR_IO);
  CHECK(strstr(a.diag.msg, "stopped") && strstr(a.diag.msg, "B s1 mb0") && strstr(a.diag.msg, "peer rank 1"));
  CHECK(a.took >= 0.19);
  CHECK_EQ(again, ZB_ERR_IO);
  CHECK(strstr(d.msg, "failed before"));
}

/* A message of another length than expected is refused, naming both. */
static void test_length_mismatch(void) {
  pair pr;
  CHECK(pair_new(&pr, NULL));
  CHECK(pair_connect(&pr));
  unsigned char buf[200] = {0};
  zb_diag d = {{0}};
  zb_tag tag = {.kind = ZB_OP_F, .stage = 0, .mb = 3};
  zb_err es = zb_transport_send(pr.t[0], 1, tag, buf, 100, &d);
  zb_err er = zb_transport_recv(pr.t[1], 0, tag, buf, 200, &d);
  pair_free(&pr);
  CHECK_EQ(es, ZB_OK);
  CHECK_EQ(er, ZB_ERR_INVALID_SCHEDULE);
  CHECK_MSG(strstr(d.msg, "(100 bytes)") && strstr(d.msg, "(200 bytes)"), "%s", d.msg);
}

/* Rank 0 dials before rank 1 listens: it retries until rank 1 appears. */
static void test_connect_retries_until_peer_listens(void) {
  pair pr;
  CHECK(pair_new(&pr, NULL));
  char later[96];
  snprintf(later, sizeof later, "%s", pr.addr[1]);
  zb_transport_free(pr.t[1]); /* frees the port; rank 1 comes back on it later */
  pr.t[1] = NULL;
  connect_arg a0 = {.pr = &pr, .rank = 0, .timeout_s = 10};
  pthread_t th;
  pthread_create(&th, NULL, connect_main, &a0);
  sleep_s(0.3);
  zb_diag d = {{0}};
  zb_tcp_config tc = {.rank = 1, .nranks = 2, .listen = later, .session = 7, .stop = &pr.stop};
  zb_err e1 = zb_transport_tcp_new(&tc, &pr.t[1], &d);
  zb_err c1 = e1 ? e1 : zb_transport_connect(pr.t[1], pr.addrs, NULL, 10, &d);
  pthread_join(th, NULL);
  unsigned char x = 0x5a, y = 0;
  zb_tag tag = {.kind = ZB_OP_B, .stage = 1, .mb = 2};
  zb_err es = c1 || a0.err ? ZB_ERR_IO : zb_transport_send(pr.t[1], 0, tag, &x, 1, &d);
  zb_err er = es ? es : zb_transport_recv(pr.t[0], 1, tag, &y, 1, &d);
  pair_free(&pr);
  CHECK_MSG(e1 == ZB_OK && c1 == ZB_OK, "rank 1: %s", d.msg);
  CHECK_MSG(a0.err == ZB_OK, "rank 0: %s", a0.diag.msg);
  CHECK_EQ(er, ZB_OK);
  CHECK_EQ(y, 0x5a);
}

/* Nobody listens at rank 1's address: the deadline ends the dial, naming
 * the peer. */
static void test_connect_deadline_names_peer(void) {
  pair pr;
  CHECK(pair_new(&pr, NULL));
  zb_transport_free(pr.t[1]);
  pr.t[1] = NULL;
  zb_diag d = {{0}};
  double t0 = zb_clock_s();
  zb_err err = zb_transport_connect(pr.t[0], pr.addrs, NULL, 0.3, &d);
  double took = zb_clock_s() - t0;
  pair_free(&pr);
  printf("  %s\n", d.msg);
  CHECK_EQ(err, ZB_ERR_IO);
  CHECK(strstr(d.msg, "deadline") && strstr(d.msg, "peer rank 1"));
  CHECK(took >= 0.3);
}

/* A peer that closes while we wait on it is reported at once, by rank. */
static void test_peer_close_during_recv(void) {
  pair pr;
  CHECK(pair_new(&pr, NULL));
  CHECK(pair_connect(&pr));
  recv_arg a = {.t = pr.t[1], .peer = 0, .len = 65536};
  pthread_t th;
  pthread_create(&th, NULL, recv_main, &a);
  sleep_s(0.1);
  zb_transport_free(pr.t[0]);
  pr.t[0] = NULL;
  pthread_join(th, NULL);
  bool stop_raised = pr.watchdog_fired;
  pair_free(&pr);
  printf("  %s\n", a.diag.msg);
  CHECK(!stop_raised);
  CHECK_EQ(a.err, ZB_ERR_IO);
  CHECK(strstr(a.diag.msg, "peer rank 0"));
}

static void test_bad_arguments(void) {
  zb_transport *t = NULL;
  zb_diag d = {{0}};
  zb_tcp_config tc = {.rank = 0, .nranks = 2, .listen = "no-port-here"};
  CHECK_EQ(zb_transport_tcp_new(&tc, &t, &d), ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "no-port-here"));
  tc.listen = "127.0.0.1:0";
  tc.rank = 2;
  CHECK_EQ(zb_transport_tcp_new(&tc, &t, &d), ZB_ERR_INVALID_ARG);
  tc.rank = 0;
  CHECK_EQ(zb_transport_tcp_new(&tc, &t, &d), ZB_OK);
  CHECK_EQ(zb_transport_send(t, 1, (zb_tag){.kind = ZB_OP_F}, "x", 1, &d), ZB_ERR_INVALID_ARG);
  zb_transport_free(t);
  CHECK(strstr(d.msg, "not connected to peer rank 1"));
  zb_transport_free(NULL);
  zb_backend_free(NULL);
  zb_executor_free(NULL);
}

/* ---- the sim backend on its own ---- */

static void test_sim_backend_times_and_memory(void) {
  zb_costs *c = zb_costs_new(2);
  for (int s = 0; s < 2; s++) {
    c->t_f[s] = 0.004;
    c->t_b[s] = 0.003;
    c->t_w[s] = 0.001;
    c->m_f[s] = 0.5;
    c->m_b[s] = -0.25;
    c->m_w[s] = -0.25;
  }
  zb_backend *b = NULL;
  zb_diag d = {{0}};
  zb_sim_backend_config bc = {.costs = c, .rank_mf = 1.0, .bytes_per_activation = 1000};
  CHECK_EQ(zb_backend_sim_new(&bc, &b, &d), ZB_OK);
  zb_err e[6];
  e[0] = zb_backend_submit(b, ZB_OP_F, 0, 0, &d);
  e[1] = zb_backend_submit(b, ZB_OP_F, 1, 0, &d);
  e[2] = zb_backend_submit(b, ZB_OP_BW, 1, 0, &d);
  e[3] = zb_backend_sync(b, &d);
  zb_backend_stats st;
  zb_backend_take_stats(b, &st);
  e[4] = zb_backend_submit(b, ZB_OP_W, 2, 0, &d); /* no stage 2 */
  void *buf = NULL;
  e[5] = zb_backend_buffer(b, ZB_OP_RECV_F, 1, 0, 1001, &buf, &d);
  zb_backend_stats st2;
  zb_backend_take_stats(b, &st2);
  zb_backend_free(b);
  zb_costs_free(c);
  for (int k = 0; k < 4; k++)
    CHECK_EQ(e[k], ZB_OK);
  CHECK_EQ(e[4], ZB_ERR_INVALID_ARG);
  CHECK_EQ(e[5], ZB_ERR_INVALID_ARG);
  CHECK(st.busy_f >= 0.008);
  CHECK(st.busy_b >= 0.003 && st.busy_w >= 0.001);
  CHECK_NEAR(st.busy_b / st.busy_w, 3.0, 1e-9); /* BW split as T_B : T_W */
  CHECK_EQ(st.peak_bytes, 1000);                /* two halves of M_F */
  CHECK_EQ(st.mem_bytes, 500);
  CHECK_EQ(st2.peak_bytes, 500); /* a new interval starts at the current bytes */
  CHECK(st2.busy_f == 0 && st2.busy_b == 0);
}

ZBT_MAIN(ZBT(test_1f1b_p4_m8), ZBT(test_zb_h1_p4_m8), ZBT(test_zb_v_p4_m8),
         ZBT(test_callback_stops_between_iterations), ZBT(test_wrong_tag_named),
         ZBT(test_peer_death_reported), ZBT(test_stop_mid_iteration), ZBT(test_one_rank_stopped_others_fail),
         ZBT(test_large_batched_exchange), ZBT(test_stop_cancels_blocked_recv),
         ZBT(test_stop_cancels_blocked_sends), ZBT(test_length_mismatch),
         ZBT(test_connect_retries_until_peer_listens), ZBT(test_connect_deadline_names_peer),
         ZBT(test_peer_close_during_recv), ZBT(test_bad_arguments), ZBT(test_sim_backend_times_and_memory))
