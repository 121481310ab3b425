/* test_store.c — the job store against real SQLite files: every field and
 * blob round-trips byte for byte, replace by id, events after a seq, data
 * that survives close and reopen and a killed process, crash recovery
 * (mark_interrupted), write groups (batching, isolation, rollback when the
 * group never commits), rank owners, a schema version 1 file migrated in
 * place with its jobs, and clean failures on bad paths, garbage files and
 * newer or foreign schemas.
 *
 * Each test runs in a fresh directory under /tmp that is removed after it,
 * even when a CHECK ends the test early.
 */
#include <dirent.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "zb_store.h"
#include "zbtest.h"

/* ---- fixture ------------------------------------------------------------- */

typedef struct fixture {
  char dir[64];
  char path[96];       /* dir/zb.db */
  zb_store *st, *peer; /* closed after the body, so a failed CHECK leaks neither */
} fixture;

/* Runs body with a fresh temp directory and cleans up after it. */
static void with_tmpdir(void (*body)(fixture *)) {
  fixture fx = {.st = NULL};
  snprintf(fx.dir, sizeof fx.dir, "/tmp/zbstore-XXXXXX");
  if (!mkdtemp(fx.dir)) {
    perror("  mkdtemp");
    zbt_failed_checks++;
    return;
  }
  snprintf(fx.path, sizeof fx.path, "%s/zb.db", fx.dir);
  body(&fx);
  zb_store_close(fx.st);
  zb_store_close(fx.peer);
  zbt_remove_dir(fx.dir);
}

/* Checks that a store call returned ZB_OK; expects a zb_diag named diag in
 * scope, whose message it prints when the call failed. */
#define CHECK_OK(call)                                                                                       \
  do {                                                                                                       \
    zb_err e_ = (call);                                                                                      \
    CHECK_MSG(e_ == ZB_OK, "%s: %s: %s", #call, zb_strerror(e_), diag.msg);                                  \
  } while (0)

#define CHECK_HAS(haystack, needle)                                                                          \
  CHECK_MSG(strstr((haystack), (needle)) != NULL, "\"%s\" does not mention \"%s\"", (haystack), (needle))

/* Reopens the store at fx->path in fx->st (the restart case). */
static zb_err reopen(fixture *fx, zb_diag *diag) {
  zb_store_close(fx->st);
  fx->st = NULL;
  return zb_store_open(fx->path, &fx->st, diag);
}

/* ---- rows ---------------------------------------------------------------- */

/* Protobuf-like bytes with zero bytes inside and at both ends: a store that
 * used string functions on them would cut them short. */
static const uint8_t spec_a[] = {0x00, 0x0a, 0x03, 'z', 0x00, 'b', 0x10, 0x00, 0x00, 0xff, 0x80, 0x00};
static const uint8_t spec_b[] = {0x12, 0x00, 0x34};
static const uint8_t iter_a[] = {0x08, 0x00, 0x11, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xf0, 0x3f, 0x00};
static const uint8_t empty[1] = {0}; /* a non-NULL pointer for length-0 blobs */
static char sentinel;                /* a non-NULL output a failing call must overwrite */

static zb_store_job make_job(const char *id, int state, int64_t created_ms, const uint8_t *spec,
                             size_t spec_len, const uint8_t *last, size_t last_len) {
  zb_store_job j;
  memset(&j, 0, sizeof j);
  snprintf(j.id, sizeof j.id, "%s", id);
  snprintf(j.name, sizeof j.name, "name of %s", id);
  j.state = state;
  snprintf(j.reason, sizeof j.reason, "reason of %s", id);
  snprintf(j.schedule, sizeof j.schedule, "zb-h1");
  j.created_ms = created_ms;
  j.updated_ms = created_ms + 5;
  j.iterations_done = 7;
  j.next_seq = 0;
  j.spec = (uint8_t *)spec;
  j.spec_len = spec_len;
  j.last = (uint8_t *)last;
  j.last_len = last_len;
  return j;
}

static zb_store_event make_event(const char *job_id, int64_t seq, int state, const uint8_t *it,
                                 size_t it_len) {
  zb_store_event e;
  memset(&e, 0, sizeof e);
  snprintf(e.job_id, sizeof e.job_id, "%s", job_id);
  e.seq = seq;
  e.unix_ms = 1700000000000 + seq;
  e.state = state;
  snprintf(e.reason, sizeof e.reason, "event %lld", (long long)seq);
  e.iteration = (uint8_t *)it;
  e.iteration_len = it_len;
  return e;
}

/* The event mark_interrupted writes. */
static zb_store_event failed_event(const char *job_id, int64_t seq, int64_t unix_ms, const char *reason) {
  zb_store_event e = make_event(job_id, seq, ZB_JOB_FAILED, NULL, 0);
  e.unix_ms = unix_ms;
  snprintf(e.reason, sizeof e.reason, "%s", reason);
  return e;
}

/* Same presence (NULL or not), same length, same bytes. */
static int blob_eq(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen) {
  return (a == NULL) == (b == NULL) && alen == blen && (alen == 0 || memcmp(a, b, alen) == 0);
}

/* The first field in which two jobs differ, or NULL. */
static const char *job_diff(const zb_store_job *a, const zb_store_job *b) {
  if (strcmp(a->id, b->id) != 0)
    return "id";
  if (strcmp(a->name, b->name) != 0)
    return "name";
  if (a->state != b->state)
    return "state";
  if (strcmp(a->reason, b->reason) != 0)
    return "reason";
  if (strcmp(a->schedule, b->schedule) != 0)
    return "schedule";
  if (a->created_ms != b->created_ms || a->updated_ms != b->updated_ms)
    return "created_ms/updated_ms";
  if (a->iterations_done != b->iterations_done)
    return "iterations_done";
  if (a->next_seq != b->next_seq)
    return "next_seq";
  if (!blob_eq(a->spec, a->spec_len, b->spec, b->spec_len))
    return "spec";
  if (!blob_eq(a->last, a->last_len, b->last, b->last_len))
    return "last";
  if (a->n_rank_owners != b->n_rank_owners || (a->rank_owners == NULL) != (b->rank_owners == NULL))
    return "n_rank_owners";
  for (int r = 0; r < a->n_rank_owners; r++)
    if (strcmp(a->rank_owners[r], b->rank_owners[r]) != 0)
      return "rank_owners";
  return NULL;
}

static const char *event_diff(const zb_store_event *a, const zb_store_event *b) {
  if (strcmp(a->job_id, b->job_id) != 0)
    return "job_id";
  if (a->seq != b->seq)
    return "seq";
  if (a->unix_ms != b->unix_ms)
    return "unix_ms";
  if (a->state != b->state)
    return "state";
  if (strcmp(a->reason, b->reason) != 0)
    return "reason";
  if (!blob_eq(a->iteration, a->iteration_len, b->iteration, b->iteration_len))
    return "iteration";
  return NULL;
}

/* Lists the jobs and compares them with want[0..n). Returns a description
 * of the first difference (static buffer) or NULL. */
static const char *jobs_differ(zb_store *st, const zb_store_job *want, int n_want) {
  static char why[384];
  zb_store_job *rows = NULL;
  int n = -1;
  zb_diag diag = {{0}};
  const char *what = NULL;
  if (zb_store_list_jobs(st, &rows, &n, &diag) != ZB_OK) {
    snprintf(why, sizeof why, "list jobs failed: %s", diag.msg);
    return why;
  }
  if (n != n_want)
    snprintf(why, sizeof why, "%d jobs, want %d", n, n_want);
  for (int i = 0; n == n_want && i < n && !what; i++)
    if ((what = job_diff(&rows[i], &want[i])) != NULL)
      snprintf(why, sizeof why, "job %d (%s, want %s): %s differs", i, rows[i].id, want[i].id, what);
  zb_store_jobs_free(rows, n);
  return n != n_want || what ? why : NULL;
}

/* The same for the events of job_id after after_seq. */
static const char *events_differ(zb_store *st, const char *job_id, int64_t after_seq,
                                 const zb_store_event *want, int n_want) {
  static char why[384];
  zb_store_event *rows = NULL;
  int n = -1;
  zb_diag diag = {{0}};
  const char *what = NULL;
  if (zb_store_list_events(st, job_id, after_seq, &rows, &n, &diag) != ZB_OK) {
    snprintf(why, sizeof why, "list events failed: %s", diag.msg);
    return why;
  }
  if (n != n_want)
    snprintf(why, sizeof why, "%s: %d events after %lld, want %d", job_id, n, (long long)after_seq, n_want);
  if (n == 0 && rows != NULL) {
    snprintf(why, sizeof why, "%s: no events but rows is not NULL", job_id);
    what = "rows";
  }
  for (int i = 0; n == n_want && i < n && !what; i++)
    if ((what = event_diff(&rows[i], &want[i])) != NULL)
      snprintf(why, sizeof why, "%s event %d (seq %lld, want %lld): %s differs", job_id, i,
               (long long)rows[i].seq, (long long)want[i].seq, what);
  zb_store_events_free(rows, n);
  return n != n_want || what ? why : NULL;
}

#define CHECK_JOBS(st, want, n)                                                                              \
  do {                                                                                                       \
    const char *why_ = jobs_differ((st), (want), (n));                                                       \
    CHECK_MSG(!why_, "%s", why_);                                                                            \
  } while (0)

#define CHECK_EVENTS(st, job, after, want, n)                                                                \
  do {                                                                                                       \
    const char *why_ = events_differ((st), (job), (after), (want), (n));                                     \
    CHECK_MSG(!why_, "%s", why_);                                                                            \
  } while (0)

/* Opens the file with plain SQLite and runs sql; returns the first column
 * of its first row as an integer (0 when none), or -1 on failure. */
static long long raw_query(const char *path, const char *sql) {
  sqlite3 *db = NULL;
  sqlite3_stmt *s = NULL;
  long long v = -1;
  if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK)
    goto done;
  if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK)
    goto done;
  int rc = sqlite3_step(s);
  if (rc == SQLITE_ROW)
    v = sqlite3_column_int64(s, 0);
  else if (rc == SQLITE_DONE)
    v = 0;
