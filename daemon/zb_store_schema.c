/* zb_store_schema.c — the job store's schema and its versions
 * (docs/operations.md, The job store). PRAGMA user_version holds the
 * version a file was written with: 0 is a new file, 1 the first release's
 * schema, 2 adds jobs.rank_owners, 3 events.iteration_no and traced
 * with their indexes. An older file is migrated in place, in
 * the transaction that opens it, so a failed migration leaves it as it
 * was; a newer one is refused (zb_store.c) because this build cannot know
 * what its rows mean. */
#include "zb_store_internal.h"

/* The current schema, as a new file gets it. CREATE ... IF NOT EXISTS, so
 * on a migrated file it finds everything there and changes nothing. */
static const char zb_store_schema_sql[] =
    "CREATE TABLE IF NOT EXISTS jobs ("
    " id TEXT PRIMARY KEY NOT NULL,"
    " name TEXT NOT NULL,"
    " state INTEGER NOT NULL,"
    " reason TEXT NOT NULL,"
    " schedule TEXT NOT NULL,"
    " created_ms INTEGER NOT NULL,"
    " updated_ms INTEGER NOT NULL,"
    " iterations_done INTEGER NOT NULL,"
    " next_seq INTEGER NOT NULL,"
    " spec BLOB,"
    " last BLOB,"
    /* by rank, the identity of the worker that ran it: NUL-terminated
     * strings one after another (NULL: not started, or a version 1 row) */
    " rank_owners BLOB);"
    "CREATE TABLE IF NOT EXISTS events ("
    " job_id TEXT NOT NULL,"
    " seq INTEGER NOT NULL,"
    " unix_ms INTEGER NOT NULL,"
    " state INTEGER NOT NULL,"
    " reason TEXT NOT NULL,"
    " iteration BLOB,"
    /* the iteration's number and whether it carries timelines, so that
     * one iteration is found through an index, not by reading the
     * history (NULL and 0: not an iteration, or a row before version 3) */
    " iteration_no INTEGER,"
    " traced INTEGER NOT NULL DEFAULT 0,"
    " PRIMARY KEY (job_id, seq));"
    "CREATE INDEX IF NOT EXISTS events_by_iteration ON events (job_id, iteration_no)"
    " WHERE iteration_no IS NOT NULL;"
    "CREATE INDEX IF NOT EXISTS events_traced ON events (job_id, seq) WHERE traced = 1;"
    /* The largest job number ever stored, kept with the
     * row that raised it and never lowered, so ids do
     * not repeat after their jobs are pruned. */
    "CREATE TABLE IF NOT EXISTS meta ("
    " key TEXT PRIMARY KEY NOT NULL,"
    " value INTEGER NOT NULL);"
    "CREATE TRIGGER IF NOT EXISTS jobs_last_number AFTER INSERT ON jobs"
    " WHEN NEW.id GLOB 'j-[0-9]*' BEGIN"
    " INSERT INTO meta (key, value)"
    " VALUES ('last_job_number', CAST(substr(NEW.id, 3) AS INTEGER))"
    " ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value);"
    " END;";

/* migrations[v] takes a file of version v to v + 1. Version 0 has none: a
 * new file gets the current schema whole. */
static const char *const zb_store_migrations[ZB_STORE_SCHEMA_VERSION] = {
    /* rows written before it keep NULL: their jobs have no owners on record */
    [1] = "ALTER TABLE jobs ADD COLUMN rank_owners BLOB",
    /* rows written before it are found by reading the history (job_rpc.c) */
    [2] = "ALTER TABLE events ADD COLUMN iteration_no INTEGER;"
          "ALTER TABLE events ADD COLUMN traced INTEGER NOT NULL DEFAULT 0",
};

int zb_store_migrate(sqlite3 *db, int64_t version, int64_t *step_failed) {
  *step_failed = -1;
  for (int64_t v = version; v >= 1 && v < ZB_STORE_SCHEMA_VERSION; v++) {
    int rc = sqlite3_exec(db, zb_store_migrations[v], NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
      *step_failed = v;
      return rc;
    }
  }
  return sqlite3_exec(db, zb_store_schema_sql, NULL, NULL, NULL);
}
