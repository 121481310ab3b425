/* zb_store.h — the coordinator's job store: jobs and their event history
 * in one SQLite database file, so a restart loses nothing.
 *
 * The store knows rows, not protobuf: job specs and iteration metrics are
 * opaque blobs (packed protobuf) it keeps byte for byte. Calls block on
 * SQLite (WAL journal, synchronous=NORMAL) and are made from the
 * coordinator's loop thread only. zb_store_begin()/zb_store_commit()
 * group many writes in one transaction (the coordinator flushes a batch
 * every few hundred ms); writes outside a group commit on their own.
 *
 * Ownership: a zb_store is freed by zb_store_close() (NULL: no-op). Row
 * arrays returned by the list functions are owned by the caller and freed
 * with zb_store_jobs_free() / zb_store_events_free().
 */
#ifndef ZB_STORE_H
#define ZB_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zb_err.h"
#include "zb_job_state.h"

typedef struct zb_store zb_store;

/* Room for one rank owner's identity, NUL included (the coordinator's
 * "zb://worker/NAME" or "insecure:ID", docs/operations.md). */
#define ZB_STORE_OWNER_CAP 96

typedef struct zb_store_job {
  char id[64];
  char name[64];
  int state;
  char reason[256];
  char schedule[32]; /* current family */
  int64_t created_ms, updated_ms;
  int iterations_done;
  int64_t next_seq; /* seq the next event of this job gets */
  uint8_t *spec;    /* packed zb.v1.JobSpec */
  size_t spec_len;
  uint8_t *last; /* packed zb.v1.IterationMetrics of the last iteration, may be NULL */
  size_t last_len;
  /* By rank, once the job started: the identity of the worker that ran it,
   * the only one that may take the rank back after a coordinator restart.
   * NULL and 0: not started, or started under schema version 1, which did
   * not keep them. Each is 1..ZB_STORE_OWNER_CAP-1 bytes. */
  char (*rank_owners)[ZB_STORE_OWNER_CAP];
  int n_rank_owners;
} zb_store_job;

typedef struct zb_store_event {
  char job_id[64];
  int64_t seq, unix_ms;
  int state;
  char reason[256];
  uint8_t *iteration; /* packed zb.v1.IterationMetrics, may be NULL */
  size_t iteration_len;
  /* written, not read back: an iteration's event says its number and
   * whether it carries timelines (traced), for zb_store_find_iteration */
  bool indexed;
  int iteration_no;
  bool traced;
} zb_store_event;

/* Opens (creating if needed) the database at path and its schema; a
 * store of an older schema version is migrated in place, one of a newer
 * version refused (ZB_ERR_PARSE). diag says why it failed (path, SQLite's
 * message). */
zb_err zb_store_open(const char *path, zb_store **out, zb_diag *diag);
void zb_store_close(zb_store *st);

zb_err zb_store_begin(zb_store *st, zb_diag *diag);
zb_err zb_store_commit(zb_store *st, zb_diag *diag);

/* Inserts the job or replaces the row with the same id (blobs and rank
 * owners copied): its state and its rank owners in one statement. */
zb_err zb_store_put_job(zb_store *st, const zb_store_job *job, zb_diag *diag);
/* Every job, oldest first. */
zb_err zb_store_list_jobs(zb_store *st, zb_store_job **rows, int *n, zb_diag *diag);
void zb_store_jobs_free(zb_store_job *rows, int n);

zb_err zb_store_append_event(zb_store *st, const zb_store_event *ev, zb_diag *diag);
/* Events of one job with seq > after_seq, in seq order, at most limit of
 * them (<= 0: all) and no more of them than keep their iteration blobs
 * within max_bytes (<= 0: no bound; the first is read whatever its size):
 * a page. */
zb_err zb_store_list_events_limit(zb_store *st, const char *job_id, int64_t after_seq, int limit,
                                  long long max_bytes, zb_store_event **rows, int *n, zb_diag *diag);
/* All of them. */
static inline zb_err zb_store_list_events(zb_store *st, const char *job_id, int64_t after_seq,
                                          zb_store_event **rows, int *n, zb_diag *diag) {
  return zb_store_list_events_limit(st, job_id, after_seq, -1, -1, rows, n, diag);
}
void zb_store_events_free(zb_store_event *rows, int n);

/* The event of a job's iteration `iteration` (its latest, should one be
 * recorded twice), or with iteration -1 its latest traced one, found
 * through the index: *out NULL when there is none; else free it with
 * zb_store_events_free(*out, 1). Rows written before schema version 3
 * are not indexed: *unindexed says whether the job has iteration events
 * the index does not cover (the caller then reads its history). */
zb_err zb_store_find_iteration(zb_store *st, const char *job_id, int iteration, zb_store_event **out,
                               bool *unindexed, zb_diag *diag);

/* Start-up after a crash: every job still PENDING or RUNNING becomes
 * FAILED with `reason`, and gets an event saying so. *n_marked counts them. */
zb_err zb_store_mark_interrupted(zb_store *st, const char *reason, int64_t now_ms, int *n_marked,
                                 zb_diag *diag);

/* The largest N of a job id "j-N" ever stored (0: none), pruned ones
 * included: the next id is past it, so ids never repeat. */
zb_err zb_store_last_job_number(zb_store *st, int64_t *number, zb_diag *diag);
/* Deletes a job's row and its events, both or neither. */
zb_err zb_store_delete_job(zb_store *st, const char *id, zb_diag *diag);

#endif