done:
  sqlite3_finalize(s);
  sqlite3_close(db);
  return v;
}

/* ---- round trips ----------------------------------------------------------- */

static void round_trip(fixture *fx) {
  zb_diag diag = {{0}};
  CHECK_OK(zb_store_open(fx->path, &fx->st, &diag));

  /* A large blob (several SQLite pages, overflow chain) with zeros every
   * third byte. */
  enum { BIG = 70000 };
  static uint8_t big[BIG];
  for (int i = 0; i < BIG; i++)
    big[i] = i % 3 ? (uint8_t)(i * 7 % 251 + 1) : 0;

  zb_store_job j2 = make_job("j-2", ZB_JOB_RUNNING, 2000, spec_a, sizeof spec_a, big, BIG);
  j2.next_seq = INT64_C(1) << 40; /* needs 64 bits */
  j2.created_ms = INT64_C(1700000000123);
  j2.iterations_done = 123456;
  memset(j2.reason, 'r', sizeof j2.reason - 1); /* the longest reason that fits */
  j2.reason[sizeof j2.reason - 1] = '\0';
  snprintf(j2.schedule, sizeof j2.schedule, "interleaved-1f1b");
  zb_store_job j1 = make_job("j-1", ZB_JOB_PENDING, 1000, spec_b, sizeof spec_b, NULL, 0);
  /* Same created_ms as j-2: the id breaks the tie. Empty but present blobs
   * (an all-default message packs to 0 bytes) must not read back as NULL. */
  zb_store_job j0 = make_job("j-0b", ZB_JOB_SUCCEEDED, j2.created_ms, empty, 0, empty, 0);
  j0.name[0] = '\0';

  CHECK_OK(zb_store_put_job(fx->st, &j2, &diag));
  CHECK_OK(zb_store_put_job(fx->st, &j1, &diag));
  CHECK_OK(zb_store_put_job(fx->st, &j0, &diag));

  const zb_store_job want[] = {j1, j0, j2}; /* oldest first, then by id */
  CHECK_JOBS(fx->st, want, 3);

  /* The rows own copies: scribbling on them must not reach the store. */
  zb_store_job *rows = NULL;
  int n = 0;
  CHECK_OK(zb_store_list_jobs(fx->st, &rows, &n, &diag));
  CHECK(n == 3 && rows[1].spec != NULL && rows[1].spec_len == 0 && rows[1].last != NULL);
  CHECK(rows[0].last == NULL && rows[2].last != big);
  memset(rows[2].last, 0xee, rows[2].last_len);
  zb_store_jobs_free(rows, n);
  CHECK_JOBS(fx->st, want, 3);
}

static void replace_by_id(fixture *fx) {
  zb_diag diag = {{0}};
  CHECK_OK(zb_store_open(fx->path, &fx->st, &diag));
  zb_store_job other = make_job("j-other", ZB_JOB_PENDING, 50, spec_b, sizeof spec_b, NULL, 0);
  zb_store_job v1 = make_job("j-1", ZB_JOB_RUNNING, 100, spec_a, sizeof spec_a, iter_a, sizeof iter_a);
  CHECK_OK(zb_store_put_job(fx->st, &other, &diag));
  CHECK_OK(zb_store_put_job(fx->st, &v1, &diag));

  /* Every field changes; the blobs get shorter and last goes away, so a
   * partial update would show. */
  zb_store_job v2 = make_job("j-1", ZB_JOB_SUCCEEDED, 90, spec_b, sizeof spec_b, NULL, 0);
  snprintf(v2.name, sizeof v2.name, "renamed");
  snprintf(v2.reason, sizeof v2.reason, "finished");
  snprintf(v2.schedule, sizeof v2.schedule, "zb-v");
  v2.updated_ms = 999;
  v2.iterations_done = 100;
  v2.next_seq = 12;
  CHECK_OK(zb_store_put_job(fx->st, &v2, &diag));

  const zb_store_job want[] = {other, v2};
  CHECK_JOBS(fx->st, want, 2);
}

static void events_after_seq(fixture *fx) {
  zb_diag diag = {{0}};
  CHECK_OK(zb_store_open(fx->path, &fx->st, &diag));
  zb_store_event ev[5];
  ev[0] = make_event("j-1", 0, ZB_JOB_PENDING, NULL, 0);
  ev[1] = make_event("j-1", 1, ZB_JOB_RUNNING, empty, 0);
  ev[2] = make_event("j-1", 2, ZB_JOB_RUNNING, iter_a, sizeof iter_a);
  ev[3] = make_event("j-1", 3, ZB_JOB_RUNNING, spec_a, sizeof spec_a);
  ev[4] = make_event("j-1", 4, ZB_JOB_SUCCEEDED, NULL, 0);
  /* Appended out of order: the list orders by seq, not by insertion. */
  static const int order[] = {0, 2, 1, 4, 3};
  for (int i = 0; i < 5; i++)
    CHECK_OK(zb_store_append_event(fx->st, &ev[order[i]], &diag));
  /* Another job's events with the same seqs must not mix in. */
  zb_store_event o0 = make_event("j-10", 0, ZB_JOB_PENDING, NULL, 0);
  zb_store_event o3 = make_event("j-10", 3, ZB_JOB_FAILED, spec_b, sizeof spec_b);
  CHECK_OK(zb_store_append_event(fx->st, &o0, &diag));
  CHECK_OK(zb_store_append_event(fx->st, &o3, &diag));

  CHECK_EVENTS(fx->st, "j-1", -1, ev, 5);
  CHECK_EVENTS(fx->st, "j-1", 2, ev + 3, 2);
  CHECK_EVENTS(fx->st, "j-1", 4, NULL, 0);
  CHECK_EVENTS(fx->st, "j-10", 0, &o3, 1);
  CHECK_EVENTS(fx->st, "j-nope", -1, NULL, 0);

  /* A seq already taken is the caller's error, reported with the job. */
  zb_store_event dup = make_event("j-1", 2, ZB_JOB_FAILED, NULL, 0);
  zb_err err = zb_store_append_event(fx->st, &dup, &diag);
  CHECK_EQ(err, ZB_ERR_INVALID_ARG);
  CHECK_HAS(diag.msg, "insert event for job j-1 seq 2");
  CHECK_HAS(diag.msg, "UNIQUE");
  CHECK_EVENTS(fx->st, "j-1", -1, ev, 5);
}

