/* zb_store.c — the job store on SQLite (see zb_store.h): opening a file
 * (its schema and migrations are zb_store_schema.c), statements prepared
 * once at open, write groups, jobs and events (zb_store_upkeep.c has the
 * start-up pass and pruning).
 *
 * Errors: every failure fills zb_diag with what was being done and SQLite's
 * own message ("store: insert event for job j-3 seq 7: UNIQUE constraint
 * failed: ..."). Caller mistakes (bad arguments, a duplicate event, misuse
 * of groups) are ZB_ERR_INVALID_ARG; a file that is not a zb database, is
 * corrupt, or has a newer schema is ZB_ERR_PARSE; everything else SQLite
 * can report (cannot open, disk full, busy) is ZB_ERR_IO.
 *
 * Groups: zb_store_begin() opens one transaction and zb_store_commit() ends
 * it; they do not nest. zb_store_close() with a group open rolls the group
 * back, so its writes are lost exactly as they would be after a crash.
 */
#include "zb_store_internal.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"

#define ZB_STORE_STR_(x) #x
#define ZB_STORE_STR(x) ZB_STORE_STR_(x)
/* How long a write waits for another connection's lock (a second
 * coordinator by mistake, or sqlite3 on the command line) before failing. */
#define ZB_STORE_BUSY_TIMEOUT_MS 5000

/* Column order of the job and event SELECTs is the bind order of the
 * INSERTs, so row_to_job/row_to_event and bind_job/bind_event share it. */
static const char *const zb_store_stmt_sql[STMT_COUNT] = {
    /* IMMEDIATE takes the write lock up front: a deferred transaction that
     * read first could not upgrade (SQLITE_BUSY, no retry) if another
     * connection wrote in between. */
    [STMT_BEGIN] = "BEGIN IMMEDIATE",
    [STMT_COMMIT] = "COMMIT",
    [STMT_ROLLBACK] = "ROLLBACK",
    [STMT_PUT_JOB] = "INSERT OR REPLACE INTO jobs (id, name, state, reason, schedule, created_ms, updated_ms,"
                     " iterations_done, next_seq, spec, last, rank_owners)"
                     " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
    [STMT_LIST_JOBS] =
        "SELECT id, name, state, reason, schedule, created_ms, updated_ms, iterations_done, next_seq,"
        " spec, last, rank_owners FROM jobs ORDER BY created_ms, id",
    [STMT_APPEND_EVENT] = "INSERT INTO events (job_id, seq, unix_ms, state, reason, iteration, iteration_no,"
                          " traced) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    [STMT_LIST_EVENTS] = "SELECT job_id, seq, unix_ms, state, reason, iteration FROM events"
                         " WHERE job_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
    /* mark_interrupted runs under a savepoint: outside a group it is the
     * transaction, inside one it nests, so either way it is all or nothing. */
    [STMT_MARK_SAVEPOINT] = "SAVEPOINT zb_mark",
    /* A crash between appending an event and rewriting the job row leaves
     * next_seq at a seq already taken; move it past the stored events so the
     * event below cannot collide and block every later start-up. */
    [STMT_MARK_RESEQ] = "UPDATE jobs SET next_seq = (SELECT max(seq) + 1 FROM events WHERE job_id = jobs.id)"
                        " WHERE state IN (?1, ?2)"
                        " AND next_seq <= (SELECT max(seq) FROM events WHERE job_id = jobs.id)",
    [STMT_MARK_EVENTS] = "INSERT INTO events (job_id, seq, unix_ms, state, reason, iteration)"
                         " SELECT id, next_seq, ?3, ?4, ?5, NULL FROM jobs WHERE state IN (?1, ?2)",
    [STMT_MARK_JOBS] = "UPDATE jobs SET state = ?4, reason = ?5, updated_ms = ?3, next_seq = next_seq + 1"
                       " WHERE state IN (?1, ?2)",
    [STMT_MARK_RELEASE] = "RELEASE zb_mark",
    [STMT_MARK_ROLLBACK_TO] = "ROLLBACK TO zb_mark",
    [STMT_DELETE_EVENTS] = "DELETE FROM events WHERE job_id = ?1",
    [STMT_DELETE_JOB] = "DELETE FROM jobs WHERE id = ?1",
};

/* ---- errors ------------------------------------------------------------ */

