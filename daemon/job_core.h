/* job_core.h — a job's lifecycle as a layer of its own (docs/architecture.md,
 * A job's life): the rules of admission to the queue, of the queue's order,
 * of state changes and their durable events, of what a restart does with
 * each stored job, and of retention. No RPC, no loop, no workers: the
 * coordinator's handlers (job_rpc.c, dispatch.c, jobs.c, recovery.c,
 * retention.c) gather what these rules look at, call them, and act on the
 * answer. Functions take a zb_store only where a rule is a durable write;
 * everything else is pure, and the unit tests drive it against an
 * in-memory SQLite store (tests/unit/test_job_core.c).
 *
 * Ownership: a jc_* function never keeps a pointer it was given; rows it
 * fills own their blobs (free them with jc_row_clear). */
#ifndef ZB_JOB_CORE_H
#define ZB_JOB_CORE_H

#include <stdbool.h>
#include <stdint.h>

#include "zb_err.h"
#include "zb_jobspec.h"
#include "zb_store.h"

/* ---- admission to the queue ---- */

/* Whether an identity with `waiting` jobs PENDING or being planned may
 * queue one more under cap (max_pending_per_identity). */
bool jc_room_in_queue(long long waiting, long long cap);

/* The row of a newly admitted job: id "j-N" from *next_number (then
 * advanced), PENDING "submitted" at now_ms, the spec packed as the store
 * keeps it (owned by row), next_seq 1. */
void jc_row_new(const zb_job_spec *spec, int64_t *next_number, int64_t now_ms, zb_store_job *row);
/* Frees what jc_row_new (or a load) put in row. */
void jc_row_clear(zb_store_job *row);

/* ---- state changes and events ---- */

/* Whether a job may go from state `from` to `to`: PENDING -> RUNNING, a
 * final state from PENDING or RUNNING, and RUNNING -> RUNNING (a reason
 * changes); never out of a final state. */
bool jc_may_move(int from, int to);

/* What an iteration's event carries: its packed IterationMetrics, its
 * number and whether it has aligned timelines (GetIteration's "last
 * traced"), which the store indexes. */
typedef struct jc_iteration {
  const uint8_t *packed;
  size_t len;
  int number;
  bool traced;
} jc_iteration;

/* Records row's current state and reason as its next event (seq
 * row->next_seq, then advanced; row->updated_ms = now_ms), with iteration
 * `it` (NULL: none), and writes the row. *ev
 * receives the event as stored (its blobs are the caller's). ZB_OK when
 * both the event and the row are in the store; else the first error, the
 * row's fields advanced all the same (the caller retries the row). */
zb_err jc_record(zb_store *st, zb_store_job *row, const jc_iteration *it, int64_t now_ms, zb_store_event *ev,
                 zb_diag *diag);

/* Moves row to state `to` with `reason` and records it (jc_record);
 * ZB_ERR_INVALID_ARG, the row unchanged, when jc_may_move refuses. */
zb_err jc_move(zb_store *st, zb_store_job *row, int to, const char *reason, int64_t now_ms,
               zb_store_event *ev, zb_diag *diag);

/* ---- the queue ---- */

/* A waiting job as the queue sees it. */
typedef struct jc_waiting {
  int ranks;
  int able;               /* attached workers able to run it */
  int idle;               /* of them, idle */
  bool has_plan;          /* it holds a plan now */
  bool planning;          /* its plan is being made to start it */
  int64_t created_ms;     /* when it was queued */
  int wait_for_workers_s; /* how long it may wait for `able` to reach ranks (<= 0: not at all) */
} jc_waiting;

typedef enum jc_step {
  JC_START,        /* start it now on idle workers */
  JC_PLAN,         /* make its plan to start it; the jobs behind it wait */
  JC_HOLD,         /* it has its workers, not idle yet, or its plan is being made: the jobs behind it wait */
  JC_WAIT_WORKERS, /* too few workers attached: it waits and holds nothing (backfill) */
  JC_TIMED_OUT     /* too few workers past its wait_for_workers_s: it fails */
} jc_step;

/* What the queue does with waiting job w at now_ms, in queue order: the
 * caller stops at JC_PLAN and JC_HOLD (no overtaking a job whose workers
 * are there, so a large job is not starved by smaller ones). */
jc_step jc_queue_step(const jc_waiting *w, int64_t now_ms);

/* ---- a restart ---- */

typedef enum jc_restart {
  JC_KEEP,           /* a finished job: kept as it was */
  JC_READMIT,        /* PENDING: waits again (planned at its start) */
  JC_RECOVER,        /* RUNNING: taken back, its ranks' workers attach again */
  JC_FAIL_UNREADABLE /* PENDING or RUNNING with a spec that does not decode: fails */
} jc_restart;

/* What a restart does with a stored job of `state` whose spec decoded
 * (spec_ok) or not. */
jc_restart jc_at_restart(int state, bool spec_ok);

/* ---- retention ---- */

/* Whether a finished job is past retention: one of the `*over` oldest
 * finished jobs beyond retain_finished_jobs (the caller walks oldest first
 * with *over = finished - retain_finished_jobs; each finished job counts
 * it down), or updated before cutoff_ms. Unfinished jobs never are. */
bool jc_expired(const zb_store_job *row, long long *over, int64_t cutoff_ms);

#endif