/* A page bounded in bytes too: as many events as keep their iteration
 * blobs within max_bytes, the first whatever its size; events without one
 * count nothing. */
static void events_page_by_bytes(fixture *fx) {
  zb_diag diag = {{0}};
  CHECK_OK(zb_store_open(fx->path, &fx->st, &diag));
  static uint8_t blob[100];
  zb_store_event ev[5];
  for (int i = 0; i < 5; i++) {
    ev[i] = make_event("j-1", i + 1, ZB_JOB_RUNNING, i == 3 ? NULL : blob, i == 3 ? 0 : sizeof blob);
    CHECK_OK(zb_store_append_event(fx->st, &ev[i], &diag));
  }
  static const struct {
    int64_t after;
    int limit;
    long long max_bytes;
    int want_first, want_n;
  } pages[] = {
      {0, 32, 250, 1, 2}, /* 100 + 100 fit, a third would pass 250 */
      {0, 32, 200, 1, 2}, /* exactly at the bound */
      {0, 32, 50, 1, 1},  /* the first, larger than the bound, still comes */
      {0, 32, 0, 1, 5},   /* no bound */
      {2, 32, 200, 3, 3}, /* 100, the blobless 0, 100 */
      {0, 1, 1000, 1, 1}, /* the count bounds too */
      {5, 32, 50, 0, 0},  /* nothing after the last */
  };
  for (size_t k = 0; k < sizeof pages / sizeof pages[0]; k++) {
    zb_store_event *rows = NULL;
    int n = -1;
    CHECK_OK(zb_store_list_events_limit(fx->st, "j-1", pages[k].after, pages[k].limit, pages[k].max_bytes,
                                        &rows, &n, &diag));
    CHECK_MSG(n == pages[k].want_n, "page %zu: %d events, want %d", k, n, pages[k].want_n);
    for (int i = 0; i < n && n == pages[k].want_n; i++)
      CHECK_EQ(rows[i].seq, pages[k].want_first + i);
    zb_store_events_free(rows, n);
  }
}

/* ---- restarts ------------------------------------------------------------ */

static void survives_reopen(fixture *fx) {
  zb_diag diag = {{0}};
  CHECK_OK(zb_store_open(fx->path, &fx->st, &diag));
  zb_store_job jobs[2] = {make_job("a", ZB_JOB_RUNNING, 10, spec_a, sizeof spec_a, iter_a, sizeof iter_a),
                          make_job("b", ZB_JOB_CANCELLED, 20, spec_b, sizeof spec_b, NULL, 0)};
  zb_store_event ev[3] = {make_event("a", 0, ZB_JOB_PENDING, NULL, 0),
                          make_event("a", 1, ZB_JOB_RUNNING, iter_a, sizeof iter_a),
                          make_event("a", 2, ZB_JOB_RUNNING, spec_a, sizeof spec_a)};
  jobs[0].next_seq = 3;
  for (int i = 0; i < 2; i++)
    CHECK_OK(zb_store_put_job(fx->st, &jobs[i], &diag));
  for (int i = 0; i < 3; i++)
    CHECK_OK(zb_store_append_event(fx->st, &ev[i], &diag));

  CHECK_OK(reopen(fx, &diag));
  CHECK_JOBS(fx->st, jobs, 2);
  CHECK_EVENTS(fx->st, "a", -1, ev, 3);

  /* The reopened store writes too (its statements were prepared anew). */
  zb_store_event more = make_event("a", 3, ZB_JOB_SUCCEEDED, NULL, 0);
  CHECK_OK(zb_store_append_event(fx->st, &more, &diag));
  CHECK_OK(reopen(fx, &diag));
  CHECK_EVENTS(fx->st, "a", 2, &more, 1);
}

static void mark_interrupted_after_crash(fixture *fx) {
  zb_diag diag = {{0}};
  CHECK_OK(zb_store_open(fx->path, &fx->st, &diag));
  zb_store_job run = make_job("run", ZB_JOB_RUNNING, 1, spec_a, sizeof spec_a, iter_a, sizeof iter_a);
  zb_store_job pend = make_job("pend", ZB_JOB_PENDING, 2, spec_b, sizeof spec_b, NULL, 0);
  zb_store_job done = make_job("done", ZB_JOB_SUCCEEDED, 3, spec_b, sizeof spec_b, iter_a, sizeof iter_a);
  zb_store_job fail = make_job("fail", ZB_JOB_FAILED, 4, spec_b, sizeof spec_b, NULL, 0);
  zb_store_job gone = make_job("gone", ZB_JOB_CANCELLED, 5, spec_b, sizeof spec_b, NULL, 0);
  run.next_seq = 2;
  done.next_seq = 1;
  zb_store_event run_ev[3] = {make_event("run", 0, ZB_JOB_PENDING, NULL, 0),
                              make_event("run", 1, ZB_JOB_RUNNING, iter_a, sizeof iter_a)};
  zb_store_event done_ev = make_event("done", 0, ZB_JOB_SUCCEEDED, NULL, 0);
  const zb_store_job *all[] = {&run, &pend, &done, &fail, &gone};
  for (int i = 0; i < 5; i++)
    CHECK_OK(zb_store_put_job(fx->st, all[i], &diag));
  for (int i = 0; i < 2; i++)
    CHECK_OK(zb_store_append_event(fx->st, &run_ev[i], &diag));
  CHECK_OK(zb_store_append_event(fx->st, &done_ev, &diag));

  /* The coordinator goes away and comes back. */
  CHECK_OK(reopen(fx, &diag));
  const char *why = "coordinator restarted while the job was live";
  int n = -1;
  CHECK_OK(zb_store_mark_interrupted(fx->st, why, 987654321, &n, &diag));
  CHECK_EQ(n, 2);

  zb_store_job want[5] = {run, pend, done, fail, gone};
  for (int i = 0; i < 2; i++) {
    want[i].state = ZB_JOB_FAILED;
    snprintf(want[i].reason, sizeof want[i].reason, "%s", why);
    want[i].updated_ms = 987654321;
    want[i].next_seq++;
  }
  /* Each gets an event at its old next_seq. */
  run_ev[2] = failed_event("run", 2, 987654321, why);
  zb_store_event pend_ev = failed_event("pend", 0, 987654321, why);

  /* Checked after another restart: the marks are on disk, not in a cache. */
  for (int pass = 0; pass < 2; pass++) {
    CHECK_JOBS(fx->st, want, 5);
    CHECK_EVENTS(fx->st, "run", -1, run_ev, 3);
    CHECK_EVENTS(fx->st, "pend", -1, &pend_ev, 1);
    CHECK_EVENTS(fx->st, "done", -1, &done_ev, 1);
    CHECK_EVENTS(fx->st, "fail", -1, NULL, 0);
    CHECK_OK(reopen(fx, &diag));
  }
  /* Nothing is live any more: a second pass marks nothing. */
  CHECK_OK(zb_store_mark_interrupted(fx->st, "again", 5, &n, &diag));
  CHECK_EQ(n, 0);
  CHECK_JOBS(fx->st, want, 5);
  CHECK_EVENTS(fx->st, "run", -1, run_ev, 3);
}