static zb_err err_of_sqlite(int rc) {
  switch (rc & 0xff) {
  case SQLITE_NOTADB:
  case SQLITE_CORRUPT:
  case SQLITE_FORMAT: return ZB_ERR_PARSE;
  case SQLITE_CONSTRAINT:
  case SQLITE_MISMATCH:
  case SQLITE_TOOBIG:
  case SQLITE_RANGE:
  case SQLITE_MISUSE: return ZB_ERR_INVALID_ARG;
  default: return ZB_ERR_IO;
  }
}

zb_err zb_store_fail(sqlite3 *db, int rc, zb_diag *diag, const char *fmt, ...) {
  char what[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  /* errmsg of a connection that failed to open is still valid; errstr
   * covers the NULL handle sqlite3_open_v2 leaves when out of memory. */
  const char *msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  return zb_diag_set(diag, err_of_sqlite(rc), "store: %s: %s", what, msg);
}

int zb_store_step_done(sqlite3_stmt *s) {
  int rc = sqlite3_step(s);
  return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

void zb_store_stmt_done(sqlite3_stmt *s) {
  sqlite3_reset(s);
  sqlite3_clear_bindings(s);
}

/* A transaction error such as SQLITE_FULL or SQLITE_IOERR makes SQLite roll
 * the whole transaction back. Writing on would autocommit each write while
 * the caller believes it is batching, so refuse until commit closes it. */
zb_err zb_store_check_group(const zb_store *st, zb_diag *diag, const char *what, const char *id) {
  if (st->in_group && sqlite3_get_autocommit(st->db))
    return zb_diag_set(
        diag, ZB_ERR_IO,
        "store: %s%s%s: the open group was rolled back by an earlier error; commit to close it", what,
        *id ? " " : "", id);
  return ZB_OK;
}

static bool fits(const char *field, size_t cap) {
  return memchr(field, '\0', cap) != NULL;
}

static bool valid_state(int state) {
  return state >= ZB_JOB_PENDING && state <= ZB_JOB_CANCELLED;
}

/* ---- open and close ---------------------------------------------------- */

int zb_store_query_one(sqlite3 *db, const char *sql, int64_t *num, char *text, size_t text_cap) {
  sqlite3_stmt *s = NULL;
  int rc = sqlite3_prepare_v2(db, sql, -1, &s, NULL);
  if (rc != SQLITE_OK)
    goto done;
  rc = sqlite3_step(s);
  if (rc != SQLITE_ROW)
    goto done;
  rc = SQLITE_OK;
  if (num)
    *num = sqlite3_column_int64(s, 0);
  if (text) {
    const unsigned char *t = sqlite3_column_text(s, 0);
    snprintf(text, text_cap, "%s", t ? (const char *)t : "");
  }
done:
  sqlite3_finalize(s);
  return rc;
}

/* Reads the file's schema version into *version; a newer one than this
 * build's is refused. */
static zb_err read_version(zb_store *st, const char *path, int64_t *version, zb_diag *diag) {
  *version = 0;
  int rc = zb_store_query_one(st->db, "PRAGMA user_version", version, NULL, 0);
  if (rc != SQLITE_OK)
    return zb_store_fail(st->db, rc, diag, "read schema version of %s", path);
  if (*version > ZB_STORE_SCHEMA_VERSION)
    return zb_diag_set(
        diag, ZB_ERR_PARSE,
        "store: %s has schema version %lld, newer than the %d this build knows; refusing to open it", path,
        (long long)*version, ZB_STORE_SCHEMA_VERSION);
  return ZB_OK;
}

/* Brings the schema to this build's version (creating the tables of a new
 * file, migrating an older one) and prepares every statement, in one
 * transaction: a database whose tables are not ours fails to migrate or to
 * prepare, and the rollback then leaves it and its user_version as they
 * were. The version is read again under the write lock, so two processes
 * opening one old file do not both migrate it. */
static zb_err store_init_schema(zb_store *st, const char *path, zb_diag *diag) {
  int rc = sqlite3_exec(st->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
  if (rc != SQLITE_OK)
    return zb_store_fail(st->db, rc, diag, "create schema in %s", path);
  int64_t version = 0, failed = -1;
  zb_err err = read_version(st, path, &version, diag);
  if (err != ZB_OK)
    goto done;
  rc = zb_store_migrate(st->db, version, &failed);
  if (rc == SQLITE_ERROR) { /* our SQL is fixed: its tables are not ours */
    err = zb_diag_set(diag, ZB_ERR_PARSE, "store: %s is not a zb job store of schema version %lld (%s)", path,
                      (long long)version, sqlite3_errmsg(st->db));
    goto done;
  }
  if (rc != SQLITE_OK) {
    err = failed >= 0 ? zb_store_fail(st->db, rc, diag, "migrate %s from schema version %lld", path,
                                      (long long)failed)
                      : zb_store_fail(st->db, rc, diag, "create schema in %s", path);
    goto done;
  }
  for (int i = 0; i < STMT_COUNT; i++) {
    rc = sqlite3_prepare_v3(st->db, zb_store_stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &st->stmt[i], NULL);
    if (rc != SQLITE_OK) {
      /* Our SQL is fixed, so a failure means the tables are not ours. */
      err = zb_diag_set(diag, ZB_ERR_PARSE, "store: %s is not a zb job store (%s)", path,
                        sqlite3_errmsg(st->db));
      goto done;
    }
  }
  rc = sqlite3_exec(st->db, "PRAGMA user_version = " ZB_STORE_STR(ZB_STORE_SCHEMA_VERSION) "; COMMIT", NULL,
                    NULL, NULL);
  if (rc != SQLITE_OK)
    err = zb_store_fail(st->db, rc, diag, "create schema in %s", path);
done:
  if (!sqlite3_get_autocommit(st->db))
    sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
  return err;
}

zb_err zb_store_open(const char *path, zb_store **out, zb_diag *diag) {
  if (!out)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "store: open: out is NULL");
  *out = NULL;
  if (!path || !*path)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "store: open: empty database path");

  zb_err err = ZB_OK;
  zb_store *st = zb_calloc(1, sizeof *st);
  /* NOMUTEX: the coordinator's loop thread is the only user, so SQLite's
   * per-call locking buys nothing. */
  int rc =
      sqlite3_open_v2(path, &st->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
  if (rc != SQLITE_OK) {
    err = zb_store_fail(st->db, rc, diag, "open %s", path);
    goto fail;
  }
  sqlite3_busy_timeout(st->db, ZB_STORE_BUSY_TIMEOUT_MS);

  /* The first read of the file: a file that is not SQLite fails here
   * (SQLITE_NOTADB), and a newer schema is refused before anything, even
   * the journal mode, is written to it. */
  int64_t version = 0;
  err = read_version(st, path, &version, diag);
  if (err != ZB_OK)
    goto fail;

  /* WAL: readers (zbctl's WatchJob replays) never block the writer, and
   * with synchronous=NORMAL a commit is one append without fsync, yet a
   * process crash loses nothing committed (a power cut may lose the last
   * commits, never consistency). */
  char mode[16];
  rc = zb_store_query_one(st->db, "PRAGMA journal_mode = WAL", NULL, mode, sizeof mode);
  if (rc != SQLITE_OK) {
    err = zb_store_fail(st->db, rc, diag, "set WAL journal on %s", path);
    goto fail;
  }
  /* An in-memory database (":memory:") reports "memory" and cannot do WAL;
   * anything else means the file system refused it (no shared memory). */
  if (strcmp(mode, "wal") != 0 && strcmp(mode, "memory") != 0) {
    err =
        zb_diag_set(diag, ZB_ERR_IO, "store: %s: journal mode is %s, WAL is not available there", path, mode);
    goto fail;
  }
  rc = sqlite3_exec(st->db, "PRAGMA synchronous = NORMAL", NULL, NULL, NULL);
  if (rc != SQLITE_OK) {
    err = zb_store_fail(st->db, rc, diag, "set synchronous on %s", path);
    goto fail;
  }
  err = store_init_schema(st, path, diag);
  if (err != ZB_OK)
    goto fail;
  *out = st;
  return ZB_OK;

fail:
  zb_store_close(st);
  return err;
}

void zb_store_close(zb_store *st) {
  if (!st)
    return;
  /* An open group is rolled back, as a crash would do. SQLite would also
   * roll back when the connection closes; saying it here makes it the
   * store's documented behaviour rather than a side effect. */
  if (st->db && !sqlite3_get_autocommit(st->db))
    sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
  for (int i = 0; i < STMT_COUNT; i++)
    sqlite3_finalize(st->stmt[i]);
  /* The last connection to close checkpoints the WAL into the database and
   * removes the -wal and -shm files. */
  sqlite3_close_v2(st->db);
  free(st);
}

/* ---- groups -------------------------------------------------------------- */

zb_err zb_store_begin(zb_store *st, zb_diag *diag) {
  if (!st)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "store: begin: store is NULL");
  if (st->in_group)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "store: begin: a group is already open (groups do not nest)");
  sqlite3_stmt *s = st->stmt[STMT_BEGIN];
  int rc = zb_store_step_done(s);
  zb_err err = rc == SQLITE_OK ? ZB_OK : zb_store_fail(st->db, rc, diag, "begin group");
  zb_store_stmt_done(s);
  if (err == ZB_OK)
    st->in_group = true;
  return err;
}

