/* test_job_core.c — the job lifecycle's rules (daemon/job_core.h) without
 * gRPC or a loop, against a real in-memory SQLite store: a queued job's
 * row, its state machine and the events each move leaves in the store
 * (in seq order, the row in step), refused moves that change nothing, the
 * queue's order (backfill past a job without workers, no overtaking one
 * whose workers are there, the wait bound), what a restart does with a
 * stored job in each state, and retention's count and age rules. */
#include <stdlib.h>
#include <string.h>

#include "job_core.h"
#include "zb_wire.h"
#include "zbtest.h"

#define CHECK_OK(call)                                                                                       \
  do {                                                                                                       \
    zb_err e_ = (call);                                                                                      \
    CHECK_MSG(e_ == ZB_OK, "%s: %s: %s", #call, zb_strerror(e_), d.msg);                                     \
  } while (0)

static zb_job_spec spec_of(const char *name, int ranks) {
  zb_job_spec s;
  zb_job_spec_default(&s);
  snprintf(s.name, sizeof s.name, "%s", name);
  s.ranks = ranks;
  s.microbatches = 8;
  return s;
}

static void test_new_row_is_pending_with_its_spec(void) {
  zb_job_spec s = spec_of("alpha", 3);
  snprintf(s.schedule, sizeof s.schedule, "zb-h1");
  int64_t next = 41;
  zb_store_job row;
  jc_row_new(&s, &next, 1000, &row);
  CHECK_STREQ(row.id, "j-41");
  CHECK_EQ(next, 42);
  CHECK_EQ(row.state, ZB_JOB_PENDING);
  CHECK_STREQ(row.schedule, "zb-h1");
  CHECK_EQ(row.next_seq, 1);
  Zb__V1__JobSpec *pb = (Zb__V1__JobSpec *)protobuf_c_message_unpack(&zb__v1__job_spec__descriptor, NULL,
                                                                     row.spec_len, row.spec);
  CHECK(pb);
  zb_job_spec back;
  zb_diag d;
  zb_err err = zb_wire_spec_from_pb(pb, &back, &d);
  protobuf_c_message_free_unpacked(&pb->base, NULL);
  jc_row_clear(&row);
  CHECK_MSG(err == ZB_OK, "%s", d.msg);
  CHECK_STREQ(back.name, "alpha");
  CHECK_EQ(back.ranks, 3);
  zb_job_spec_free(&back);
}

static void test_state_machine(void) {
  static const int states[] = {ZB_JOB_PENDING, ZB_JOB_RUNNING, ZB_JOB_SUCCEEDED, ZB_JOB_FAILED,
                               ZB_JOB_CANCELLED};
  for (int a = 0; a < 5; a++)
    for (int b = 0; b < 5; b++) {
      int from = states[a], to = states[b];
      bool want = !zb_job_state_final(from) &&
                  (zb_job_state_final(to) || to == ZB_JOB_RUNNING || (to == ZB_JOB_PENDING && from == to));
      CHECK_MSG(jc_may_move(from, to) == want, "%s -> %s", zb_job_state_name(from), zb_job_state_name(to));
    }
  CHECK(!jc_may_move(ZB_JOB_RUNNING, ZB_JOB_PENDING));
  CHECK(!jc_may_move(ZB_JOB_SUCCEEDED, ZB_JOB_FAILED));
}

/* A job's life through the store: each move is an event in seq order
 * and the row follows; a refused move writes nothing. */
static void test_moves_are_durable_events(void) {
  zb_store *st = NULL;
  zb_diag d = {0};
  CHECK_OK(zb_store_open(":memory:", &st, &d));
  zb_job_spec s = spec_of("life", 2);
  int64_t next = 1;
  zb_store_job row;
  jc_row_new(&s, &next, 100, &row);
  zb_store_event ev;
  uint8_t metrics[] = {8, 7}; /* IterationMetrics{iteration: 7} */
  bool ok = jc_record(st, &row, NULL, 100, &ev, &d) == ZB_OK && ev.seq == 1 &&
            jc_move(st, &row, ZB_JOB_RUNNING, "ranks assigned", 200, &ev, &d) == ZB_OK && ev.seq == 2 &&
            jc_record(st, &row, &(jc_iteration){metrics, sizeof metrics, 7, true}, 250, &ev, &d) == ZB_OK &&
            ev.seq == 3 && jc_move(st, &row, ZB_JOB_SUCCEEDED, "done", 300, &ev, &d) == ZB_OK && ev.seq == 4;
  zb_err refused = jc_move(st, &row, ZB_JOB_RUNNING, "again", 400, &ev, &d);
  /* the iteration's event is found through the index, by number and as
   * the last traced; another number is not there */
  zb_store_event *by_no = NULL, *traced = NULL, *absent = NULL;
  bool unindexed = true;
  zb_err found = zb_store_find_iteration(st, "j-1", 7, &by_no, &unindexed, &d);
  found = found ? found : zb_store_find_iteration(st, "j-1", -1, &traced, &unindexed, &d);
  found = found ? found : zb_store_find_iteration(st, "j-1", 8, &absent, &unindexed, &d);
  bool index_right =
      found == ZB_OK && by_no && by_no->seq == 3 && traced && traced->seq == 3 && !absent && !unindexed;
  zb_store_events_free(by_no, 1);
  zb_store_events_free(traced, 1);
  zb_store_event *evs = NULL;
  zb_store_job *rows = NULL;
  int n_ev = 0, n_rows = 0;
  CHECK_OK(zb_store_list_events(st, "j-1", 0, &evs, &n_ev, &d));
  CHECK_OK(zb_store_list_jobs(st, &rows, &n_rows, &d));
  bool events_right = n_ev == 4 && evs[0].state == ZB_JOB_PENDING && evs[1].state == ZB_JOB_RUNNING &&
                      evs[2].iteration_len == 2 && evs[2].iteration[1] == 7 &&
                      evs[3].state == ZB_JOB_SUCCEEDED && strcmp(evs[3].reason, "done") == 0 &&
                      evs[3].unix_ms == 300;
  bool row_right = n_rows == 1 && rows[0].state == ZB_JOB_SUCCEEDED && rows[0].next_seq == 5 &&
                   rows[0].updated_ms == 300 && strcmp(rows[0].reason, "done") == 0;
  zb_store_events_free(evs, n_ev);
  zb_store_jobs_free(rows, n_rows);
  jc_row_clear(&row);
  zb_store_close(st);
  CHECK_MSG(ok, "a move failed: %s", d.msg);
  CHECK_EQ(refused, ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "SUCCEEDED to RUNNING"));
  CHECK(events_right);
  CHECK(row_right);
  CHECK_MSG(index_right, "find_iteration: %s", d.msg);
}