/* A crash between appending a job's event and rewriting its row leaves
 * next_seq on a seq that is taken; the mark must still go through, after
 * the stored events, or every later start-up would fail the same way. */
static void mark_interrupted_stale_next_seq(fixture *fx) {
  zb_diag diag = {{0}};
  CHECK_OK(zb_store_open(fx->path, &fx->st, &diag));
  zb_store_job job = make_job("j", ZB_JOB_RUNNING, 1, spec_a, sizeof spec_a, NULL, 0);
  job.next_seq = 1;
  CHECK_OK(zb_store_put_job(fx->st, &job, &diag));
  zb_store_event ev[5];
  for (int i = 0; i < 4; i++) {
    ev[i] = make_event("j", i, ZB_JOB_RUNNING, NULL, 0);
    CHECK_OK(zb_store_append_event(fx->st, &ev[i], &diag));
  }
  int n = -1;
  CHECK_OK(zb_store_mark_interrupted(fx->st, "lost", 42, &n, &diag));
  CHECK_EQ(n, 1);
  ev[4] = failed_event("j", 4, 42, "lost");
  CHECK_EVENTS(fx->st, "j", -1, ev, 5);
  job.state = ZB_JOB_FAILED;
  job.updated_ms = 42;
  job.next_seq = 5;
  snprintf(job.reason, sizeof job.reason, "lost");
  CHECK_JOBS(fx->st, &job, 1);
}

/* Inside a group the mark joins it (a savepoint) instead of failing on a
 * nested BEGIN, and commits with it. */
static void mark_interrupted_in_group(fixture *fx) {
  zb_diag diag = {{0}};
  CHECK_OK(zb_store_open(fx->path, &fx->st, &diag));
  zb_store_job job = make_job("j", ZB_JOB_PENDING, 1, spec_a, sizeof spec_a, NULL, 0);
  CHECK_OK(zb_store_begin(fx->st, &diag));
  CHECK_OK(zb_store_put_job(fx->st, &job, &diag));
  int n = -1;
  CHECK_OK(zb_store_mark_interrupted(fx->st, "x", 7, &n, &diag));
  CHECK_EQ(n, 1);
  CHECK_OK(zb_store_commit(fx->st, &diag));
  CHECK_OK(reopen(fx, &diag));
  job.state = ZB_JOB_FAILED;
  job.updated_ms = 7;
  job.next_seq = 1;
  snprintf(job.reason, sizeof job.reason, "x");
  CHECK_JOBS(fx->st, &job, 1);
}

/* ---- groups -------------------------------------------------------------- */

static void batch_of_1000(fixture *fx) {
  zb_diag diag = {{0}};
  CHECK_OK(zb_store_open(fx->path, &fx->st, &diag));
  CHECK_OK(zb_store_open(fx->path, &fx->peer, &diag)); /* a second connection, as zbctl's reader would be */
  enum { N = 1000 };
  static uint8_t payload[N][8];
  static zb_store_event ev[N];
  CHECK_OK(zb_store_begin(fx->st, &diag));
  for (int i = 0; i < N; i++) {
    for (int b = 0; b < 8; b++)
      payload[i][b] = (uint8_t)((uint64_t)i >> (8 * b)); /* little-endian seq: mostly zero bytes */
    ev[i] = make_event("batch", i, ZB_JOB_RUNNING, payload[i], 8);
    CHECK_OK(zb_store_append_event(fx->st, &ev[i], &diag));
  }
  /* One transaction: nothing of it is visible before the commit. */
  CHECK_EVENTS(fx->peer, "batch", -1, NULL, 0);
  CHECK_OK(zb_store_commit(fx->st, &diag));
  CHECK_EVENTS(fx->peer, "batch", -1, ev, N);

  zb_store_close(fx->peer);
  fx->peer = NULL;
  CHECK_OK(reopen(fx, &diag));
  CHECK_EVENTS(fx->st, "batch", -1, ev, N);
  CHECK_EVENTS(fx->st, "batch", N - 3, ev + N - 2, 2);
}

static void autocommit_outside_group(fixture *fx) {
  zb_diag diag = {{0}};
  CHECK_OK(zb_store_open(fx->path, &fx->st, &diag));
  CHECK_OK(zb_store_open(fx->path, &fx->peer, &diag));
  zb_store_job job = make_job("solo", ZB_JOB_PENDING, 1, spec_a, sizeof spec_a, NULL, 0);
  zb_store_event ev = make_event("solo", 0, ZB_JOB_PENDING, NULL, 0);
  CHECK_OK(zb_store_put_job(fx->st, &job, &diag));
  CHECK_OK(zb_store_append_event(fx->st, &ev, &diag));
  /* Visible to another connection at once: each write committed itself. */
  CHECK_JOBS(fx->peer, &job, 1);
  CHECK_EVENTS(fx->peer, "solo", -1, &ev, 1);
}

/* zb_store_close() with a group open rolls the group back, as a crash
 * would: only what committed before it survives. */
static void close_with_open_group(fixture *fx) {
  zb_diag diag = {{0}};
  CHECK_OK(zb_store_open(fx->path, &fx->st, &diag));
  zb_store_job a = make_job("a", ZB_JOB_PENDING, 1, spec_a, sizeof spec_a, NULL, 0);
  CHECK_OK(zb_store_put_job(fx->st, &a, &diag));

  CHECK_OK(zb_store_begin(fx->st, &diag));
  zb_store_job a2 = a;
  a2.state = ZB_JOB_RUNNING;
  zb_store_job b = make_job("b", ZB_JOB_PENDING, 2, spec_b, sizeof spec_b, NULL, 0);
  zb_store_event ev = make_event("a", 0, ZB_JOB_RUNNING, iter_a, sizeof iter_a);
  CHECK_OK(zb_store_put_job(fx->st, &a2, &diag));
  CHECK_OK(zb_store_put_job(fx->st, &b, &diag));
  CHECK_OK(zb_store_append_event(fx->st, &ev, &diag));
  CHECK_OK(reopen(fx, &diag)); /* closes without commit */

  CHECK_JOBS(fx->st, &a, 1);
  CHECK_EVENTS(fx->st, "a", -1, NULL, 0);
  /* The reopened store starts outside any group. */
  CHECK_OK(zb_store_begin(fx->st, &diag));
  CHECK_OK(zb_store_commit(fx->st, &diag));
}

/* A real crash: a child process writes and dies with _exit() without
 * closing, leaving its WAL behind. What committed survives; the group it
 * was in the middle of does not, although its 4 MB of events overflowed
 * SQLite's 2 MB page cache and were spilled into the WAL uncommitted. */