zb_err zb_store_commit(zb_store *st, zb_diag *diag) {
  if (!st)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "store: commit: store is NULL");
  if (!st->in_group)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "store: commit: no group is open");
  /* Whatever happens below, the group is over: the caller either has its
   * writes on disk or knows (from the error) that they are gone. */
  st->in_group = false;
  if (sqlite3_get_autocommit(st->db))
    return zb_diag_set(diag, ZB_ERR_IO,
                       "store: commit: the group was rolled back by an earlier error; its writes are lost");
  sqlite3_stmt *s = st->stmt[STMT_COMMIT];
  int rc = zb_store_step_done(s);
  zb_err err = ZB_OK;
  if (rc != SQLITE_OK) {
    err = zb_store_fail(st->db, rc, diag, "commit group (rolled back)");
    /* A failed COMMIT (SQLITE_BUSY, SQLITE_FULL) may leave the transaction
     * open; close it so the next write does not silently join it. */
    if (!sqlite3_get_autocommit(st->db)) {
      zb_store_step_done(st->stmt[STMT_ROLLBACK]);
      zb_store_stmt_done(st->stmt[STMT_ROLLBACK]);
    }
  }
  zb_store_stmt_done(s);
  return err;
}

/* ---- jobs ---------------------------------------------------------------- */

