/* zb_store_internal.h — what the files of the job store share (zb_store.c:
 * opening, statements, rows; zb_store_schema.c: the schema and its
 * migrations; zb_store_upkeep.c: recovery at start, the id counter and
 * pruning; zb_store_iteration.c: one iteration's event by its index). Not for the store's users: they have
 * zb_store.h. */
#ifndef ZB_STORE_INTERNAL_H
#define ZB_STORE_INTERNAL_H

#include <sqlite3.h>
#include <stdbool.h>

#include "zb_store.h"

/* The schema this build reads and writes; PRAGMA user_version holds it. */
#define ZB_STORE_SCHEMA_VERSION 3

/* Capacity of the reason field of rows (the mark's reason is copied there). */
#define ZB_STORE_REASON_CAP sizeof(((zb_store_job *)0)->reason)

typedef enum zb_store_stmt_id {
  STMT_BEGIN,
  STMT_COMMIT,
  STMT_ROLLBACK,
  STMT_PUT_JOB,
  STMT_LIST_JOBS,
  STMT_APPEND_EVENT,
  STMT_LIST_EVENTS,
  STMT_MARK_SAVEPOINT,
  STMT_MARK_RESEQ,
  STMT_MARK_EVENTS,
  STMT_MARK_JOBS,
  STMT_MARK_RELEASE,
  STMT_MARK_ROLLBACK_TO,
  STMT_DELETE_EVENTS,
  STMT_DELETE_JOB,
  STMT_COUNT
} zb_store_stmt_id;

struct zb_store {
  sqlite3 *db;
  sqlite3_stmt *stmt[STMT_COUNT];
  bool in_group; /* between a successful zb_store_begin() and zb_store_commit() */
};

/* Fills diag with "store: <what>: <SQLite's message>" and returns the
 * zb_err for rc. Call it before resetting the failed statement: the reset
 * keeps the message, but a later statement on the connection replaces it. */
zb_err zb_store_fail(sqlite3 *db, int rc, zb_diag *diag, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Steps a statement that returns no rows; SQLITE_OK when it ran. */
int zb_store_step_done(sqlite3_stmt *s);
/* Makes a statement ready for its next use and drops the pointers to the
 * caller's memory bound with SQLITE_STATIC. */
void zb_store_stmt_done(sqlite3_stmt *s);
/* Refuses writes in a group SQLite has rolled back (see zb_store.c). */
zb_err zb_store_check_group(const zb_store *st, zb_diag *diag, const char *what, const char *id);
/* Runs a statement that yields one row and returns its first column
 * (SQLITE_DONE: no row). */
int zb_store_query_one(sqlite3 *db, const char *sql, int64_t *num, char *text, size_t text_cap);

/* Fills row from the current result row of a statement selecting
 * job_id, seq, unix_ms, state, reason, iteration (in that order) from
 * events. */
zb_err zb_store_row_to_event(sqlite3_stmt *s, zb_store_event *row, zb_diag *diag);

/* Brings a file of schema `version` (0: new) to ZB_STORE_SCHEMA_VERSION
 * inside the caller's transaction: each migration from there, then the
 * current schema's CREATE ... IF NOT EXISTS. SQLITE_OK when done; else
 * *step_failed is the version whose migration failed (-1: the CREATE). */
int zb_store_migrate(sqlite3 *db, int64_t version, int64_t *step_failed);

#endif