static void killed_in_group(fixture *fx) {
  enum { BLOB = 8192, EVENTS = 500 };
  static uint8_t blob[BLOB];
  for (int i = 0; i < BLOB; i++)
    blob[i] = (uint8_t)(i % 5 ? i : 0);
  zb_store_job a = make_job("a", ZB_JOB_RUNNING, 1, spec_a, sizeof spec_a, NULL, 0);
  zb_store_job c = make_job("c", ZB_JOB_PENDING, 2, spec_b, sizeof spec_b, iter_a, sizeof iter_a);
  zb_store_job b = make_job("b", ZB_JOB_PENDING, 3, spec_b, sizeof spec_b, NULL, 0);
  fflush(NULL);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    zb_store *st = NULL;
    zb_diag d = {{0}};
    int ok = zb_store_open(fx->path, &st, &d) == ZB_OK && zb_store_put_job(st, &a, &d) == ZB_OK &&
             zb_store_begin(st, &d) == ZB_OK && zb_store_put_job(st, &c, &d) == ZB_OK &&
             zb_store_commit(st, &d) == ZB_OK && zb_store_begin(st, &d) == ZB_OK &&
             zb_store_put_job(st, &b, &d) == ZB_OK;
    for (int i = 0; ok && i < EVENTS; i++) {
      zb_store_event ev = make_event("b", i, ZB_JOB_RUNNING, blob, BLOB);
      ok = zb_store_append_event(st, &ev, &d) == ZB_OK;
    }
    if (!ok)
      fprintf(stderr, "  child: %s\n", d.msg);
    _exit(ok ? 0 : 1); /* no close, no atexit: as if killed */
  }
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed (status %d)", status);
  char wal[128];
  snprintf(wal, sizeof wal, "%s-wal", fx->path);
  struct stat sb;
  CHECK_MSG(stat(wal, &sb) == 0 && sb.st_size > (1 << 20),
            "the child's WAL is missing or holds no spilled pages");

  zb_diag diag = {{0}};
  CHECK_OK(zb_store_open(fx->path, &fx->st, &diag));
  const zb_store_job want[] = {a, c};
  CHECK_JOBS(fx->st, want, 2);
  CHECK_EVENTS(fx->st, "b", -1, NULL, 0);
}

static void group_misuse(fixture *fx) {
  zb_diag diag = {{0}};
  CHECK_OK(zb_store_open(fx->path, &fx->st, &diag));
  CHECK_OK(zb_store_open(fx->path, &fx->peer, &diag));
  CHECK_EQ(zb_store_commit(fx->st, &diag), ZB_ERR_INVALID_ARG);
  CHECK_HAS(diag.msg, "no group is open");

  CHECK_OK(zb_store_begin(fx->st, &diag));
  diag.msg[0] = '\0';
  CHECK_EQ(zb_store_begin(fx->st, &diag), ZB_ERR_INVALID_ARG);
  CHECK_HAS(diag.msg, "already open");
  /* The refused begin left the open group intact: it still batches. */
  zb_store_job job = make_job("j", ZB_JOB_PENDING, 1, spec_a, sizeof spec_a, NULL, 0);
  CHECK_OK(zb_store_put_job(fx->st, &job, &diag));
  CHECK_JOBS(fx->peer, NULL, 0);
  CHECK_OK(zb_store_commit(fx->st, &diag));
  CHECK_JOBS(fx->peer, &job, 1);
  CHECK_EQ(zb_store_commit(fx->st, &diag), ZB_ERR_INVALID_ARG);
}

/* ---- opening ------------------------------------------------------------- */

static void open_missing_dir(fixture *fx) {
  char path[160];
  snprintf(path, sizeof path, "%s/no-such-dir/zb.db", fx->dir);
  zb_diag diag = {{0}};
  zb_store *st = (zb_store *)&sentinel;
  zb_err err = zb_store_open(path, &st, &diag);
  CHECK(err != ZB_OK);
  CHECK_EQ(err, ZB_ERR_IO);
  CHECK(st == NULL);
  CHECK_HAS(diag.msg, path);
  CHECK_HAS(diag.msg, "unable to open");
  struct stat sb;
  CHECK_MSG(stat(path, &sb) != 0, "%s was created", path);
}

static void open_garbage_file(fixture *fx) {
  char junk[8192];
  for (size_t i = 0; i < sizeof junk; i++)
    junk[i] = "this is not a database\n"[i % 23];
  FILE *f = fopen(fx->path, "wb");
  CHECK(f != NULL);
  CHECK(fwrite(junk, 1, sizeof junk, f) == sizeof junk);
  CHECK(fclose(f) == 0);

  zb_diag diag = {{0}};
  zb_store *st = NULL;
  CHECK_EQ(zb_store_open(fx->path, &st, &diag), ZB_ERR_PARSE);
  CHECK(st == NULL);
  CHECK_HAS(diag.msg, fx->path);
  CHECK_HAS(diag.msg, "not a database");

  /* Untouched: the refusal came before any write. */
  char back[sizeof junk + 1];
  f = fopen(fx->path, "rb");
  CHECK(f != NULL);
  size_t got = fread(back, 1, sizeof back, f);
  fclose(f);
  CHECK(got == sizeof junk && memcmp(back, junk, sizeof junk) == 0);
}

static void schema_and_pragmas(fixture *fx) {
  zb_diag diag = {{0}};
  CHECK_OK(zb_store_open(fx->path, &fx->st, &diag));
  CHECK_EQ(raw_query(fx->path, "PRAGMA user_version"), 3);
  /* WAL is a property of the file; the -wal file exists while open. */
  char wal[128];
  snprintf(wal, sizeof wal, "%s-wal", fx->path);
  struct stat sb;
  CHECK_MSG(stat(wal, &sb) == 0, "no %s: not in WAL mode", wal);
  CHECK_EQ(raw_query(fx->path, "SELECT count(*) FROM pragma_table_info('jobs')"), 12);
  CHECK_EQ(raw_query(fx->path, "SELECT count(*) FROM pragma_table_info('events')"), 8);
  /* (job_id, seq) is the primary key, in that order. */
  CHECK_EQ(raw_query(fx->path, "SELECT count(*) FROM pragma_table_info('events') WHERE pk > 0"), 2);
  CHECK_EQ(raw_query(fx->path, "SELECT pk FROM pragma_table_info('events') WHERE name = 'job_id'"), 1);
  CHECK_EQ(raw_query(fx->path, "SELECT pk FROM pragma_table_info('events') WHERE name = 'seq'"), 2);
  CHECK_EQ(raw_query(fx->path, "SELECT pk FROM pragma_table_info('jobs') WHERE name = 'id'"), 1);
}

static void newer_version_refused(fixture *fx) {
  zb_diag diag = {{0}};
  CHECK_OK(zb_store_open(fx->path, &fx->st, &diag));
  zb_store_job job = make_job("j-1", ZB_JOB_RUNNING, 1, spec_a, sizeof spec_a, NULL, 0);
  CHECK_OK(zb_store_put_job(fx->st, &job, &diag));
  zb_store_close(fx->st);
  fx->st = NULL;
  CHECK_EQ(raw_query(fx->path, "PRAGMA user_version = 4"), 0);

  zb_store *st = NULL;
  CHECK_EQ(zb_store_open(fx->path, &st, &diag), ZB_ERR_PARSE);
  CHECK(st == NULL);
  CHECK_HAS(diag.msg, fx->path);
  CHECK_HAS(diag.msg, "schema version 4, newer than the 3 this build knows");
  /* left as it was: not marked failed, not re-stamped */
  CHECK_EQ(raw_query(fx->path, "PRAGMA user_version"), 4);
  CHECK_EQ(raw_query(fx->path, "SELECT state FROM jobs WHERE id = 'j-1'"), ZB_JOB_RUNNING);

  /* Version 3 (its own) opens again. */
  CHECK_EQ(raw_query(fx->path, "PRAGMA user_version = 3"), 0);
  CHECK_OK(zb_store_open(fx->path, &fx->st, &diag));
  CHECK_JOBS(fx->st, &job, 1);
}

/* A SQLite file of some other program that happens to have a jobs table:
 * refused, and left as it was (no user_version stamped on it). */
static void foreign_schema_refused(fixture *fx) {
  sqlite3 *db = NULL;
  CHECK(sqlite3_open(fx->path, &db) == SQLITE_OK);
  int rc = sqlite3_exec(db, "CREATE TABLE jobs (id INTEGER PRIMARY KEY, owner TEXT)", NULL, NULL, NULL);
  sqlite3_close(db);
  CHECK(rc == SQLITE_OK);

  zb_diag diag = {{0}};
  zb_store *st = NULL;
  CHECK_EQ(zb_store_open(fx->path, &st, &diag), ZB_ERR_PARSE);
  CHECK(st == NULL);
  CHECK_HAS(diag.msg, "not a zb job store");
  CHECK_EQ(raw_query(fx->path, "PRAGMA user_version"), 0);
  CHECK_EQ(raw_query(fx->path, "SELECT count(*) FROM sqlite_master WHERE name = 'events'"), 0);
}