/* Binds a blob; a NULL pointer stores SQL NULL, a non-NULL pointer with
 * length 0 an empty blob (an all-default protobuf message packs to 0 bytes
 * and must still read back as present). */
static int bind_blob(sqlite3_stmt *s, int idx, const uint8_t *data, size_t len) {
  if (!data)
    return sqlite3_bind_null(s, idx);
  return sqlite3_bind_blob64(s, idx, len ? (const void *)data : "", (sqlite3_uint64)len, SQLITE_STATIC);
}

/* Copies a blob column into zb_malloc'd memory; SQL NULL gives NULL, an
 * empty blob a non-NULL pointer with length 0. */
static void copy_blob(sqlite3_stmt *s, int col, uint8_t **data, size_t *len) {
  *data = NULL;
  *len = 0;
  if (sqlite3_column_type(s, col) == SQLITE_NULL)
    return;
  const void *src = sqlite3_column_blob(s, col); /* before _bytes, as SQLite documents */
  size_t n = (size_t)sqlite3_column_bytes(s, col);
  *data = zb_malloc(n ? n : 1);
  if (n)
    memcpy(*data, src, n);
  *len = n;
}

/* Copies a text column into a fixed field; false when the stored text does
 * not fit, which the API never writes, so the file was altered. */
static bool copy_text(sqlite3_stmt *s, int col, char *dst, size_t cap) {
  const unsigned char *t = sqlite3_column_text(s, col);
  size_t n = (size_t)sqlite3_column_bytes(s, col);
  if (n >= cap)
    return false;
  memcpy(dst, t ? (const char *)t : "", n);
  dst[n] = '\0';
  return true;
}

/* Rank owners as the rank_owners column keeps them: each identity with its
 * NUL, one after another (identities are C strings, so NUL cannot occur
 * inside one). NULL (SQL NULL) when there are none; free() it. */
static char *owners_pack(const zb_store_job *job, size_t *len) {
  *len = 0;
  if (job->n_rank_owners <= 0)
    return NULL;
  for (int r = 0; r < job->n_rank_owners; r++)
    *len += strlen(job->rank_owners[r]) + 1;
  char *blob = zb_malloc(*len), *p = blob;
  for (int r = 0; r < job->n_rank_owners; r++) {
    size_t n = strlen(job->rank_owners[r]) + 1;
    memcpy(p, job->rank_owners[r], n);
    p += n;
  }
  return blob;
}

