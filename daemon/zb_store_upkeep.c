/* zb_store_upkeep.c — the store's work outside single rows: the start-up
 * pass that fails jobs a crash left running, the job-id counter, and
 * pruning finished jobs with their events (see zb_store.h). */
#include <string.h>

#include "zb_store_internal.h"

/* ---- crash recovery ------------------------------------------------------ */

/* Binds the parameters the three mark statements share: ?1 and ?2 the
 * states that mean "was live", ?3 now, ?4 FAILED, ?5 the reason. Only up to
 * the statement's own count: binding an index it lacks is SQLITE_RANGE. */
static int bind_mark(sqlite3_stmt *s, const char *reason, int64_t now_ms) {
  int np = sqlite3_bind_parameter_count(s), rc = SQLITE_OK;
  if (rc == SQLITE_OK && np >= 1)
    rc = sqlite3_bind_int(s, 1, ZB_JOB_PENDING);
  if (rc == SQLITE_OK && np >= 2)
    rc = sqlite3_bind_int(s, 2, ZB_JOB_RUNNING);
  if (rc == SQLITE_OK && np >= 3)
    rc = sqlite3_bind_int64(s, 3, now_ms);
  if (rc == SQLITE_OK && np >= 4)
    rc = sqlite3_bind_int(s, 4, ZB_JOB_FAILED);
  if (rc == SQLITE_OK && np >= 5)
    rc = sqlite3_bind_text(s, 5, reason, -1, SQLITE_STATIC);
  return rc;
}

/* Binds and runs one mark statement; SQLITE_OK when it ran. */
static int run_mark(sqlite3_stmt *s, const char *reason, int64_t now_ms) {
  int rc = bind_mark(s, reason, now_ms);
  return rc == SQLITE_OK ? zb_store_step_done(s) : rc;
}

zb_err zb_store_mark_interrupted(zb_store *st, const char *reason, int64_t now_ms, int *n_marked,
                                 zb_diag *diag) {
  if (n_marked)
    *n_marked = 0;
  if (!st || !reason || !n_marked)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "store: mark interrupted jobs: store, reason or n_marked is NULL");
  if (strlen(reason) >= ZB_STORE_REASON_CAP)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "store: mark interrupted jobs: reason is longer than %zu bytes",
                       ZB_STORE_REASON_CAP - 1);
  zb_err err = zb_store_check_group(st, diag, "mark interrupted jobs", "");
  if (err != ZB_OK)
    return err;

  sqlite3_stmt *sp = st->stmt[STMT_MARK_SAVEPOINT];
  int rc = zb_store_step_done(sp);
  zb_store_stmt_done(sp);
  if (rc != SQLITE_OK)
    return zb_store_fail(st->db, rc, diag, "mark interrupted jobs: begin");

  /* Order matters: reseq first so the events take free seqs, events before
   * the job update because the update changes the states they select on. */
  static const zb_store_stmt_id steps[] = {STMT_MARK_RESEQ, STMT_MARK_EVENTS, STMT_MARK_JOBS};
  static const char *const step_names[] = {"renumber", "insert events", "update jobs"};
  int marked = 0;
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    sqlite3_stmt *s = st->stmt[steps[i]];
    rc = run_mark(s, reason, now_ms);
    if (rc != SQLITE_OK)
      err = zb_store_fail(st->db, rc, diag, "mark interrupted jobs: %s", step_names[i]);
    else if (steps[i] == STMT_MARK_JOBS)
      marked = sqlite3_changes(st->db);
    zb_store_stmt_done(s);
    if (err != ZB_OK)
      goto done;
  }
  sqlite3_stmt *rel = st->stmt[STMT_MARK_RELEASE];
  rc = zb_store_step_done(rel);
  if (rc != SQLITE_OK)
    err = zb_store_fail(st->db, rc, diag, "mark interrupted jobs: commit");
  zb_store_stmt_done(rel);

done:
  if (err != ZB_OK && !sqlite3_get_autocommit(st->db)) {
    /* Undo this call's writes only: inside a group the caller's earlier
     * writes stay; outside one the RELEASE then ends the transaction. */
    zb_store_step_done(st->stmt[STMT_MARK_ROLLBACK_TO]);
    zb_store_stmt_done(st->stmt[STMT_MARK_ROLLBACK_TO]);
    zb_store_step_done(st->stmt[STMT_MARK_RELEASE]);
    zb_store_stmt_done(st->stmt[STMT_MARK_RELEASE]);
  }
  if (err == ZB_OK)
    *n_marked = marked;
  return err;
}

/* ---- ids and pruning ----------------------------------------------------- */

zb_err zb_store_last_job_number(zb_store *st, int64_t *number, zb_diag *diag) {
  *number = 0;
  int rc =
      zb_store_query_one(st->db, "SELECT value FROM meta WHERE key = 'last_job_number'", number, NULL, 0);
  if (rc != SQLITE_OK && rc != SQLITE_DONE)
    return zb_store_fail(st->db, rc, diag, "read the last job number");
  return ZB_OK;
}

/* Runs one of the delete statements for job id. */
static int run_delete(zb_store *st, zb_store_stmt_id which, const char *id) {
  sqlite3_stmt *s = st->stmt[which];
  int rc = sqlite3_bind_text(s, 1, id, -1, SQLITE_STATIC);
  if (rc == SQLITE_OK)
    rc = zb_store_step_done(s);
  return rc;
}

zb_err zb_store_delete_job(zb_store *st, const char *id, zb_diag *diag) {
  zb_err err = zb_store_check_group(st, diag, "delete job", id);
  if (err != ZB_OK)
    return err;
  int rc = zb_store_step_done(st->stmt[STMT_MARK_SAVEPOINT]);
  zb_store_stmt_done(st->stmt[STMT_MARK_SAVEPOINT]);
  if (rc != SQLITE_OK)
    return zb_store_fail(st->db, rc, diag, "delete job %s: begin", id);
  static const zb_store_stmt_id steps[] = {STMT_DELETE_EVENTS, STMT_DELETE_JOB, STMT_MARK_RELEASE};
  for (size_t i = 0; i < sizeof steps / sizeof steps[0] && err == ZB_OK; i++) {
    rc =
        steps[i] == STMT_MARK_RELEASE ? zb_store_step_done(st->stmt[steps[i]]) : run_delete(st, steps[i], id);
    if (rc != SQLITE_OK)
      err = zb_store_fail(st->db, rc, diag, "delete job %s", id);
    zb_store_stmt_done(st->stmt[steps[i]]);
  }
  if (err != ZB_OK && !sqlite3_get_autocommit(st->db)) {
    zb_store_step_done(st->stmt[STMT_MARK_ROLLBACK_TO]);
    zb_store_stmt_done(st->stmt[STMT_MARK_ROLLBACK_TO]);
    zb_store_step_done(st->stmt[STMT_MARK_RELEASE]);
    zb_store_stmt_done(st->stmt[STMT_MARK_RELEASE]);
  }
  return err;
}