/* A write the store refuses (an event whose seq it already has): the
 * record is an error naming it, the stored history keeps one event. */
static void test_refused_record_is_an_error(void) {
  zb_store *st = NULL;
  zb_diag d = {0};
  CHECK_OK(zb_store_open(":memory:", &st, &d));
  zb_job_spec s = spec_of("x", 1);
  int64_t next = 1;
  zb_store_job row;
  jc_row_new(&s, &next, 1, &row);
  zb_store_event ev;
  zb_err first = jc_record(st, &row, NULL, 1, &ev, &d);
  row.next_seq = 1; /* a stale row: its next event's seq is taken */
  zb_err second = jc_record(st, &row, NULL, 2, &ev, &d);
  zb_store_event *evs = NULL;
  int n = 0;
  zb_err listed = zb_store_list_events(st, "j-1", 0, &evs, &n, &d);
  zb_store_events_free(evs, n);
  jc_row_clear(&row);
  zb_store_close(st);
  CHECK_EQ(first, ZB_OK);
  CHECK(second != ZB_OK);
  CHECK_MSG(d.msg[0], "no message");
  CHECK_EQ(listed, ZB_OK);
  CHECK_EQ(n, 1);
}

static void test_queue_steps(void) {
  int64_t now = 100000;
  jc_waiting base = {.ranks = 4, .able = 4, .idle = 4, .has_plan = true, .created_ms = now - 1000};
  jc_waiting w = base;
  CHECK_EQ(jc_queue_step(&w, now), JC_START);
  w.has_plan = false; /* a waiting job dropped its plan */
  CHECK_EQ(jc_queue_step(&w, now), JC_PLAN);
  w.planning = true;
  CHECK_EQ(jc_queue_step(&w, now), JC_HOLD);
  w = base;
  w.idle = 2; /* its workers are there, busy: no overtaking */
  CHECK_EQ(jc_queue_step(&w, now), JC_HOLD);
  w.able = 3; /* too few attached: holds nothing (backfill) */
  CHECK_EQ(jc_queue_step(&w, now), JC_WAIT_WORKERS);
  w.wait_for_workers_s = 1; /* queued 1 s ago: not yet past */
  CHECK_EQ(jc_queue_step(&w, now), JC_WAIT_WORKERS);
  CHECK_EQ(jc_queue_step(&w, now + 1), JC_TIMED_OUT);
  w.able = 4; /* the workers came: the wait bound no longer applies */
  CHECK_EQ(jc_queue_step(&w, now + 1), JC_HOLD);
}

static void test_restart_by_state(void) {
  CHECK_EQ(jc_at_restart(ZB_JOB_PENDING, true), JC_READMIT);
  CHECK_EQ(jc_at_restart(ZB_JOB_RUNNING, true), JC_RECOVER);
  CHECK_EQ(jc_at_restart(ZB_JOB_PENDING, false), JC_FAIL_UNREADABLE);
  CHECK_EQ(jc_at_restart(ZB_JOB_RUNNING, false), JC_FAIL_UNREADABLE);
  CHECK_EQ(jc_at_restart(ZB_JOB_SUCCEEDED, false), JC_KEEP);
  CHECK_EQ(jc_at_restart(ZB_JOB_FAILED, true), JC_KEEP);
  CHECK_EQ(jc_at_restart(ZB_JOB_CANCELLED, true), JC_KEEP);
}

static void test_retention_count_and_age(void) {
  /* oldest first: finished, running, finished, finished; keep 1 finished */
  zb_store_job rows[4] = {{.state = ZB_JOB_SUCCEEDED, .updated_ms = 500},
                          {.state = ZB_JOB_RUNNING, .updated_ms = 1},
                          {.state = ZB_JOB_FAILED, .updated_ms = 600},
                          {.state = ZB_JOB_CANCELLED, .updated_ms = 700}};
  long long over = 3 - 1;
  bool got[4];
  for (int k = 0; k < 4; k++)
    got[k] = jc_expired(&rows[k], &over, 0);
  CHECK(got[0] && !got[1] && got[2] && !got[3]);
  over = 0; /* within the count: only age removes */
  CHECK(jc_expired(&rows[3], &over, 701));
  over = 0;
  CHECK(!jc_expired(&rows[3], &over, 700));
  over = 0;
  CHECK(!jc_expired(&rows[1], &over, 1000)); /* running: never */
  CHECK(jc_room_in_queue(63, 64) && !jc_room_in_queue(64, 64));
}

ZBT_MAIN(ZBT(test_new_row_is_pending_with_its_spec), ZBT(test_state_machine),
         ZBT(test_moves_are_durable_events), ZBT(test_refused_record_is_an_error), ZBT(test_queue_steps),
         ZBT(test_restart_by_state), ZBT(test_retention_count_and_age))