/* The rank_owners column back into row; false when the stored bytes are
 * not what owners_pack writes (the file was altered). */
static bool owners_unpack(sqlite3_stmt *s, int col, zb_store_job *row) {
  if (sqlite3_column_type(s, col) == SQLITE_NULL)
    return true;
  const char *blob = sqlite3_column_blob(s, col); /* before _bytes, as SQLite documents */
  size_t len = (size_t)sqlite3_column_bytes(s, col);
  int n = 0;
  for (size_t k = 0; k < len; k++)
    n += blob[k] == '\0';
  if (len == 0 || blob[len - 1] != '\0')
    return false;
  row->rank_owners = zb_calloc((size_t)n, sizeof *row->rank_owners);
  row->n_rank_owners = n;
  for (int r = 0; r < n; r++) {
    size_t id_len = strlen(blob);
    if (id_len == 0 || id_len >= sizeof *row->rank_owners)
      return false;
    memcpy(row->rank_owners[r], blob, id_len + 1);
    blob += id_len + 1;
  }
  return true;
}

/* The rank owners of a job to be written: each non-empty and terminated. */
static bool owners_valid(const zb_store_job *job) {
  if (job->n_rank_owners < 0 || (job->n_rank_owners > 0 && !job->rank_owners))
    return false;
  for (int r = 0; r < job->n_rank_owners; r++)
    if (!job->rank_owners[r][0] || !fits(job->rank_owners[r], sizeof *job->rank_owners))
      return false;
  return true;
}

static zb_err check_job(const zb_store_job *job, zb_diag *diag) {
  if (!job)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "store: put job: job is NULL");
  if (!fits(job->id, sizeof job->id) || !job->id[0])
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "store: put job: id is empty or not NUL-terminated");
  const char *bad = !fits(job->name, sizeof job->name)           ? "name"
                    : !fits(job->reason, sizeof job->reason)     ? "reason"
                    : !fits(job->schedule, sizeof job->schedule) ? "schedule"
                    : !valid_state(job->state)                   ? "state"
                    : job->iterations_done < 0                   ? "iterations_done"
                    : job->next_seq < 0                          ? "next_seq"
                    : !job->spec && job->spec_len                ? "spec"
                    : !job->last && job->last_len                ? "last"
                    : !owners_valid(job)                         ? "rank_owners"
                                                                 : NULL;
  if (bad)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "store: put job %s: invalid %s", job->id, bad);
  return ZB_OK;
}

zb_err zb_store_put_job(zb_store *st, const zb_store_job *job, zb_diag *diag) {
  if (!st)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "store: put job: store is NULL");
  zb_err err = check_job(job, diag);
  if (err == ZB_OK)
    err = zb_store_check_group(st, diag, "put job", job->id);
  if (err != ZB_OK)
    return err;
  sqlite3_stmt *s = st->stmt[STMT_PUT_JOB];
  size_t owners_len = 0;
  char *owners = owners_pack(job, &owners_len);
  int rc;
  if ((rc = sqlite3_bind_text(s, 1, job->id, -1, SQLITE_STATIC)) != SQLITE_OK ||
      (rc = sqlite3_bind_text(s, 2, job->name, -1, SQLITE_STATIC)) != SQLITE_OK ||
      (rc = sqlite3_bind_int(s, 3, job->state)) != SQLITE_OK ||
      (rc = sqlite3_bind_text(s, 4, job->reason, -1, SQLITE_STATIC)) != SQLITE_OK ||
      (rc = sqlite3_bind_text(s, 5, job->schedule, -1, SQLITE_STATIC)) != SQLITE_OK ||
      (rc = sqlite3_bind_int64(s, 6, job->created_ms)) != SQLITE_OK ||
      (rc = sqlite3_bind_int64(s, 7, job->updated_ms)) != SQLITE_OK ||
      (rc = sqlite3_bind_int(s, 8, job->iterations_done)) != SQLITE_OK ||
      (rc = sqlite3_bind_int64(s, 9, job->next_seq)) != SQLITE_OK ||
      (rc = bind_blob(s, 10, job->spec, job->spec_len)) != SQLITE_OK ||
      (rc = bind_blob(s, 11, job->last, job->last_len)) != SQLITE_OK ||
      (rc = bind_blob(s, 12, (const uint8_t *)owners, owners_len)) != SQLITE_OK ||
      (rc = zb_store_step_done(s)) != SQLITE_OK)
    err = zb_store_fail(st->db, rc, diag, "put job %s", job->id);
  zb_store_stmt_done(s); /* before the free: the statement pointed at owners */
  free(owners);
  return err;
}

