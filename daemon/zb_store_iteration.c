/* zb_store_iteration.c — one iteration's event through the events
 * table's indexes (schema version 3): GetIteration on a job of thousands
 * of iterations reads one row, not its history. */
#include <stdlib.h>

#include "zb_alloc.h"
#include "zb_store_internal.h"

static const char by_number_sql[] = "SELECT job_id, seq, unix_ms, state, reason, iteration FROM events"
                                    " WHERE job_id = ?1 AND iteration_no = ?2 ORDER BY seq DESC LIMIT 1";
static const char last_traced_sql[] = "SELECT job_id, seq, unix_ms, state, reason, iteration FROM events"
                                      " WHERE job_id = ?1 AND traced = 1 ORDER BY seq DESC LIMIT 1";
static const char unindexed_sql[] = "SELECT 1 FROM events WHERE job_id = ?1 AND iteration IS NOT NULL"
                                    " AND iteration_no IS NULL LIMIT 1";

/* Runs sql (job_id ?1, iteration ?2 when it has one); *row when a row came. */
static zb_err query(zb_store *st, const char *sql, const char *job_id, int iteration, zb_store_event **row,
                    bool *any, zb_diag *diag) {
  sqlite3_stmt *s = NULL;
  int rc = sqlite3_prepare_v2(st->db, sql, -1, &s, NULL);
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_text(s, 1, job_id, -1, SQLITE_STATIC);
  if (rc == SQLITE_OK && sqlite3_bind_parameter_count(s) >= 2)
    rc = sqlite3_bind_int(s, 2, iteration);
  if (rc == SQLITE_OK)
    rc = sqlite3_step(s);
  zb_err err = ZB_OK;
  *any = rc == SQLITE_ROW;
  if (rc == SQLITE_ROW && row) {
    *row = zb_calloc(1, sizeof **row);
    if ((err = zb_store_row_to_event(s, *row, diag)) != ZB_OK) {
      zb_store_events_free(*row, 1);
      *row = NULL;
    }
  } else if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
    err = zb_store_fail(st->db, rc, diag, "find iteration %d of job %s", iteration, job_id);
  }
  sqlite3_finalize(s);
  return err;
}

zb_err zb_store_find_iteration(zb_store *st, const char *job_id, int iteration, zb_store_event **out,
                               bool *unindexed, zb_diag *diag) {
  *out = NULL;
  *unindexed = false;
  if (!st || !job_id || !*job_id || iteration < -1)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "store: find iteration: %s",
                       !st              ? "store is NULL"
                       : iteration < -1 ? "iteration below -1"
                                        : "job_id is empty");
  bool any = false;
  zb_err err = query(st, iteration < 0 ? last_traced_sql : by_number_sql, job_id, iteration, out, &any, diag);
  if (err == ZB_OK && !*out)
    err = query(st, unindexed_sql, job_id, iteration, NULL, unindexed, diag);
  return err;
}