/* ---- rank owners and schema versions ------------------------------------- */

/* Runs sql (several statements allowed) on the file with plain SQLite;
 * SQLITE_OK when it ran. */
static int raw_exec(const char *path, const char *sql) {
  sqlite3 *db = NULL;
  int rc = sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
  if (rc == SQLITE_OK)
    rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
  sqlite3_close(db);
  return rc;
}

/* A started job keeps, by rank, who ran it: written with the row, read
 * back in rank order after a reopen, replaced with the row, and checked
 * both ways (bad ones refused on write, altered bytes refused on read). */
static void rank_owners_round_trip(fixture *fx) {
  zb_diag diag = {{0}};
  CHECK_OK(zb_store_open(fx->path, &fx->st, &diag));
  char owners[3][ZB_STORE_OWNER_CAP] = {"zb://worker/w0", "insecure:w\xc3\xbc 1", ""};
  memset(owners[2], 'o', sizeof owners[2] - 1); /* the longest that fits */
  owners[2][sizeof owners[2] - 1] = '\0';
  zb_store_job run = make_job("j-1", ZB_JOB_RUNNING, 1, spec_a, sizeof spec_a, NULL, 0);
  run.rank_owners = owners;
  run.n_rank_owners = 3;
  zb_store_job pending = make_job("j-2", ZB_JOB_PENDING, 2, spec_b, sizeof spec_b, NULL, 0);
  CHECK_OK(zb_store_put_job(fx->st, &run, &diag));
  CHECK_OK(zb_store_put_job(fx->st, &pending, &diag));
  zb_store_job want[2] = {run, pending};
  CHECK_JOBS(fx->st, want, 2);
  CHECK_OK(reopen(fx, &diag));
  CHECK_JOBS(fx->st, want, 2);
  CHECK_EQ(raw_query(fx->path, "SELECT length(rank_owners) FROM jobs WHERE id = 'j-1'"),
           (long long)(strlen(owners[0]) + strlen(owners[1]) + strlen(owners[2]) + 3));

  /* a later write of the row carries them, or drops them when it has none */
  want[0].iterations_done = run.iterations_done = 9;
  CHECK_OK(zb_store_put_job(fx->st, &run, &diag));
  CHECK_JOBS(fx->st, want, 2);
  pending.rank_owners = owners;
  pending.n_rank_owners = 1;
  want[1] = pending;
  CHECK_OK(zb_store_put_job(fx->st, &pending, &diag));
  CHECK_JOBS(fx->st, want, 2);
  run.rank_owners = NULL;
  run.n_rank_owners = 0;
  want[0] = run;
  CHECK_OK(zb_store_put_job(fx->st, &run, &diag));
  CHECK_JOBS(fx->st, want, 2);

  /* refused on write: an empty one, one without its NUL, none behind a count */
  char bad[1][ZB_STORE_OWNER_CAP] = {""};
  zb_store_job b = make_job("j-3", ZB_JOB_RUNNING, 3, spec_a, sizeof spec_a, NULL, 0);
  b.rank_owners = bad;
  b.n_rank_owners = 1;
  CHECK_EQ(zb_store_put_job(fx->st, &b, &diag), ZB_ERR_INVALID_ARG);
  CHECK_HAS(diag.msg, "invalid rank_owners");
  memset(bad[0], 'x', sizeof bad[0]);
  CHECK_EQ(zb_store_put_job(fx->st, &b, &diag), ZB_ERR_INVALID_ARG);
  b.rank_owners = NULL;
  CHECK_EQ(zb_store_put_job(fx->st, &b, &diag), ZB_ERR_INVALID_ARG);
  b.n_rank_owners = -1;
  CHECK_EQ(zb_store_put_job(fx->st, &b, &diag), ZB_ERR_INVALID_ARG);
  CHECK_JOBS(fx->st, want, 2);

  /* refused on read: bytes the store never writes */
  const char *altered[] = {"UPDATE jobs SET rank_owners = x'7730' WHERE id = 'j-2'",   /* no NUL */
                           "UPDATE jobs SET rank_owners = x'770000' WHERE id = 'j-2'", /* an empty one */
                           "UPDATE jobs SET rank_owners = x'' WHERE id = 'j-2'",
                           "UPDATE jobs SET rank_owners = zeroblob(97) WHERE id = 'j-2'"};
  for (size_t k = 0; k < sizeof altered / sizeof altered[0]; k++) {
    CHECK_EQ(raw_exec(fx->path, altered[k]), SQLITE_OK);
    zb_store_job *rows = &(zb_store_job){.id = {0}};
    int n = -1;
    CHECK_EQ(zb_store_list_jobs(fx->st, &rows, &n, &diag), ZB_ERR_PARSE);
    CHECK(rows == NULL && n == 0);
    CHECK_HAS(diag.msg, "job j-2: stored rank owners are malformed");
  }
  char long_one[200]; /* one owner of ZB_STORE_OWNER_CAP bytes before its NUL: one too long */
  snprintf(long_one, sizeof long_one,
           "UPDATE jobs SET rank_owners = CAST(substr(replace(hex(zeroblob(%d)), '0', 'o'), 1, %d) || x'00'"
           " AS BLOB) WHERE id = 'j-2'",
           ZB_STORE_OWNER_CAP, ZB_STORE_OWNER_CAP);
  CHECK_EQ(raw_exec(fx->path, long_one), SQLITE_OK);
  CHECK_EQ(raw_query(fx->path, "SELECT length(rank_owners) FROM jobs WHERE id = 'j-2'"),
           ZB_STORE_OWNER_CAP + 1);
  zb_store_job *rows = NULL;
  int n = 0;
  CHECK_EQ(zb_store_list_jobs(fx->st, &rows, &n, &diag), ZB_ERR_PARSE);
  CHECK_HAS(diag.msg, "stored rank owners are malformed");
}

/* The schema of version 1, word for word as that release created it: the
 * jobs table without rank_owners. */
static const char schema_v1[] =
    "CREATE TABLE jobs (id TEXT PRIMARY KEY NOT NULL, name TEXT NOT NULL, state INTEGER NOT NULL,"
    " reason TEXT NOT NULL, schedule TEXT NOT NULL, created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL,"
    " iterations_done INTEGER NOT NULL, next_seq INTEGER NOT NULL, spec BLOB, last BLOB);"
    "CREATE TABLE events (job_id TEXT NOT NULL, seq INTEGER NOT NULL, unix_ms INTEGER NOT NULL,"
    " state INTEGER NOT NULL, reason TEXT NOT NULL, iteration BLOB, PRIMARY KEY (job_id, seq));"
    "CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL);"
    "CREATE TRIGGER jobs_last_number AFTER INSERT ON jobs WHEN NEW.id GLOB 'j-[0-9]*' BEGIN"
    " INSERT INTO meta (key, value) VALUES ('last_job_number', CAST(substr(NEW.id, 3) AS INTEGER))"
    " ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value); END;"
    "PRAGMA journal_mode = WAL;";

/* A store written by version 1 (made here by hand, rows and all) opens,
 * is migrated to version 3 in place, and keeps its jobs, events and job
 * numbers; the RUNNING job it had reads back with no owners on record,
 * and rows written from then on keep theirs. */