/* Fills row from the current result row of STMT_LIST_JOBS. */
static zb_err row_to_job(sqlite3_stmt *s, zb_store_job *row, zb_diag *diag) {
  memset(row, 0, sizeof *row);
  if (!copy_text(s, 0, row->id, sizeof row->id))
    return zb_diag_set(diag, ZB_ERR_PARSE, "store: list jobs: a job id is longer than %zu bytes",
                       sizeof row->id - 1);
  const char *bad = !copy_text(s, 1, row->name, sizeof row->name)           ? "name"
                    : !copy_text(s, 3, row->reason, sizeof row->reason)     ? "reason"
                    : !copy_text(s, 4, row->schedule, sizeof row->schedule) ? "schedule"
                                                                            : NULL;
  if (bad)
    return zb_diag_set(diag, ZB_ERR_PARSE, "store: list jobs: job %s: stored %s is too long", row->id, bad);
  row->state = sqlite3_column_int(s, 2);
  row->created_ms = sqlite3_column_int64(s, 5);
  row->updated_ms = sqlite3_column_int64(s, 6);
  row->iterations_done = sqlite3_column_int(s, 7);
  row->next_seq = sqlite3_column_int64(s, 8);
  copy_blob(s, 9, &row->spec, &row->spec_len);
  copy_blob(s, 10, &row->last, &row->last_len);
  if (!owners_unpack(s, 11, row)) {
    /* the row is not counted in the list yet: its parts are freed here */
    free(row->spec);
    free(row->last);
    free(row->rank_owners);
    return zb_diag_set(diag, ZB_ERR_PARSE, "store: list jobs: job %s: stored rank owners are malformed",
                       row->id);
  }
  return ZB_OK;
}

zb_err zb_store_list_jobs(zb_store *st, zb_store_job **rows, int *n, zb_diag *diag) {
  if (!rows || !n)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "store: list jobs: rows or n is NULL");
  *rows = NULL;
  *n = 0;
  if (!st)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "store: list jobs: store is NULL");
  sqlite3_stmt *s = st->stmt[STMT_LIST_JOBS];
  zb_store_job *out = NULL;
  int count = 0, cap = 0, rc;
  zb_err err = ZB_OK;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    if (count == cap) {
      cap = cap ? 2 * cap : 16;
      out = zb_realloc(out, (size_t)cap * sizeof *out);
    }
    err = row_to_job(s, &out[count], diag);
    if (err != ZB_OK)
      goto done;
    count++;
  }
  if (rc != SQLITE_DONE)
    err = zb_store_fail(st->db, rc, diag, "list jobs");
done:
  zb_store_stmt_done(s);
  if (err != ZB_OK) {
    zb_store_jobs_free(out, count);
    return err;
  }
  *rows = out;
  *n = count;
  return ZB_OK;
}

void zb_store_jobs_free(zb_store_job *rows, int n) {
  if (!rows)
    return;
  for (int i = 0; i < n; i++) {
    free(rows[i].spec);
    free(rows[i].last);
    free(rows[i].rank_owners);
  }
  free(rows);
}

/* ---- events -------------------------------------------------------------- */

static zb_err check_event(const zb_store_event *ev, zb_diag *diag) {
  if (!ev)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "store: insert event: event is NULL");
  if (!fits(ev->job_id, sizeof ev->job_id) || !ev->job_id[0])
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "store: insert event: job id is empty or not NUL-terminated");
  const char *bad = ev->seq < 0                            ? "seq"
                    : !valid_state(ev->state)              ? "state"
                    : !fits(ev->reason, sizeof ev->reason) ? "reason"
                    : !ev->iteration && ev->iteration_len  ? "iteration"
                                                           : NULL;
  if (bad)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "store: insert event for job %s: invalid %s", ev->job_id,
                       bad);
  return ZB_OK;
}