static void migrates_version_1(fixture *fx) {
  CHECK_EQ(raw_exec(fx->path, schema_v1), SQLITE_OK);
  CHECK_EQ(
      raw_exec(fx->path,
               "INSERT INTO jobs VALUES ('j-7', 'old', 2, 'iteration 4 done', 'zb-h1', 100, 150, 5, 3,"
               " x'0a0300', x'08');"
               "INSERT INTO jobs VALUES ('j-8', 'queued', 1, 'waiting', '', 200, 200, 0, 1, x'12', NULL);"
               "INSERT INTO events VALUES ('j-7', 1, 100, 1, 'submitted', NULL);"
               "INSERT INTO events VALUES ('j-7', 2, 120, 2, 'ranks assigned', NULL);"
               "INSERT INTO events VALUES ('j-9', 1, 300, 2, 'an iteration', x'0800');"
               "PRAGMA user_version = 1;"),
      SQLITE_OK);

  zb_diag diag = {{0}};
  CHECK_OK(zb_store_open(fx->path, &fx->st, &diag));
  CHECK_EQ(raw_query(fx->path, "PRAGMA user_version"), 3);
  CHECK_EQ(raw_query(fx->path, "SELECT count(*) FROM pragma_table_info('jobs') WHERE name = 'rank_owners'"),
           1);
  CHECK_EQ(
      raw_query(fx->path, "SELECT count(*) FROM pragma_table_info('events') WHERE name = 'iteration_no'"), 1);
  /* an iteration stored before version 3 is not in the index, and the
   * store says so (GetIteration then reads that job's history) */
  zb_store_event *found = NULL;
  bool unindexed = false;
  CHECK_OK(zb_store_find_iteration(fx->st, "j-9", 0, &found, &unindexed, &diag));
  CHECK(!found && unindexed);
  CHECK_OK(zb_store_find_iteration(fx->st, "j-7", 0, &found, &unindexed, &diag));
  CHECK(!found && !unindexed);
  static const uint8_t spec7[] = {0x0a, 0x03, 0x00}, last7[] = {0x08}, spec8[] = {0x12};
  zb_store_job want[2] = {make_job("j-7", ZB_JOB_RUNNING, 100, spec7, sizeof spec7, last7, sizeof last7),
                          make_job("j-8", ZB_JOB_PENDING, 200, spec8, sizeof spec8, NULL, 0)};
  snprintf(want[0].name, sizeof want[0].name, "old");
  snprintf(want[0].reason, sizeof want[0].reason, "iteration 4 done");
  want[0].updated_ms = 150, want[0].iterations_done = 5, want[0].next_seq = 3;
  snprintf(want[1].name, sizeof want[1].name, "queued");
  snprintf(want[1].reason, sizeof want[1].reason, "waiting");
  want[1].schedule[0] = '\0';
  want[1].updated_ms = 200, want[1].iterations_done = 0, want[1].next_seq = 1;
  CHECK_JOBS(fx->st, want, 2);
  zb_store_event ev[2] = {make_event("j-7", 1, ZB_JOB_PENDING, NULL, 0),
                          make_event("j-7", 2, ZB_JOB_RUNNING, NULL, 0)};
  ev[0].unix_ms = 100, ev[1].unix_ms = 120;
  snprintf(ev[0].reason, sizeof ev[0].reason, "submitted");
  snprintf(ev[1].reason, sizeof ev[1].reason, "ranks assigned");
  CHECK_EVENTS(fx->st, "j-7", 0, ev, 2);
  int64_t last = 0;
  CHECK_OK(zb_store_last_job_number(fx->st, &last, &diag));
  CHECK_EQ(last, 8);

  /* the migrated store takes owners, and opens again as it is */
  char owners[2][ZB_STORE_OWNER_CAP] = {"zb://worker/a", "zb://worker/b"};
  want[1].state = ZB_JOB_RUNNING;
  want[1].rank_owners = owners;
  want[1].n_rank_owners = 2;
  CHECK_OK(zb_store_put_job(fx->st, &want[1], &diag));
  CHECK_OK(reopen(fx, &diag));
  CHECK_EQ(raw_query(fx->path, "PRAGMA user_version"), 3);
  CHECK_JOBS(fx->st, want, 2);
}

/* A file stamped version 1 whose tables are not the store's: the
 * migration fails, says so, and leaves the file as it was. */
static void failed_migration_leaves_file(fixture *fx) {
  CHECK_EQ(raw_exec(fx->path, "CREATE TABLE other (x INTEGER); PRAGMA user_version = 1;"), SQLITE_OK);
  zb_diag diag = {{0}};
  zb_store *st = NULL;
  CHECK_EQ(zb_store_open(fx->path, &st, &diag), ZB_ERR_PARSE);
  CHECK(st == NULL);
  CHECK_HAS(diag.msg, "is not a zb job store of schema version 1");
  CHECK_HAS(diag.msg, "jobs");
  CHECK_EQ(raw_query(fx->path, "PRAGMA user_version"), 1);
  CHECK_EQ(raw_query(fx->path, "SELECT count(*) FROM sqlite_master WHERE name IN ('jobs', 'events', 'meta')"),
           0);
}

/* ---- arguments ----------------------------------------------------------- */

static void bad_arguments(fixture *fx) {
  zb_diag diag = {{0}};
  zb_store *st = NULL;
  CHECK_EQ(zb_store_open(NULL, &st, &diag), ZB_ERR_INVALID_ARG);
  CHECK_EQ(zb_store_open("", &st, &diag), ZB_ERR_INVALID_ARG);
  CHECK_EQ(zb_store_open(fx->path, NULL, &diag), ZB_ERR_INVALID_ARG);
  CHECK_OK(zb_store_open(fx->path, &fx->st, &diag));

  zb_store_job job = make_job("j", ZB_JOB_PENDING, 1, spec_a, sizeof spec_a, NULL, 0);
  CHECK_EQ(zb_store_put_job(NULL, &job, &diag), ZB_ERR_INVALID_ARG);
  CHECK_EQ(zb_store_put_job(fx->st, NULL, &diag), ZB_ERR_INVALID_ARG);
  zb_store_job bad = job;
  bad.id[0] = '\0';
  CHECK_EQ(zb_store_put_job(fx->st, &bad, &diag), ZB_ERR_INVALID_ARG);
  CHECK_HAS(diag.msg, "id");
  bad = job;
  memset(bad.id, 'x', sizeof bad.id); /* no terminator */
  CHECK_EQ(zb_store_put_job(fx->st, &bad, &diag), ZB_ERR_INVALID_ARG);
  bad = job;
  memset(bad.reason, 'x', sizeof bad.reason);
  CHECK_EQ(zb_store_put_job(fx->st, &bad, &diag), ZB_ERR_INVALID_ARG);
  CHECK_HAS(diag.msg, "put job j: invalid reason");
  bad = job;
  bad.spec = NULL; /* spec_len still says there are bytes */
  CHECK_EQ(zb_store_put_job(fx->st, &bad, &diag), ZB_ERR_INVALID_ARG);
  CHECK_HAS(diag.msg, "spec");
  bad = job;
  bad.state = 0;
  CHECK_EQ(zb_store_put_job(fx->st, &bad, &diag), ZB_ERR_INVALID_ARG);
  CHECK_HAS(diag.msg, "state");
  CHECK_JOBS(fx->st, NULL, 0); /* none of them wrote */

  zb_store_event ev = make_event("j", 0, ZB_JOB_PENDING, NULL, 0);
  CHECK_EQ(zb_store_append_event(NULL, &ev, &diag), ZB_ERR_INVALID_ARG);
  CHECK_EQ(zb_store_append_event(fx->st, NULL, &diag), ZB_ERR_INVALID_ARG);
  ev.job_id[0] = '\0';
  CHECK_EQ(zb_store_append_event(fx->st, &ev, &diag), ZB_ERR_INVALID_ARG);
  ev = make_event("j", -1, ZB_JOB_PENDING, NULL, 0);
  CHECK_EQ(zb_store_append_event(fx->st, &ev, &diag), ZB_ERR_INVALID_ARG);
  ev = make_event("j", 0, ZB_JOB_PENDING, NULL, 3);
  CHECK_EQ(zb_store_append_event(fx->st, &ev, &diag), ZB_ERR_INVALID_ARG);
  CHECK_EVENTS(fx->st, "j", -1, NULL, 0);

  zb_store_event *rows = (zb_store_event *)&sentinel;
  zb_store_job *jrows = NULL;
  int n = 5;
  CHECK_EQ(zb_store_list_events(fx->st, "", -1, &rows, &n, &diag), ZB_ERR_INVALID_ARG);
  CHECK(rows == NULL && n == 0);
  CHECK_EQ(zb_store_list_events(fx->st, NULL, -1, &rows, &n, &diag), ZB_ERR_INVALID_ARG);
  CHECK_EQ(zb_store_list_jobs(fx->st, NULL, &n, &diag), ZB_ERR_INVALID_ARG);
  CHECK_EQ(zb_store_list_jobs(NULL, &jrows, &n, &diag), ZB_ERR_INVALID_ARG);

  CHECK_EQ(zb_store_mark_interrupted(fx->st, NULL, 0, &n, &diag), ZB_ERR_INVALID_ARG);
  CHECK_EQ(zb_store_mark_interrupted(fx->st, "r", 0, NULL, &diag), ZB_ERR_INVALID_ARG);
  CHECK_EQ(zb_store_begin(NULL, &diag), ZB_ERR_INVALID_ARG);
  CHECK_EQ(zb_store_commit(NULL, &diag), ZB_ERR_INVALID_ARG);
  /* A NULL diag is allowed everywhere. */
  CHECK_EQ(zb_store_put_job(fx->st, NULL, NULL), ZB_ERR_INVALID_ARG);

  zb_store_close(NULL);
  zb_store_jobs_free(NULL, 0);
  zb_store_events_free(NULL, 0);
}