zb_err zb_store_append_event(zb_store *st, const zb_store_event *ev, zb_diag *diag) {
  if (!st)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "store: insert event: store is NULL");
  zb_err err = check_event(ev, diag);
  if (err == ZB_OK)
    err = zb_store_check_group(st, diag, "insert event for job", ev->job_id);
  if (err != ZB_OK)
    return err;
  sqlite3_stmt *s = st->stmt[STMT_APPEND_EVENT];
  int rc;
  if ((rc = sqlite3_bind_text(s, 1, ev->job_id, -1, SQLITE_STATIC)) != SQLITE_OK ||
      (rc = sqlite3_bind_int64(s, 2, ev->seq)) != SQLITE_OK ||
      (rc = sqlite3_bind_int64(s, 3, ev->unix_ms)) != SQLITE_OK ||
      (rc = sqlite3_bind_int(s, 4, ev->state)) != SQLITE_OK ||
      (rc = sqlite3_bind_text(s, 5, ev->reason, -1, SQLITE_STATIC)) != SQLITE_OK ||
      (rc = bind_blob(s, 6, ev->iteration, ev->iteration_len)) != SQLITE_OK ||
      (rc = ev->indexed ? sqlite3_bind_int(s, 7, ev->iteration_no) : sqlite3_bind_null(s, 7)) != SQLITE_OK ||
      (rc = sqlite3_bind_int(s, 8, ev->indexed && ev->traced)) != SQLITE_OK ||
      (rc = zb_store_step_done(s)) != SQLITE_OK)
    err = zb_store_fail(st->db, rc, diag, "insert event for job %s seq %lld", ev->job_id, (long long)ev->seq);
  zb_store_stmt_done(s);
  return err;
}

zb_err zb_store_row_to_event(sqlite3_stmt *s, zb_store_event *row, zb_diag *diag) {
  memset(row, 0, sizeof *row);
  row->seq = sqlite3_column_int64(s, 1);
  if (!copy_text(s, 0, row->job_id, sizeof row->job_id) || !copy_text(s, 4, row->reason, sizeof row->reason))
    return zb_diag_set(diag, ZB_ERR_PARSE, "store: list events: event seq %lld: stored text is too long",
                       (long long)row->seq);
  row->unix_ms = sqlite3_column_int64(s, 2);
  row->state = sqlite3_column_int(s, 3);
  copy_blob(s, 5, &row->iteration, &row->iteration_len);
  return ZB_OK;
}

zb_err zb_store_list_events_limit(zb_store *st, const char *job_id, int64_t after_seq, int limit,
                                  long long max_bytes, zb_store_event **rows, int *n, zb_diag *diag) {
  if (rows && n)
    *rows = NULL, *n = 0;
  if (!rows || !n || !st || !job_id || !*job_id)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "store: list events: %s",
                       !rows || !n ? "rows or n is NULL" : "store is NULL or job id is empty");
  sqlite3_stmt *s = st->stmt[STMT_LIST_EVENTS];
  zb_store_event *out = NULL;
  int count = 0, cap = 0, rc;
  long long bytes = 0;
  zb_err err = ZB_OK;
  if ((rc = sqlite3_bind_text(s, 1, job_id, -1, SQLITE_STATIC)) != SQLITE_OK ||
      (rc = sqlite3_bind_int64(s, 2, after_seq)) != SQLITE_OK ||
      (rc = sqlite3_bind_int(s, 3, limit > 0 ? limit : -1)) != SQLITE_OK) { /* SQLite: -1, no limit */
    err = zb_store_fail(st->db, rc, diag, "list events of job %s", job_id);
    goto done;
  }
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    bytes += sqlite3_column_bytes(s, 5); /* the iteration blob, before it is copied */
    if (count > 0 && max_bytes > 0 && bytes > max_bytes) {
      rc = SQLITE_DONE; /* the page is full */
      break;
    }
    if (count == cap) {
      cap = cap ? 2 * cap : 16;
      out = zb_realloc(out, (size_t)cap * sizeof *out);
    }
    err = zb_store_row_to_event(s, &out[count], diag);
    if (err != ZB_OK)
      goto done;
    count++;
  }
  if (rc != SQLITE_DONE)
    err = zb_store_fail(st->db, rc, diag, "list events of job %s", job_id);
done:
  zb_store_stmt_done(s);
  if (err != ZB_OK) {
    zb_store_events_free(out, count);
    return err;
  }
  *rows = out;
  *n = count;
  return ZB_OK;
}

void zb_store_events_free(zb_store_event *rows, int n) {
  if (!rows)
    return;
  for (int i = 0; i < n; i++)
    free(rows[i].iteration);
  free(rows);
}