/* ---- pruning and the id counter ------------------------------------------ */

/* Deleting a job takes its events and nothing else; the largest job number
 * ever stored survives the deletion of every job and a reopen. */
static void delete_keeps_last_number(fixture *fx) {
  zb_diag diag;
  CHECK_OK(zb_store_open(fx->path, &fx->st, &diag));
  int64_t last = -1;
  CHECK_OK(zb_store_last_job_number(fx->st, &last, &diag));
  CHECK_EQ(last, 0);
  const char *ids[] = {"j-9", "j-10", "j-2", "other"};
  for (int k = 0; k < 4; k++) {
    zb_store_job job = make_job(ids[k], ZB_JOB_SUCCEEDED, 100 + k, spec_a, sizeof spec_a, NULL, 0);
    CHECK_OK(zb_store_put_job(fx->st, &job, &diag));
    for (int seq = 1; seq <= 3; seq++) {
      zb_store_event ev = make_event(ids[k], seq, ZB_JOB_RUNNING, iter_a, sizeof iter_a);
      CHECK_OK(zb_store_append_event(fx->st, &ev, &diag));
    }
  }
  CHECK_OK(zb_store_last_job_number(fx->st, &last, &diag));
  CHECK_EQ(last, 10); /* numerically, not j-9 as text sorts */
  CHECK_OK(zb_store_delete_job(fx->st, "j-10", &diag));
  zb_store_job *rows = NULL;
  zb_store_event *evs = NULL;
  int n = -1;
  CHECK_OK(zb_store_list_jobs(fx->st, &rows, &n, &diag));
  CHECK_EQ(n, 3);
  zb_store_jobs_free(rows, n);
  CHECK_OK(zb_store_list_events(fx->st, "j-10", 0, &evs, &n, &diag));
  CHECK_EQ(n, 0);
  zb_store_events_free(evs, n);
  CHECK_OK(zb_store_list_events(fx->st, "j-9", 0, &evs, &n, &diag));
  CHECK_EQ(n, 3);
  zb_store_events_free(evs, n);
  for (int k = 0; k < 4; k++)
    CHECK_OK(zb_store_delete_job(fx->st, ids[k], &diag)); /* j-10 again: nothing to delete, no error */
  CHECK_OK(reopen(fx, &diag));
  CHECK_OK(zb_store_list_jobs(fx->st, &rows, &n, &diag));
  CHECK_EQ(n, 0);
  zb_store_jobs_free(rows, n);
  CHECK_OK(zb_store_last_job_number(fx->st, &last, &diag));
  CHECK_EQ(last, 10);
}

/* ---- runner -------------------------------------------------------------- */

static void test_store_round_trip(void) {
  with_tmpdir(round_trip);
}
static void test_store_replace_by_id(void) {
  with_tmpdir(replace_by_id);
}
static void test_store_events_after_seq(void) {
  with_tmpdir(events_after_seq);
}
static void test_store_events_page_by_bytes(void) {
  with_tmpdir(events_page_by_bytes);
}
static void test_store_survives_reopen(void) {
  with_tmpdir(survives_reopen);
}
static void test_store_mark_interrupted_after_crash(void) {
  with_tmpdir(mark_interrupted_after_crash);
}
static void test_store_mark_interrupted_stale_next_seq(void) {
  with_tmpdir(mark_interrupted_stale_next_seq);
}
static void test_store_mark_interrupted_in_group(void) {
  with_tmpdir(mark_interrupted_in_group);
}
static void test_store_batch_of_1000(void) {
  with_tmpdir(batch_of_1000);
}
static void test_store_autocommit_outside_group(void) {
  with_tmpdir(autocommit_outside_group);
}
static void test_store_close_with_open_group(void) {
  with_tmpdir(close_with_open_group);
}
static void test_store_killed_in_group(void) {
  with_tmpdir(killed_in_group);
}
static void test_store_group_misuse(void) {
  with_tmpdir(group_misuse);
}
static void test_store_open_missing_dir(void) {
  with_tmpdir(open_missing_dir);
}
static void test_store_open_garbage_file(void) {
  with_tmpdir(open_garbage_file);
}
static void test_store_schema_and_pragmas(void) {
  with_tmpdir(schema_and_pragmas);
}
static void test_store_newer_version_refused(void) {
  with_tmpdir(newer_version_refused);
}
static void test_store_foreign_schema_refused(void) {
  with_tmpdir(foreign_schema_refused);
}
static void test_store_rank_owners_round_trip(void) {
  with_tmpdir(rank_owners_round_trip);
}
static void test_store_migrates_version_1(void) {
  with_tmpdir(migrates_version_1);
}
static void test_store_failed_migration_leaves_file(void) {
  with_tmpdir(failed_migration_leaves_file);
}
static void test_store_bad_arguments(void) {
  with_tmpdir(bad_arguments);
}
static void test_store_delete_keeps_last_number(void) {
  with_tmpdir(delete_keeps_last_number);
}

ZBT_MAIN(ZBT(test_store_round_trip), ZBT(test_store_replace_by_id), ZBT(test_store_events_after_seq),
         ZBT(test_store_events_page_by_bytes), ZBT(test_store_survives_reopen),
         ZBT(test_store_mark_interrupted_after_crash), ZBT(test_store_mark_interrupted_stale_next_seq),
         ZBT(test_store_mark_interrupted_in_group), ZBT(test_store_batch_of_1000),
         ZBT(test_store_autocommit_outside_group), ZBT(test_store_close_with_open_group),
         ZBT(test_store_killed_in_group), ZBT(test_store_group_misuse), ZBT(test_store_open_missing_dir),
         ZBT(test_store_open_garbage_file), ZBT(test_store_schema_and_pragmas),
         ZBT(test_store_newer_version_refused), ZBT(test_store_foreign_schema_refused),
         ZBT(test_store_rank_owners_round_trip), ZBT(test_store_migrates_version_1),
         ZBT(test_store_failed_migration_leaves_file), ZBT(test_store_bad_arguments),
         ZBT(test_store_delete_keeps_last_number))
